use super::*;

const MIB: u64 = 1 << 20;

/// Feeds `steps` repetitions of a step (after `prefix` requests kept
/// forever) and returns the event count at which a step was reported.
fn feed(
    detector: &mut StepDetector,
    prefix: &[u64],
    step: &[(bool, u64)],
    steps: usize,
) -> Option<(usize, RepeatedStep)> {
    // A step as (is_alloc, size or index of the request freed).
    let mut clock = 0u64;
    let mut found = None;
    let mut observe = |d: &mut StepDetector, e: StepEvent, clock: &mut u64| {
        *clock += 1;
        if let Some(s) = d.observe(e)
            && found.is_none()
        {
            found = Some((*clock as usize, s));
        }
    };
    for &size in prefix {
        observe(detector, StepEvent::Alloc { size, stream: 0 }, &mut clock);
    }
    for _ in 0..steps {
        let mut at: Vec<u64> = Vec::new();
        for &(alloc, v) in step {
            if alloc {
                at.push(clock);
                observe(
                    detector,
                    StepEvent::Alloc { size: v, stream: 0 },
                    &mut clock,
                );
            } else {
                let age = clock - at[v as usize];
                let size = step.iter().filter(|e| e.0).nth(v as usize).unwrap().1;
                observe(detector, StepEvent::Free { age, size }, &mut clock);
            }
        }
    }
    found
}

/// 20 requests of varied sizes, each freed two events later.
fn toy_step() -> Vec<(bool, u64)> {
    let mut step = Vec::new();
    for i in 0..20u64 {
        step.push((true, (i % 7 + 1) * MIB));
        if i >= 1 {
            step.push((false, i - 1));
        }
    }
    step.push((false, 19));
    step
}

#[test]
fn a_step_is_reported_once_it_has_repeated_whole() {
    let step = toy_step();
    let mut d = StepDetector::new();
    let (at, found) = feed(&mut d, &[4 * MIB, 8 * MIB], &step, 3).expect("found");
    assert_eq!(found.period, step.len());
    // Not before the end of the second step.
    assert!(at >= 2 + 2 * step.len(), "reported at event {at}");
    assert!(at <= 2 + 2 * step.len() + WINDOW_EVENTS);
    let blocks: Vec<_> = found.blocks.iter().flatten().collect();
    assert_eq!(blocks.len(), 20);
    assert!(
        blocks
            .iter()
            .all(|b| b.len > 0 && b.len < found.period as u64)
    );
}

#[test]
fn a_single_step_or_a_growing_pattern_is_not_a_step() {
    let mut d = StepDetector::new();
    assert!(feed(&mut d, &[], &toy_step(), 1).is_none());
    // Repeating requests that are never freed (a forward pass keeping its
    // activations) repeat but do not give their bytes back.
    let mut d = StepDetector::new();
    let layer: Vec<(bool, u64)> = (0..40).map(|i| (true, (i % 5 + 1) * MIB)).collect();
    assert!(feed(&mut d, &[], &layer, 4).is_none());
}

#[test]
fn a_block_freed_in_the_next_step_wraps_around() {
    // Request 0 is freed only after the next step's first request.
    let mut d = StepDetector::new();
    let mut events = Vec::new();
    let step_len = 24u64;
    for s in 0..3u64 {
        for k in 0..step_len {
            let t = s * step_len + k;
            events.push(match k {
                0 => StepEvent::Alloc {
                    size: 64 * MIB,
                    stream: 0,
                },
                // Frees the previous step's first request.
                1 if s > 0 => StepEvent::Free {
                    age: step_len + 1,
                    size: 64 * MIB,
                },
                k if k % 2 == 0 => StepEvent::Alloc {
                    size: (k + 1) * MIB,
                    stream: 0,
                },
                _ => StepEvent::Free {
                    age: 1,
                    size: k * MIB,
                },
            });
            let _ = t;
        }
    }
    // The first step has no free at phase 1: a plain alloc-free pair there.
    events[1] = StepEvent::Alloc {
        size: MIB,
        stream: 0,
    };
    let found = events.into_iter().find_map(|e| d.observe(e));
    // The 64 MiB block lives longer than a step: not planned, yet the rest is.
    let found = found.expect("found");
    assert_eq!(found.period, step_len as usize);
    assert!(found.blocks.iter().flatten().all(|b| b.size != 64 * MIB));
    assert!(found.blocks.iter().flatten().count() >= 10);
}

