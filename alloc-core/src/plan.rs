//! Planned layouts for a repeating allocation sequence (a training step).
//!
//! A training step asks the allocator for the same blocks, of the same
//! sizes, on the same streams, in the same order, and frees them at the
//! same points, step after step. Two pure parts live here:
//!
//! * [`StepDetector`] watches the sequence of requests and frees and says
//!   when its last two periods were identical ([`RepeatedStep`]).
//! * [`plan_layout`] packs the blocks of one period into one arena, as a
//!   static memory planner does: each block gets an offset such that no two
//!   blocks alive at the same time overlap.
//!
//! Time is counted in events (each request and each free is one). A block
//! of the step lives from its request at phase `start` for `len` events;
//! lifetimes are arcs on a circle of `period` events, so a block requested
//! late in one step and freed early in the next (a loss, gradients freed by
//! the next `zero_grad`) is planned like any other.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::device::StreamId;

/// What the vramfit policy's planner did (`vramfit.plan*` counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanFigures {
    /// Whether requests are being served from a plan now.
    pub active: bool,
    /// Bytes of the planned arena (mapped while the plan is active).
    pub arena_bytes: u64,
    /// The most bytes the planned blocks hold at once (the arena's bound).
    pub max_live_bytes: u64,
    /// Requests and frees per planned step.
    pub step_events: u64,
    /// Blocks of the step placed by the plan.
    pub planned_blocks: u64,
    /// Requests served at their planned offset, since the start.
    pub served: u64,
    /// Plans switched to, since the start.
    pub activations: u64,
    /// Plans left because a request or free differed from the step.
    pub deviations: u64,
    /// Plans not used because they would not lower the footprint (or pass
    /// a limit).
    pub rejected: u64,
    /// Bytes by which switching to a plan raised the highest reserved
    /// level, from just before each switch to one step after it, summed
    /// over the switches: 0 whenever the plan's footprint fits within the
    /// level already reached (every recorded step).
    #[serde(default)]
    pub raised_bytes: u64,
}

/// Requests and frees a repeating step may span at most; longer sequences
/// are not planned (the history kept to find them, and laying them out,
/// would cost too much). 32,768 events: ten times the recorded transformer
/// steps (2,400-3,700 events).
pub const MAX_STEP_EVENTS: usize = 1 << 15;

/// Events in the rolling window whose hash proposes a period: long enough
/// that a handful of repeated small requests does not propose one, short
/// enough to re-synchronise quickly after a deviation.
const WINDOW_EVENTS: usize = 32;

/// The shortest step: two requests and their frees.
const MIN_STEP_EVENTS: usize = 4;

/// One event of the sequence, as the detector compares them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepEvent {
    /// A request of `size` bytes (rounded) on `stream`.
    Alloc {
        /// Rounded size.
        size: u64,
        /// Stream of the request.
        stream: StreamId,
    },
    /// A free of the block requested `age` events before (with `size`
    /// bytes, which does not take part in the comparison: the age names
    /// the block).
    Free {
        /// Events since the block's request.
        age: u64,
        /// Rounded size of the block.
        size: u64,
    },
}

impl StepEvent {
    fn token(&self) -> u64 {
        // FNV-1a over the fields: cheap, and collisions only cost a missed
        // or late detection (equality is checked on the events themselves).
        let (tag, a, b) = match *self {
            StepEvent::Alloc { size, stream } => (1u64, size, stream),
            StepEvent::Free { age, .. } => (2u64, age, 0),
        };
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for word in [tag, a, b] {
            h ^= word;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h
    }

    /// Whether `other` is the same event of a step: same size and stream
    /// for a request, same age for a free.
    pub fn same(&self, other: &StepEvent) -> bool {
        match (self, other) {
            (
                StepEvent::Alloc { size, stream },
                StepEvent::Alloc {
                    size: s2,
                    stream: t2,
                },
            ) => size == s2 && stream == t2,
            (StepEvent::Free { age, .. }, StepEvent::Free { age: a2, .. }) => age == a2,
            _ => false,
        }
    }

    fn byte_delta(&self) -> i64 {
        match *self {
            StepEvent::Alloc { size, .. } => size as i64,
            StepEvent::Free { size, .. } => -(size as i64),
        }
    }
}

/// A block of a repeating step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepBlock {
    /// Phase of its request within the step (event index from the step's
    /// first event).
    pub start: u64,
    /// Events from its request to its free (its free is at phase
    /// `(start + len) % period`); less than the period.
    pub len: u64,
    /// Rounded size in bytes.
    pub size: u64,
    /// Stream of the request.
    pub stream: StreamId,
}

