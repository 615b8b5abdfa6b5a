use super::*;

const GIB: u64 = 1 << 30;

fn wanted(committed: u64, used: u64) -> Wanted {
    Wanted {
        allocation: NodeAllocation {
            committed_bytes: committed,
            free_bytes: 80 * GIB - committed,
            committed: format!("{committed}"),
            free: format!("{}", 80 * GIB - committed),
            used: format!("{used}"),
            gpu_free: String::new(),
            jobs: 1,
        },
        used_bytes: used,
    }
}

fn state(written: Option<Wanted>, last_attempt: Instant) -> NodeState {
    NodeState {
        written,
        last_attempt,
    }
}

#[test]
fn a_node_whose_status_already_shows_the_allocation_is_not_written() {
    let now = Instant::now();
    let want = wanted(10 * GIB, 3 * GIB);
    assert_eq!(due(&want, None, Some(&want.allocation), now), None);
    let old = wanted(5 * GIB, 3 * GIB);
    let long_ago = state(Some(old), now - 10 * USED_REFRESH);
    assert_eq!(
        due(&want, Some(&long_ago), Some(&want.allocation), now),
        None
    );
}

#[test]
fn the_first_write_after_a_start_goes_out_at_once() {
    let now = Instant::now();
    let want = wanted(10 * GIB, 3 * GIB);
    assert_eq!(due(&want, None, None, now), Some(now));
    let other = wanted(20 * GIB, 3 * GIB);
    assert_eq!(due(&want, None, Some(&other.allocation), now), Some(now));
}

#[test]
fn changes_within_the_interval_wait_for_its_end_and_go_out_as_one_write() {
    let written_at = Instant::now();
    let last = wanted(10 * GIB, 3 * GIB);
    let s = state(Some(last.clone()), written_at);
    // A placement one second after the last write: due when the interval ends.
    let soon = written_at + Duration::from_secs(1);
    let more = wanted(20 * GIB, 3 * GIB);
    let at = due(&more, Some(&s), Some(&last.allocation), soon).unwrap();
    assert_eq!(at, written_at + MIN_INTERVAL);
    assert!(at > soon, "not written before the interval is over");
    // Another one before then is due at the same time (one write for both).
    let even_more = wanted(30 * GIB, 3 * GIB);
    let later = written_at + Duration::from_secs(3);
    assert_eq!(
        due(&even_more, Some(&s), Some(&last.allocation), later),
        Some(written_at + MIN_INTERVAL)
    );
}

#[test]
fn a_small_move_of_the_measured_memory_waits_for_the_refresh() {
    let written_at = Instant::now();
    let last = wanted(10 * GIB, 3 * GIB);
    let s = state(Some(last.clone()), written_at);
    let now = written_at + 2 * MIN_INTERVAL;
    let moved = wanted(10 * GIB, 3 * GIB + USED_STEP - 1);
    assert_eq!(
        due(&moved, Some(&s), Some(&last.allocation), now),
        Some(written_at + USED_REFRESH)
    );
    // Once the last write is that old, it goes out.
    let much_later = written_at + USED_REFRESH;
    assert!(due(&moved, Some(&s), Some(&last.allocation), much_later).unwrap() <= much_later);
}

#[test]
fn a_large_move_of_the_measured_memory_is_written_after_the_interval() {
    let written_at = Instant::now();
    let last = wanted(10 * GIB, 3 * GIB);
    let s = state(Some(last.clone()), written_at);
    for moved in [3 * GIB + USED_STEP, 3 * GIB - USED_STEP] {
        let moved = wanted(10 * GIB, moved);
        assert_eq!(
            due(&moved, Some(&s), Some(&last.allocation), written_at),
            Some(written_at + MIN_INTERVAL),
            "{moved:?}"
        );
    }
}

#[test]
fn a_failed_write_is_tried_again_after_the_interval() {
    let tried_at = Instant::now();
    let want = wanted(10 * GIB, 3 * GIB);
    let failed = state(None, tried_at);
    assert_eq!(
        due(&want, Some(&failed), None, tried_at),
        Some(tried_at + MIN_INTERVAL)
    );
}

#[test]
fn a_status_that_lost_the_last_write_gets_it_again_even_for_a_small_move() {
    let written_at = Instant::now();
    let last = wanted(10 * GIB, 3 * GIB);
    let s = state(Some(last.clone()), written_at);
    let moved = wanted(10 * GIB, 3 * GIB + 1);
    // The GpuNode was recreated: its status has no allocation.
    assert_eq!(
        due(&moved, Some(&s), None, written_at),
        Some(written_at + MIN_INTERVAL)
    );
    // Unchanged wanted allocation, but the status shows another one.
    let other = wanted(1, 3 * GIB);
    assert_eq!(
        due(&last, Some(&s), Some(&other.allocation), written_at),
        Some(written_at + MIN_INTERVAL)
    );
}