fn block(start: u64, len: u64, size: u64) -> StepBlock {
    StepBlock {
        start,
        len,
        size,
        stream: 0,
    }
}

#[test]
fn arcs_meet_when_one_starts_inside_the_other() {
    let p = 100;
    assert!(block(10, 20, 1).overlaps_in_time(&block(29, 5, 1), p));
    assert!(!block(10, 20, 1).overlaps_in_time(&block(30, 5, 1), p));
    // Wrapping: [90, 110) covers 0..10.
    assert!(block(90, 20, 1).overlaps_in_time(&block(5, 2, 1), p));
    assert!(!block(90, 20, 1).overlaps_in_time(&block(10, 70, 1), p));
    assert!(block(95, 10, 1).overlaps_in_time(&block(90, 10, 1), p));
}

#[test]
fn blocks_alive_at_different_times_share_space() {
    let blocks = [
        block(0, 10, 8 * MIB),
        block(10, 10, 8 * MIB),
        block(5, 10, MIB),
    ];
    let layout = plan_layout(&blocks, 20);
    assert_eq!(layout.offsets[0], layout.offsets[1]);
    assert_eq!(layout.arena_bytes, 9 * MIB);
    assert_eq!(layout.max_live_bytes, 9 * MIB);
}

/// A random cycle of blocks: no two blocks alive together overlap, and the
/// arena is never below the max-live bound.
#[test]
fn packed_blocks_never_overlap_while_alive() {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    for _ in 0..20 {
        let period = 200 + next(300);
        let blocks: Vec<StepBlock> = (0..120)
            .map(|_| block(next(period), 1 + next(period - 1), 512 * (1 + next(4096))))
            .collect();
        let layout = plan_layout(&blocks, period);
        for i in 0..blocks.len() {
            for j in i + 1..blocks.len() {
                if blocks[i].overlaps_in_time(&blocks[j], period) {
                    let (a, b) = (layout.offsets[i], layout.offsets[j]);
                    assert!(
                        a + blocks[i].size <= b || b + blocks[j].size <= a,
                        "blocks {i} and {j} overlap"
                    );
                }
            }
        }
        assert!(layout.arena_bytes >= layout.max_live_bytes);
        assert!(layout.arena_bytes <= blocks.iter().map(|b| b.size).sum());
    }
}

#[test]
fn the_quietest_phase_has_the_fewest_bytes_in_flight() {
    // A big block alive over [10, 60) and a small one over [70, 110) mod 100.
    let blocks = [block(10, 50, 8 * MIB), block(70, 40, MIB)];
    let (phase, bytes) = quietest_phase(&blocks, 100);
    assert_eq!(bytes, 0);
    // Not 60: the switch comes just before the event at its phase, and the
    // event at 60 frees the big block.
    assert!(
        (61..=70).contains(&phase) || (10..=10).contains(&phase),
        "{phase}"
    );
}

/// Run 7's LLaMA: the quiet moment right after zero_grad frees a 125 MiB
/// gradient was taken one event early, just before that free, so the
/// gradient sat in the old pages beside an arena that holds it too.
#[test]
fn a_block_freed_at_the_switch_is_still_held_when_the_arena_is_mapped() {
    // A block over [10, 60) and one freed by the event at phase 9 (its arc
    // [61, 109) wraps): phase 9 has nothing alive across it, but the block
    // it frees is still held before it.
    let blocks = [block(10, 50, 8 * MIB), block(61, 48, 4 * MIB)];
    assert_eq!(quietest_phase(&blocks, 100), (10, 0));
    // Two blocks back to back: every phase holds one, and the phases that
    // hold the smaller one least (0, the event that frees it, is the first).
    let blocks = [block(0, 5, 6 * MIB), block(5, 5, 2 * MIB)];
    assert_eq!(quietest_phase(&blocks, 10), (0, 2 * MIB));
}

