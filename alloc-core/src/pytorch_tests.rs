use super::*;
use crate::SimulatedDevice;

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

#[test]
fn resetting_the_peaks_brings_each_down_to_its_current_value() {
    let mut a = unlimited();
    a.allocate(3 * MIB, 0).unwrap();
    let freed = a.allocate(40 * MIB, 0).unwrap();
    a.free(freed).unwrap();
    a.empty_cache().unwrap();
    let stats = |a: &PytorchAllocator<SimulatedDevice>| {
        let s = a.stats();
        [
            ("allocated", s.allocated_bytes),
            ("requested", s.requested_bytes),
            ("reserved", s.reserved_bytes),
            ("allocations", s.allocations),
            ("segments", s.segments),
        ]
    };
    // (current, peak) before the reset: 3 MiB left of a 20 MiB segment; the
    // 40 MiB segment is gone.
    let before = [
        (3 * MIB, 43 * MIB),
        (3 * MIB, 43 * MIB),
        (20 * MIB, 60 * MIB),
        (1, 2),
        (1, 2),
    ];
    for ((name, stat), (current, peak)) in stats(&a).into_iter().zip(before) {
        assert_eq!((stat.current, stat.peak), (current, peak), "{name} before");
    }
    a.reset_peak_stats();
    for ((name, stat), (current, _)) in stats(&a).into_iter().zip(before) {
        assert_eq!(
            (stat.current, stat.peak),
            (current, current),
            "{name} after"
        );
    }
    // Peaks rise again from there: 5 MiB more out of the same segment.
    a.allocate(5 * MIB, 0).unwrap();
    let after = [
        (8 * MIB, 8 * MIB),
        (8 * MIB, 8 * MIB),
        (20 * MIB, 20 * MIB),
        (2, 2),
        (1, 1),
    ];
    for ((name, stat), expected) in stats(&a).into_iter().zip(after) {
        assert_eq!((stat.current, stat.peak), expected, "{name} again");
    }
}

#[test]
fn device_calls_are_counted_once_per_segment() {
    let mut a = unlimited();
    let kept = a.allocate(3 * MIB, 0).unwrap();
    let big = a.allocate(40 * MIB, 0).unwrap();
    a.free(big).unwrap();
    // Served from the cache: no device call.
    assert_eq!(a.allocate(40 * MIB, 0).unwrap(), big);
    a.free(big).unwrap();
    a.empty_cache().unwrap();
    let s = a.stats();
    assert_eq!((s.num_device_allocs, s.num_device_frees), (2, 1));
    assert_eq!((a.device().malloc_calls, a.device().free_calls), (2, 1));
    a.free(kept).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.stats().num_device_frees, 2);
}

#[test]
fn garbage_collection_frees_the_least_recently_used_segments_until_under_the_threshold() {
    // A 20 MiB segment cached first, a 32 MiB one reused since, and a live
    // block; the threshold is half of the allowed 100 MiB. A 40 MiB request
    // fits no cached block: with 18 MiB live, 70 MiB are reserved, 20 past
    // the threshold, and the older segment alone goes back; with 22 MiB live,
    // 24 MiB past it, both go.
    for (live, reserved, recent_kept) in [(18 * MIB, 90 * MIB, true), (22 * MIB, 62 * MIB, false)] {
        let config = AllocatorConfig {
            memory_fraction: Some(1.0),
            garbage_collection_threshold: Some(0.5),
            ..Default::default()
        };
        let mut a = allocator(100 * MIB, config);
        let old = a.allocate(20 * MIB, 0).unwrap();
        let recent = a.allocate(32 * MIB, 0).unwrap();
        a.allocate(live, 0).unwrap();
        a.free(old).unwrap();
        a.free(recent).unwrap();
        assert_eq!(a.allocate(32 * MIB, 0).unwrap(), recent);
        a.free(recent).unwrap();
        a.allocate(40 * MIB, 0).unwrap();
        assert_eq!(a.stats().reserved_bytes.current, reserved, "live {live}");
        let segments = a.stats().segments.current;
        let again = a.allocate(32 * MIB, 0).unwrap();
        assert_eq!(
            again == recent && a.stats().segments.current == segments,
            recent_kept,
            "live {live}"
        );
        assert_eq!(a.stats().num_alloc_retries, 0);
    }
}

