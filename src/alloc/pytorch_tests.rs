use super::*;
use crate::alloc::SimulatedDevice;

const MIB: u64 = 1 << 20;

fn allocator(capacity: u64, config: AllocatorConfig) -> PytorchAllocator<SimulatedDevice> {
    PytorchAllocator::new(SimulatedDevice::new(capacity), config)
}

fn unlimited() -> PytorchAllocator<SimulatedDevice> {
    allocator(1 << 40, AllocatorConfig::default())
}

#[test]
fn small_requests_share_a_two_mib_segment() {
    let mut a = unlimited();
    let first = a.allocate(1000, 0).unwrap();
    let second = a.allocate(200_000, 0).unwrap();
    assert_eq!(
        second,
        first + 1024,
        "second block follows the rounded first"
    );
    assert_eq!(a.stats().reserved_bytes.current, 2 * MIB);
    assert_eq!(a.stats().segments.current, 1);
    assert_eq!(a.stats().allocated_bytes.current, 1024 + 200_192);
}

#[test]
fn segment_sizes_follow_the_request_class() {
    for (request, reserved) in [
        (512, 2 * MIB),
        (MIB, 2 * MIB),
        (MIB + 1, 20 * MIB),
        (9 * MIB, 20 * MIB),
        (10 * MIB, 10 * MIB),
        (11 * MIB, 12 * MIB),
    ] {
        let mut a = unlimited();
        a.allocate(request, 0).unwrap();
        assert_eq!(
            a.stats().reserved_bytes.current,
            reserved,
            "request {request}"
        );
    }
}

#[test]
fn medium_requests_split_a_twenty_mib_segment() {
    let mut a = unlimited();
    let first = a.allocate(3 * MIB, 0).unwrap();
    let second = a.allocate(5 * MIB, 0).unwrap();
    assert_eq!(second, first + 3 * MIB);
    assert_eq!(a.stats().segments.current, 1);
}

#[test]
fn large_pool_keeps_a_remainder_of_one_mib_or_less_in_the_block() {
    let mut a = unlimited();
    // 11 MiB + 1 byte rounds to a 12 MiB segment: the ~1 MiB tail is not split off.
    a.allocate(11 * MIB + 1, 0).unwrap();
    assert_eq!(a.stats().allocated_bytes.current, 12 * MIB);
}

#[test]
fn best_fit_takes_the_smallest_cached_block_then_the_lowest_address() {
    let mut a = unlimited();
    let big = a.allocate(40 * MIB, 0).unwrap();
    let small_a = a.allocate(12 * MIB, 0).unwrap();
    let small_b = a.allocate(12 * MIB, 0).unwrap();
    for ptr in [big, small_b, small_a] {
        a.free(ptr).unwrap();
    }
    let reused = a.allocate(11 * MIB, 0).unwrap();
    assert_eq!(reused, small_a.min(small_b));
    assert_eq!(
        a.stats().segments.current,
        3,
        "no new segment for a fitting request"
    );
}

#[test]
fn freed_neighbours_coalesce_into_the_whole_segment() {
    let mut a = unlimited();
    let blocks: Vec<_> = (0..4).map(|_| a.allocate(4 * MIB, 0).unwrap()).collect();
    for ptr in [blocks[1], blocks[3], blocks[0], blocks[2]] {
        a.free(ptr).unwrap();
    }
    // The whole 20 MiB segment is one free block again: a 19 MiB request fits.
    let whole = a.allocate(19 * MIB, 0).unwrap();
    assert_eq!(whole, blocks[0]);
    assert_eq!(a.stats().segments.current, 1);
}

#[test]
fn cached_blocks_are_not_shared_across_streams() {
    let mut a = unlimited();
    let on_default = a.allocate(4 * MIB, 0).unwrap();
    a.free(on_default).unwrap();
    a.allocate(4 * MIB, 7).unwrap();
    assert_eq!(a.stats().segments.current, 2);
}

#[test]
fn oversize_blocks_serve_only_requests_within_twenty_mib() {
    let config = AllocatorConfig {
        max_split_size: Some(100 * MIB),
        ..Default::default()
    };
    let mut a = allocator(1 << 40, config);
    let big = a.allocate(200 * MIB, 0).unwrap();
    a.free(big).unwrap();
    for (request, reuses) in [(150 * MIB, false), (190 * MIB, true), (50 * MIB, false)] {
        let before = a.stats().segments.current;
        let ptr = a.allocate(request, 0).unwrap();
        assert_eq!(ptr == big, reuses, "request {request}");
        assert_eq!(a.stats().segments.current == before, reuses);
        a.free(ptr).unwrap();
    }
}

