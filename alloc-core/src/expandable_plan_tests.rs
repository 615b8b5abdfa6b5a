use std::collections::{BTreeMap, HashMap};

use crate::{
    AllocError, AllocatorConfig, DevicePtr, ExpandableAllocator, GpuAllocator, SimulatedDevice,
    StreamId, round_request,
};

const MIB: u64 = 1 << 20;

/// An allocator plus the spans of its live blocks, checked at every
/// request: no two live blocks may overlap.
struct Checked {
    a: ExpandableAllocator<SimulatedDevice>,
    spans: BTreeMap<DevicePtr, (u64, StreamId)>,
}

impl Checked {
    fn new(config: AllocatorConfig) -> Self {
        Self::lagging(config, 0)
    }

    /// On a device `lag` frees behind the host.
    fn lagging(config: AllocatorConfig, lag: u64) -> Self {
        let mut device = SimulatedDevice::new(1 << 40);
        device.free_lag = lag;
        Self {
            a: ExpandableAllocator::new(device, config),
            spans: BTreeMap::new(),
        }
    }

    fn alloc(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        let ptr = self.a.allocate(bytes, stream)?;
        let end = ptr + round_request(bytes);
        if let Some((&before, &(before_end, _))) = self.spans.range(..=ptr).next_back() {
            assert!(
                before_end <= ptr,
                "{ptr:#x} inside the block at {before:#x}"
            );
        }
        if let Some((&after, _)) = self.spans.range(ptr..).next() {
            assert!(
                after >= end,
                "{ptr:#x}..{end:#x} over the block at {after:#x}"
            );
        }
        self.spans.insert(ptr, (end, stream));
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr) {
        self.a.free(ptr).unwrap();
        self.spans.remove(&ptr);
    }

    fn calls(&self) -> u64 {
        self.a.device().map_calls + self.a.device().unmap_calls
    }

    /// Runs a step: `(request index, bytes, stream)` requests, each freed
    /// `life` requests later (the last ones at the end of the step),
    /// returning the addresses by stream.
    fn step(
        &mut self,
        requests: &[(u64, StreamId)],
        life: usize,
    ) -> HashMap<StreamId, Vec<(u64, u64)>> {
        let mut live: Vec<DevicePtr> = Vec::new();
        let mut by_stream: HashMap<StreamId, Vec<(u64, u64)>> = HashMap::new();
        for &(bytes, stream) in requests {
            let ptr = self.alloc(bytes, stream).unwrap();
            by_stream
                .entry(stream)
                .or_default()
                .push((ptr, ptr + round_request(bytes)));
            live.push(ptr);
            if live.len() > life {
                let oldest = live.remove(0);
                self.free(oldest);
            }
        }
        for ptr in live {
            self.free(ptr);
        }
        by_stream
    }
}

/// Twelve requests of varied sizes over two streams.
fn two_stream_requests() -> Vec<(u64, StreamId)> {
    (0..12u64)
        .map(|i| ((3 + (i * 7) % 11) * MIB + 512 * i, i % 2))
        .collect()
}

/// An allocator under `config` with 200 MiB of parameters, after six steps
/// of [`two_stream_requests`] (enough for a plan to take over).
fn planned_steps(config: AllocatorConfig) -> (Checked, Vec<(u64, StreamId)>) {
    let mut c = Checked::new(config);
    c.alloc(200 * MIB, 0).unwrap();
    let requests = two_stream_requests();
    for _ in 0..6 {
        c.step(&requests, 3);
    }
    (c, requests)
}

#[test]
fn a_repeating_step_is_served_from_one_arena_per_stream_without_driver_calls() {
    let (mut c, requests) = planned_steps(AllocatorConfig::default());
    let figures = c.a.plan_figures().unwrap();
    assert!(figures.active, "{figures:?}");
    assert_eq!(figures.step_events, 24);
    let before = c.calls();
    let mut layouts = Vec::new();
    for _ in 0..10 {
        layouts.push(c.step(&requests, 3));
    }
    assert_eq!(c.calls(), before, "no driver calls under the plan");
    // Every step lands on the same addresses...
    assert!(layouts.windows(2).all(|w| w[0] == w[1]));
    // ...and the streams never share memory: each has an arena of its own.
    let span = |s: &[(u64, u64)]| {
        (
            s.iter().map(|b| b.0).min().unwrap(),
            s.iter().map(|b| b.1).max().unwrap(),
        )
    };
    let (s0, s1) = (span(&layouts[0][&0]), span(&layouts[0][&1]));
    assert!(s0.1 <= s1.0 || s1.1 <= s0.0, "{s0:x?} {s1:x?}");
    assert!(c.a.plan_figures().unwrap().served >= 120);
}