#[test]
fn garbage_collection_needs_a_memory_fraction_and_a_positive_threshold() {
    // As in the test above it, but with a budget instead of a memory
    // fraction, or a threshold of 0: the cached 40 MiB segment stays.
    for (memory_fraction, budget_bytes, threshold) in [
        (None, Some(100 * MIB), Some(0.3)),
        (Some(1.0), None, Some(0.0)),
    ] {
        let config = AllocatorConfig {
            memory_fraction,
            budget_bytes,
            garbage_collection_threshold: threshold,
            ..Default::default()
        };
        let mut a = allocator(100 * MIB, config);
        let old = a.allocate(40 * MIB, 0).unwrap();
        a.free(old).unwrap();
        a.allocate(50 * MIB, 0).unwrap();
        assert_eq!(
            a.stats().reserved_bytes.current,
            90 * MIB,
            "fraction {memory_fraction:?}, budget {budget_bytes:?}, threshold {threshold:?}"
        );
    }
}

#[test]
fn a_segment_that_takes_exactly_the_room_left_under_the_limit_is_granted() {
    let by_budget = AllocatorConfig {
        budget_bytes: Some(64 * MIB),
        ..Default::default()
    };
    let by_fraction = AllocatorConfig {
        memory_fraction: Some(0.5),
        ..Default::default()
    };
    for config in [by_budget, by_fraction] {
        let mut a = allocator(128 * MIB, config);
        a.allocate(24 * MIB, 0).unwrap();
        a.allocate(40 * MIB, 0).unwrap();
        assert_eq!(a.stats().reserved_bytes.current, 64 * MIB, "{config:?}");
        // Not one segment more, not even a small one.
        assert!(a.allocate(512, 0).is_err(), "{config:?}");
    }
}

