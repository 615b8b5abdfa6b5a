//! The allocator model behind the predictor: replays a tensor event sequence
//! and reports the caching allocator's reserved peak and what was alive then.
//!
//! The built-in model follows PyTorch's `CUDACachingAllocator` policy closely
//! enough for prediction (512-byte rounding; requests up to 1 MiB from 2 MiB
//! segments; up to 10 MiB from 20 MiB segments; larger ones in their own
//! segment rounded to 2 MiB; best fit, splitting and coalescing; nothing is
//! ever returned to the device). It sits behind [`AllocatorModel`] so the full
//! allocator in `src/alloc` can replace it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::events::{Category, TensorEvent};

const SMALL_REQUEST: u64 = 1 << 20;
const SMALL_SEGMENT: u64 = 2 << 20;
const LARGE_SEGMENT: u64 = 20 << 20;
const MIN_LARGE_ALLOC: u64 = 10 << 20;
const ROUND_LARGE: u64 = 2 << 20;

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
}

impl LiveBytes {
    fn slot(&mut self, c: Category) -> &mut u64 {
        match c {
            Category::Parameters => &mut self.parameters,
            Category::Gradients => &mut self.gradients,
            Category::Optimizer => &mut self.optimizer,
            Category::Activations => &mut self.activations,
            Category::Workspace => &mut self.workspace,
        }
    }
    /// Sum over categories.
    pub fn total(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer + self.activations + self.workspace
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
}

/// An allocator model: events in, reserved peak out.
pub trait AllocatorModel {
    /// Replays `events` from an empty cache.
    fn replay(&self, events: &[TensorEvent]) -> ReplayOutcome;
}

/// The reserved peak of `events` under the built-in PyTorch-policy model.
pub fn reserved_peak(events: &[TensorEvent]) -> u64 {
    CachingModel.replay(events).reserved_peak
}

/// The built-in PyTorch-policy allocator model.
#[derive(Clone, Copy, Debug, Default)]
pub struct CachingModel;

/// PyTorch's request rounding.
pub fn round_request(bytes: u64) -> u64 {
    bytes.max(1).div_ceil(512) * 512
}

fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_REQUEST {
        SMALL_SEGMENT
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_SEGMENT
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

#[derive(Clone, Copy)]
struct Block {
    size: u64,
    free: bool,
}

#[derive(Default)]
struct Pool {
    /// (size, segment, offset) of free blocks, for best fit.
    free: BTreeSet<(u64, usize, u64)>,
}

struct State {
    segments: Vec<BTreeMap<u64, Block>>,
    small: Pool,
    large: Pool,
    seg_small: Vec<bool>,
    reserved: u64,
}

impl State {
    fn pool(&mut self, small: bool) -> &mut Pool {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    fn malloc(&mut self, bytes: u64) -> (usize, u64) {
        let size = round_request(bytes);
        let small = size <= SMALL_REQUEST;
        let found = self.pool(small).free.range((size, 0, 0)..).next().copied();
        let (seg, off, bsize) = match found {
            Some((bsize, seg, off)) => {
                self.pool(small).free.remove(&(bsize, seg, off));
                (seg, off, bsize)
            }
            None => {
                let s = segment_size(size);
                self.segments.push(BTreeMap::from([(
                    0,
                    Block {
                        size: s,
                        free: true,
                    },
                )]));
                self.seg_small.push(small);
                self.reserved += s;
                (self.segments.len() - 1, 0, s)
            }
        };
        let rest = bsize - size;
        // PyTorch splits small blocks down to 512 B and large ones only when
        // more than 1 MiB would remain.
        let split = if small {
            rest >= 512
        } else {
            rest > SMALL_REQUEST
        };
        let used = if split { size } else { bsize };
        self.segments[seg].insert(
            off,
            Block {
                size: used,
                free: false,
            },
        );
        if split {
            self.segments[seg].insert(
                off + size,
                Block {
                    size: rest,
                    free: true,
                },
            );
            self.pool(small).free.insert((rest, seg, off + size));
        }
        (seg, off)
    }

    fn release(&mut self, seg: usize, off: u64) {
        let small = self.seg_small[seg];
        let mut start = off;
        let mut size = self.segments[seg][&off].size;
        // merge with the free neighbour after
        if let Some((&noff, &nb)) = self.segments[seg].range(off + 1..).next()
            && nb.free
            && noff == off + size
        {
            self.segments[seg].remove(&noff);
            self.pool(small).free.remove(&(nb.size, seg, noff));
            size += nb.size;
        }
        // and before
        if let Some((&poff, &pb)) = self.segments[seg].range(..off).next_back()
            && pb.free
            && poff + pb.size == off
        {
            self.segments[seg].remove(&off);
            self.pool(small).free.remove(&(pb.size, seg, poff));
            start = poff;
            size += pb.size;
        }
        self.segments[seg].insert(start, Block { size, free: true });
        self.pool(small).free.insert((size, seg, start));
    }
}

impl AllocatorModel for CachingModel {
    fn replay(&self, events: &[TensorEvent]) -> ReplayOutcome {
        let mut st = State {
            segments: Vec::new(),
            small: Pool::default(),
            large: Pool::default(),
            seg_small: Vec::new(),
            reserved: 0,
        };
        let mut where_: HashMap<u32, (usize, u64, u64, Category)> = HashMap::new();
        let mut live = LiveBytes::default();
        let mut out = ReplayOutcome::default();
        for e in events {
            match *e {
                TensorEvent::Alloc {
                    id,
                    bytes,
                    category,
                } => {
                    let (seg, off) = st.malloc(bytes);
                    where_.insert(id, (seg, off, bytes, category));
                    *live.slot(category) += bytes;
                    out.allocated_peak = out.allocated_peak.max(live.total());
                    if st.reserved > out.reserved_peak {
                        out.reserved_peak = st.reserved;
                        out.live_at_peak = live;
                    } else if st.reserved == out.reserved_peak
                        && live.total() > out.live_at_peak.total()
                    {
                        // Report the fullest moment at the peak reservation.
                        out.live_at_peak = live;
                    }
                }
                TensorEvent::Free { id } => {
                    if let Some((seg, off, bytes, category)) = where_.remove(&id) {
                        *live.slot(category) -= bytes;
                        st.release(seg, off);
                    }
                }
            }
        }
        out
    }
}
