//! The allocator model behind the predictor: replays a tensor event sequence
//! and reports the caching allocator's reserved peak and what was alive then.
//!
//! There is one implementation of the allocator's rules, the one in
//! [`crate::alloc`]: [`CachingAllocatorModel`] turns the tensor events into
//! [`AllocEvent`]s on their streams and replays them with
//! [`crate::alloc::replay_events_observed`] on an unlimited simulated device.
//! With [`Policy::Pytorch`] (the default) that is PyTorch's
//! `CUDACachingAllocator` rule by rule, the model that reproduces PyTorch's
//! reserved peak on recorded traces (docs/allocator.md).

use std::collections::HashMap;

use crate::alloc::{AllocEvent, Policy, replay_events_observed};

use super::PredictError;
use super::sequence::{Category, TensorEvent};

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
    /// A profile's allocations that outlive its step.
    pub persistent: u64,
}

impl LiveBytes {
    fn slot(&mut self, c: Category) -> &mut u64 {
        match c {
            Category::Parameters => &mut self.parameters,
            Category::Gradients => &mut self.gradients,
            Category::Optimizer => &mut self.optimizer,
            Category::Activations => &mut self.activations,
            Category::Workspace => &mut self.workspace,
            Category::Persistent => &mut self.persistent,
        }
    }
    /// Sum over categories.
    pub fn total(&self) -> u64 {
        self.parameters
            + self.gradients
            + self.optimizer
            + self.activations
            + self.workspace
            + self.persistent
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
    /// When the allocated peak was (last) reached: bytes the pools of the streams
    /// other than the default one held unused, counted as each such
    /// stream's highest live bytes so far minus its live bytes then. Those
    /// blocks cannot serve a default-stream request.
    pub idle_other_streams_at_allocated_peak: u64,
}

/// An allocator model: events in, reserved peak out.
pub trait AllocatorModel {
    /// Replays `events` from an empty cache.
    fn replay(&self, events: &[TensorEvent]) -> Result<ReplayOutcome, PredictError>;
}

/// The caching allocator of [`crate::alloc`] under `policy`, each tensor on
/// its event's stream (FSDP's communication buffers on their own streams,
/// everything else, and every profile event, on the default stream).
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

/// The allocator's event for a tensor event, on the tensor's stream.
fn alloc_event(e: &TensorEvent) -> AllocEvent {
    match *e {
        TensorEvent::Alloc {
            id, bytes, stream, ..
        } => AllocEvent::Alloc {
            id: u64::from(id),
            bytes,
            stream: stream.id(),
        },
        TensorEvent::Free { id } => AllocEvent::Free { id: u64::from(id) },
    }
}

impl AllocatorModel for CachingAllocatorModel {
    fn replay(&self, events: &[TensorEvent]) -> Result<ReplayOutcome, PredictError> {
        let alloc_events: Vec<AllocEvent> = events.iter().map(alloc_event).collect();
        let mut alive: HashMap<u32, (u64, Category, u64)> = HashMap::new();
        let mut live = LiveBytes::default();
        // Live bytes and their running maximum per non-default stream.
        let mut by_stream: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut out = ReplayOutcome::default();
        let report = replay_events_observed(&alloc_events, self.policy, |i, stats| {
            match events[i] {
                TensorEvent::Alloc {
                    id,
                    bytes,
                    category,
                    stream,
                } => {
                    let stream = stream.id();
                    alive.insert(id, (bytes, category, stream));
                    *live.slot(category) += bytes;
                    if stream != 0 {
                        let (now, max) = by_stream.entry(stream).or_default();
                        *now += bytes;
                        *max = (*max).max(*now);
                    }
                    if live.total() >= out.allocated_peak {
                        out.allocated_peak = live.total();
                        out.idle_other_streams_at_allocated_peak =
                            by_stream.values().map(|(now, max)| max - now).sum();
                    }
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
                    if let Some((bytes, category, stream)) = alive.remove(&id) {
                        *live.slot(category) -= bytes;
                        if let Some((now, _)) = by_stream.get_mut(&stream) {
                            *now -= bytes;
                        }
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
    use crate::predict::sequence::Stream;

    const MIB: u64 = 1 << 20;

    fn alloc(id: u32, bytes: u64) -> TensorEvent {
        TensorEvent::Alloc {
            id,
            bytes,
            category: Category::Activations,
            stream: Stream::Default,
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
    fn a_block_cached_for_another_stream_is_not_reused() {
        let on = |id, stream| TensorEvent::Alloc {
            id,
            bytes: 30 * MIB,
            category: Category::Gradients,
            stream,
        };
        let events = vec![
            on(0, Stream::ReduceScatter),
            TensorEvent::Free { id: 0 },
            on(1, Stream::Default),
        ];
        let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
        // Each stream has its own pool: the freed 30 MiB block stays cached
        // for the reduce-scatter stream and sits idle at the allocated peak.
        assert_eq!(out.reserved_peak, 60 * MIB);
        assert_eq!(out.allocated_peak, 30 * MIB);
        assert_eq!(out.idle_other_streams_at_allocated_peak, 30 * MIB);
        let same = vec![
            on(0, Stream::Default),
            TensorEvent::Free { id: 0 },
            on(1, Stream::Default),
        ];
        let out = CachingAllocatorModel::PYTORCH.replay(&same).unwrap();
        assert_eq!(out.reserved_peak, 30 * MIB);
        assert_eq!(out.idle_other_streams_at_allocated_peak, 0);
    }

    #[test]
    fn live_bytes_at_the_peak_are_reported_by_category() {
        let events = vec![
            TensorEvent::Alloc {
                id: 0,
                bytes: 30 * MIB,
                category: Category::Parameters,
                stream: Stream::Default,
            },
            TensorEvent::Alloc {
                id: 1,
                bytes: 12 * MIB,
                category: Category::Gradients,
                stream: Stream::Default,
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

    #[test]
    fn idle_bytes_of_another_stream_are_its_highest_live_minus_its_live_then() {
        let on = |id, bytes, category, stream| TensorEvent::Alloc {
            id,
            bytes,
            category,
            stream,
        };
        let events = vec![
            on(0, 20 * MIB, Category::Gradients, Stream::ReduceScatter),
            on(1, 10 * MIB, Category::Gradients, Stream::ReduceScatter),
            TensorEvent::Free { id: 0 },
            on(2, 100 * MIB, Category::Activations, Stream::Default),
        ];
        let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
        // At the allocated peak (110 MiB) the reduce-scatter stream has 10 MiB
        // live of the 30 MiB it once held: 20 MiB of its pool sit idle.
        assert_eq!(out.allocated_peak, 110 * MIB);
        assert_eq!(out.idle_other_streams_at_allocated_peak, 20 * MIB);
    }

    #[test]
    fn of_two_equally_full_moments_at_the_peak_the_first_is_reported() {
        let on = |id, category| TensorEvent::Alloc {
            id,
            bytes: 12 * MIB,
            category,
            stream: Stream::Default,
        };
        // The activations reuse the gradients' freed block: the reservation
        // and the live bytes are the same at both moments.
        let events = vec![
            on(0, Category::Parameters),
            on(1, Category::Gradients),
            TensorEvent::Free { id: 1 },
            on(2, Category::Activations),
        ];
        let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
        assert_eq!(out.live_at_peak.gradients, 12 * MIB);
        assert_eq!(out.live_at_peak.activations, 0);
    }
}
