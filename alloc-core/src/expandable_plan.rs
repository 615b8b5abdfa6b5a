//! The vramfit policy's planned steps: a repeating sequence of requests is
//! served from one arena laid out in advance (see `super::super::plan` and
//! `docs/allocator.md`, "Planned steps").
//!
//! States: *watching* (the [`StepDetector`] sees every event), *waiting*
//! (a step was found and laid out; events are checked against it until the
//! phase chosen for the switch), *active* (requests of planned blocks are
//! carved at their offsets in the arena ranges, whose pages were mapped
//! once). Any event that differs from the step, in either of the last two
//! states, drops the plan: its arena ranges become ordinary cached memory
//! (their live blocks are freed as usual, their free pages can be moved or
//! released), and watching starts again.

use std::collections::{BTreeMap, BTreeSet};

use super::super::device::{DeviceError, StreamId};
use super::super::error::AllocError;
use super::super::plan::{
    MAX_STEP_EVENTS, PlanFigures, StepBlock, StepDetector, StepEvent, plan_layout, quietest_phase,
};
use super::{DeviceMemory, ExpandableAllocator, Piece, Range};

/// A step whose requests that no plan of one period places (blocks kept
/// longer than a step) add up to this many page-rounded bytes is laid out
/// over two periods ([`StepDetector::doubled_step`]), and its arenas are
/// mapped as their blocks first need them: such a block kept beside an
/// arena of one period raises the reserved peak by its size when the next
/// one comes (run 8: ResNet-50's and ViT's input batches, 84 and 154 MiB),
/// and the one in flight at the switch would sit beside a fully mapped
/// arena. Smaller shares (the transformers' token ids, one page) are not
/// worth two more steps before the plan takes over. 8 pages.
const DOUBLE_STEP_UNPLANNED_BYTES: u64 = 16 << 20;

/// After a plan was rejected, watching resumes only after this many steps
/// (doubling with every rejection in a row): finding and laying out a step
/// costs O(blocks^2) of host time.
const REJECT_BACKOFF_STEPS: u64 = 4;

/// Events during which, before any plan was tried, moves for the ceiling
/// buy no headroom: a training step is found within its third repetition,
/// and the reserved peak reached before the switch is the peak a plan may
/// not pass, so it is kept at the live-page high-water mark. 2^16 events
/// are 17-27 steps of the recorded transformer steps.
pub const PLAN_GRACE_EVENTS: u64 = 1 << 16;

/// The grace ends earlier when nothing has repeated for this many events
/// (no period checked over 64 events in a row): a sequence that does not
/// repeat gets the hysteresis after 8,192 events.
pub const PLAN_PROMISE_EVENTS: u64 = 1 << 13;

#[derive(Debug, Clone, Copy)]
struct Slot {
    /// Index into `Plan::arenas`.
    arena: usize,
    offset: u64,
}

#[derive(Debug)]
struct Plan {
    events: Vec<StepEvent>,
    /// Per phase: where the request at that phase goes (`None`: not planned).
    slots: Vec<Option<Slot>>,
    /// Phase of the next event.
    phase: usize,
    /// Phase at which the plan takes over.
    switch_phase: usize,
    /// Per stream: (stream, bytes, range index once mapped).
    arenas: Vec<(StreamId, u64, Option<usize>)>,
    /// Bytes of the step's requests that the plan does not place (blocks
    /// kept longer than a step), page-rounded: the fallback's share.
    unplanned_bytes: u64,
    max_live_bytes: u64,
    planned_blocks: u64,
    /// Whether the pages left free by the blocks in flight at the switch
    /// were given back (one step after the switch).
    trimmed: bool,
    /// The highest reserved level just before the switch.
    high_before_switch: u64,
    /// Laid out over two periods: its arenas are mapped as their blocks
    /// first need them (the first period of the plan), not at the switch.
    lazy: bool,
    /// Bytes of the step's blocks in flight at the switch phase.
    held_at_switch: u64,
    active: bool,
    /// Events checked against the plan so far.
    followed: u64,
}