impl StepBlock {
    /// Whether the two blocks are alive at a common moment of the cycle.
    pub fn overlaps_in_time(&self, other: &StepBlock, period: u64) -> bool {
        // Two arcs of a circle meet iff one starts inside the other.
        let inside = |a: &StepBlock, b: &StepBlock| (b.start + period - a.start) % period < a.len;
        inside(self, other) || inside(other, self)
    }
}

/// One period of a sequence seen twice in a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepeatedStep {
    /// Events per step.
    pub period: usize,
    /// The step's events, from phase 0.
    pub events: Vec<StepEvent>,
    /// For each event that is a request of a block freed within a period
    /// of it: the block (others, e.g. state kept for several steps, are
    /// `None`).
    pub blocks: Vec<Option<StepBlock>>,
}

/// Watches requests and frees and reports a repeated step.
///
/// The rule: the last `2 * period` events are `period`-periodic (every
/// request has the size and stream, and every free the age, of the event
/// one period earlier), the bytes requested in the last period equal the
/// bytes freed in it (a step gives back what it takes: the forward pass of
/// one transformer layer repeats too, but it keeps its activations), and
/// the period has at least [`MIN_STEP_EVENTS`] (or more, see
/// [`StepDetector::require_longer_than`]) and at most
/// [`MAX_STEP_EVENTS`] events. A candidate period comes from the last
/// place where the last [`WINDOW_EVENTS`] events occurred before (a
/// rolling hash), and is dropped at the first event that differs.
#[derive(Debug)]
pub struct StepDetector {
    /// Absolute number of the first event in `events`.
    base: u64,
    events: Vec<StepEvent>,
    tokens: Vec<u64>,
    /// Bytes requested minus bytes freed before each event (and after the
    /// last one): `net[i]` is the level before `events[i]`.
    net: Vec<i64>,
    /// Rolling hash of the last [`WINDOW_EVENTS`] tokens, and where each
    /// window hash last ended (absolute event number).
    window_hash: u64,
    seen: HashMap<u64, u64>,
    /// The period being checked and how many events in a row matched it.
    candidate: Option<usize>,
    run: usize,
    /// Periods below this are not proposed ([`StepDetector::require_longer_than`]).
    min_period: usize,
}

/// Multiplier of the rolling hash.
const ROLL: u64 = 0x9e37_79b9_7f4a_7c15;

impl Default for StepDetector {
    fn default() -> Self {
        Self {
            base: 0,
            events: Vec::new(),
            tokens: Vec::new(),
            net: vec![0],
            window_hash: 0,
            seen: HashMap::new(),
            candidate: None,
            run: 0,
            min_period: MIN_STEP_EVENTS,
        }
    }
}

impl StepDetector {
    /// A detector that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets everything seen (keeping the shortest period allowed).
    pub fn reset(&mut self) {
        let min_period = self.min_period;
        *self = Self::new();
        self.min_period = min_period;
    }

    /// Proposes only periods longer than `period` from now on (`0`: any):
    /// a period that stopped repeating within two periods was a repeating
    /// part of a longer step (the layers of a forward pass without saved
    /// activations, an optimizer's loop over equal-shaped parameters), and
    /// the step that contains it is longer.
    pub fn require_longer_than(&mut self, period: usize) {
        self.min_period = (period + 1).max(MIN_STEP_EVENTS);
    }

    /// Whether the last events repeat a period the detector is checking
    /// (at least twice the window in a row): a step may be on its way.
    pub fn repeating(&self) -> bool {
        self.candidate.is_some() && self.run >= 2 * WINDOW_EVENTS
    }

    /// The period being checked, if any.
    pub fn candidate(&self) -> Option<usize> {
        self.candidate
    }

    /// Two periods of the step being checked as one step, once four
    /// periods in a row were identical: blocks kept a little longer than a
    /// step (an input batch made while the last one is still referenced)
    /// are blocks of this doubled step, their two lifetimes at two places
    /// of its arena. `None` until then, or when twice the period would be
    /// longer than [`MAX_STEP_EVENTS`].
    pub fn doubled_step(&self) -> Option<RepeatedStep> {
        let period = self.candidate?;
        let n = self.events.len();
        if 2 * period > MAX_STEP_EVENTS
            || self.run < 3 * period
            || n < 4 * period
            || self.net[n] != self.net[n - 2 * period]
        {
            return None;
        }
        self.repeated_step(2 * period)
    }

