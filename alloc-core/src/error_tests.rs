use super::*;

#[test]
fn sizes_format_like_pytorch() {
    for (bytes, text) in [
        (512, "512 bytes"),
        (1024, "1024 bytes"),
        (1536, "1.50 KiB"),
        (20 << 20, "20.00 MiB"),
        (3 << 29, "1.50 GiB"),
    ] {
        assert_eq!(format_size(bytes), text);
    }
}

#[test]
fn out_of_memory_message_names_every_number() {
    let err = OomFacts {
        device_index: 0,
        requested: 20 << 20,
        device_total: 80 << 30,
        device_free: 12 << 20,
        allowed: Some(40 << 30),
        allocated: 39 << 30,
        reserved: 40 << 30,
        budget: None,
        largest_free: 0,
        budget_exceeded: false,
    }
    .into_error();
    let text = err.to_string();
    for part in [
        "Tried to allocate 20.00 MiB",
        "GPU 0 has a total capacity of 80.00 GiB of which 12.00 MiB is free",
        "40.00 GiB allowed;",
        "39.00 GiB is allocated by PyTorch",
        "1024.00 MiB is reserved by PyTorch but unallocated",
    ] {
        assert!(text.contains(part), "{part:?} missing from {text}");
    }
}

#[test]
fn budget_message_names_budget_allocated_reserved_requested_and_largest_free() {
    let err = OomFacts {
        device_index: 1,
        requested: 20 << 20,
        device_total: 80 << 30,
        device_free: 60 << 30,
        allowed: Some(4 << 30),
        allocated: 3 << 30,
        reserved: (4 << 30) - (8 << 20),
        budget: Some(4 << 30),
        largest_free: 12 << 20,
        budget_exceeded: true,
    }
    .into_error();
    assert!(matches!(
        err,
        AllocError::OutOfMemory {
            budget_exceeded: true,
            ..
        }
    ));
    let text = err.to_string();
    for part in [
        "CUDA out of memory: vramfit budget exceeded on GPU 1",
        "Tried to allocate 20.00 MiB with a budget of 4.00 GiB",
        "3.00 GiB is allocated by PyTorch",
        "3.99 GiB is reserved",
        "the largest free block is 12.00 MiB",
        "of which 60.00 GiB is free",
        "[budget=4294967296 allocated=3221225472 reserved=4286578688 requested=20971520 largest_free=12582912]",
    ] {
        assert!(text.contains(part), "{part:?} missing from {text}");
    }
}