#[test]
fn out_of_memory_names_the_largest_cached_block_and_is_no_retry_when_nothing_went_back() {
    let mut a = allocator(40 * MIB, AllocatorConfig::default());
    a.allocate(1024, 0).unwrap();
    // A 20 MiB segment with a 17 MiB free tail: cached, but split, so it
    // cannot go back to the device.
    a.allocate(3 * MIB, 0).unwrap();
    let err = a.allocate(30 * MIB, 0).unwrap_err();
    let AllocError::OutOfMemory {
        largest_free,
        reserved,
        ..
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!((*largest_free, *reserved), (17 * MIB, 22 * MIB));
    let s = a.stats();
    assert_eq!((s.num_ooms, s.num_alloc_retries), (1, 0));
    assert_eq!(s.reserved_bytes.current, 22 * MIB);
}

#[test]
fn oversize_cached_segments_go_back_largest_first_before_the_whole_cache() {
    // With max_split_size 100 MiB, each row caches segments of these sizes
    // (MiB, stream 0) on a device with 10 MiB more, then asks for 200 MiB:
    // (cached, still cached after, retries).
    let rows: [(&[u64], &[u64], u64); 3] = [
        // An oversize segment at least as large as the request goes back alone.
        (&[300, 50], &[50], 0),
        // Smaller oversize segments go back, largest first, until 200 MiB are back.
        (&[150, 120, 110, 50], &[110, 50], 0),
        // Too few oversize bytes: the whole cache goes back, and that is a retry.
        (&[120, 90], &[], 1),
    ];
    for (cached, kept, retries) in rows {
        let config = AllocatorConfig {
            max_split_size: Some(100 * MIB),
            ..Default::default()
        };
        let held: u64 = cached.iter().sum::<u64>() * MIB;
        let mut a = allocator(held + 10 * MIB, config);
        let ptrs: Vec<_> = cached
            .iter()
            .map(|&mib| a.allocate(mib * MIB, 0).unwrap())
            .collect();
        for &ptr in &ptrs {
            a.free(ptr).unwrap();
        }
        a.allocate(200 * MIB, 0).unwrap();
        assert_eq!(a.stats().num_alloc_retries, retries, "{cached:?}");
        let kept_bytes: u64 = kept.iter().sum::<u64>() * MIB;
        assert_eq!(
            a.stats().reserved_bytes.current,
            kept_bytes + 200 * MIB,
            "{cached:?}"
        );
        let segments = a.stats().segments.current;
        for (&mib, &ptr) in cached.iter().zip(&ptrs) {
            if kept.contains(&mib) {
                assert_eq!(a.allocate(mib * MIB, 0).unwrap(), ptr, "{cached:?}: {mib}");
            }
        }
        assert_eq!(a.stats().segments.current, segments, "{cached:?}");
    }
}

#[test]
fn a_request_the_device_grants_gives_nothing_back_from_the_cache() {
    let config = AllocatorConfig {
        max_split_size: Some(100 * MIB),
        ..Default::default()
    };
    let mut a = allocator(1 << 40, config);
    let big = a.allocate(200 * MIB, 0).unwrap();
    let medium = a.allocate(30 * MIB, 0).unwrap();
    a.free(big).unwrap();
    a.free(medium).unwrap();
    // 200 MiB is oversize for 150 MiB, and 50 MiB fits neither.
    a.allocate(150 * MIB, 0).unwrap();
    a.allocate(50 * MIB, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.reserved_bytes.current, 430 * MIB);
    assert_eq!((s.num_device_allocs, s.num_device_frees), (4, 0));
    assert_eq!(s.num_alloc_retries, 0);
    assert_eq!(a.allocate(190 * MIB, 0).unwrap(), big);
    assert_eq!(a.allocate(30 * MIB, 0).unwrap(), medium);
}

#[test]
fn a_request_of_exactly_max_split_size_is_oversize() {
    // A cached 110 MiB segment with max_split_size 100 MiB: (request,
    // served by it, bytes allocated). At 100 MiB the request is oversize
    // itself and takes the block whole (less than 20 MiB to spare); just
    // below, an oversize block does not serve it (and its own 100 MiB
    // segment keeps the 512-byte tail).
    for (request, reuses, allocated) in [
        (100 * MIB, true, 110 * MIB),
        (100 * MIB - 512, false, 100 * MIB),
    ] {
        let config = AllocatorConfig {
            max_split_size: Some(100 * MIB),
            ..Default::default()
        };
        let mut a = allocator(1 << 40, config);
        let cached = a.allocate(110 * MIB, 0).unwrap();
        a.free(cached).unwrap();
        let ptr = a.allocate(request, 0).unwrap();
        assert_eq!(ptr == cached, reuses, "request {request}");
        assert_eq!(a.stats().segments.current == 1, reuses, "request {request}");
        assert_eq!(
            a.stats().allocated_bytes.current,
            allocated,
            "request {request}"
        );
    }
}

#[test]
fn a_large_block_is_split_only_when_more_than_one_mib_is_left() {
    // Both requests get a 12 MiB segment: (request, bytes allocated).
    for (request, allocated) in [(11 * MIB, 12 * MIB), (11 * MIB - 512, 11 * MIB - 512)] {
        let mut a = unlimited();
        a.allocate(request, 0).unwrap();
        assert_eq!(a.stats().reserved_bytes.current, 12 * MIB);
        assert_eq!(
            a.stats().allocated_bytes.current,
            allocated,
            "request {request}"
        );
    }
}

#[test]
fn without_max_split_size_a_much_larger_cached_block_serves_a_request() {
    let mut a = unlimited();
    let big = a.allocate(60 * MIB, 0).unwrap();
    a.free(big).unwrap();
    assert_eq!(a.allocate(4 * MIB, 0).unwrap(), big);
    assert_eq!(a.stats().segments.current, 1);
    assert_eq!(a.stats().allocated_bytes.current, 4 * MIB);
}

#[test]
fn a_cached_segment_goes_back_alone_only_when_whole_and_unused() {
    let mut a = unlimited();
    let whole = a.allocate(40 * MIB, 0).unwrap();
    let other = a.allocate(30 * MIB, 0).unwrap();
    let head = a.allocate(3 * MIB, 0).unwrap();
    // Larger than the 17 MiB tail of `head`'s segment: a segment of its own.
    let live = a.allocate(18 * MIB, 0).unwrap();
    a.free(whole).unwrap();
    a.free(other).unwrap();
    for (ptr, released, what) in [
        (live, false, "a block in use"),
        (head + 3 * MIB, false, "the free tail of a split segment"),
        (12345, false, "an unknown address"),
        (whole, true, "a whole unused segment"),
    ] {
        assert_eq!(a.release_cached_segment(ptr).unwrap(), released, "{what}");
    }
    // Only `whole` went back: 30 + 20 + 18 MiB are left, `other` still cached.
    assert_eq!(a.stats().reserved_bytes.current, 68 * MIB);
    assert_eq!(a.stats().num_device_frees, 1);
    assert_eq!(a.allocate(30 * MIB, 0).unwrap(), other);
}

#[test]
fn a_memory_fraction_set_while_running_caps_the_next_segments() {
    let mut a = allocator(100 * MIB, AllocatorConfig::default());
    a.allocate(20 * MIB, 0).unwrap();
    a.config_mut().memory_fraction = Some(0.25);
    assert_eq!(a.config().memory_fraction, Some(0.25));
    assert!(a.allocate(10 * MIB, 0).is_err());
}

#[test]
fn a_segment_policy_reports_no_page_or_plan_figures() {
    let mut a = unlimited();
    a.allocate(4 * MIB, 0).unwrap();
    assert_eq!(a.page_figures(), None);
    assert!(a.plan_figures().is_none());
}
