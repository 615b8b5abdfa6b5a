//! One device's allocator as PyTorch uses it: the policy, plus what
//! PyTorch's pluggable interface needs on top of it (blocks used on other
//! streams, counters in `torch.cuda.memory_stats` form, lifetime peaks).
//!
//! Pure logic over [`GpuAllocator`] and [`StreamEvents`], so that the unit
//! tests run it on a simulated device with fake events.

use std::collections::HashMap;

use serde_json::{Value, json};
use vramfit_alloc_core::stats_file::AllocCounters;
use vramfit_alloc_core::{
    AllocError, DevicePtr, GpuAllocator, MemoryStats, Policy, SMALL_REQUEST_BYTES, StreamId,
    round_request,
};

/// CUDA events, as far as deferred frees need them.
pub trait StreamEvents {
    /// A recorded event.
    type Event;
    /// Records an event on `stream` (`cuEventRecord`).
    fn record(&mut self, stream: StreamId) -> Result<Self::Event, String>;
    /// Whether the work before the event has finished (`cuEventQuery`).
    fn done(&mut self, event: &Self::Event) -> Result<bool, String>;
    /// Waits for the event (`cuEventSynchronize`).
    fn wait(&mut self, event: &Self::Event) -> Result<(), String>;
    /// Gives the event back for reuse.
    fn recycle(&mut self, event: Self::Event);
}

/// A gauge with PyTorch's four figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counter {
    /// Now.
    pub current: u64,
    /// Highest since the last peak reset.
    pub peak: u64,
    /// Sum of increases since the last accumulated-stats reset.
    pub allocated: u64,
    /// Sum of decreases since the last accumulated-stats reset.
    pub freed: u64,
}

impl Counter {
    fn add(&mut self, n: u64) {
        self.current += n;
        self.allocated += n;
        self.peak = self.peak.max(self.current);
    }

    fn sub(&mut self, n: u64) {
        self.current = self.current.saturating_sub(n);
        self.freed += n;
    }

    /// Follows a level kept elsewhere (the policy's reserved bytes).
    fn follow(&mut self, level: u64, peak: u64) {
        if level > self.current {
            self.allocated += level - self.current;
        } else {
            self.freed += self.current - level;
        }
        self.current = level;
        self.peak = self.peak.max(peak).max(level);
    }

    fn json(&self) -> Value {
        json!({"current": self.current, "peak": self.peak,
               "allocated": self.allocated, "freed": self.freed})
    }
}

/// Counters of one pool (PyTorch's small: requests up to 1 MiB; large: the rest).
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolCounters {
    /// Bytes of live blocks (rounded, as the policy keeps them).
    pub bytes: Counter,
    /// Bytes PyTorch asked for.
    pub requested: Counter,
    /// Live blocks.
    pub blocks: Counter,
}

#[derive(Debug)]
struct LiveBlock {
    stream: StreamId,
    size: u64,
    requested: u64,
    small: bool,
    /// Other streams the block was used on (`record_stream`).
    uses: Vec<StreamId>,
}

/// What a refused request reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The message, ready for the user.
    pub message: String,
    /// Whether it is an out-of-memory error (budget or device).
    pub out_of_memory: bool,
    /// Whether the budget refused it.
    pub budget: bool,
}

/// One device's allocator and its bookkeeping.
pub struct DeviceState<E: StreamEvents> {
    alloc: Box<dyn GpuAllocator + Send>,
    events: E,
    policy: Policy,
    device: u32,
    live: HashMap<DevicePtr, LiveBlock>,
    /// Blocks PyTorch freed that other streams may still use, with the
    /// events recorded on those streams at the time.
    pending: Vec<(DevicePtr, Vec<E::Event>)>,
    small: PoolCounters,
    large: PoolCounters,
    reserved: Counter,
    segments: Counter,
    /// Accumulated counters at the last reset of accumulated stats.
    base_ooms: u64,
    base_retries: u64,
    base_device_allocs: u64,
    base_device_frees: u64,
    syncs: u64,
    /// Peaks since the process started (not cleared by peak resets).
    lifetime_peak_allocated: u64,
    lifetime_peak_reserved: u64,
    /// Out-of-memory errors since the process started.
    lifetime_ooms: u64,
    /// `record_stream` calls that named a live block and another stream.
    record_streams: u64,
    /// Frees held back for other streams (each waited for events).
    held_back_frees: u64,
}