#[test]
fn a_step_that_changes_midway_falls_back_and_is_planned_again() {
    let (mut c, requests) = planned_steps(AllocatorConfig::default());
    assert!(c.a.plan_figures().unwrap().active);
    // Half a step, then other sizes (another shape) for a while, with a
    // block kept across the change.
    let kept = c.alloc(5 * MIB, 0).unwrap();
    c.step(&requests[..6], 3);
    let figures = c.a.plan_figures().unwrap();
    assert!(!figures.active);
    assert_eq!(figures.deviations, 1);
    let other: Vec<(u64, StreamId)> = requests.iter().map(|&(b, s)| (b * 2, s)).collect();
    for _ in 0..3 {
        c.step(&other, 3);
    }
    c.free(kept);
    for _ in 0..30 {
        c.step(&requests, 3);
    }
    let figures = c.a.plan_figures().unwrap();
    assert!(figures.active, "{figures:?}");
    assert!(figures.activations >= 2);
    let before = c.calls();
    c.step(&requests, 3);
    assert_eq!(c.calls(), before);
}

/// Two large blocks that take turns, one of them always alive: whatever
/// phase the plan switched at, the block in flight would sit in the old
/// pages beside an arena that holds both, above what the policy reserves.
#[test]
fn a_plan_that_would_raise_the_reserved_peak_is_not_used() {
    let run = |plan: bool| {
        let config = AllocatorConfig {
            disable_step_plan: !plan,
            ..Default::default()
        };
        let mut c = Checked::new(config);
        let _parameters = c.alloc(100 * MIB, 0).unwrap();
        let mut y = c.alloc(62 * MIB, 0).unwrap();
        for _ in 0..40 {
            let x = c.alloc(64 * MIB, 0).unwrap();
            c.free(y);
            let s = c.alloc(MIB, 0).unwrap();
            c.free(s);
            y = c.alloc(62 * MIB, 0).unwrap();
            c.free(x);
            let t = c.alloc(MIB, 0).unwrap();
            c.free(t);
        }
        (c.a.stats().reserved_bytes.peak, c.a.plan_figures())
    };
    let (planned, figures) = run(true);
    let (unplanned, _) = run(false);
    let figures = figures.unwrap();
    assert!(figures.rejected >= 1, "{figures:?}");
    assert_eq!(figures.activations, 0);
    assert!(planned <= unplanned, "{planned} vs {unplanned}");
}

#[test]
fn empty_cache_under_a_plan_gives_free_arena_pages_back_and_the_plan_goes_on() {
    let (mut c, requests) = planned_steps(AllocatorConfig::default());
    assert!(c.a.plan_figures().unwrap().active);
    let reserved = c.a.stats().reserved_bytes.current;
    c.a.empty_cache().unwrap();
    assert_eq!(c.a.stats().reserved_bytes.current, 200 * MIB);
    assert!(reserved > 200 * MIB);
    c.step(&requests, 3);
    assert!(c.a.plan_figures().unwrap().active);
    let before = c.calls();
    c.step(&requests, 3);
    assert_eq!(c.calls(), before, "pages mapped again once, then kept");
}

#[test]
fn a_budget_still_refuses_under_a_plan_with_its_message() {
    let config = AllocatorConfig {
        budget_bytes: Some(300 * MIB),
        ..Default::default()
    };
    let (mut c, requests) = planned_steps(config);
    assert!(c.a.plan_figures().unwrap().active);
    assert!(c.a.stats().reserved_bytes.peak <= 300 * MIB);
    match c.alloc(150 * MIB, 0) {
        Err(AllocError::OutOfMemory {
            budget_exceeded,
            message,
            ..
        }) => {
            assert!(budget_exceeded);
            assert!(message.contains("budget"), "{message}");
        }
        other => panic!("expected the budget's refusal, got {other:?}"),
    }
    // The refused request was not part of the step: the plan is left, and
    // the steps go on correctly.
    for _ in 0..3 {
        c.step(&requests, 3);
    }
    assert!(c.a.stats().reserved_bytes.peak <= 300 * MIB);
}

