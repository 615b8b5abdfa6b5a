//! PyTorch's `CUDACachingAllocator` policy (native backend).
//!
//! Followed rule by rule so that replaying a PyTorch trace asks the device for
//! the same segments in the same order: requests are rounded to 512 bytes;
//! requests up to 1 MiB come from the small pool and its 2 MiB segments,
//! larger ones from the large pool (20 MiB segments below 10 MiB, else the
//! request rounded to 2 MiB); the smallest cached block of the same stream
//! that fits wins, ties going to the lower address; a block is split when the
//! remainder is at least 512 bytes (small pool) or more than 1 MiB (large
//! pool); freed blocks merge with free neighbours of the same segment. When
//! the device refuses, oversize cached blocks (with `max_split_size`) and then
//! every unsplit cached segment are released before the request fails.

use std::collections::{BTreeSet, HashMap};

use super::GpuAllocator;
use super::config::{
    AllocatorConfig, LARGE_SEGMENT_BYTES, MIN_BLOCK_BYTES, SMALL_REQUEST_BYTES, round_request,
    segment_bytes_for,
};
use super::device::{DeviceError, DeviceMemory, DevicePtr, StreamId};
use super::error::{AllocError, OomFacts};
use super::stats::MemoryStats;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PoolKind {
    Small,
    Large,
}

/// A piece of a segment: handed out, or cached in its pool.
#[derive(Debug, Clone)]
struct Block {
    ptr: DevicePtr,
    size: u64,
    requested: u64,
    stream: StreamId,
    pool: PoolKind,
    /// Neighbours in the same segment (by start address), as PyTorch's
    /// `prev`/`next`: a block with neither is a whole segment.
    prev: Option<DevicePtr>,
    next: Option<DevicePtr>,
    allocated: bool,
    /// Value of the pool's search counter when this block was cached, for the
    /// garbage collector's notion of age.
    gc_base: u64,
}

impl Block {
    fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}

/// The cached blocks of one pool, ordered as PyTorch's `BlockComparatorSize`.
#[derive(Debug, Default)]
struct BlockPool {
    free: BTreeSet<(StreamId, u64, DevicePtr)>,
    search_calls: u64,
}

/// A caching allocator with PyTorch's policy over a [`DeviceMemory`] backend.
pub struct PytorchAllocator<D: DeviceMemory> {
    device: D,
    config: AllocatorConfig,
    blocks: HashMap<DevicePtr, Block>,
    small: BlockPool,
    large: BlockPool,
    stats: MemoryStats,
}

impl<D: DeviceMemory> PytorchAllocator<D> {
    /// An empty allocator over `device`.
    pub fn new(device: D, config: AllocatorConfig) -> Self {
        Self {
            device,
            config,
            blocks: HashMap::new(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            stats: MemoryStats::default(),
        }
    }

    /// The backend, e.g. to read a simulated device's call counts.
    pub fn device(&self) -> &D {
        &self.device
    }

    fn pool(&mut self, kind: PoolKind) -> &mut BlockPool {
        match kind {
            PoolKind::Small => &mut self.small,
            PoolKind::Large => &mut self.large,
        }
    }

    fn max_split(&self) -> u64 {
        self.config.max_split_size.unwrap_or(u64::MAX)
    }

    fn gc_enabled(&self) -> bool {
        self.config.memory_fraction.is_some()
            && self.config.garbage_collection_threshold.unwrap_or(0.0) > 0.0
    }

    fn cache(&mut self, mut block: Block) {
        block.allocated = false;
        let pool = self.pool(block.pool);
        block.gc_base = pool.search_calls;
        pool.free.insert((block.stream, block.size, block.ptr));
        self.blocks.insert(block.ptr, block);
    }

    fn uncache(&mut self, ptr: DevicePtr) -> Block {
        let block = self.blocks.remove(&ptr).expect("cached block exists");
        let key = (block.stream, block.size, block.ptr);
        self.pool(block.pool).free.remove(&key);
        block
    }

    /// Best fit: the smallest cached block of the stream that holds `size`.
    fn find_free_block(
        &mut self,
        kind: PoolKind,
        size: u64,
        stream: StreamId,
    ) -> Option<DevicePtr> {
        let gc = self.gc_enabled();
        let max_split = self.max_split();
        let pool = self.pool(kind);
        if gc {
            pool.search_calls += 1;
        }
        let &(found_stream, found_size, ptr) = pool.free.range((stream, size, 0)..).next()?;
        if found_stream != stream {
            return None;
        }
        // Oversize blocks are kept for oversize requests, and only for those
        // that would not waste more than a large segment of them.
        if size < max_split && found_size >= max_split {
            return None;
        }
        if size >= max_split && found_size >= size + LARGE_SEGMENT_BYTES {
            return None;
        }
        Some(ptr)
    }

    /// Asks the device for a new segment; `Ok(None)` when it has no room.
    fn alloc_segment(
        &mut self,
        kind: PoolKind,
        segment: u64,
        stream: StreamId,
        is_retry: bool,
    ) -> Result<Option<DevicePtr>, AllocError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        let total = self.device.mem_info().total;
        if let Some(allowed) = self.config.allowed_bytes(total)
            && self.stats.reserved_bytes.current + segment > allowed
        {
            return Ok(None);
        }
        let ptr = match self.device.malloc(segment) {
            Ok(ptr) => ptr,
            Err(DeviceError::OutOfMemory { .. }) => return Ok(None),
            Err(other) => return Err(other.into()),
        };
        self.stats.num_device_allocs += 1;
        self.stats.reserved_bytes.increase(segment);
        self.stats.segments.increase(1);
        self.blocks.insert(
            ptr,
            Block {
                ptr,
                size: segment,
                requested: 0,
                stream,
                pool: kind,
                prev: None,
                next: None,
                allocated: false,
                gc_base: 0,
            },
        );
        Ok(Some(ptr))
    }

