//! The `vramfit` policy: expandable ranges mapped in physical pages.
//!
//! Each `(stream, small|large)` pair gets one virtual address range, as large
//! as the device, that grows at its end. Blocks inside a range are found by
//! best fit (smallest free block that holds the request, lowest offset on
//! ties), split whenever the remainder is at least 512 bytes, and merged with
//! free neighbours on free. Physical memory comes in 2 MiB pages mapped under
//! the blocks that need them.
//!
//! What lowers the reserved peak: before mapping pages that would lift the
//! reserved level above a ceiling, the allocator moves pages that lie wholly
//! inside free blocks (unmaps them and maps them under the new block). The
//! ceiling is the highest number of pages live blocks have touched at once
//! (what moving at every growth would reserve), plus an allowance that
//! grows with every such move ([`SLACK_PER_MOVE_PAGES`]): a training step
//! that needs moves pays them for a few steps, then fits in place and makes
//! no driver calls. Below the ceiling pages stay mapped (reuse costs
//! nothing); a limit (budget, memory fraction, the device) always moves or
//! unmaps what it takes. PyTorch's segments, in contrast, keep whole 2/20
//! MiB or request-sized segments whose free tails cannot serve other sizes
//! or streams.
//!
//! A repeating training step is served from a layout planned in advance
//! (`expandable_plan.rs`, `super::plan`): one arena per stream, mapped
//! once, each request at its planned offset.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::GpuAllocator;
use super::config::{AllocatorConfig, MIN_BLOCK_BYTES, SMALL_REQUEST_BYTES, round_request};
use super::device::{DeviceError, DeviceMemory, DevicePtr, StreamId};
use super::error::{AllocError, OomFacts};
use super::plan::{PlanFigures, StepEvent};
use super::stats::MemoryStats;

#[path = "expandable_plan.rs"]
mod plan_serving;

/// Pages the ceiling rises by each time free pages are moved only to keep
/// the reserved level under it (not for a limit). Moving pages costs driver
/// calls (and, on a real GPU, waiting for the device), and a training step
/// that needs a move repeats it every step; each move thus buys headroom
/// until the step's layout fits without moving, which bounds the reserved
/// level by what never moving would reach. 8 pages (16 MiB) settles every
/// committed trace and the Hugging Face steps of tests/data/steps to zero
/// driver calls within 3-6 steps for 0.4-2.6% more reserved memory than
/// moving at every growth; 4 pages left GPT-2 moving after 10 steps, and
/// increments the size of each move cost up to 8% (docs/benchmarks/allocator.md).
pub const SLACK_PER_MOVE_PAGES: u64 = 8;

/// Pages a move for the ceiling may leave for later, mapping new pages past
/// the ceiling instead, when the free pages it would take may still be used
/// by kernels queued before their free ([`DeviceMemory::frees_done`]):
/// waiting for the device stalls the host (and, if it drains the queue, the
/// GPU). A larger shortfall, or one that a limit needs, waits. 32 MiB is
/// 0.25% of the transformer runs' footprint.
pub const DEFERRED_MOVE_PAGES: u64 = 16;

/// The allowance stops at the live-page high-water mark divided by this
/// (10%): a workload whose layout never repeats keeps moving pages rather
/// than give up the policy's lower footprint. The committed traces settle
/// with at most 2.1% (a 5% cap kept gpt2_checkpointing moving pages).
pub const HEADROOM_CAP_DIVISOR: u64 = 10;

/// The policy's constants, for experiments on traces (the defaults are the
/// constants above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// [`SLACK_PER_MOVE_PAGES`].
    pub slack_per_move_pages: u64,
    /// [`HEADROOM_CAP_DIVISOR`].
    pub headroom_cap_divisor: u64,
    /// [`DEFERRED_MOVE_PAGES`].
    pub deferred_move_pages: u64,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            slack_per_move_pages: SLACK_PER_MOVE_PAGES,
            headroom_cap_divisor: HEADROOM_CAP_DIVISOR,
            deferred_move_pages: DEFERRED_MOVE_PAGES,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Piece {
    size: u64,
    requested: u64,
    allocated: bool,
}

