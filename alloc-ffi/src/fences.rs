//! How far the device is behind the allocator's frees, per stream, so that
//! pages are unmapped in stream order instead of after `cuCtxSynchronize`.
//!
//! PyTorch frees a block when the host drops the tensor; kernels queued on
//! the block's stream before that may still use it. Reusing the block on
//! the same stream is ordered after them, unmapping its pages is not. So the
//! allocator numbers its frees ([`vramfit_alloc_core::DeviceMemory::note_free`])
//! and this records a CUDA event on the freeing stream now and then (at most
//! one per [`FENCE_INTERVAL`]), stamped with the number of the latest free
//! before it. Once an event has completed, every free up to its stamp is
//! behind the device, and the pages of those blocks can be unmapped at once
//! ([`FreeFences::done`]). Pages freed later wait for a later move, or, when
//! a limit needs them now, for `cuCtxSynchronize`.
//!
//! Recording an event costs a driver call; a process whose steps no longer
//! move pages does not ask [`FreeFences::done`], and after [`QUIET_AFTER`]
//! without a question no event is recorded any more (the steady state makes
//! no driver call). The next question starts recording again; until those
//! events complete, the pages freed since count as not yet passed.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use vramfit_alloc_core::StreamId;

use crate::state::StreamEvents;

/// The most often an event is recorded on one stream.
pub const FENCE_INTERVAL: Duration = Duration::from_millis(1);

/// How long events keep being recorded after the last question.
pub const QUIET_AFTER: Duration = Duration::from_secs(10);

/// Events in flight per stream at most (older ones complete first).
const MAX_IN_FLIGHT: usize = 256;

struct StreamFences<Ev> {
    /// Recorded, not yet seen completed: (stamp, event), oldest first.
    in_flight: VecDeque<(u64, Ev)>,
    /// Every free up to this one is behind the device.
    done: u64,
    /// The latest free noted.
    latest: u64,
    last_record: Option<Instant>,
}

/// Per-stream progress of the device through the allocator's frees.
pub struct FreeFences<E: StreamEvents> {
    events: E,
    streams: HashMap<StreamId, StreamFences<E::Event>>,
    interval: Duration,
    quiet_after: Duration,
    /// The last [`FreeFences::done`] question (or the start).
    asked: Instant,
    /// Events recorded so far.
    recorded: u64,
}

impl<E: StreamEvents> FreeFences<E> {
    /// Fences over `events`, recording at most one event per stream every
    /// `interval`, and none `quiet_after` the last question.
    pub fn new(events: E, interval: Duration, quiet_after: Duration, now: Instant) -> Self {
        Self {
            events,
            streams: HashMap::new(),
            interval,
            quiet_after,
            asked: now,
            recorded: 0,
        }
    }

    /// Events recorded so far.
    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    /// Free `seq` (numbers increase) was of a block of `stream`, at `now`.
    pub fn note(&mut self, stream: StreamId, seq: u64, now: Instant) {
        let quiet = now.saturating_duration_since(self.asked) > self.quiet_after;
        let fences = self.streams.entry(stream).or_insert(StreamFences {
            in_flight: VecDeque::new(),
            done: 0,
            latest: 0,
            last_record: None,
        });
        fences.latest = fences.latest.max(seq);
        if quiet
            || fences
                .last_record
                .is_some_and(|t| now.saturating_duration_since(t) < self.interval)
        {
            return;
        }
        poll(&mut self.events, fences);
        if fences.in_flight.len() >= MAX_IN_FLIGHT {
            return;
        }
        // An error (a stream PyTorch no longer has) only means no fence:
        // the frees count as not passed until a later event or a wait.
        if let Ok(event) = self.events.record(stream) {
            fences.in_flight.push_back((seq, event));
            fences.last_record = Some(now);
            self.recorded += 1;
        }
    }

    /// The highest free number up to which every free of `stream` is behind
    /// the device.
    pub fn done(&mut self, stream: StreamId, now: Instant) -> u64 {
        self.asked = now;
        match self.streams.get_mut(&stream) {
            Some(fences) => {
                poll(&mut self.events, fences);
                fences.done
            }
            // No free noted on it: nothing to wait for.
            None => u64::MAX,
        }
    }

    /// Waits until the device has passed free `seq` of `stream`: for the
    /// first event recorded after it, or for one recorded now if there is
    /// none (`cuEventSynchronize`, not the whole device).
    pub fn wait_until(&mut self, stream: StreamId, seq: u64, now: Instant) -> Result<(), String> {
        self.asked = now;
        let Some(fences) = self.streams.get_mut(&stream) else {
            return Ok(());
        };
        poll(&mut self.events, fences);
        if fences.done >= seq {
            return Ok(());
        }
        if !fences.in_flight.iter().any(|(stamp, _)| *stamp >= seq) {
            let event = self.events.record(stream)?;
            fences.in_flight.push_back((fences.latest, event));
            fences.last_record = Some(now);
            self.recorded += 1;
        }
        let (_, event) = fences
            .in_flight
            .iter()
            .find(|(stamp, _)| *stamp >= seq)
            .expect("an event after the free");
        self.events.wait(event)?;
        poll(&mut self.events, fences);
        Ok(())
    }

    /// The device is idle (after `cuCtxSynchronize`): every free so far is
    /// behind it.
    pub fn all_done(&mut self) {
        for fences in self.streams.values_mut() {
            for (_, event) in fences.in_flight.drain(..) {
                self.events.recycle(event);
            }
            fences.done = fences.latest;
        }
    }
}

/// Retires the completed events of one stream, oldest first (events of one
/// stream complete in order).
fn poll<E: StreamEvents>(events: &mut E, fences: &mut StreamFences<E::Event>) {
    while let Some((stamp, event)) = fences.in_flight.front() {
        if !events.done(event).unwrap_or(false) {
            break;
        }
        fences.done = fences.done.max(*stamp);
        let (_, event) = fences.in_flight.pop_front().expect("front exists");
        events.recycle(event);
    }
}

#[cfg(test)]
#[path = "fences_tests.rs"]
mod tests;