    /// Frees one cached block that is a whole segment.
    fn release_segment(&mut self, ptr: DevicePtr) -> Result<(), AllocError> {
        let block = self.uncache(ptr);
        debug_assert!(!block.is_split() && !block.allocated);
        self.device.free(block.ptr, block.size)?;
        self.stats.num_device_frees += 1;
        self.stats.reserved_bytes.decrease(block.size);
        self.stats.segments.decrease(1);
        Ok(())
    }

    /// Releases every cached block that is a whole segment
    /// (`release_cached_blocks`). Returns whether anything was freed.
    fn release_cached_segments(&mut self) -> Result<bool, AllocError> {
        let whole: Vec<DevicePtr> = self
            .large
            .free
            .iter()
            .chain(self.small.free.iter())
            .map(|&(_, _, ptr)| ptr)
            .filter(|ptr| !self.blocks[ptr].is_split())
            .collect();
        for &ptr in &whole {
            self.release_segment(ptr)?;
        }
        Ok(!whole.is_empty())
    }

    /// With `max_split_size` set, frees oversize cached segments of the
    /// stream, largest first, until `size` bytes are released
    /// (`release_available_cached_blocks`).
    fn release_oversize_segments(
        &mut self,
        kind: PoolKind,
        size: u64,
        stream: StreamId,
    ) -> Result<bool, AllocError> {
        let max_split = self.max_split();
        if max_split == u64::MAX {
            return Ok(false);
        }
        let wanted = size.max(max_split);
        let pool = self.pool(kind);
        if let Some(&(s, _, ptr)) = pool.free.range((stream, wanted, 0)..).next()
            && s == stream
        {
            self.release_segment(ptr)?;
            return Ok(true);
        }
        let candidates: Vec<(u64, DevicePtr)> = pool
            .free
            .range(..(stream, wanted, 0))
            .rev()
            .take_while(|&&(s, sz, _)| s == stream && sz >= max_split)
            .map(|&(_, sz, ptr)| (sz, ptr))
            .collect();
        let mut released = 0;
        for (sz, ptr) in candidates {
            if released >= wanted {
                break;
            }
            self.release_segment(ptr)?;
            released += sz;
        }
        Ok(released >= wanted)
    }

    /// With a memory fraction and `garbage_collection_threshold`, frees the
    /// least recently reused whole segments of the large pool once reserved
    /// memory passes the threshold (`garbage_collect_cached_blocks`).
    fn collect_garbage(&mut self) -> Result<(), AllocError> {
        let total = self.device.mem_info().total;
        let (Some(allowed), Some(threshold)) = (
            self.config.allowed_bytes(total),
            self.config.garbage_collection_threshold,
        ) else {
            return Ok(());
        };
        let limit = (threshold * allowed as f64) as u64;
        let reserved = self.stats.reserved_bytes.current;
        if reserved <= limit {
            return Ok(());
        }
        let target = reserved - limit;
        let now = self.large.search_calls;
        let mut aged: Vec<(DevicePtr, u64, u64)> = self
            .large
            .free
            .iter()
            .map(|&(_, size, ptr)| (ptr, size, now - self.blocks[&ptr].gc_base))
            .filter(|(ptr, _, _)| !self.blocks[ptr].is_split())
            .collect();
        let mut reclaimed = 0;
        while reclaimed < target && !aged.is_empty() {
            let mean_age = aged.iter().map(|a| a.2 as f64).sum::<f64>() / aged.len() as f64;
            let (old, young): (Vec<_>, Vec<_>) =
                aged.into_iter().partition(|a| a.2 as f64 >= mean_age);
            if old.is_empty() {
                break;
            }
            for (ptr, size, _) in old {
                self.release_segment(ptr)?;
                reclaimed += size;
            }
            aged = young;
        }
        Ok(())
    }