/// One growing virtual range: pieces tile `[0, end)`.
#[derive(Debug)]
struct Range {
    base: DevicePtr,
    capacity: u64,
    end: u64,
    pieces: BTreeMap<u64, Piece>,
    free: BTreeSet<(u64, u64)>,
    mapped: Vec<bool>,
    /// Live blocks on each page.
    users: Vec<u32>,
    /// The stream whose blocks the range holds.
    stream: StreamId,
    /// For each page, the number of the last free of a block on it: the
    /// page may be unmapped without waiting once the device is past it
    /// ([`DeviceMemory::frees_done`]).
    freed_at: Vec<u64>,
    /// An arena of the active plan: placed into only by the plan, and its
    /// free pages are not moved for the ceiling (only for a limit or
    /// `empty_cache`).
    planned: bool,
}

impl Range {
    fn page_span(&self, offset: u64, size: u64, page: u64) -> (usize, usize) {
        (
            (offset / page) as usize,
            (offset + size).div_ceil(page) as usize,
        )
    }
}

/// A caching allocator with the `vramfit` policy over a [`DeviceMemory`]
/// backend that supports virtual memory management.
pub struct ExpandableAllocator<D: DeviceMemory> {
    device: D,
    config: AllocatorConfig,
    page: u64,
    ranges: Vec<Range>,
    range_of: HashMap<(StreamId, bool), usize>,
    /// Live blocks: range, offset, and the planner's clock at the request.
    live: HashMap<DevicePtr, (usize, u64, u64)>,
    /// Set when a free may have left whole free pages behind.
    reclaimable: bool,
    /// Pages under live blocks, now and at most so far.
    live_pages: u64,
    live_pages_peak: u64,
    /// Bytes the reserved level may pass the live-page high-water mark by
    /// before free pages are moved (see [`SLACK_PER_MOVE_PAGES`]).
    allowance: u64,
    /// Frees so far (each free's number, for [`DeviceMemory::note_free`]).
    free_seq: u64,
    tuning: Tuning,
    stats: MemoryStats,
    /// The highest reserved level so far (not cleared by peak resets): a
    /// plan is used only if it stays at or below it.
    reserved_high: u64,
    planner: plan_serving::Planner,
}

impl<D: DeviceMemory> ExpandableAllocator<D> {
    /// An empty allocator over `device`.
    pub fn new(device: D, config: AllocatorConfig) -> Self {
        Self::with_tuning(device, config, Tuning::default())
    }

    /// An empty allocator over `device` with other constants.
    pub fn with_tuning(device: D, config: AllocatorConfig, tuning: Tuning) -> Self {
        let page = device.page_bytes();
        Self {
            device,
            config,
            page,
            ranges: Vec::new(),
            range_of: HashMap::new(),
            live: HashMap::new(),
            reclaimable: false,
            live_pages: 0,
            live_pages_peak: 0,
            allowance: 0,
            free_seq: 0,
            tuning,
            stats: MemoryStats::default(),
            reserved_high: 0,
            planner: Default::default(),
        }
    }

    /// The backend, e.g. to read a simulated device's call counts.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The backend, e.g. to set a simulated device's queue.
    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    /// The most bytes of pages live blocks have touched at once: what the
    /// policy would reserve if it moved pages at every growth.
    pub fn live_page_high_water_bytes(&self) -> u64 {
        self.live_pages_peak * self.page
    }

    /// Bytes the reserved level may exceed the live-page high-water mark by
    /// before pages move (grown by moves, see [`SLACK_PER_MOVE_PAGES`]).
    pub fn headroom_bytes(&self) -> u64 {
        self.allowance
    }

    fn range_for(&mut self, stream: StreamId, small: bool) -> Result<usize, AllocError> {
        if let Some(&index) = self.range_of.get(&(stream, small)) {
            return Ok(index);
        }
        // Virtual space is cheap: room for four times the device, so that
        // holes left behind never stop a range from growing.
        let total = self.device.mem_info().total;
        let capacity = 4 * total.div_ceil(self.page) * self.page;
        let base = self.device.reserve_range(capacity)?;
        self.ranges.push(Range {
            base,
            capacity,
            end: 0,
            pieces: BTreeMap::new(),
            free: BTreeSet::new(),
            mapped: Vec::new(),
            users: Vec::new(),
            stream,
            freed_at: Vec::new(),
            planned: false,
        });
        self.stats.segments.increase(1);
        let index = self.ranges.len() - 1;
        self.range_of.insert((stream, small), index);
        Ok(index)
    }