#[test]
fn cache_is_released_and_the_request_retried_before_running_out() {
    let mut a = allocator(40 * MIB, AllocatorConfig::default());
    let cached = a.allocate(12 * MIB, 0).unwrap();
    a.free(cached).unwrap();
    a.allocate(30 * MIB, 0).unwrap();
    assert_eq!(a.stats().num_alloc_retries, 1);
    assert_eq!(a.stats().reserved_bytes.current, 30 * MIB);
    assert_eq!(a.stats().num_ooms, 0);
}

#[test]
fn out_of_memory_is_counted_and_explained() {
    let mut a = allocator(64 * MIB, AllocatorConfig::default());
    a.allocate(40 * MIB, 0).unwrap();
    let err = a.allocate(30 * MIB, 0).unwrap_err();
    assert_eq!(a.stats().num_ooms, 1);
    let text = err.to_string();
    assert!(text.contains("Tried to allocate 30.00 MiB"), "{text}");
    assert!(text.contains("of which 24.00 MiB is free"), "{text}");
    assert!(text.contains("40.00 MiB is allocated by PyTorch"), "{text}");
}

#[test]
fn memory_fraction_caps_what_is_reserved() {
    let config = AllocatorConfig {
        memory_fraction: Some(0.25),
        ..Default::default()
    };
    let mut a = allocator(100 * MIB, config);
    a.allocate(20 * MIB, 0).unwrap();
    let err = a.allocate(10 * MIB, 0).unwrap_err().to_string();
    assert!(err.contains("25.00 MiB allowed"), "{err}");
}

#[test]
fn garbage_collection_frees_old_segments_past_the_threshold() {
    for (threshold, reserved) in [(None, 90 * MIB), (Some(0.3), 50 * MIB)] {
        let config = AllocatorConfig {
            memory_fraction: Some(1.0),
            garbage_collection_threshold: threshold,
            ..Default::default()
        };
        let mut a = allocator(100 * MIB, config);
        let old = a.allocate(40 * MIB, 0).unwrap();
        a.free(old).unwrap();
        // 50 MiB does not fit the cached 40 MiB: past the threshold (30 MiB
        // of 100) the old segment goes back before the device is asked.
        a.allocate(50 * MIB, 0).unwrap();
        assert_eq!(
            a.stats().reserved_bytes.current,
            reserved,
            "threshold {threshold:?}"
        );
        assert_eq!(a.stats().num_alloc_retries, 0);
    }
}

#[test]
fn empty_cache_returns_unused_whole_segments_only() {
    let mut a = unlimited();
    let kept = a.allocate(3 * MIB, 0).unwrap();
    let split_away = a.allocate(3 * MIB, 0).unwrap();
    let whole = a.allocate(50 * MIB, 0).unwrap();
    a.free(split_away).unwrap();
    a.free(whole).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes.current, 20 * MIB);
    a.free(kept).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().reserved_bytes.current, 0);
    assert_eq!(a.device().free_calls, 2);
}

#[test]
fn freeing_an_unknown_pointer_is_an_error() {
    let mut a = unlimited();
    let ptr = a.allocate(4096, 0).unwrap();
    a.free(ptr).unwrap();
    assert!(matches!(a.free(ptr), Err(AllocError::UnknownPointer(p)) if p == ptr));
}

#[test]
fn budget_releases_the_cache_then_refuses_with_its_own_message() {
    let config = AllocatorConfig {
        budget_bytes: Some(64 * MIB),
        ..Default::default()
    };
    let mut a = allocator(1 << 40, config);
    let cached = a.allocate(30 * MIB, 0).unwrap();
    let live = a.allocate(20 * MIB, 0).unwrap();
    a.free(cached).unwrap();
    // 40 MiB does not fit the cached 30 MiB segment and 50 + 40 > 64: the
    // cached segment goes back and the request fits.
    let big = a.allocate(40 * MIB, 0).unwrap();
    assert_eq!(a.stats().reserved_bytes.current, 60 * MIB);
    assert_eq!(a.stats().num_alloc_retries, 1);
    let err = a.allocate(10 * MIB, 0).unwrap_err();
    let AllocError::OutOfMemory {
        budget_exceeded,
        largest_free,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert!(*budget_exceeded);
    assert_eq!(*largest_free, 0);
    let text = err.to_string();
    assert!(text.contains("vramfit budget exceeded"), "{text}");
    assert!(text.contains("with a budget of 64.00 MiB"), "{text}");
    a.free(big).unwrap();
    a.free(live).unwrap();
}

#[test]
fn device_refusal_under_the_budget_is_not_a_budget_error() {
    let config = AllocatorConfig {
        budget_bytes: Some(1 << 30),
        ..Default::default()
    };
    let mut a = allocator(64 * MIB, config);
    a.allocate(40 * MIB, 0).unwrap();
    let err = a.allocate(30 * MIB, 0).unwrap_err();
    assert!(matches!(
        err,
        AllocError::OutOfMemory {
            budget_exceeded: false,
            ..
        }
    ));
}
