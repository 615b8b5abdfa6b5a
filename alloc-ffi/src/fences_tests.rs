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