    /// Where a block of `size` bytes goes among range `r`'s free pieces:
    /// `(piece_size, piece_offset, block_offset)`, or `None` when no free
    /// piece holds it.
    ///
    /// Pages come first, then fit: the smallest piece where the block lies
    /// on pages already mapped wins (at the piece's start, or at its end
    /// when only that part is mapped); when every fitting piece lacks pages,
    /// the placement that lacks the fewest. Best fit with mapped pages is
    /// the first candidate looked at, so the common case costs one look.
    /// A repeating workload (a training step) thus lands on the pages it
    /// used last time instead of moving pages around, which is what keeps
    /// the steady state free of driver calls.
    fn place(&self, r: usize, size: u64) -> Option<(u64, u64, u64)> {
        // Bounds the search when no mapped placement exists; the driver call
        // that follows then costs far more than the search.
        const MAX_CANDIDATES: usize = 256;
        let range = &self.ranges[r];
        let mut best: Option<(u64, u64, u64, u64)> = None;
        for &(piece_size, piece_offset) in range.free.range((size, 0)..).take(MAX_CANDIDATES) {
            let mut missing = self.missing_pages(r, piece_offset, size);
            let mut at = piece_offset;
            let end_at = piece_offset + piece_size - size;
            if missing > 0 && end_at - piece_offset >= MIN_BLOCK_BYTES {
                let at_end = self.missing_pages(r, end_at, size);
                if at_end < missing {
                    missing = at_end;
                    at = end_at;
                }
            }
            if best.is_none_or(|b| missing < b.0) {
                best = Some((missing, piece_size, piece_offset, at));
            }
            if missing == 0 {
                break;
            }
        }
        best.map(|(_, piece_size, piece_offset, at)| (piece_size, piece_offset, at))
    }

    /// Carves `size` bytes out of range `r` ([`Self::place`]), else at its end.
    fn carve(&mut self, r: usize, size: u64) -> Option<u64> {
        let placement = self.place(r, size);
        let range = &mut self.ranges[r];
        let (offset, piece_size) = match placement {
            Some((piece_size, piece_offset, at)) => {
                range.free.remove(&(piece_size, piece_offset));
                let left = at - piece_offset;
                if left > 0 {
                    range.pieces.insert(
                        piece_offset,
                        Piece {
                            size: left,
                            requested: 0,
                            allocated: false,
                        },
                    );
                    range.free.insert((left, piece_offset));
                }
                (at, piece_size - left)
            }
            None => {
                // Grow the range; a free piece at its end becomes part of the block.
                let tail = range
                    .pieces
                    .last_key_value()
                    .filter(|(o, p)| !p.allocated && **o + p.size == range.end)
                    .map(|(o, p)| (*o, p.size));
                let offset = match tail {
                    Some((offset, tail_size)) => {
                        range.free.remove(&(tail_size, offset));
                        offset
                    }
                    None => range.end,
                };
                if offset + size > range.capacity {
                    return None;
                }
                range.end = offset + size;
                (offset, size)
            }
        };
        let remainder = piece_size - size;
        let kept = if remainder >= MIN_BLOCK_BYTES {
            range.pieces.insert(
                offset + size,
                Piece {
                    size: remainder,
                    requested: 0,
                    allocated: false,
                },
            );
            range.free.insert((remainder, offset + size));
            size
        } else {
            piece_size
        };
        range.pieces.insert(
            offset,
            Piece {
                size: kept,
                requested: 0,
                allocated: true,
            },
        );
        Some(offset)
    }

    /// Marks the piece at `offset` free and merges it with free neighbours.
    fn release_piece(&mut self, r: usize, offset: u64) -> Piece {
        let range = &mut self.ranges[r];
        let piece = range.pieces.remove(&offset).expect("piece exists");
        let (mut start, mut size) = (offset, piece.size);
        if let Some((&prev_offset, &prev)) = range.pieces.range(..offset).next_back()
            && !prev.allocated
        {
            range.pieces.remove(&prev_offset);
            range.free.remove(&(prev.size, prev_offset));
            start = prev_offset;
            size += prev.size;
        }
        if let Some(&next) = range.pieces.get(&(offset + piece.size))
            && !next.allocated
        {
            range.pieces.remove(&(offset + piece.size));
            range.free.remove(&(next.size, offset + piece.size));
            size += next.size;
        }
        range.pieces.insert(
            start,
            Piece {
                size,
                requested: 0,
                allocated: false,
            },
        );
        range.free.insert((size, start));
        self.reclaimable = true;
        piece
    }

