//! The allocator benchmark: one fixed, seeded mix of allocations and frees,
//! timed through any allocator. `scripts/gpu/bench_torch_alloc.py` draws the
//! same mix for PyTorch's allocator.

use std::time::Instant;

use serde::{Deserialize, Serialize};
use vramfit::alloc::{AllocEvent, DevicePtr, GpuAllocator};

/// Live blocks the mix keeps around, like tensors alive in a training step.
pub const LIVE_WINDOW: usize = 64;

/// A small PCG-style generator; the Python script implements the same one.
struct MixRng(u64);

impl MixRng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    /// 60% small (512 B - 1 MiB, powers of two), 30% 1-10 MiB, 10% 10-256 MiB.
    fn size(&mut self) -> u64 {
        match self.next() % 100 {
            0..60 => 512 << (self.next() % 12),
            60..90 => (1 << 20) + self.next() % (9 << 20),
            _ => (10 << 20) + self.next() % (246 << 20),
        }
    }
}

/// The benchmark's sequence: `ops` events; block ids count up from 0.
pub fn size_mix(ops: usize, seed: u64) -> Vec<AllocEvent> {
    let mut rng = MixRng(seed);
    let mut live: Vec<u64> = Vec::new();
    let mut events = Vec::with_capacity(ops);
    let mut next_id = 0;
    for _ in 0..ops {
        if live.len() < LIVE_WINDOW / 2
            || (live.len() < LIVE_WINDOW && rng.next().is_multiple_of(2))
        {
            events.push(AllocEvent::Alloc {
                id: next_id,
                bytes: rng.size(),
                stream: 0,
            });
            live.push(next_id);
            next_id += 1;
        } else {
            let index = (rng.next() % live.len() as u64) as usize;
            events.push(AllocEvent::Free {
                id: live.swap_remove(index),
            });
        }
    }
    events
}

/// Timings of one allocator on the mix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BenchRow {
    /// What was measured.
    pub name: String,
    /// Allocations timed.
    pub allocs: u64,
    /// Frees timed.
    pub frees: u64,
    /// Median latency of one allocation, in microseconds.
    pub alloc_p50_us: f64,
    /// 99th percentile latency of one allocation.
    pub alloc_p99_us: f64,
    /// Median latency of one free.
    pub free_p50_us: f64,
    /// 99th percentile latency of one free.
    pub free_p99_us: f64,
    /// Allocations plus frees per second over the whole run.
    pub ops_per_second: f64,
    /// Reserved peak of the allocator (0 when it does not cache).
    pub peak_reserved_bytes: u64,
    /// Share of the timed allocations served from a planned step layout
    /// (0 for allocators without one).
    #[serde(default)]
    pub planned_share: f64,
}

/// Timed allocate/free calls, whatever performs them.
pub trait TimedAllocator {
    /// Allocates `bytes`.
    fn alloc(&mut self, bytes: u64) -> crate::Result<DevicePtr>;
    /// Frees `ptr` (allocated with `bytes`).
    fn release(&mut self, ptr: DevicePtr, bytes: u64) -> crate::Result<()>;
    /// Reserved peak so far.
    fn peak_reserved(&self) -> u64;
    /// Allocations served from a planned step layout so far.
    fn plan_served(&self) -> u64 {
        0
    }
}

impl<A: GpuAllocator + ?Sized> TimedAllocator for Box<A> {
    fn alloc(&mut self, bytes: u64) -> crate::Result<DevicePtr> {
        Ok(self.allocate(bytes, 0)?)
    }

    fn release(&mut self, ptr: DevicePtr, _bytes: u64) -> crate::Result<()> {
        Ok(self.free(ptr)?)
    }

    fn peak_reserved(&self) -> u64 {
        self.stats().reserved_bytes.peak
    }

    fn plan_served(&self) -> u64 {
        self.plan_figures().map_or(0, |f| f.served)
    }
}

fn percentile(sorted: &[f64], share: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * share).round() as usize]
}

/// Runs `events` through `allocator` `rounds` times (the first round warms
/// caches and is not timed), then frees what is left.
pub fn run_mix(
    name: &str,
    allocator: &mut dyn TimedAllocator,
    events: &[AllocEvent],
    rounds: usize,
) -> crate::Result<BenchRow> {
    run_mix_after(name, allocator, events, rounds, 1)
}

/// Runs `events` through `allocator` `rounds` times and times all but the
/// first `untimed` rounds (at least one is timed), then frees what is left.
/// Leaving out the rounds in which a policy settles (finds and lays out a
/// plan) measures its steady state.
pub fn run_mix_after(
    name: &str,
    allocator: &mut dyn TimedAllocator,
    events: &[AllocEvent],
    rounds: usize,
    untimed: usize,
) -> crate::Result<BenchRow> {
    let mut alloc_us = Vec::new();
    let mut free_us = Vec::new();
    let mut timed = std::time::Duration::ZERO;
    let mut served_before = 0;
    for round in 0..rounds.max(untimed + 1) {
        if round == untimed {
            served_before = allocator.plan_served();
        }
        let mut ptrs = std::collections::HashMap::new();
        for event in events {
            match *event {
                AllocEvent::Alloc { id, bytes, .. } => {
                    let start = Instant::now();
                    let ptr = allocator.alloc(bytes)?;
                    let took = start.elapsed();
                    if round >= untimed {
                        alloc_us.push(took.as_secs_f64() * 1e6);
                        timed += took;
                    }
                    ptrs.insert(id, (ptr, bytes));
                }
                AllocEvent::Free { id } => {
                    let (ptr, bytes) = ptrs.remove(&id).expect("mix frees live blocks");
                    let start = Instant::now();
                    allocator.release(ptr, bytes)?;
                    let took = start.elapsed();
                    if round >= untimed {
                        free_us.push(took.as_secs_f64() * 1e6);
                        timed += took;
                    }
                }
                AllocEvent::ReleaseSegment { .. } => {}
            }
        }
        // In id order, so that every pass is the same sequence.
        let mut left: Vec<_> = ptrs.into_iter().collect();
        left.sort_unstable_by_key(|(id, _)| *id);
        for (_, (ptr, bytes)) in left {
            allocator.release(ptr, bytes)?;
        }
    }
    let ops = (alloc_us.len() + free_us.len()) as f64;
    let planned = allocator.plan_served().saturating_sub(served_before);
    let planned_share = if alloc_us.is_empty() {
        0.0
    } else {
        planned as f64 / alloc_us.len() as f64
    };
    alloc_us.sort_by(f64::total_cmp);
    free_us.sort_by(f64::total_cmp);
    Ok(BenchRow {
        name: name.to_owned(),
        allocs: alloc_us.len() as u64,
        frees: free_us.len() as u64,
        alloc_p50_us: percentile(&alloc_us, 0.5),
        alloc_p99_us: percentile(&alloc_us, 0.99),
        free_p50_us: percentile(&free_us, 0.5),
        free_p99_us: percentile(&free_us, 0.99),
        ops_per_second: if timed.is_zero() {
            0.0
        } else {
            ops / timed.as_secs_f64()
        },
        peak_reserved_bytes: allocator.peak_reserved(),
        planned_share,
    })
}

#[cfg(test)]
#[path = "bench_tests.rs"]
mod tests;