/// On random cycles, the bytes the chosen phase reports are those of the
/// blocks requested before it and freed by it or later (what is held when
/// the switch comes, just before the event at that phase), and no phase
/// holds less.
#[test]
fn the_quietest_phase_holds_the_fewest_bytes_by_brute_force() {
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    for _ in 0..50 {
        let period = 20 + next(80);
        let blocks: Vec<StepBlock> = (0..1 + next(12))
            .map(|_| block(next(period), 1 + next(period - 1), MIB * (1 + next(64))))
            .collect();
        let held = |p: u64| -> u64 {
            blocks
                .iter()
                .filter(|b| (1..=b.len).contains(&((p + period - b.start) % period)))
                .map(|b| b.size)
                .sum()
        };
        let (phase, bytes) = quietest_phase(&blocks, period);
        assert_eq!(bytes, held(phase), "{blocks:?} at {phase}");
        let least = (0..period).map(held).min().unwrap();
        assert_eq!(bytes, least, "{blocks:?}");
    }
}

/// A step whose saved activations nest, as in a forward and backward pass:
/// each layer saves three blocks and makes three temporaries, the backward
/// pass frees the saved blocks in reverse beside its own temporaries. On
/// every one of 40 such steps the arena is the max-live bound (largest
/// first alone was above it on 31 of them, by up to 2.2%).
#[test]
fn nested_activations_are_packed_at_their_bound() {
    let mut seed = 0x1234_5678_9abc_def1u64;
    let mut next = |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    for _ in 0..40 {
        let layers = 10 + next(20);
        // (is a request, size, block id)
        let mut events: Vec<(bool, u64, usize)> = Vec::new();
        let mut saved = Vec::new();
        let mut id = 0;
        for _ in 0..3 * layers {
            events.push((true, MIB * (1 + next(60)), id));
            saved.push(id);
            events.push((true, MIB * (1 + next(80)), id + 1));
            events.push((false, 0, id + 1));
            id += 2;
        }
        for _ in 0..3 * layers {
            events.push((true, MIB * (1 + next(80)), id));
            events.push((false, 0, saved.pop().unwrap()));
            events.push((false, 0, id));
            id += 1;
        }
        let mut requested = HashMap::new();
        let mut blocks = Vec::new();
        for (at, &(request, size, id)) in events.iter().enumerate() {
            if request {
                requested.insert(id, (at as u64, size));
            } else {
                let (start, size) = requested[&id];
                blocks.push(block(start, at as u64 - start, size));
            }
        }
        let layout = plan_layout(&blocks, events.len() as u64);
        assert_eq!(layout.arena_bytes, layout.max_live_bytes);
    }
}

#[test]
fn a_request_matches_on_size_and_stream_and_a_free_on_its_age_alone() {
    let alloc = |size, stream| StepEvent::Alloc { size, stream };
    let free = |age, size| StepEvent::Free { age, size };
    let cases = [
        (alloc(MIB, 0), alloc(MIB, 0), true),
        (alloc(MIB, 0), alloc(MIB, 1), false),
        (alloc(MIB, 0), alloc(2 * MIB, 0), false),
        (alloc(MIB, 0), alloc(2 * MIB, 1), false),
        // The size of a free does not take part: its age names the block.
        (free(3, MIB), free(3, 2 * MIB), true),
        (free(3, MIB), free(4, MIB), false),
        (alloc(MIB, 0), free(1, MIB), false),
    ];
    for (x, y, same) in cases {
        assert_eq!(x.same(&y), same, "{x:?} and {y:?}");
        assert_eq!(y.same(&x), same, "{y:?} and {x:?}");
    }
}

/// One period of `k` requests, each freed by the next event, of the sizes
/// `size(0)`, ..., `size(k - 1)` (the free of request `m` has `free(m)`
/// bytes).
fn pairs(k: u64, size: impl Fn(u64) -> u64, free: impl Fn(u64) -> u64) -> Vec<StepEvent> {
    (0..k)
        .flat_map(|m| {
            [
                StepEvent::Alloc {
                    size: size(m),
                    stream: 0,
                },
                StepEvent::Free {
                    age: 1,
                    size: free(m),
                },
            ]
        })
        .collect()
}

/// 20 requests of 1, 2, ..., 20 MiB, each freed by the next event.
fn twenty_pairs() -> Vec<StepEvent> {
    pairs(20, |m| (m + 1) * MIB, |m| (m + 1) * MIB)
}