    /// Counts a live block on its pages (`add`) or stops counting it.
    fn touch(&mut self, r: usize, offset: u64, size: u64, add: bool) {
        let page = self.page;
        let range = &mut self.ranges[r];
        let (first, last) = range.page_span(offset, size, page);
        if range.users.len() < last {
            range.users.resize(last, 0);
        }
        for users in &mut range.users[first..last] {
            if add {
                if *users == 0 {
                    self.live_pages += 1;
                }
                *users += 1;
            } else {
                *users -= 1;
                if *users == 0 {
                    self.live_pages -= 1;
                }
            }
        }
        self.live_pages_peak = self.live_pages_peak.max(self.live_pages);
    }

    fn missing_pages(&self, r: usize, offset: u64, size: u64) -> u64 {
        let range = &self.ranges[r];
        let (first, last) = range.page_span(offset, size, self.page);
        (first..last)
            .filter(|&p| !range.mapped.get(p).copied().unwrap_or(false))
            .count() as u64
    }

    /// Maps the missing pages under `[offset, offset + size)`, one device
    /// call per run of consecutive pages.
    fn map_under(&mut self, r: usize, offset: u64, size: u64) -> Result<(), DeviceError> {
        let page = self.page;
        let (first, last) = self.ranges[r].page_span(offset, size, page);
        if self.ranges[r].mapped.len() < last {
            self.ranges[r].mapped.resize(last, false);
        }
        let mut p = first;
        while p < last {
            if self.ranges[r].mapped[p] {
                p += 1;
                continue;
            }
            let run_start = p;
            while p < last && !self.ranges[r].mapped[p] {
                p += 1;
            }
            let bytes = (p - run_start) as u64 * page;
            self.device
                .map_pages(self.ranges[r].base + run_start as u64 * page, bytes)?;
            self.ranges[r].mapped[run_start..p].fill(true);
            self.stats.num_device_allocs += 1;
            self.stats.reserved_bytes.increase(bytes);
            self.reserved_high = self.reserved_high.max(self.stats.reserved_bytes.current);
        }
        Ok(())
    }

    /// Unmaps pages that lie wholly inside free pieces, largest pieces
    /// first, until `want` bytes are given back (or none are left). Giving
    /// back only what is needed keeps the pages that later requests would
    /// otherwise have to map again.
    ///
    /// With `park`, the pages are kept by the backend for the map that
    /// follows ([`DeviceMemory::park_pages`]). With `settled_only`, only
    /// pages whose last free the device has passed are taken
    /// ([`DeviceMemory::frees_done`]): the others may still be used by
    /// kernels queued before their free, and stay mapped until a later
    /// move finds them settled (no waiting for the device).
    ///
    /// With `include_planned`, the free pages of the active plan's arenas
    /// may be taken too (a limit or `empty_cache`; not the ceiling).
    fn reclaim_free_pages(
        &mut self,
        want: u64,
        park: bool,
        settled_only: bool,
        include_planned: bool,
    ) -> Result<u64, DeviceError> {
        let page = self.page;
        let done: Vec<u64> = if settled_only {
            let streams: Vec<StreamId> = self.ranges.iter().map(|r| r.stream).collect();
            streams
                .into_iter()
                .map(|stream| self.device.frees_done(stream))
                .collect()
        } else {
            vec![u64::MAX; self.ranges.len()]
        };
        let mut skipped = false;
        let mut spans = self.free_spans(include_planned);
        spans.sort_unstable_by(|a, b| b.cmp(a));
        let mut freed = 0;
        for (_, r, first, last) in spans {
            let settled = done[r];
            let movable = |range: &Range, p: usize| {
                range.mapped[p] && range.freed_at.get(p).copied().unwrap_or(0) <= settled
            };
            let mut p = first;
            while p < last && freed < want {
                if !movable(&self.ranges[r], p) {
                    skipped |= self.ranges[r].mapped[p];
                    p += 1;
                    continue;
                }
                let run_start = p;
                let run_cap = run_start + ((want - freed).div_ceil(page) as usize);
                while p < last && p < run_cap && movable(&self.ranges[r], p) {
                    p += 1;
                }
                let bytes = (p - run_start) as u64 * page;
                let at = self.ranges[r].base + run_start as u64 * page;
                if park {
                    self.device.park_pages(at, bytes)?;
                    self.stats.moved_bytes += bytes;
                } else {
                    self.device.unmap_pages(at, bytes)?;
                }
                self.ranges[r].mapped[run_start..p].fill(false);
                self.stats.num_device_frees += 1;
                self.stats.reserved_bytes.decrease(bytes);
                freed += bytes;
            }
            if freed >= want {
                return Ok(freed);
            }
        }
        // Everything reclaimable is gone until the next free (pages left
        // for the device to pass, and the plan's arenas when they were
        // left out, stay reclaimable).
        self.reclaimable = skipped || (!include_planned && self.ranges.iter().any(|r| r.planned));
        Ok(freed)
    }