fn named(name: &str, want: &Wanted) -> (String, Wanted) {
    (name.to_string(), want.clone())
}

fn shown(pairs: &[(&str, Option<&Wanted>)]) -> HashMap<String, Option<NodeAllocation>> {
    pairs
        .iter()
        .map(|(name, w)| (name.to_string(), w.map(|w| w.allocation.clone())))
        .collect()
}

#[test]
fn a_pass_writes_what_is_due_by_now_and_wakes_for_the_earliest_later_write() {
    let now = Instant::now();
    let shows = wanted(10 * GIB, 3 * GIB);
    let moved = wanted(20 * GIB, 3 * GIB);
    let states: HashMap<String, NodeState> = [
        // Written 5 s ago: the interval is over exactly now.
        ("due-now", state(Some(shows.clone()), now - MIN_INTERVAL)),
        // Written 1 s and 3 s ago: due in 4 s and in 2 s.
        (
            "due-in-4s",
            state(Some(shows.clone()), now - Duration::from_secs(1)),
        ),
        (
            "due-in-2s",
            state(Some(shows.clone()), now - Duration::from_secs(3)),
        ),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    let in_status = shown(&[
        ("up-to-date", Some(&shows)),
        ("new", None),
        ("due-now", Some(&shows)),
        ("due-in-4s", Some(&shows)),
        ("due-in-2s", Some(&shows)),
    ]);
    let all = vec![
        named("up-to-date", &shows),
        named("new", &moved),
        named("due-now", &moved),
        named("due-in-4s", &moved),
        named("due-in-2s", &moved),
    ];
    let (writes, next) = plan(all, &states, &in_status, now);
    let names: Vec<&str> = writes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["new", "due-now"]);
    assert!(writes.iter().all(|(_, w)| *w == moved));
    assert_eq!(next, now + Duration::from_secs(2));

    // Nothing due at all: look again after the idle recheck.
    let (writes, next) = plan(vec![named("up-to-date", &shows)], &states, &in_status, now);
    assert!(writes.is_empty());
    assert_eq!(next, now + IDLE_RECHECK);
    // A write due later than the idle recheck does not delay the recheck.
    let small = wanted(10 * GIB, 3 * GIB + 1);
    let recent: HashMap<String, NodeState> =
        [("n".to_string(), state(Some(shows.clone()), now))].into();
    let (writes, next) = plan(
        vec![named("n", &small)],
        &recent,
        &shown(&[("n", Some(&shows))]),
        now,
    );
    assert!(writes.is_empty());
    assert_eq!(next, now + IDLE_RECHECK, "the refresh is 60 s away");
}

