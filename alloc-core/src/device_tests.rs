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