    fn should_split(&self, block: &Block, size: u64) -> bool {
        let remaining = block.size - size;
        match block.pool {
            PoolKind::Small => remaining >= MIN_BLOCK_BYTES,
            PoolKind::Large => size < self.max_split() && remaining > SMALL_REQUEST_BYTES,
        }
    }

    /// The largest cached block of either pool.
    fn largest_free(&self) -> u64 {
        self.small
            .free
            .iter()
            .chain(self.large.free.iter())
            .map(|&(_, size, _)| size)
            .max()
            .unwrap_or(0)
    }

    fn out_of_memory(&mut self, size: u64) -> AllocError {
        let largest = self.largest_free();
        OomFacts::record(
            &mut self.stats,
            &self.device,
            &self.config,
            size,
            segment_bytes_for(size),
            largest,
        )
        .into_error()
    }
}

impl<D: DeviceMemory> GpuAllocator for PytorchAllocator<D> {
    fn allocate(&mut self, bytes: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        let size = round_request(bytes);
        let kind = if size <= SMALL_REQUEST_BYTES {
            PoolKind::Small
        } else {
            PoolKind::Large
        };
        let mut block = match self.find_free_block(kind, size, stream) {
            Some(ptr) => self.uncache(ptr),
            None => {
                if self.gc_enabled() {
                    self.collect_garbage()?;
                }
                let segment = segment_bytes_for(size);
                let mut got = self.alloc_segment(kind, segment, stream, false)?;
                if got.is_none() && self.release_oversize_segments(kind, size, stream)? {
                    got = self.alloc_segment(kind, segment, stream, false)?;
                }
                if got.is_none() && self.release_cached_segments()? {
                    got = self.alloc_segment(kind, segment, stream, true)?;
                }
                match got {
                    Some(ptr) => self.blocks.remove(&ptr).expect("new segment is recorded"),
                    None => return Err(self.out_of_memory(size)),
                }
            }
        };
        let ptr = block.ptr;
        if self.should_split(&block, size) {
            let remainder = Block {
                ptr: block.ptr + size,
                size: block.size - size,
                requested: 0,
                stream: block.stream,
                pool: block.pool,
                prev: Some(block.ptr),
                next: block.next,
                allocated: false,
                gc_base: 0,
            };
            if let Some(next) = remainder.next {
                self.blocks.get_mut(&next).expect("neighbour exists").prev = Some(remainder.ptr);
            }
            block.next = Some(remainder.ptr);
            block.size = size;
            self.cache(remainder);
        }
        block.allocated = true;
        block.requested = bytes;
        self.stats.allocated_bytes.increase(block.size);
        self.stats.requested_bytes.increase(bytes);
        self.stats.allocations.increase(1);
        self.blocks.insert(ptr, block);
        Ok(ptr)
    }

    fn free(&mut self, ptr: DevicePtr) -> Result<(), AllocError> {
        let mut block = match self.blocks.remove(&ptr) {
            Some(block) if block.allocated => block,
            Some(block) => {
                self.blocks.insert(ptr, block);
                return Err(AllocError::UnknownPointer(ptr));
            }
            None => return Err(AllocError::UnknownPointer(ptr)),
        };
        self.stats.allocated_bytes.decrease(block.size);
        self.stats.requested_bytes.decrease(block.requested);
        self.stats.allocations.decrease(1);
        if let Some(prev) = block.prev.filter(|p| !self.blocks[p].allocated) {
            let merged = self.uncache(prev);
            block.ptr = merged.ptr;
            block.size += merged.size;
            block.prev = merged.prev;
        }
        if let Some(next) = block.next.filter(|n| !self.blocks[n].allocated) {
            let merged = self.uncache(next);
            block.size += merged.size;
            block.next = merged.next;
        }
        if let Some(prev) = block.prev {
            self.blocks.get_mut(&prev).expect("neighbour exists").next = Some(block.ptr);
        }
        if let Some(next) = block.next {
            self.blocks.get_mut(&next).expect("neighbour exists").prev = Some(block.ptr);
        }
        self.cache(block);
        Ok(())
    }

    fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.release_cached_segments().map(|_| ())
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

    fn release_cached_segment(&mut self, ptr: DevicePtr) -> Result<bool, AllocError> {
        match self.blocks.get(&ptr) {
            Some(block) if !block.allocated && !block.is_split() => {
                self.release_segment(ptr)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

#[cfg(test)]
#[path = "pytorch_tests.rs"]
mod tests;