/// The planner's state inside an [`ExpandableAllocator`].
#[derive(Debug, Default)]
pub(super) struct Planner {
    detector: StepDetector,
    plan: Option<Plan>,
    /// Events seen (requests and frees), the clock of ages.
    pub(super) clock: u64,
    /// No watching before this event (after rejections).
    resume_at: u64,
    rejections_in_a_row: u32,
    /// Whether a plan was switched to or rejected.
    tried: bool,
    /// The longest step that followed its plan for three periods.
    known_step: u64,
    /// When the detector may propose short periods again (0: it may).
    longer_until: u64,
    /// The last event at which a step seemed on its way (a period repeating,
    /// or a plan laid out).
    promising_at: u64,
    /// The last plan left after following for two periods or more: its
    /// period, when it was left, and how long after the one before it (0:
    /// no such plan of that period before).
    last_left: Option<(usize, u64, u64)>,
    /// The period whose longer cycle was looked for last (once per period:
    /// a cycle that cannot be planned costs one search, not one per cycle).
    searched_beyond: usize,
    /// Whether the detector forgets what it saw when the look for longer
    /// periods ends without a plan (a candidate of the longer cycle that
    /// fails every cycle would otherwise keep the step's own period from
    /// being proposed).
    forget_after_longer: bool,
    /// A step was found whose blocks kept longer than a step are worth a
    /// layout over two periods: waiting for four identical periods.
    doubling: bool,
    /// Until this event, a lazily mapped plan fills its arenas: moves for
    /// the ceiling buy no headroom and are not deferred, as before the first
    /// plan, so that filling them does not raise the peak.
    filling_until: u64,
    figures: PlanFigures,
}

impl Planner {
    pub(super) fn figures(&self) -> PlanFigures {
        let mut figures = self.figures;
        if let Some(plan) = &self.plan {
            figures.active = plan.active;
            figures.arena_bytes = plan.arenas.iter().map(|a| a.1).sum();
            figures.max_live_bytes = plan.max_live_bytes;
            figures.step_events = plan.events.len() as u64;
            figures.planned_blocks = plan.planned_blocks;
        }
        figures
    }
}

impl<D: DeviceMemory> ExpandableAllocator<D> {
    /// Whether a plan is expected to take over: before any plan was used or
    /// rejected, during the first [`PLAN_GRACE_EVENTS`] events, while
    /// something repeated within the last [`PLAN_PROMISE_EVENTS`].
    pub(super) fn expecting_plan(&self) -> bool {
        !self.config.disable_step_plan
            && !self.planner.tried
            && self.planner.clock < PLAN_GRACE_EVENTS
            && self.planner.clock - self.planner.promising_at < PLAN_PROMISE_EVENTS
    }

    /// Takes the next event through the planner; returns `(range, offset)`
    /// when the active plan places this request.
    pub(super) fn plan_event(
        &mut self,
        event: StepEvent,
    ) -> Result<Option<(usize, u64)>, AllocError> {
        if self.config.disable_step_plan {
            return Ok(None);
        }
        self.planner.clock += 1;
        let Some(mut plan) = self.planner.plan.take() else {
            if self.planner.longer_until != 0 && self.planner.clock >= self.planner.longer_until {
                self.planner.longer_until = 0;
                self.planner.detector.require_longer_than(0);
                if std::mem::take(&mut self.planner.forget_after_longer) {
                    self.planner.detector.reset();
                }
            }
            if self.planner.clock >= self.planner.resume_at {
                if let Some(step) = self.planner.detector.observe(event)
                    && !self.planner.doubling
                {
                    if self.unplanned_bytes(&step) >= DOUBLE_STEP_UNPLANNED_BYTES
                        && 2 * step.period <= MAX_STEP_EVENTS
                    {
                        self.planner.doubling = true;
                    } else {
                        self.planner.plan = Some(self.lay_out(step, false));
                        self.planner.detector.reset();
                    }
                }
                if self.planner.doubling {
                    if self.planner.detector.candidate().is_none() {
                        self.planner.doubling = false;
                    } else if let Some(step) = self.planner.detector.doubled_step() {
                        self.planner.doubling = false;
                        self.planner.plan = Some(self.lay_out(step, true));
                        self.planner.detector.reset();
                    }
                }
                if self.planner.plan.is_some() || self.planner.detector.repeating() {
                    self.planner.promising_at = self.planner.clock;
                }
            }
            return Ok(None);
        };
        if !plan.active {
            self.planner.promising_at = self.planner.clock;
        }
        if !plan.events[plan.phase].same(&event) {
            self.drop_plan(plan, true);
            self.planner.detector.observe(event);
            return Ok(None);
        }
        if plan.phase == plan.switch_phase {
            if !plan.active {
                if !self.switch_to(&mut plan)? {
                    self.drop_plan(plan, false);
                    return Ok(None);
                }
            } else if !plan.trimmed {
                // The blocks in flight at the switch are freed by now:
                // give their pages back (only what the device has passed,
                // so this never waits).
                plan.trimmed = true;
                self.note_raise(&plan);
                self.reclaimable = true;
                self.reclaim_free_pages(u64::MAX, false, true, false)?;
            }
        }
        let placed = match (plan.active, plan.slots[plan.phase]) {
            (true, Some(slot)) => plan.arenas[slot.arena].2.map(|r| (r, slot.offset)),
            _ => None,
        };
        plan.phase = (plan.phase + 1) % plan.events.len();
        plan.followed += 1;
        if plan.followed == 3 * plan.events.len() as u64 {
            // Three whole periods matched: the step is a step.
            self.planner.rejections_in_a_row = 0;
            self.planner.known_step = self.planner.known_step.max(plan.events.len() as u64);
            self.planner.longer_until = 0;
            self.planner.forget_after_longer = false;
            self.planner.detector.require_longer_than(0);
        }
        self.planner.plan = Some(plan);
        if placed.is_some() {
            self.planner.figures.served += 1;
        }
        Ok(placed)
    }