#[test]
fn a_pass_keeps_what_was_written_and_when_and_forgets_deleted_nodes() {
    let before = Instant::now();
    let now = before + Duration::from_secs(7);
    let old = wanted(10 * GIB, 3 * GIB);
    let new = wanted(20 * GIB, 4 * GIB);
    let mut states: HashMap<String, NodeState> = [
        ("kept", state(Some(old.clone()), before)),
        ("failed", state(Some(old.clone()), before)),
        ("deleted", state(Some(old.clone()), before)),
        ("untouched", state(Some(old.clone()), before)),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    let in_status = shown(&[
        ("kept", Some(&old)),
        ("failed", Some(&old)),
        ("untouched", Some(&old)),
        ("first", None),
        ("first-failed", None),
    ]);
    let results = vec![
        ("kept".to_string(), new.clone(), true),
        ("failed".to_string(), new.clone(), false),
        ("first".to_string(), new.clone(), true),
        ("first-failed".to_string(), new.clone(), false),
    ];
    record(&mut states, results, &in_status, now);
    let view = |name: &str| {
        let s = &states[name];
        (s.written.clone(), s.last_attempt)
    };
    assert_eq!(view("kept"), (Some(new.clone()), now));
    assert_eq!(
        view("failed"),
        (Some(old.clone()), now),
        "a failure keeps the last write"
    );
    assert_eq!(view("first"), (Some(new.clone()), now));
    assert_eq!(view("first-failed"), (None, now));
    assert_eq!(view("untouched"), (Some(old.clone()), before));
    assert!(!states.contains_key("deleted"));
    assert_eq!(states.len(), 5);
}

#[test]
fn each_reported_node_wants_its_allocation_and_its_gpus_measured_memory() {
    let node = |name: &str, used: &[u64]| -> GpuNode {
        used.iter()
            .fold(
                GpuNode::test(name).heartbeat("2026-12-01T08:00:00Z"),
                |node, used| node.gpu("H200", 140 * GIB).used(*used).health("Healthy"),
            )
            .build()
    };
    let nodes = [node("a", &[3 * GIB, 5 * GIB]), node("b", &[7 * GIB])];
    let now: Timestamp = "2026-12-01T08:00:10Z".parse().unwrap();
    let ttl = SignedDuration::from_secs(120);
    let got = super::wanted::<TrainingJob, _>(&[], &nodes, now, ttl);
    let (views, _) = crate::status::node_views::<TrainingJob, _>(&[], &nodes, now, ttl);
    let expected: Vec<(String, Wanted)> = views
        .iter()
        .zip([8 * GIB, 7 * GIB])
        .map(|(view, used)| {
            let allocation = crate::status::node_allocation(view);
            (
                view.name.clone(),
                Wanted {
                    allocation,
                    used_bytes: used,
                },
            )
        })
        .collect();
    assert_eq!(got, expected);
    assert_eq!(got[0].1.allocation.free_bytes, 280 * GIB);
}

fn placed_on(name: &str, node: &str, budget: u64, attempt: u32) -> TrainingJob {
    use crate::api::{AssignedGpu, Phase, TrainingJobStatus};
    TrainingJob::test(name)
        .status(TrainingJobStatus {
            phase: Phase::Placed,
            attempt,
            placement: Some(PlacementStatus {
                compute_percent: None,
                node: node.into(),
                gpus: vec![AssignedGpu {
                    index: 0,
                    uuid: "GPU-0".into(),
                }],
                budget_bytes: budget,
                memory_fraction: 0.1,
                attempt,
                gpu_model: None,
                micro_batch: None,
                elastic: None,
            }),
            ..Default::default()
        })
        .build()
}

#[test]
fn the_writer_wakes_when_a_recorded_placement_changes() {
    use crate::api::Phase;
    let mut watch = PlacementWatch::default();
    let pending = TrainingJob::test("a").phase(Phase::Pending).build();
    let placed = placed_on("a", "n1", 10 << 30, 1);
    let cases: Vec<(&str, Event<TrainingJob>, bool)> = vec![
        (
            "a job with no placement",
            Event::Apply(pending.clone()),
            false,
        ),
        ("its placement recorded", Event::Apply(placed.clone()), true),
        (
            "the same placement again",
            Event::Apply(placed.clone()),
            false,
        ),
        (
            "another budget",
            Event::Apply(placed_on("a", "n1", 12 << 30, 1)),
            true,
        ),
        (
            "another node",
            Event::Apply(placed_on("a", "n2", 12 << 30, 1)),
            true,
        ),
        (
            "back to waiting (an OOM retry)",
            Event::Apply(pending.clone()),
            true,
        ),
        ("still waiting", Event::Apply(pending.clone()), false),
        ("placed again", Event::Apply(placed.clone()), true),
        ("deleted while placed", Event::Delete(placed.clone()), true),
        ("deleted again", Event::Delete(placed.clone()), false),
        ("a relist starts", Event::Init, false),
        (
            "a placed job listed",
            Event::InitApply(placed.clone()),
            false,
        ),
        ("the relist ends", Event::InitDone, true),
        (
            "the listed job unchanged",
            Event::Apply(placed.clone()),
            false,
        ),
    ];
    for (what, event, wakes) in cases {
        assert_eq!(watch.observe(&event), wakes, "{what}");
    }
    // A job placed before a relist and gone from it is forgotten, so it wakes
    // the writer when it comes back.
    let b = placed_on("b", "n1", 1 << 30, 1);
    assert!(watch.observe(&Event::Apply(b.clone())));
    watch.observe(&Event::Init);
    watch.observe(&Event::InitDone);
    assert!(watch.observe(&Event::Apply(b)));
}

#[test]
fn computations_are_at_least_a_second_apart() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let cases = [
        (None, t0, t0),
        (Some(t0), t0 + ms(200), t0 + MIN_RECOMPUTE),
        (Some(t0), t0 + ms(999), t0 + MIN_RECOMPUTE),
        (Some(t0), t0 + ms(1500), t0 + ms(1500)),
    ];
    for (last, now, want) in cases {
        assert_eq!(earliest_computation(last, now), want, "{last:?} {now:?}");
    }
}
