use super::*;
use crate::alloc::{replay_events, round_request, segment_bytes_for};
use crate::predict::sequence::Stream;

const MIB: u64 = 1 << 20;

fn alloc(id: u32, bytes: u64) -> TensorEvent {
    TensorEvent::Alloc {
        id,
        bytes,
        category: Category::Activations,
        stream: Stream::Default,
    }
}

#[test]
fn the_reserved_peak_is_the_allocators() {
    // Sizes in the three segment classes, frees that leave holes, and a
    // request that only fits once neighbours have merged.
    let events = vec![
        alloc(0, 300),
        alloc(1, 3 * MIB),
        alloc(2, 40 * MIB + 7),
        alloc(3, 40 * MIB),
        TensorEvent::Free { id: 2 },
        TensorEvent::Free { id: 3 },
        alloc(4, 70 * MIB),
        alloc(5, 5 * MIB),
        TensorEvent::Free { id: 1 },
    ];
    let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
    let direct = replay_events(
        &events.iter().map(alloc_event).collect::<Vec<_>>(),
        Policy::Pytorch,
    )
    .unwrap();
    assert_eq!(out.reserved_peak, direct.peak_reserved_bytes);
    // A 2 MiB small segment, a 20 MiB one (3 and 5 MiB share it), and
    // one segment per large request: the two freed 40 MiB segments do
    // not merge, so the 70 MiB request needs its own.
    let expected: u64 = [300, 3 * MIB, 40 * MIB + 7, 40 * MIB, 70 * MIB]
        .into_iter()
        .map(|b| segment_bytes_for(round_request(b)))
        .sum();
    assert_eq!(out.reserved_peak, expected);
    assert_eq!(out.allocated_peak, 300 + 3 * MIB + 80 * MIB + 7);
}

#[test]
fn a_block_cached_for_another_stream_is_not_reused() {
    let on = |id, stream| TensorEvent::Alloc {
        id,
        bytes: 30 * MIB,
        category: Category::Gradients,
        stream,
    };
    let events = vec![
        on(0, Stream::ReduceScatter),
        TensorEvent::Free { id: 0 },
        on(1, Stream::Default),
    ];
    let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
    // Each stream has its own pool: the freed 30 MiB block stays cached
    // for the reduce-scatter stream and sits idle at the allocated peak.
    assert_eq!(out.reserved_peak, 60 * MIB);
    assert_eq!(out.allocated_peak, 30 * MIB);
    assert_eq!(out.idle_other_streams_at_allocated_peak, 30 * MIB);
    let same = vec![
        on(0, Stream::Default),
        TensorEvent::Free { id: 0 },
        on(1, Stream::Default),
    ];
    let out = CachingAllocatorModel::PYTORCH.replay(&same).unwrap();
    assert_eq!(out.reserved_peak, 30 * MIB);
    assert_eq!(out.idle_other_streams_at_allocated_peak, 0);
}

#[test]
fn live_bytes_at_the_peak_are_reported_by_category() {
    let events = vec![
        TensorEvent::Alloc {
            id: 0,
            bytes: 30 * MIB,
            category: Category::Parameters,
            stream: Stream::Default,
        },
        TensorEvent::Alloc {
            id: 1,
            bytes: 12 * MIB,
            category: Category::Gradients,
            stream: Stream::Default,
        },
        TensorEvent::Free { id: 1 },
        alloc(2, 10 * MIB),
    ];
    let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
    assert_eq!(out.reserved_peak, 42 * MIB);
    // The 10 MiB request reuses the freed 12 MiB block: the peak's fullest
    // moment is the first one.
    assert_eq!(out.live_at_peak.parameters, 30 * MIB);
    assert_eq!(out.live_at_peak.gradients, 12 * MIB);
    assert_eq!(out.live_at_peak.activations, 0);
}

#[test]
fn idle_bytes_of_another_stream_are_its_highest_live_minus_its_live_then() {
    let on = |id, bytes, category, stream| TensorEvent::Alloc {
        id,
        bytes,
        category,
        stream,
    };
    let events = vec![
        on(0, 20 * MIB, Category::Gradients, Stream::ReduceScatter),
        on(1, 10 * MIB, Category::Gradients, Stream::ReduceScatter),
        TensorEvent::Free { id: 0 },
        on(2, 100 * MIB, Category::Activations, Stream::Default),
    ];
    let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
    // At the allocated peak (110 MiB) the reduce-scatter stream has 10 MiB
    // live of the 30 MiB it once held: 20 MiB of its pool sit idle.
    assert_eq!(out.allocated_peak, 110 * MIB);
    assert_eq!(out.idle_other_streams_at_allocated_peak, 20 * MIB);
}

#[test]
fn of_two_equally_full_moments_at_the_peak_the_first_is_reported() {
    let on = |id, category| TensorEvent::Alloc {
        id,
        bytes: 12 * MIB,
        category,
        stream: Stream::Default,
    };
    // The activations reuse the gradients' freed block: the reservation
    // and the live bytes are the same at both moments.
    let events = vec![
        on(0, Category::Parameters),
        on(1, Category::Gradients),
        TensorEvent::Free { id: 1 },
        on(2, Category::Activations),
    ];
    let out = CachingAllocatorModel::PYTORCH.replay(&events).unwrap();
    assert_eq!(out.live_at_peak.gradients, 12 * MIB);
    assert_eq!(out.live_at_peak.activations, 0);
}
