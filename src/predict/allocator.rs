//! The allocator model behind the predictor: replays a tensor event sequence
//! and reports the caching allocator's reserved peak and what was alive then.
//!
//! There is one implementation of the allocator's rules, the one in
//! [`crate::alloc`]: [`CachingAllocatorModel`] turns the tensor events into
//! [`AllocEvent`]s on the default stream and replays them with
//! [`crate::alloc::replay_events_observed`] on an unlimited simulated device.
//! With [`Policy::Pytorch`] (the default) that is PyTorch's
//! `CUDACachingAllocator` rule by rule, the model that reproduces PyTorch's
//! reserved peak on recorded traces (docs/allocator.md).

use std::collections::HashMap;

use crate::alloc::{AllocEvent, Policy, replay_events_observed};

use super::PredictError;
use super::events::{Category, TensorEvent};

/// Live bytes by category at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveBytes {
    /// Weights and their autocast copies.
    pub parameters: u64,
    /// Gradients.
    pub gradients: u64,
    /// Optimizer state and temporaries.
    pub optimizer: u64,
    /// Activations and temporaries.
    pub activations: u64,
    /// cuBLAS workspaces.
    pub workspace: u64,
}

impl LiveBytes {
    fn slot(&mut self, c: Category) -> &mut u64 {
        match c {
            Category::Parameters => &mut self.parameters,
            Category::Gradients => &mut self.gradients,
            Category::Optimizer => &mut self.optimizer,
            Category::Activations => &mut self.activations,
            Category::Workspace => &mut self.workspace,
        }
    }
    /// Sum over categories.
    pub fn total(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer + self.activations + self.workspace
    }
}

/// What a replay found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplayOutcome {
    /// Highest reserved (segment) bytes.
    pub reserved_peak: u64,
    /// Highest requested bytes alive at once.
    pub allocated_peak: u64,
    /// Requested bytes alive, by category, when the reserved peak was reached.
    pub live_at_peak: LiveBytes,
}

/// An allocator model: events in, reserved peak out.
pub trait AllocatorModel {
    /// Replays `events` from an empty cache.
    fn replay(&self, events: &[TensorEvent]) -> Result<ReplayOutcome, PredictError>;
}

/// The caching allocator of [`crate::alloc`] under `policy`, every tensor on
/// the default stream (the generated sequences and the profiles describe
/// one stream).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachingAllocatorModel {
    /// Allocation policy replayed; [`Policy::Pytorch`] for predictions.
    pub policy: Policy,
}

impl CachingAllocatorModel {
    /// PyTorch's `CUDACachingAllocator` with its default settings.
    pub const PYTORCH: Self = Self {
        policy: Policy::Pytorch,
    };
}

/// The allocator's event for a tensor event (default stream).
fn alloc_event(e: &TensorEvent) -> AllocEvent {
    match *e {
        TensorEvent::Alloc { id, bytes, .. } => AllocEvent::Alloc {
            id: u64::from(id),
            bytes,
            stream: 0,
        },
        TensorEvent::Free { id } => AllocEvent::Free { id: u64::from(id) },
    }
}

impl AllocatorModel for CachingAllocatorModel {
    fn replay(&self, events: &[TensorEvent]) -> Result<ReplayOutcome, PredictError> {
        let alloc_events: Vec<AllocEvent> = events.iter().map(alloc_event).collect();
        let mut alive: HashMap<u32, (u64, Category)> = HashMap::new();
        let mut live = LiveBytes::default();
        let mut out = ReplayOutcome::default();
        let report = replay_events_observed(&alloc_events, self.policy, |i, stats| {
            match events[i] {
                TensorEvent::Alloc {
                    id,
                    bytes,
                    category,
                } => {
                    alive.insert(id, (bytes, category));
                    *live.slot(category) += bytes;
                    out.allocated_peak = out.allocated_peak.max(live.total());
                    let reserved = stats.reserved_bytes.current;
                    if reserved > out.reserved_peak {
                        out.reserved_peak = reserved;
                        out.live_at_peak = live;
                    } else if reserved == out.reserved_peak
                        && live.total() > out.live_at_peak.total()
                    {
                        // Report the fullest moment at the peak reservation.
                        out.live_at_peak = live;
                    }
                }
                TensorEvent::Free { id } => {
                    if let Some((bytes, category)) = alive.remove(&id) {
                        *live.slot(category) -= bytes;
                    }
                }
            }
        })
        .map_err(|e| PredictError::Invalid(format!("allocator replay: {e}")))?;
        debug_assert_eq!(report.peak_reserved_bytes, out.reserved_peak);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{replay_events, round_request, segment_bytes_for};

    const MIB: u64 = 1 << 20;

    fn alloc(id: u32, bytes: u64) -> TensorEvent {
        TensorEvent::Alloc {
            id,
            bytes,
            category: Category::Activations,
        }
    }

    #[test]
    fn the_reserved_peak_is_the_allocators() {
        // Sizes in the three segment classes, frees that leave holes, and a
        // request that only fits once neighbours have merged.
        let events = vec![
            alloc(0, 300),
            alloc(1, 3 * MIB),
            alloc(2, 40 * MIB + 7),
            alloc(3, 40 * MIB),
            TensorEvent::Free { id: 2 },
            TensorEvent::Free { id: 3 },
            alloc(4, 70 * MIB),
            alloc(5, 5 * MIB),
            TensorEvent::Free { id: 1 },
        ];
        let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
        let direct = replay_events(
            &events.iter().map(alloc_event).collect::<Vec<_>>(),
            Policy::Pytorch,
        )
        .unwrap();
        assert_eq!(out.reserved_peak, direct.peak_reserved_bytes);
        // A 2 MiB small segment, a 20 MiB one (3 and 5 MiB share it), and
        // one segment per large request: the two freed 40 MiB segments do
        // not merge, so the 70 MiB request needs its own.
        let expected: u64 = [300, 3 * MIB, 40 * MIB + 7, 40 * MIB, 70 * MIB]
            .into_iter()
            .map(|b| segment_bytes_for(round_request(b)))
            .sum();
        assert_eq!(out.reserved_peak, expected);
        assert_eq!(out.allocated_peak, 300 + 3 * MIB + 80 * MIB + 7);
    }

    #[test]
    fn live_bytes_at_the_peak_are_reported_by_category() {
        let events = vec![
            TensorEvent::Alloc {
                id: 0,
                bytes: 30 * MIB,
                category: Category::Parameters,
            },
            TensorEvent::Alloc {
                id: 1,
                bytes: 12 * MIB,
                category: Category::Gradients,
            },
            TensorEvent::Free { id: 1 },
            alloc(2, 10 * MIB),
        ];
        let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
        assert_eq!(out.reserved_peak, 42 * MIB);
        // The 10 MiB request reuses the freed 12 MiB block: the peak's fullest
        // moment is the first one.
        assert_eq!(out.live_at_peak.parameters, 30 * MIB);
        assert_eq!(out.live_at_peak.gradients, 12 * MIB);
        assert_eq!(out.live_at_peak.activations, 0);
    }
}