/// The step of `twenty_pairs` repeated `times` over: a request at each even
/// phase, freed one event later.
fn twenty_pair_blocks(times: u64) -> Vec<Option<StepBlock>> {
    (0..40 * times)
        .map(|phase| {
            (phase % 2 == 0).then(|| StepBlock {
                start: phase,
                len: 1,
                size: (phase % 40 / 2 + 1) * MIB,
                stream: 0,
            })
        })
        .collect()
}

/// A step of 40 events from the first event on: the window of the 32
/// events ending at event 72 is the first to have occurred before (at
/// event 32), so the period is checked from there with a run of 32; it
/// repeats from a run of 64 (event 104); the step is reported at event 80,
/// its second whole period, with a block for every request, the very first
/// one included; the doubled step from event 160, its fourth period.
#[test]
fn a_step_from_the_first_event_is_checked_reported_and_doubled_on_time() {
    let step = twenty_pairs();
    let mut d = StepDetector::new();
    assert!(d.is_empty());
    assert_eq!((d.len(), d.candidate(), d.repeating()), (0, None, false));
    assert!(d.doubled_step().is_none());
    let mut reported = Vec::new();
    let mut doubled = Vec::new();
    for n in 1..=170usize {
        let found = d.observe(step[(n - 1) % 40]);
        assert_eq!(d.len(), n);
        assert!(!d.is_empty());
        assert_eq!(d.candidate(), (n >= 72).then_some(40), "event {n}");
        assert_eq!(d.repeating(), n >= 104, "event {n}");
        if let Some(found) = found {
            reported.push((n, found));
        }
        if let Some(found) = d.doubled_step() {
            doubled.push((n, found));
        }
    }
    // Reported at every event from the second period's end on.
    assert_eq!(
        reported.iter().map(|r| r.0).collect::<Vec<_>>(),
        (80..=170).collect::<Vec<_>>()
    );
    let expected = RepeatedStep {
        period: 40,
        events: step.clone(),
        blocks: twenty_pair_blocks(1),
    };
    assert_eq!(reported[0].1, expected);
    assert_eq!(
        doubled.iter().map(|r| r.0).collect::<Vec<_>>(),
        (160..=170).collect::<Vec<_>>()
    );
    let expected = RepeatedStep {
        period: 80,
        events: [step.clone(), step].concat(),
        blocks: twenty_pair_blocks(2),
    };
    assert_eq!(doubled[0].1, expected);
    d.reset();
    assert!(d.is_empty());
    assert_eq!((d.len(), d.candidate(), d.repeating()), (0, None, false));
}

/// After 80 requests kept for good, the step of 40 events is checked from
/// event 152 (its first window seen twice) and reported from 160, but
/// doubled only from 240, once three periods in a row repeated: four
/// periods of events are not enough on their own.
#[test]
fn the_doubled_step_waits_for_three_repeated_periods_after_other_events() {
    let step = twenty_pairs();
    let mut d = StepDetector::new();
    for j in 0..80 {
        let kept = StepEvent::Alloc {
            size: (100 + j) * MIB,
            stream: 0,
        };
        assert!(d.observe(kept).is_none());
        assert!(d.doubled_step().is_none());
    }
    for n in 81..=290usize {
        let found = d.observe(step[(n - 81) % 40]);
        assert_eq!(d.candidate(), (n >= 152).then_some(40), "event {n}");
        assert_eq!(
            found.map(|s| s.period),
            (n >= 160).then_some(40),
            "event {n}"
        );
        let doubled = d.doubled_step();
        assert_eq!(
            doubled.map(|s| s.period),
            (n >= 240).then_some(80),
            "event {n}"
        );
    }
}

/// A step that keeps 64 MiB each period repeats (the period is checked)
/// but is neither reported nor doubled: two periods do not give their
/// bytes back either.
#[test]
fn a_step_that_keeps_bytes_is_not_doubled() {
    let mut step = twenty_pairs();
    step.push(StepEvent::Alloc {
        size: 64 * MIB,
        stream: 0,
    });
    let mut d = StepDetector::new();
    for n in 1..=6 * 41 {
        assert!(d.observe(step[(n - 1) % 41]).is_none(), "event {n}");
        assert!(d.doubled_step().is_none(), "event {n}");
    }
    assert_eq!(d.candidate(), Some(41));
    assert!(d.repeating());
}