#[test]
fn with_the_plan_disabled_nothing_is_planned() {
    let config = AllocatorConfig {
        disable_step_plan: true,
        ..Default::default()
    };
    let mut c = Checked::new(config);
    for _ in 0..10 {
        c.step(&two_stream_requests(), 3);
    }
    assert_eq!(c.a.plan_figures(), None);
}

/// A step shaped like run 7's LLaMA: activations, then a small gradient
/// freed by the next step's zero_grad, where the only quiet moment is just
/// after that free. Whichever event the detected period starts at, the plan
/// switches after the free and never raises the reserved peak above the
/// live-page high-water mark (switching just before the free held the
/// gradient beside an arena that holds it too: the peak rose by its size).
#[test]
fn whatever_its_phase_a_plan_switches_after_a_free_and_does_not_raise_the_peak() {
    // (block, bytes; 0 frees it): A and B activations, G the gradient.
    let step: [(usize, u64); 6] = [
        (2, 0),
        (0, 30 * MIB),
        (1, 10 * MIB),
        (1, 0),
        (0, 0),
        (2, 4 * MIB),
    ];
    for rotation in 0..step.len() {
        let mut c = Checked::new(AllocatorConfig::default());
        let _parameters = c.alloc(100 * MIB, 0).unwrap();
        let mut live: [Option<DevicePtr>; 3] = [None; 3];
        for i in 0..40 * step.len() {
            let (b, bytes) = step[(i + rotation) % step.len()];
            match (bytes, live[b].take()) {
                (0, Some(ptr)) => c.free(ptr),
                (0, None) => {}
                (bytes, _) => live[b] = Some(c.alloc(bytes, 0).unwrap()),
            }
        }
        let figures = c.a.plan_figures().unwrap();
        assert!(figures.active, "rotation {rotation}: {figures:?}");
        assert_eq!(figures.raised_bytes, 0, "rotation {rotation}: {figures:?}");
        assert_eq!(
            c.a.stats().reserved_bytes.peak,
            c.a.live_page_high_water_bytes(),
            "rotation {rotation}"
        );
    }
}

/// A block alive across every phase of the step (no quiet moment): the
/// plan's footprint is that block above the highest reserved level. It is
/// used (within what the policy may grow to without it), and the rise is
/// counted.
#[test]
fn a_plan_that_raises_the_peak_within_the_headroom_cap_is_used_and_counted() {
    let mut c = Checked::new(AllocatorConfig::default());
    let _parameters = c.alloc(100 * MIB, 0).unwrap();
    let mut y = c.alloc(4 * MIB, 0).unwrap();
    for _ in 0..40 {
        let x = c.alloc(64 * MIB, 0).unwrap();
        c.free(y);
        y = c.alloc(4 * MIB, 0).unwrap();
        c.free(x);
    }
    let figures = c.a.plan_figures().unwrap();
    assert!(figures.active, "{figures:?}");
    let high_water = c.a.live_page_high_water_bytes();
    assert_eq!(high_water, 168 * MIB);
    assert_eq!(figures.raised_bytes, 4 * MIB, "{figures:?}");
    assert_eq!(c.a.stats().reserved_bytes.peak, high_water + 4 * MIB);
}

/// Gradient accumulation: `n` micro-batches, then an optimizer step whose
/// requests differ. The micro-batch's plan is left at every optimizer step;
/// once it was left twice at the same distance after following for two
/// periods or more, the detector looks for the longer cycle and plans the
/// micro-batches and the optimizer step as one, and the cycles make no
/// driver calls from then on.
#[test]
fn gradient_accumulation_is_planned_as_one_cycle_of_its_micro_batches() {
    for n in [2, 4, 6, 8] {
        let mut c = Checked::new(AllocatorConfig::default());
        let _parameters = c.alloc(200 * MIB, 0).unwrap();
        let micro = two_stream_requests();
        let optimizer: Vec<(u64, StreamId)> =
            vec![(7 * MIB, 0), (9 * MIB + 512, 0), (MIB, 0), (5 * MIB, 1)];
        let cycle = |c: &mut Checked| {
            for _ in 0..n {
                c.step(&micro, 3);
            }
            c.step(&optimizer, 1);
        };
        for _ in 0..14 {
            cycle(&mut c);
        }
        let figures = c.a.plan_figures().unwrap();
        assert!(figures.active, "{n} micro-batches: {figures:?}");
        assert_eq!(
            figures.step_events as usize,
            2 * (n * micro.len() + optimizer.len()),
            "{n} micro-batches: {figures:?}"
        );
        let deviations = figures.deviations;
        let before = c.calls();
        for _ in 0..4 {
            cycle(&mut c);
        }
        assert_eq!(
            c.calls(),
            before,
            "{n} micro-batches: driver calls in the planned cycles"
        );
        assert_eq!(c.a.plan_figures().unwrap().deviations, deviations, "{n}");
    }
}