impl<E: StreamEvents> DeviceState<E> {
    /// Wraps `alloc`, the `policy` allocator of device `device`.
    pub fn new(
        alloc: Box<dyn GpuAllocator + Send>,
        events: E,
        policy: Policy,
        device: u32,
    ) -> Self {
        Self {
            alloc,
            events,
            policy,
            device,
            live: HashMap::new(),
            pending: Vec::new(),
            small: PoolCounters::default(),
            large: PoolCounters::default(),
            reserved: Counter::default(),
            segments: Counter::default(),
            base_ooms: 0,
            base_retries: 0,
            base_device_allocs: 0,
            base_device_frees: 0,
            syncs: 0,
            lifetime_peak_allocated: 0,
            lifetime_peak_reserved: 0,
            lifetime_ooms: 0,
            record_streams: 0,
            held_back_frees: 0,
        }
    }

    /// The policy's counters.
    pub fn core_stats(&self) -> &MemoryStats {
        self.alloc.stats()
    }

    /// The budget in force (bytes; 0 when none).
    pub fn budget(&self) -> u64 {
        self.alloc.config().budget_bytes.unwrap_or(0)
    }

    /// Blocks freed by PyTorch but held back for other streams.
    pub fn pending_frees(&self) -> usize {
        self.pending.len()
    }

    /// What the vramfit policy's step planner did (`None`: no planner).
    pub fn plan_figures(&self) -> Option<vramfit_alloc_core::PlanFigures> {
        self.alloc.plan_figures()
    }

    /// The page policy's `(live-page high-water mark, headroom)` in bytes.
    pub fn page_figures(&self) -> Option<(u64, u64)> {
        self.alloc.page_figures()
    }

    /// `(record_stream calls that named a live block of this device and
    /// another stream, frees held back for other streams)` since the
    /// process started: whether PyTorch's hook reaches the library at all.
    pub fn stream_counters(&self) -> (u64, u64) {
        (self.record_streams, self.held_back_frees)
    }

    /// Allocates `bytes` for `stream`. On a refusal, blocks held back for
    /// other streams are waited for and the request is tried once more, as
    /// PyTorch's allocator does (`synchronize_and_free_events`).
    pub fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, Refusal> {
        if !self.pending.is_empty() {
            self.collect_pending(false)?;
        }
        let before = self.alloc.stats().allocated_bytes.current;
        let result = match self.alloc.allocate(bytes, stream) {
            Err(AllocError::OutOfMemory { .. }) if !self.pending.is_empty() => {
                self.collect_pending(true)?;
                self.alloc.allocate(bytes, stream)
            }
            other => other,
        };
        self.follow_reserved();
        match result {
            Ok(ptr) => {
                let size = self.alloc.stats().allocated_bytes.current - before;
                let small = round_request(bytes) <= SMALL_REQUEST_BYTES;
                let pool = if small {
                    &mut self.small
                } else {
                    &mut self.large
                };
                pool.bytes.add(size);
                pool.requested.add(bytes);
                pool.blocks.add(1);
                self.live.insert(
                    ptr,
                    LiveBlock {
                        stream,
                        size,
                        requested: bytes,
                        small,
                        uses: Vec::new(),
                    },
                );
                self.lifetime_peak_allocated = self
                    .lifetime_peak_allocated
                    .max(self.alloc.stats().allocated_bytes.current);
                Ok(ptr)
            }
            Err(err) => {
                let (out_of_memory, budget) = match &err {
                    AllocError::OutOfMemory {
                        budget_exceeded, ..
                    } => (true, *budget_exceeded),
                    _ => (false, false),
                };
                if out_of_memory {
                    self.lifetime_ooms += 1;
                }
                Err(Refusal {
                    message: err.to_string(),
                    out_of_memory,
                    budget,
                })
            }
        }
    }