    /// Lays out a repeated step: one arena per stream (blocks of different
    /// streams never share memory, so planned reuse is always ordered on
    /// one stream).
    fn lay_out(&self, step: super::super::plan::RepeatedStep, lazy: bool) -> Plan {
        let period = step.period as u64;
        let page = self.page;
        let mut streams: Vec<StreamId> = step.blocks.iter().flatten().map(|b| b.stream).collect();
        streams.sort_unstable();
        streams.dedup();
        let mut slots: Vec<Option<Slot>> = vec![None; step.period];
        let mut arenas = Vec::new();
        let mut max_live_bytes = 0;
        for (arena, &stream) in streams.iter().enumerate() {
            let blocks: Vec<StepBlock> = step
                .blocks
                .iter()
                .flatten()
                .filter(|b| b.stream == stream)
                .copied()
                .collect();
            let layout = plan_layout(&blocks, period);
            for (block, &offset) in blocks.iter().zip(&layout.offsets) {
                slots[block.start as usize] = Some(Slot { arena, offset });
            }
            arenas.push((stream, layout.arena_bytes.div_ceil(page) * page, None));
            max_live_bytes += layout.max_live_bytes;
        }
        let all: Vec<StepBlock> = step.blocks.iter().flatten().copied().collect();
        let (switch_phase, held_at_switch) = quietest_phase(&all, period);
        let unplanned_bytes = self.unplanned_bytes(&step);
        Plan {
            planned_blocks: all.len() as u64,
            events: step.events,
            slots,
            phase: 0,
            switch_phase: switch_phase as usize,
            arenas,
            unplanned_bytes,
            max_live_bytes,
            trimmed: false,
            high_before_switch: 0,
            lazy,
            held_at_switch,
            active: false,
            followed: 0,
        }
    }

    /// Bytes of the step's requests that the plan would not place (blocks
    /// kept longer than a step), page-rounded.
    fn unplanned_bytes(&self, step: &super::super::plan::RepeatedStep) -> u64 {
        let page = self.page;
        step.events
            .iter()
            .zip(&step.blocks)
            .filter_map(|(event, block)| match (event, block) {
                (StepEvent::Alloc { size, .. }, None) => Some(size.div_ceil(page) * page),
                _ => None,
            })
            .sum()
    }

    /// Whether moves for the ceiling buy no headroom and are not deferred:
    /// before the first plan ([`Self::expecting_plan`]), and while a lazily
    /// mapped plan fills its arenas.
    pub(super) fn moves_keep_the_peak(&self) -> bool {
        self.expecting_plan() || self.planner.clock < self.planner.filling_until
    }