/// A step of `k` requests of 512, 1024, ... bytes, each freed by the next
/// event, whose last free gives back 512 bytes more in even periods and 512
/// less in odd ones: one period never gives back what it takes (the step is
/// never reported, which keeps long steps cheap here), two always do.
fn feed_alternating(
    d: &mut StepDetector,
    k: u64,
    periods: u64,
    mut each: impl FnMut(&StepDetector),
) {
    for r in 0..periods {
        let extra = |m: u64| match (m + 1 == k, r % 2 == 0) {
            (false, _) => 0,
            (true, true) => 512,
            (true, false) => -512,
        };
        let step = pairs(
            k,
            |m| (m + 1) * 512,
            |m| ((m + 1) as i64 * 512 + extra(m)) as u64,
        );
        for e in step {
            assert!(d.observe(e).is_none());
            each(d);
        }
    }
}

/// A period of exactly half the longest step doubles into a step of
/// `MAX_STEP_EVENTS` events, at the end of its fourth period.
#[test]
fn a_step_of_half_the_longest_doubles_into_the_longest() {
    let k = MAX_STEP_EVENTS as u64 / 4;
    let mut d = StepDetector::new();
    let mut doubled = None;
    feed_alternating(&mut d, k, 4, |d| {
        if doubled.is_none() {
            doubled = d.doubled_step().map(|s| (d.len(), s));
        }
    });
    let (at, step) = doubled.expect("doubled");
    assert_eq!(at, 2 * MAX_STEP_EVENTS);
    assert_eq!(step.period, MAX_STEP_EVENTS);
    let blocks: Vec<StepBlock> = step.blocks.iter().flatten().copied().collect();
    assert_eq!(blocks.len(), MAX_STEP_EVENTS / 2);
    for (m, b) in blocks.iter().enumerate() {
        let m = m as u64;
        assert_eq!(*b, block(2 * m, 1, (m % k + 1) * 512));
    }
}

/// A period just over half the longest step is checked and repeats, but
/// twice it would be longer than the longest step: never doubled.
#[test]
fn a_step_over_half_the_longest_is_never_doubled() {
    let k = MAX_STEP_EVENTS as u64 / 4 + 4;
    let mut d = StepDetector::new();
    feed_alternating(&mut d, k, 4, |d| assert!(d.doubled_step().is_none()));
    assert_eq!(d.len(), 8 * k as usize);
    assert_eq!(d.candidate(), Some(2 * k as usize));
    assert!(d.repeating());
}

/// At three of the longest steps the history drops its oldest events,
/// keeping two of the longest steps (with the hashes of their windows):
/// after a deviation right at that moment the step is found again, 89
/// events after it, just as by a detector that saw only 224 events of the
/// step before the deviation.
#[test]
fn trimming_the_history_keeps_the_step_found_after_a_deviation() {
    let step = twenty_pairs();
    let deviation = StepEvent::Alloc {
        size: 1000 * MIB,
        stream: 0,
    };
    let run = |before: usize| {
        let mut d = StepDetector::new();
        for i in 0..before {
            d.observe(step[i % 40]);
        }
        let kept = d.len();
        d.observe(deviation);
        let after = d.len();
        let timeline: Vec<_> = (0..200)
            .map(|j| {
                let found = d.observe(step[(before + j) % 40]);
                (found.map(|s| s.period), d.candidate(), d.repeating())
            })
            .collect();
        (kept, after, d.len(), timeline)
    };
    // Both end their last step before the deviation 24 events in.
    let (_, _, _, reference) = run(224);
    let (kept, after, end, trimmed) = run(3 * MAX_STEP_EVENTS);
    assert_eq!(kept, 3 * MAX_STEP_EVENTS);
    assert_eq!(after, 2 * MAX_STEP_EVENTS + 1);
    assert_eq!(end, 2 * MAX_STEP_EVENTS + 201);
    assert_eq!(trimmed, reference);
    assert_eq!(reference.iter().position(|t| t.0.is_some()), Some(88));
    assert_eq!(reference[88].0, Some(40));
}