    /// PyTorch's `record_stream`: the block at `ptr` is also used on
    /// `stream`. Returns whether `ptr` is a live block of this device.
    pub fn record_stream(&mut self, ptr: DevicePtr, stream: StreamId) -> bool {
        let Some(block) = self.live.get_mut(&ptr) else {
            return false;
        };
        if block.stream != stream {
            self.record_streams += 1;
            if !block.uses.contains(&stream) {
                block.uses.push(stream);
            }
        }
        true
    }

    /// PyTorch freed the block at `ptr`. A block used on other streams goes
    /// back to the cache only once the work queued on them so far is done.
    pub fn free(&mut self, ptr: DevicePtr) -> Result<(), Refusal> {
        let Some(block) = self.live.get_mut(&ptr) else {
            return Err(plain(format!(
                "vramfit allocator: free of {ptr:#x}, which it did not hand out"
            )));
        };
        if block.uses.is_empty() {
            return self.release(ptr);
        }
        let uses = std::mem::take(&mut block.uses);
        let mut events = Vec::with_capacity(uses.len());
        for stream in uses {
            events.push(self.events.record(stream).map_err(plain)?);
        }
        self.pending.push((ptr, events));
        self.held_back_frees += 1;
        Ok(())
    }

    /// `torch.cuda.empty_cache()`: waits for held-back blocks, then gives
    /// every cached block (or free page) back to the driver.
    pub fn empty_cache(&mut self) -> Result<(), Refusal> {
        self.collect_pending(true)?;
        let result = self.alloc.empty_cache();
        self.follow_reserved();
        result.map_err(|e| plain(e.to_string()))
    }

    /// `torch.cuda.set_per_process_memory_fraction`.
    pub fn set_memory_fraction(&mut self, fraction: f64) {
        self.alloc.config_mut().memory_fraction = Some(fraction);
    }

    /// `torch.cuda.reset_peak_memory_stats`.
    pub fn reset_peaks(&mut self) {
        self.alloc.reset_peak_stats();
        for pool in [&mut self.small, &mut self.large] {
            for c in [&mut pool.bytes, &mut pool.requested, &mut pool.blocks] {
                c.peak = c.current;
            }
        }
        self.reserved.peak = self.reserved.current;
        self.segments.peak = self.segments.current;
    }

    /// `torch.cuda.reset_accumulated_memory_stats`.
    pub fn reset_accumulated(&mut self) {
        for pool in [&mut self.small, &mut self.large] {
            for c in [&mut pool.bytes, &mut pool.requested, &mut pool.blocks] {
                c.allocated = 0;
                c.freed = 0;
            }
        }
        for c in [&mut self.reserved, &mut self.segments] {
            c.allocated = 0;
            c.freed = 0;
        }
        let s = self.alloc.stats();
        self.base_ooms = s.num_ooms;
        self.base_retries = s.num_alloc_retries;
        self.base_device_allocs = s.num_device_allocs;
        self.base_device_frees = s.num_device_frees;
        self.syncs = 0;
    }

    fn release(&mut self, ptr: DevicePtr) -> Result<(), Refusal> {
        let block = self.live.remove(&ptr).expect("caller checked");
        self.alloc.free(ptr).map_err(|e| plain(e.to_string()))?;
        let pool = if block.small {
            &mut self.small
        } else {
            &mut self.large
        };
        pool.bytes.sub(block.size);
        pool.requested.sub(block.requested);
        pool.blocks.sub(1);
        Ok(())
    }

    /// Frees held-back blocks whose events completed (all of them, waiting
    /// for each, when `wait`).
    fn collect_pending(&mut self, wait: bool) -> Result<(), Refusal> {
        if wait && !self.pending.is_empty() {
            self.syncs += 1;
        }
        let mut index = 0;
        while index < self.pending.len() {
            let mut ready = true;
            for event in &self.pending[index].1 {
                if wait {
                    self.events.wait(event).map_err(plain)?;
                } else if !self.events.done(event).map_err(plain)? {
                    ready = false;
                    break;
                }
            }
            if ready {
                let (ptr, events) = self.pending.swap_remove(index);
                for event in events {
                    self.events.recycle(event);
                }
                self.release(ptr)?;
            } else {
                index += 1;
            }
        }
        Ok(())
    }