/// Micro-batches between optimizer steps that differ every time (no
/// longer cycle repeats): the longer cycle is looked for once, and from
/// then on the micro-batches are planned in every cycle as before.
#[test]
fn a_longer_cycle_that_does_not_repeat_is_looked_for_once() {
    let mut c = Checked::new(AllocatorConfig::default());
    let _parameters = c.alloc(200 * MIB, 0).unwrap();
    let micro = two_stream_requests();
    let cycle = |c: &mut Checked, k: u64| {
        for _ in 0..6 {
            c.step(&micro, 3);
        }
        c.step(&[(7 * MIB + 512 * k, 0), (3 * MIB, 0)], 1);
    };
    for k in 0..12 {
        cycle(&mut c, k);
    }
    let before = c.a.plan_figures().unwrap().activations;
    for k in 12..24 {
        cycle(&mut c, k);
    }
    let figures = c.a.plan_figures().unwrap();
    assert_eq!(figures.activations - before, 12, "{figures:?}");
}

/// Run 8's ResNet-50 and ViT: the input batch is made while the last one
/// is still referenced, so each batch lives a little longer than a step and
/// is not a block of a one-period plan (its lifetime is not an arc of the
/// cycle). Kept in the policy's pages beside an arena with room for the
/// activations, the new batch comes on top at the step's start and raises
/// the highest reserved level by one batch. A batch of 16 MiB or more makes
/// the plan cover two periods, with the two batches at two places of the
/// arena, mapped as its blocks first need them: nothing raised, the peak at
/// the high-water mark, no driver calls once filled. A smaller one is not
/// worth the wait: the rise is counted.
#[test]
fn a_batch_kept_into_the_next_step_is_planned_over_two_steps_or_counted() {
    // (batch, device lag in frees, raised, events a planned step)
    for (batch_mib, lag, raised_mib, events) in [(20, 0, 0, 16), (20, 3, 0, 16), (10, 0, 10, 8)] {
        let mut c = Checked::lagging(AllocatorConfig::default(), lag);
        let _parameters = c.alloc(200 * MIB, 0).unwrap();
        let mut batch = c.alloc(batch_mib * MIB, 0).unwrap();
        let mut calls = Vec::new();
        for _ in 0..40 {
            let before = c.calls();
            let next = c.alloc(batch_mib * MIB, 0).unwrap();
            c.free(batch);
            batch = next;
            let a = c.alloc(30 * MIB, 0).unwrap();
            let b = c.alloc(30 * MIB, 0).unwrap();
            let g = c.alloc(10 * MIB, 0).unwrap();
            c.free(b);
            c.free(a);
            c.free(g);
            calls.push(c.calls() - before);
        }
        let figures = c.a.plan_figures().unwrap();
        assert!(figures.active, "{batch_mib} MiB, lag {lag}: {figures:?}");
        assert_eq!(
            figures.step_events, events,
            "{batch_mib} MiB, lag {lag}: {figures:?}"
        );
        let high_water = c.a.live_page_high_water_bytes();
        assert_eq!(high_water, (200 + batch_mib + 70) * MIB);
        assert_eq!(
            figures.raised_bytes,
            raised_mib * MIB,
            "{batch_mib} MiB, lag {lag}: {figures:?}, calls {calls:?}"
        );
        assert_eq!(
            c.a.stats().reserved_bytes.peak,
            high_water + raised_mib * MIB
        );
        assert_eq!(
            calls[30..],
            [0; 10],
            "{batch_mib} MiB, lag {lag}: calls {calls:?}"
        );
    }
}
