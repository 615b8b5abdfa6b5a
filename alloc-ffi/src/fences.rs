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
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    /// Events that complete when the test says so: event `n` is the n-th
    /// recorded; `completed` is how many have completed (waiting for one
    /// completes it and those before).
    #[derive(Default, Clone)]
    struct Fake {
        recorded: Rc<RefCell<Vec<StreamId>>>,
        completed: Rc<RefCell<usize>>,
        spare: Rc<RefCell<Vec<usize>>>,
        waited: Rc<RefCell<Vec<usize>>>,
    }

    impl StreamEvents for Fake {
        type Event = usize;
        fn record(&mut self, stream: StreamId) -> Result<usize, String> {
            let mut recorded = self.recorded.borrow_mut();
            recorded.push(stream);
            Ok(recorded.len())
        }
        fn done(&mut self, event: &usize) -> Result<bool, String> {
            Ok(*event <= *self.completed.borrow())
        }
        fn wait(&mut self, event: &usize) -> Result<(), String> {
            self.waited.borrow_mut().push(*event);
            let mut completed = self.completed.borrow_mut();
            *completed = (*completed).max(*event);
            Ok(())
        }
        fn recycle(&mut self, event: usize) {
            self.spare.borrow_mut().push(event);
        }
    }

    fn fences(fake: &Fake, t0: Instant) -> FreeFences<Fake> {
        FreeFences::new(
            fake.clone(),
            Duration::from_millis(1),
            Duration::from_secs(10),
            t0,
        )
    }

    #[test]
    fn frees_count_as_passed_once_an_event_recorded_after_them_completes() {
        let fake = Fake::default();
        let t0 = Instant::now();
        let mut f = fences(&fake, t0);
        f.note(0, 1, t0); // event 1, stamp 1
        f.note(0, 2, t0); // within the interval: no event
        f.note(0, 3, t0 + Duration::from_millis(2)); // event 2, stamp 3
        assert_eq!(*fake.recorded.borrow(), vec![0, 0]);
        assert_eq!(f.done(0, t0), 0, "nothing completed yet");
        *fake.completed.borrow_mut() = 1;
        assert_eq!(f.done(0, t0), 1, "free 2 came after event 1");
        *fake.completed.borrow_mut() = 2;
        assert_eq!(f.done(0, t0), 3);
        assert_eq!(fake.spare.borrow().len(), 2, "completed events are reused");
    }

    #[test]
    fn streams_are_fenced_separately() {
        let fake = Fake::default();
        let t0 = Instant::now();
        let mut f = fences(&fake, t0);
        f.note(0, 1, t0); // event 1 on stream 0
        f.note(7, 2, t0); // event 2 on stream 7
        *fake.completed.borrow_mut() = 1;
        assert_eq!(f.done(0, t0), 1);
        assert_eq!(f.done(7, t0), 0);
        assert_eq!(f.done(9, t0), u64::MAX, "a stream without frees");
    }

    #[test]
    fn a_quiet_allocator_records_no_events_until_asked_again() {
        let fake = Fake::default();
        let t0 = Instant::now();
        let mut f = fences(&fake, t0);
        let late = t0 + Duration::from_secs(11);
        f.note(0, 1, late);
        assert_eq!(f.recorded(), 0, "nobody asked for 11 s");
        assert_eq!(f.done(0, late), 0, "free 1 has no fence");
        f.note(0, 2, late + Duration::from_millis(1));
        assert_eq!(f.recorded(), 1);
        *fake.completed.borrow_mut() = 1;
        assert_eq!(f.done(0, late), 2);
    }

    #[test]
    fn waiting_for_a_free_waits_for_the_first_event_after_it() {
        let fake = Fake::default();
        let t0 = Instant::now();
        let mut f = fences(&fake, t0);
        let ms = Duration::from_millis(2);
        f.note(0, 1, t0); // event 1, stamp 1
        f.note(0, 2, t0 + ms); // event 2, stamp 2
        f.note(0, 3, t0 + ms * 2); // event 3, stamp 3
        f.wait_until(0, 2, t0 + ms * 2).unwrap();
        assert_eq!(*fake.waited.borrow(), vec![2], "not event 3");
        assert_eq!(f.done(0, t0), 2);
        // A free after the last event: one is recorded now and waited for.
        f.note(0, 4, t0 + ms * 2); // within the interval: no event
        f.wait_until(0, 4, t0 + ms * 2).unwrap();
        assert_eq!(*fake.waited.borrow(), vec![2, 4]);
        assert_eq!(f.done(0, t0), 4);
        // Already passed: nothing to wait for.
        f.wait_until(0, 3, t0).unwrap();
        assert_eq!(fake.waited.borrow().len(), 2);
    }

    #[test]
    fn an_idle_device_has_passed_every_free() {
        let fake = Fake::default();
        let t0 = Instant::now();
        let mut f = fences(&fake, t0);
        f.note(0, 1, t0);
        f.note(0, 5, t0);
        f.all_done();
        assert_eq!(f.done(0, t0), 5);
        assert_eq!(fake.spare.borrow().len(), 1);
    }
}