    fn follow_reserved(&mut self) {
        let s = self.alloc.stats();
        let (level, peak, segments) = (s.reserved_bytes.current, s.reserved_bytes.peak, s.segments);
        self.reserved.follow(level, peak);
        self.segments.follow(segments.current, segments.peak);
        self.lifetime_peak_reserved = self.lifetime_peak_reserved.max(peak);
    }

    /// The counters as `torch._C._cuda_memoryStats` returns them (nested).
    ///
    /// Exact: allocated, requested and active bytes and blocks per pool, the
    /// reserved bytes and segments overall, retries, OOMs, device calls.
    /// Not tracked: the reserved bytes and segments per pool (both pools
    /// show 0), inactive split blocks and oversize blocks (0).
    pub fn torch_stats(&self) -> Value {
        let s = self.alloc.stats();
        let zero = Counter::default();
        let per_pool = |pick: fn(&PoolCounters) -> Counter| {
            let (small, large) = (pick(&self.small), pick(&self.large));
            // The peak of the sum is set from the policy's own peak below.
            let all = Counter {
                current: small.current + large.current,
                peak: 0,
                allocated: small.allocated + large.allocated,
                freed: small.freed + large.freed,
            };
            (all, small, large)
        };
        let pools = |(all, small, large): (Counter, Counter, Counter)| json!({"all": all.json(), "small_pool": small.json(), "large_pool": large.json()});
        let (mut bytes_all, bytes_small, bytes_large) = per_pool(|p| p.bytes);
        bytes_all.peak = s.allocated_bytes.peak;
        let (mut req_all, req_small, req_large) = per_pool(|p| p.requested);
        req_all.peak = s.requested_bytes.peak;
        let (mut blocks_all, blocks_small, blocks_large) = per_pool(|p| p.blocks);
        blocks_all.peak = s.allocations.peak;
        let bytes = pools((bytes_all, bytes_small, bytes_large));
        let blocks = pools((blocks_all, blocks_small, blocks_large));
        json!({
            "allocated_bytes": bytes,
            "active_bytes": bytes,
            "requested_bytes": pools((req_all, req_small, req_large)),
            "reserved_bytes": pools((self.reserved, zero, zero)),
            "inactive_split_bytes": pools((zero, zero, zero)),
            "allocation": blocks,
            "active": blocks,
            "segment": pools((self.segments, zero, zero)),
            "inactive_split": pools((zero, zero, zero)),
            "oversize_allocations": zero.json(),
            "oversize_segments": zero.json(),
            "num_alloc_retries": s.num_alloc_retries - self.base_retries,
            "num_ooms": s.num_ooms - self.base_ooms,
            "num_sync_all_streams": self.syncs,
            "num_device_alloc": s.num_device_allocs - self.base_device_allocs,
            "num_device_free": s.num_device_frees - self.base_device_frees,
            "max_split_size": -1,
        })
    }

    /// The counters the node agent reads (docs/node-protocol.md), without
    /// the `pid` and time the publisher adds.
    pub fn published(&self) -> AllocCounters {
        let s = self.alloc.stats();
        AllocCounters {
            device: self.device,
            policy: self.policy.to_string(),
            budget_bytes: self.budget(),
            allocated_bytes: s.allocated_bytes.current,
            reserved_bytes: s.reserved_bytes.current,
            peak_allocated_bytes: self.lifetime_peak_allocated,
            peak_reserved_bytes: self.lifetime_peak_reserved.max(s.reserved_bytes.peak),
            num_ooms: self.lifetime_ooms,
        }
    }
}

fn plain(message: String) -> Refusal {
    Refusal {
        message,
        out_of_memory: false,
        budget: false,
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
