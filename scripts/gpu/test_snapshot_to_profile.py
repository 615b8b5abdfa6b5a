"""Tests of scripts/snapshot_to_profile.py on hand-made snapshots (no PyTorch)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import snapshot_to_profile as s2p  # noqa: E402

MB2 = 2 << 20


def snapshot():
    trace = [
        {"action": "segment_alloc", "addr": 0, "size": MB2},
        {"action": "alloc", "addr": 0, "size": 512},
        {"action": "alloc", "addr": 512, "size": 1024},
        {"action": "free_requested", "addr": 0, "size": 512},
        {"action": "free_completed", "addr": 0, "size": 512},
        {"action": "segment_alloc", "addr": 1 << 30, "size": 20 << 20},
        {"action": "alloc", "addr": 1 << 30, "size": 20 << 20},
    ]
    segments = [
        {"device": 0, "address": 0, "total_size": MB2, "segment_type": "small",
         "blocks": [{"size": 512, "state": "inactive"},
                    {"size": 1024, "state": "active_allocated"},
                    {"size": MB2 - 1536, "state": "inactive"}]},
        {"device": 0, "address": 1 << 30, "total_size": 20 << 20, "segment_type": "large",
         "blocks": [{"size": 20 << 20, "state": "active_allocated"}]},
        {"device": 1, "address": 0, "total_size": MB2, "segment_type": "small", "blocks": []},
    ]
    return {"segments": segments, "device_traces": [trace]}


def test_tensor_events_replay_allocs_and_completed_frees():
    prof = s2p.convert(snapshot(), micro_batch=4)
    assert prof["sizes"] == [512, 1024, 20 << 20]
    # alloc 512, alloc 1024, free of the first, alloc 20 MiB
    assert prof["events"] == [0, 1, -1, 2]
    assert prof["microBatch"] == 4


def test_allocator_view_keeps_the_device_segments_and_where_each_segment_event_fell():
    view = s2p.allocator_view(snapshot())
    assert [(g["size"], g["pool"]) for g in view["segments"]] == [(MB2, "small"),
                                                                   (20 << 20, "large")]
    assert view["segments"][0]["blocks"][1] == [1024, "active_allocated"]
    # the second segment came after three tensor events (two allocs, one completed free)
    assert view["segmentEvents"] == [[0, "segment_alloc", MB2], [3, "segment_alloc", 20 << 20]]


def test_origins_name_the_kernels_that_asked_for_large_blocks():
    snap = snapshot()
    snap["device_traces"][0][-1]["frames"] = [
        {"name": "c10::cuda::CUDACachingAllocator::malloc"},
        {"name": "at::native::cudnn_convolution_backward_weight"},
        {"name": "std::function<void()>::operator()"},
        {"name": "torch::autograd::Engine::thread_main"}]
    # the 512-byte and 1 KiB allocations are below the threshold
    assert s2p.alloc_origins(snap) == [
        [3, 20 << 20, ["at::native::cudnn_convolution_backward_weight",
                       "torch::autograd::Engine::thread_main"]]]