    /// Switches to `plan` if its footprint stays within what the policy may
    /// reserve without it and within the limits: gives every
    /// whole free page back (waiting for the device once), then maps the
    /// arenas. Returns whether the plan is active (the caller drops a
    /// rejected one).
    ///
    /// The footprint is the pages live blocks touch at the switch, the
    /// arenas, and a page-rounded share for the step's unplanned requests.
    /// On every recorded step it fits within the highest reserved level so
    /// far (the live-page high-water mark, as moves before the first plan
    /// buy no headroom), so the plan never raises the reserved peak. One
    /// that does not fit is still used while it stays within what the policy
    /// may grow to without it (the high-water mark plus the largest
    /// headroom, a tenth), since that bounds the policy's own peak too; what
    /// it then raises the highest level by is recorded (`raised_bytes`,
    /// `vramfit.planRaisedBytes`).
    fn switch_to(&mut self, plan: &mut Plan) -> Result<bool, AllocError> {
        let page = self.page;
        let arena_bytes: u64 = plan.arenas.iter().map(|a| a.1).sum();
        let mut footprint = self.live_pages * page + arena_bytes + plan.unplanned_bytes;
        if plan.lazy {
            // The blocks in flight give their pages to the arena once freed.
            footprint -= plan.held_at_switch.min(self.live_pages * page);
        }
        let info = self.device.mem_info();
        let allowed = self.config.allowed_bytes(info.total).unwrap_or(u64::MAX);
        let reserved = self.stats.reserved_bytes.current;
        let reclaimable_bytes = reserved.saturating_sub(self.live_pages * page);
        // The most the policy itself may reach: its highest level so far, or
        // the live-page high-water mark plus the largest allowance it may
        // grow (moves before the switch buy none, see PLAN_GRACE_EVENTS).
        let high_water = self.live_page_high_water_bytes();
        let policy_peak = self
            .reserved_high
            .max(high_water + high_water / self.tuning.headroom_cap_divisor);
        if footprint > policy_peak
            || footprint > allowed
            || arena_bytes > info.free + reclaimable_bytes
        {
            self.planner.figures.rejected += 1;
            self.back_off(plan.events.len());
            return Ok(false);
        }
        plan.high_before_switch = self.reserved_high;
        if plan.lazy {
            // The arenas are mapped as their blocks first need them, over the
            // plan's first period: the blocks in flight now (the last input
            // batch) leave their pages to the arena once freed.
            for arena in 0..plan.arenas.len() {
                let (stream, bytes, _) = plan.arenas[arena];
                plan.arenas[arena].2 = Some(self.arena_range(stream, bytes)?);
            }
            self.planner.filling_until = self.planner.clock + plan.events.len() as u64;
            plan.active = true;
            self.planner.tried = true;
            self.planner.rejections_in_a_row = 0;
            self.planner.figures.activations += 1;
            return Ok(true);
        }
        // Free pages move under the arenas as far as needed to keep the
        // reserved level at its highest so far; the rest are given back one
        // step later, once the device has passed them.
        let want = (reserved + arena_bytes).saturating_sub(self.reserved_high);
        if want > 0 {
            self.reclaimable = true;
            let mut got = self.reclaim_free_pages(want, true, true, true)?;
            if got < want && self.reclaimable {
                self.stats.num_device_waits += 1;
                self.wait_for_free_pages(want - got, true)?;
                got += self.reclaim_free_pages(want - got, true, true, true)?;
                if got < want && self.reclaimable {
                    self.device.wait_frees()?;
                    self.reclaim_free_pages(want - got, true, false, true)?;
                }
            }
        }
        for arena in 0..plan.arenas.len() {
            let (stream, bytes, _) = plan.arenas[arena];
            let r = self.arena_range(stream, bytes)?;
            plan.arenas[arena].2 = Some(r);
            match self.map_under(r, 0, bytes) {
                Ok(()) => {}
                Err(DeviceError::OutOfMemory { .. }) => {
                    self.device.release_parked()?;
                    self.planner.figures.rejected += 1;
                    return Ok(false);
                }
                Err(other) => return Err(other.into()),
            }
        }
        self.device.release_parked()?;
        plan.active = true;
        self.planner.tried = true;
        self.planner.rejections_in_a_row = 0;
        self.planner.figures.activations += 1;
        Ok(true)
    }

    /// Counts what the highest reserved level rose by since `plan`'s switch
    /// (once per switch: one step after it, or when it is left before).
    fn note_raise(&mut self, plan: &Plan) {
        self.planner.figures.raised_bytes +=
            self.reserved_high.saturating_sub(plan.high_before_switch);
    }

    /// Stops watching for a while after a plan failed: `REJECT_BACKOFF_STEPS`
    /// periods, doubling with each failure in a row.
    fn back_off(&mut self, period: usize) {
        let steps = REJECT_BACKOFF_STEPS << self.planner.rejections_in_a_row.min(10);
        self.planner.rejections_in_a_row += 1;
        self.planner.resume_at = self.planner.clock + steps * period as u64;
    }

    /// A range holding one free piece of `bytes`, for an arena of `stream`.
    fn arena_range(&mut self, stream: StreamId, bytes: u64) -> Result<usize, AllocError> {
        let base = self.device.reserve_range(bytes)?;
        let pages = (bytes / self.page) as usize;
        let mut pieces = BTreeMap::new();
        pieces.insert(
            0,
            Piece {
                size: bytes,
                requested: 0,
                allocated: false,
            },
        );
        let mut free = BTreeSet::new();
        free.insert((bytes, 0));
        self.ranges.push(Range {
            base,
            capacity: bytes,
            end: bytes,
            pieces,
            free,
            mapped: vec![false; pages],
            users: vec![0; pages],
            stream,
            freed_at: vec![0; pages],
            planned: true,
        });
        self.stats.segments.increase(1);
        Ok(self.ranges.len() - 1)
    }