    /// The pages lying wholly inside free pieces: `(piece size, range,
    /// first page, end page)`.
    fn free_spans(&self, include_planned: bool) -> Vec<(u64, usize, usize, usize)> {
        let page = self.page;
        let mut spans = Vec::new();
        for (r, range) in self.ranges.iter().enumerate() {
            if range.planned && !include_planned {
                continue;
            }
            for &(size, offset) in &range.free {
                let first = offset.div_ceil(page) as usize;
                // Nothing lives past the end of the range, so a free piece
                // that reaches it owns its last, partly covered page too.
                let end = offset + size;
                let last = if end == range.end {
                    end.div_ceil(page)
                } else {
                    end / page
                };
                let last = (last as usize).min(range.mapped.len());
                if first < last {
                    spans.push((size, r, first, last));
                }
            }
        }
        spans
    }

    /// Waits until `want` more bytes of mapped free pages are behind the
    /// device, the pages freed longest ago first: for each stream, only up
    /// to the last free among them ([`DeviceMemory::wait_free`]), not for
    /// the work queued since.
    fn wait_for_free_pages(&mut self, want: u64, include_planned: bool) -> Result<(), DeviceError> {
        let mut pages: Vec<(u64, usize)> = Vec::new();
        for (_, r, first, last) in self.free_spans(include_planned) {
            let range = &self.ranges[r];
            for p in first..last {
                if range.mapped[p] {
                    pages.push((range.freed_at.get(p).copied().unwrap_or(0), r));
                }
            }
        }
        pages.sort_unstable();
        let mut until: HashMap<StreamId, u64> = HashMap::new();
        for &(seq, r) in pages.iter().take(want.div_ceil(self.page) as usize) {
            let at = until.entry(self.ranges[r].stream).or_insert(0);
            *at = (*at).max(seq);
        }
        for (stream, seq) in until {
            self.device.wait_free(stream, seq)?;
        }
        Ok(())
    }

    /// Backs a freshly carved block with pages, moving free pages first
    /// when the new pages would pass the ceiling or a limit.
    fn back_with_pages(&mut self, r: usize, offset: u64, size: u64) -> Result<bool, AllocError> {
        let needed = self.missing_pages(r, offset, size) * self.page;
        if needed == 0 {
            return Ok(true);
        }
        let reserved = self.stats.reserved_bytes.current;
        let info = self.device.mem_info();
        let allowed = self.config.allowed_bytes(info.total).unwrap_or(u64::MAX);
        // Bytes to give back so that the new pages pass neither the
        // ceiling (the live-page high-water mark plus the allowance) nor a
        // limit.
        let ceiling = self.live_pages_peak * self.page + self.allowance;
        let over_ceiling = (reserved + needed).saturating_sub(ceiling);
        let over_limit = (reserved + needed)
            .saturating_sub(allowed)
            .max(needed.saturating_sub(info.free));
        let want = over_ceiling.max(over_limit);
        if want > 0 && self.reclaimable {
            if over_limit > 0 {
                self.stats.num_alloc_retries += 1;
            } else if !self.moves_keep_the_peak() {
                // Moving pages only to stay under the ceiling: a pattern
                // that needs it once will likely need it again next step
                // (unless a planned layout is expected to take over soon).
                let cap = self.live_page_high_water_bytes() / self.tuning.headroom_cap_divisor;
                self.allowance =
                    (self.allowance + self.tuning.slack_per_move_pages * self.page).min(cap);
            }
            // Pages the device is done with first: moving them costs no
            // wait. Short of those, the ceiling is passed by a little for
            // a while (the pages left behind move once the device is past
            // them); a limit, or a larger shortfall, waits until the device
            // is past the frees of the pages it takes (the oldest), and a
            // limit still short waits for the device to be idle.
            // Before a planned layout takes over, nothing is deferred: the
            // peak reached then is the one the plan starts from.
            let limit = over_limit > 0;
            let deferrable = if self.moves_keep_the_peak() {
                0
            } else {
                self.tuning.deferred_move_pages * self.page
            };
            let mut got = self.reclaim_free_pages(want, true, true, limit)?;
            if self.reclaimable && (over_limit > got || want - got.min(want) > deferrable) {
                self.stats.num_device_waits += 1;
                self.wait_for_free_pages(want - got.min(want), limit)?;
                got += self.reclaim_free_pages(want - got.min(want), true, true, limit)?;
                if over_limit > got && self.reclaimable {
                    self.device.wait_frees()?;
                    self.reclaim_free_pages(over_limit - got, true, false, true)?;
                }
            }
        }
        let mapped = if self.stats.reserved_bytes.current + needed > allowed {
            Ok(false)
        } else {
            match self.map_under(r, offset, size) {
                Ok(()) => Ok(true),
                Err(DeviceError::OutOfMemory { .. }) => Ok(false),
                Err(other) => Err(other.into()),
            }
        };
        self.device.release_parked()?;
        mapped
    }