/// The two halves of an 80-event step differ in one request, 3 MiB in
/// the first and 35 MiB in the second (bit 25 apart, a bit the token's
/// hash state holds after the tag): the step is found whole, at the end of
/// its second period, and never taken for a step of 40.
#[test]
fn a_step_whose_halves_differ_in_one_size_is_found_whole() {
    let size = |big: bool| {
        move |m: u64| {
            if big && m == 2 {
                35 * MIB
            } else {
                (m + 1) * MIB
            }
        }
    };
    let step = [
        pairs(20, size(false), size(false)),
        pairs(20, size(true), size(true)),
    ]
    .concat();
    let mut d = StepDetector::new();
    let mut first = None;
    for n in 1..=4 * 80 {
        if let Some(found) = d.observe(step[(n - 1) % 80])
            && first.is_none()
        {
            first = Some((n, found.period));
        }
    }
    assert_eq!(first, Some((160, 80)));
}

/// The FNV-1a prime of [`StepEvent::token`].
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// The stream that gives a request of `size` bytes the token `target`:
/// the token's last step xors the stream in and multiplies by the prime.
fn stream_with_token(size: u64, target: u64) -> u64 {
    // The inverse of the (odd) prime modulo 2^64, by Newton's iteration.
    let mut inverse = FNV_PRIME;
    for _ in 0..6 {
        inverse = inverse.wrapping_mul(2u64.wrapping_sub(FNV_PRIME.wrapping_mul(inverse)));
    }
    assert_eq!(FNV_PRIME.wrapping_mul(inverse), 1);
    let before_stream = StepEvent::Alloc { size, stream: 0 }
        .token()
        .wrapping_mul(inverse);
    target.wrapping_mul(inverse) ^ before_stream
}

/// Two windows whose rolling hashes are equal but whose oldest two events
/// differ (the second given a stream that makes up for the first): the
/// events themselves are compared, so no period is proposed.
#[test]
fn a_window_whose_hash_collides_with_other_events_proposes_no_period() {
    let alloc = |size, stream| StepEvent::Alloc { size, stream };
    let first: Vec<StepEvent> = (0..32).map(|m| alloc((m + 1) * MIB, 0)).collect();
    let filler: Vec<StepEvent> = (0..8).map(|m| alloc((100 + m) * MIB, 0)).collect();
    let mut second = first.clone();
    second[0] = alloc(200 * MIB, 0);
    // Hash = sum of token(i) * ROLL^(31 - i): a change of d in the oldest
    // token is undone by -d * ROLL in the next one.
    let d0 = second[0].token().wrapping_sub(first[0].token());
    let target = first[1].token().wrapping_sub(d0.wrapping_mul(ROLL));
    second[1] = alloc(2 * MIB, stream_with_token(2 * MIB, target));
    assert_eq!(second[1].token(), target);
    assert!(!second[1].same(&first[1]));
    let mut d = StepDetector::new();
    for e in &first {
        d.observe(*e);
    }
    let hash_of_first = d.window_hash;
    for e in filler.iter().chain(&second) {
        d.observe(*e);
        assert_eq!(d.candidate(), None);
    }
    // The windows of the first and the second 32 requests did collide.
    assert_eq!(d.window_hash, hash_of_first);
}

/// Three blocks that meet two by two (never all three): every order packs
/// them into 7 MiB, above the 6 MiB bound, so all three are tried and the
/// first, largest first, is kept.
#[test]
fn of_orders_that_tie_the_earliest_is_kept() {
    let blocks = [block(1, 3, MIB), block(0, 3, 4 * MIB), block(3, 2, 2 * MIB)];
    // Largest first: 4 MiB at 0, 2 MiB at 4, 1 MiB at 6. Longest first and
    // request order: 4 MiB at 0, 1 MiB at 4, 2 MiB at 5.
    for order in layout_orders(&blocks) {
        assert_eq!(pack_in_order(&blocks, 4, &order).0, 7 * MIB);
    }
    assert_eq!(
        plan_layout(&blocks, 4),
        StepLayout {
            offsets: vec![6 * MIB, 0, 4 * MIB],
            arena_bytes: 7 * MIB,
            max_live_bytes: 6 * MIB,
        }
    );
}