    /// Leaves `plan`: its arenas become ordinary ranges (never placed into
    /// again; their free pages can be moved and released like any other).
    fn drop_plan(&mut self, plan: Plan, deviated: bool) {
        // A plan that never took over and stopped matching (a repeating
        // part of a longer step) does not end the grace; one that was used
        // or rejected does.
        if plan.active || !deviated {
            self.planner.tried = true;
        }
        if plan.active && !plan.trimmed {
            self.note_raise(&plan);
        }
        for &(_, _, r) in &plan.arenas {
            if let Some(r) = r {
                self.ranges[r].planned = false;
                self.reclaimable = true;
            }
        }
        if deviated && plan.active {
            self.planner.figures.deviations += 1;
        }
        let period = plan.events.len();
        if deviated && plan.followed >= 2 * period as u64 {
            self.left_after_following(period);
        }
        if deviated && plan.followed < 2 * period as u64 {
            // It stopped repeating at once: a repeating part of a longer
            // step, or the workload changed. Look for longer periods only
            // for a while (long enough to see a known step, or the longest
            // one, three times), and not at once (each try costs a layout,
            // and a switch maps pages).
            self.planner.detector.require_longer_than(period);
            let window = if self.planner.known_step > 0 {
                4 * self.planner.known_step
            } else {
                3 * MAX_STEP_EVENTS as u64
            };
            self.planner.longer_until = self.planner.clock + window;
            self.back_off(period);
        }
        self.planner.detector.reset();
    }

    /// A plan of `period` that had been followed for two periods or more was
    /// left. Left twice in a row at the same distance, it is a part of a
    /// longer cycle (micro-batches of gradient accumulation, left at every
    /// optimizer step; training steps between regular evaluations): the
    /// detector looks only for periods longer than `period` for three such
    /// distances, long enough to see the cycle twice and lay it out, then
    /// any period again. Once per period: if no longer cycle took over, the
    /// step is planned and left as before.
    fn left_after_following(&mut self, period: usize) {
        let now = self.planner.clock;
        let gap = match self.planner.last_left {
            Some((p, at, _)) if p == period => now - at,
            _ => 0,
        };
        if let Some((p, _, before)) = self.planner.last_left
            && p == period
            && gap == before
            && gap > period as u64
            && gap <= MAX_STEP_EVENTS as u64
            && self.planner.searched_beyond != period
        {
            self.planner.searched_beyond = period;
            self.planner.detector.require_longer_than(period);
            self.planner.longer_until = now + 3 * gap;
            self.planner.forget_after_longer = true;
        }
        self.planner.last_left = Some((period, now, gap));
    }

    /// Carves exactly `[offset, offset + size)` out of arena range `r`, if
    /// that span lies in one free piece (always, while the sequence follows
    /// the plan; checked, so that no two live blocks can ever overlap).
    pub(super) fn carve_at(&mut self, r: usize, offset: u64, size: u64) -> bool {
        let range = &mut self.ranges[r];
        let Some((&at, &piece)) = range.pieces.range(..=offset).next_back() else {
            return false;
        };
        if piece.allocated || at + piece.size < offset + size {
            return false;
        }
        range.pieces.remove(&at);
        range.free.remove(&(piece.size, at));
        let free_piece = Piece {
            size: 0,
            requested: 0,
            allocated: false,
        };
        if offset > at {
            range.pieces.insert(
                at,
                Piece {
                    size: offset - at,
                    ..free_piece
                },
            );
            range.free.insert((offset - at, at));
        }
        let tail = at + piece.size - (offset + size);
        if tail > 0 {
            range.pieces.insert(
                offset + size,
                Piece {
                    size: tail,
                    ..free_piece
                },
            );
            range.free.insert((tail, offset + size));
        }
        range.pieces.insert(
            offset,
            Piece {
                size,
                requested: 0,
                allocated: true,
            },
        );
        true
    }

    /// Leaves the plan after a request it placed could not be carved.
    pub(super) fn plan_failed(&mut self) {
        if let Some(plan) = self.planner.plan.take() {
            self.drop_plan(plan, true);
        }
    }
}

#[cfg(test)]
#[path = "expandable_plan_tests.rs"]
mod tests;