    /// Events seen since the last reset (or kept after trimming).
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether nothing was seen since the last reset.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Takes the next event; returns the step when this event completes
    /// its second identical period.
    pub fn observe(&mut self, event: StepEvent) -> Option<RepeatedStep> {
        if self.events.len() >= 3 * MAX_STEP_EVENTS {
            self.trim();
        }
        let token = event.token();
        let level = *self.net.last().expect("net starts with 0");
        self.events.push(event);
        self.tokens.push(token);
        self.net.push(level + event.byte_delta());
        let n = self.events.len();
        let now = self.base + n as u64 - 1;

        // The rolling hash of the window ending at this event.
        let pow = ROLL.wrapping_pow(WINDOW_EVENTS as u32);
        self.window_hash = self.window_hash.wrapping_mul(ROLL).wrapping_add(token);
        if n > WINDOW_EVENTS {
            self.window_hash = self
                .window_hash
                .wrapping_sub(self.tokens[n - 1 - WINDOW_EVENTS].wrapping_mul(pow));
        }

        // Keep checking the candidate, or propose one.
        if let Some(period) = self.candidate {
            if n > period && self.events[n - 1].same(&self.events[n - 1 - period]) {
                self.run += 1;
            } else {
                self.candidate = None;
                self.run = 0;
            }
        }
        if n >= WINDOW_EVENTS {
            let previous = self.seen.insert(self.window_hash, now);
            if self.candidate.is_none()
                && let Some(before) = previous
            {
                let period = (now - before) as usize;
                if (self.min_period..=MAX_STEP_EVENTS).contains(&period)
                    && n > period
                    && (1..=WINDOW_EVENTS.min(n - period))
                        .all(|k| self.events[n - k].same(&self.events[n - k - period]))
                {
                    self.candidate = Some(period);
                    self.run = WINDOW_EVENTS.min(n - period);
                }
            }
        }

        let period = self.candidate?;
        if self.run < period || self.net[n] != self.net[n - period] {
            return None;
        }
        self.repeated_step(period)
    }

    /// The last `period` events as a step, their blocks' lifetimes read
    /// from the period before (whose frees all fall in the last two).
    fn repeated_step(&self, period: usize) -> Option<RepeatedStep> {
        let n = self.events.len();
        let first = n - period;
        let events = self.events[first..].to_vec();
        let mut blocks: Vec<Option<StepBlock>> = vec![None; period];
        // Frees in the last two periods name their request by age: a
        // request of the earlier period freed less than a period later.
        for i in n.saturating_sub(2 * period)..n {
            if let StepEvent::Free { age, .. } = self.events[i] {
                let age = age as usize;
                if age == 0 || age >= period || age > i {
                    continue;
                }
                let at = i - age;
                if at + period < first || at >= first {
                    continue;
                }
                let phase = at + period - first;
                if let StepEvent::Alloc { size, stream } = self.events[at] {
                    blocks[phase] = Some(StepBlock {
                        start: phase as u64,
                        len: age as u64,
                        size,
                        stream,
                    });
                }
            }
        }
        blocks.iter().any(Option::is_some).then_some(RepeatedStep {
            period,
            events,
            blocks,
        })
    }

    /// Drops the oldest events, keeping two of the longest periods.
    fn trim(&mut self) {
        let drop = self.events.len() - 2 * MAX_STEP_EVENTS;
        self.events.drain(..drop);
        self.tokens.drain(..drop);
        self.net.drain(..drop);
        self.base += drop as u64;
        let base = self.base;
        self.seen.retain(|_, at| *at >= base);
    }
}

/// Offsets for the blocks of a step in one arena.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepLayout {
    /// Offset of each block (same order as the blocks given).
    pub offsets: Vec<u64>,
    /// Bytes the arena needs (the highest block end).
    pub arena_bytes: u64,
    /// The most bytes the blocks hold at one moment: no layout needs less.
    pub max_live_bytes: u64,
}

