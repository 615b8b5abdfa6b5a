//! The allocator model behind the predictor: replays a tensor event sequence
//! and reports the caching allocator's reserved peak and what was alive then.
//!
//! There is one implementation of the allocator's rules, the one in
//! [`crate::alloc`]: [`CachingAllocatorModel`] turns the tensor events into
//! [`AllocEvent`]s on their streams and replays them with
//! [`crate::alloc::replay_events_ordered`] on an unlimited simulated device.
//! With [`Policy::Pytorch`] (the default) that is PyTorch's
//! `CUDACachingAllocator` rule by rule, the model that reproduces PyTorch's
//! reserved peak on recorded traces (docs/allocator.md).

use std::collections::HashMap;

use crate::alloc::{AddressOrder, AllocEvent, Policy, replay_events_ordered};

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
    /// The larger of the replays with descending and ascending segment
    /// addresses. The driver mostly hands out descending ones, but not
    /// always, and where equal-size cached blocks tie the address decides
    /// which one a request splits; the run may go either way.
    fn replay(&self, events: &[TensorEvent]) -> Result<ReplayOutcome, PredictError> {
        let down = self.replay_ordered(events, AddressOrder::Descending)?;
        let up = self.replay_ordered(events, AddressOrder::Ascending)?;
        Ok(if up.reserved_peak > down.reserved_peak {
            up
        } else {
            down
        })
    }
}

impl CachingAllocatorModel {
    /// Replays `events` on a device that hands out addresses in `order`.
    pub fn replay_ordered(
        &self,
        events: &[TensorEvent],
        order: AddressOrder,
    ) -> Result<ReplayOutcome, PredictError> {
        let alloc_events: Vec<AllocEvent> = events.iter().map(alloc_event).collect();
        let mut alive: HashMap<u32, (u64, Category, u64)> = HashMap::new();
        let mut live = LiveBytes::default();
        // Live bytes and their running maximum per non-default stream.
        let mut by_stream: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut out = ReplayOutcome::default();
        let report = replay_events_ordered(&alloc_events, self.policy, order, |i, stats| {
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
#[path = "allocator_tests.rs"]
mod tests;