    /// The largest free piece of any range.
    fn largest_free(&self) -> u64 {
        self.ranges
            .iter()
            .filter_map(|range| range.free.last().map(|&(size, _)| size))
            .max()
            .unwrap_or(0)
    }

    fn out_of_memory(&mut self, size: u64, needed: u64) -> AllocError {
        let largest = self.largest_free();
        OomFacts::record(
            &mut self.stats,
            &self.device,
            &self.config,
            size,
            needed,
            largest,
        )
        .into_error()
    }
}

impl<D: DeviceMemory> GpuAllocator for ExpandableAllocator<D> {
    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        let size = round_request(bytes);
        let planned = self.plan_event(StepEvent::Alloc { size, stream })?;
        let carved = match planned {
            Some((r, offset)) if self.carve_at(r, offset, size) => Some((r, offset)),
            Some(_) => {
                self.plan_failed();
                None
            }
            None => None,
        };
        let (r, offset) = match carved {
            Some(place) => place,
            None => {
                let r = self.range_for(stream, size <= SMALL_REQUEST_BYTES)?;
                let Some(offset) = self.carve(r, size) else {
                    return Err(self.out_of_memory(size, size));
                };
                (r, offset)
            }
        };
        let carved = self.ranges[r].pieces[&offset].size;
        self.touch(r, offset, carved, true);
        if !self.back_with_pages(r, offset, size)? {
            self.touch(r, offset, carved, false);
            let needed = self.missing_pages(r, offset, size) * self.page;
            self.release_piece(r, offset);
            return Err(self.out_of_memory(size, needed));
        }
        let range = &mut self.ranges[r];
        let piece = range.pieces.get_mut(&offset).expect("carved piece exists");
        piece.requested = bytes;
        let kept = piece.size;
        let ptr = range.base + offset;
        self.live.insert(ptr, (r, offset, self.planner.clock));
        self.stats.allocated_bytes.increase(kept);
        self.stats.requested_bytes.increase(bytes);
        self.stats.allocations.increase(1);
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<(), AllocError> {
        let (r, offset, born) = self
            .live
            .remove(&ptr)
            .ok_or(AllocError::UnknownPointer(ptr))?;
        let size = self.ranges[r].pieces[&offset].size;
        // Events from the request to this free (the clock counts this one).
        let age = self.planner.clock + 1 - born;
        self.plan_event(StepEvent::Free { age, size })?;
        self.touch(r, offset, size, false);
        self.free_seq += 1;
        let seq = self.free_seq;
        let range = &mut self.ranges[r];
        let (first, last) = range.page_span(offset, size, self.page);
        if range.freed_at.len() < last {
            range.freed_at.resize(last, 0);
        }
        range.freed_at[first..last].fill(seq);
        let stream = range.stream;
        self.device.note_free(stream, seq);
        let piece = self.release_piece(r, offset);
        self.stats.allocated_bytes.decrease(piece.size);
        self.stats.requested_bytes.decrease(piece.requested);
        self.stats.allocations.decrease(1);
        Ok(())
    }

    fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.reclaimable = true;
        self.device.wait_frees()?;
        self.reclaim_free_pages(u64::MAX, false, false, true)
            .map(|_| ())
            .map_err(AllocError::from)
    }

    fn stats(&self) -> &MemoryStats {
        &self.stats
    }

    fn reset_peak_stats(&mut self) {
        self.stats.reset_peaks();
    }

    fn config_mut(&mut self) -> &mut AllocatorConfig {
        &mut self.config
    }

    fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    fn page_figures(&self) -> Option<(u64, u64)> {
        Some((self.live_page_high_water_bytes(), self.headroom_bytes()))
    }

    fn plan_figures(&self) -> Option<PlanFigures> {
        (!self.config.disable_step_plan).then(|| self.planner.figures())
    }
}

#[cfg(test)]
#[path = "expandable_tests.rs"]
mod tests;