/// Packs `blocks` (arcs on a cycle of `period` events) into one arena.
///
/// Each block goes at the lowest offset where it overlaps no block already
/// placed that is alive at a common moment (what offline allocators of
/// static graphs do), in three orders: largest first (ties: the
/// longer-lived first), longest-lived first (ties: the larger first), and
/// in request order; the smallest arena wins (ties: the earlier order).
/// Largest first reaches the max-live-bytes bound on the recorded steps,
/// where a handful of large blocks (activations, logits, gradients)
/// dominate; on steps whose saved activations nest (freed in reverse order
/// in the backward pass) the other two reach it where largest first is up
/// to 2% above. The next order is tried only while the arena is above the
/// bound. O(n^2) in the blocks of one step per order (a linear scan; with
/// detection, 130-220 ms for the 1,200-1,900 blocks of the recorded steps
/// in a debug build, where the first order reaches the bound; at most
/// [`MAX_STEP_EVENTS`] / 2 blocks), done once per planned step.
pub fn plan_layout(blocks: &[StepBlock], period: u64) -> StepLayout {
    let max_live_bytes = live_bytes_by_phase(blocks, period)
        .into_iter()
        .max()
        .unwrap_or(0);
    let mut best: Option<(u64, Vec<u64>)> = None;
    for order in layout_orders(blocks) {
        let (arena, offsets) = pack_in_order(blocks, period, &order);
        if best.as_ref().is_none_or(|b| arena < b.0) {
            best = Some((arena, offsets));
        }
        if arena <= max_live_bytes {
            // At the bound: no order can do better.
            break;
        }
    }
    let (arena_bytes, offsets) = best.unwrap_or_default();
    StepLayout {
        offsets,
        arena_bytes,
        max_live_bytes,
    }
}

/// The orders [`plan_layout`] tries, each a permutation of the blocks.
fn layout_orders(blocks: &[StepBlock]) -> [Vec<usize>; 3] {
    let indices: Vec<usize> = (0..blocks.len()).collect();
    let mut largest = indices.clone();
    largest.sort_by(|&a, &b| {
        let (x, y) = (&blocks[a], &blocks[b]);
        y.size
            .cmp(&x.size)
            .then(y.len.cmp(&x.len))
            .then(x.start.cmp(&y.start))
    });
    let mut longest = indices.clone();
    longest.sort_by(|&a, &b| {
        let (x, y) = (&blocks[a], &blocks[b]);
        y.len
            .cmp(&x.len)
            .then(y.size.cmp(&x.size))
            .then(x.start.cmp(&y.start))
    });
    let mut in_request_order = indices;
    in_request_order.sort_by_key(|&i| blocks[i].start);
    [largest, longest, in_request_order]
}

/// Places the blocks in `order`, each at the lowest offset free over its
/// lifetime; returns the arena's bytes and the offsets.
fn pack_in_order(blocks: &[StepBlock], period: u64, order: &[usize]) -> (u64, Vec<u64>) {
    let mut offsets = vec![0u64; blocks.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(blocks.len());
    let mut busy: Vec<(u64, u64)> = Vec::new();
    let mut arena = 0u64;
    for &i in order {
        let block = &blocks[i];
        busy.clear();
        busy.extend(
            placed
                .iter()
                .filter(|&&j| blocks[j].overlaps_in_time(block, period))
                .map(|&j| (offsets[j], offsets[j] + blocks[j].size)),
        );
        busy.sort_unstable();
        let mut at = 0u64;
        for &(from, to) in &busy {
            if from >= at + block.size {
                break;
            }
            at = at.max(to);
        }
        offsets[i] = at;
        arena = arena.max(at + block.size);
        placed.push(i);
    }
    (arena, offsets)
}

/// Bytes of `blocks` alive at each phase of the cycle.
pub fn live_bytes_by_phase(blocks: &[StepBlock], period: u64) -> Vec<u64> {
    let p = period as usize;
    let mut diff = vec![0i64; p + 1];
    for b in blocks {
        let (s, e) = (b.start as usize, (b.start + b.len) as usize);
        let size = b.size as i64;
        diff[s] += size;
        if e <= p {
            diff[e] -= size;
        } else {
            diff[p] -= size;
            diff[0] += size;
            diff[e - p] -= size;
        }
    }
    let mut level = 0i64;
    diff[..p]
        .iter()
        .map(|d| {
            level += d;
            level as u64
        })
        .collect()
}

/// The phase at which switching to a plan leaves the fewest bytes of the
/// step in blocks requested before the switch (those stay where the policy
/// put them until their free, beside the arena): the switch happens just
/// before the event at its phase, so a block counts if it was requested at
/// an earlier phase and is freed at this one or later. That is the bytes
/// alive across each phase, minus the blocks requested at it, plus the
/// blocks freed at it (still held when the switch maps the arena: run 7's
/// LLaMA switched just before a 125 MiB gradient's free, which raised its
/// reserved peak by 96 MiB).
pub fn quietest_phase(blocks: &[StepBlock], period: u64) -> (u64, u64) {
    let mut live = live_bytes_by_phase(blocks, period);
    for b in blocks {
        live[b.start as usize] -= b.size;
        live[((b.start + b.len) % period) as usize] += b.size;
    }
    live.iter()
        .enumerate()
        .min_by_key(|&(phase, bytes)| (*bytes, phase))
        .map(|(phase, &bytes)| (phase as u64, bytes))
        .unwrap_or((0, 0))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
