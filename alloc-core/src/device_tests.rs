use super::*;

#[test]
fn simulated_device_refuses_past_its_capacity() {
    let mut device = SimulatedDevice::new(4 << 20);
    let a = device.malloc(2 << 20).unwrap();
    device.malloc(2 << 20).unwrap();
    assert_eq!(
        device.malloc(512),
        Err(DeviceError::OutOfMemory { bytes: 512 })
    );
    device.free(a, 2 << 20).unwrap();
    assert_eq!(device.mem_info().free, 2 << 20);
}

#[test]
fn simulated_device_uses_suggested_addresses_in_order() {
    let mut device = SimulatedDevice::new(1 << 30);
    device.expect_segment(2 << 20, 0x7000_0000);
    device.expect_segment(20 << 20, 0x6000_0000);
    assert_eq!(device.malloc(2 << 20).unwrap(), 0x7000_0000);
    assert_eq!(device.malloc(20 << 20).unwrap(), 0x6000_0000);
    assert!(device.malloc(2 << 20).unwrap() >= SYNTHETIC_BASE);
}

#[test]
fn a_top_down_device_hands_out_decreasing_addresses_as_cuda_does() {
    let mut device = SimulatedDevice::top_down(1 << 40);
    let a = device.malloc(20 << 20).unwrap();
    let b = device.malloc(2 << 20).unwrap();
    let c = device.malloc(3 << 20).unwrap();
    assert!(a > b && b > c, "{a:#x} {b:#x} {c:#x}");
    // segments do not overlap: each ends where the one before began
    assert_eq!(b + (2 << 20), a);
    assert_eq!(c + (4 << 20), b, "rounded to whole 2 MiB pages");
    assert!(c >= SYNTHETIC_BASE);
    let mut up = SimulatedDevice::new(1 << 40);
    let (x, y) = (up.malloc(2 << 20).unwrap(), up.malloc(2 << 20).unwrap());
    assert!(y > x);
}

#[test]
fn which_equal_size_cached_block_a_request_takes_follows_the_address_order() {
    // Segment A (60 MiB) holds a freed 40 MiB block beside a live 20 MiB one;
    // segment B, made after it, is one freed 40 MiB block. PyTorch gives a
    // 40 MiB request the lower address: top-down that is B, so when the
    // 20 MiB block goes A is one free 60 MiB block and a 60 MiB request fits.
    // Bottom-up A's block is taken and the 60 MiB request needs a segment.
    use crate::{AllocEvent, Policy, replay_events};
    let mib = 1u64 << 20;
    let alloc = |id, bytes| AllocEvent::Alloc {
        id,
        bytes,
        stream: 0,
    };
    let free = |id| AllocEvent::Free { id };
    let events = [
        alloc(0, 60 * mib),
        free(0),
        alloc(1, 40 * mib),
        alloc(2, 20 * mib),
        alloc(3, 40 * mib),
        free(1),
        free(3),
        alloc(4, 40 * mib),
        free(2),
        alloc(5, 60 * mib),
    ];
    let report = replay_events(&events, Policy::Pytorch).unwrap();
    assert_eq!(report.peak_reserved_bytes, 100 * mib, "no third segment");
}
