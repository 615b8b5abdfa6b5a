use super::fake::{FakeNvml, Script, h200};
use super::*;

fn monitor(script: Script) -> (GpuMonitor, FakeNvml) {
    let fake = FakeNvml(std::sync::Arc::new(std::sync::Mutex::new(script)));
    (GpuMonitor::new(Box::new(fake.clone())), fake)
}

#[test]
fn gpus_are_read_with_profile_names_and_processes() {
    let (mut monitor, _) = monitor(Script {
        devices: vec![Ok(h200(0, &[(10, 5 << 30)])), Ok(h200(1, &[]))],
        ..Default::default()
    });
    let reading = monitor.read(Instant::now());
    assert_eq!(reading.health, GpuHealth::Healthy);
    assert_eq!(reading.gpus.len(), 2);
    assert_eq!(reading.gpus[0].model, "H200");
    assert_eq!(reading.gpus[0].processes[0].used_bytes, 5 << 30);
}

#[test]
fn missing_nvml_is_degraded_and_retried_with_growing_delays() {
    let (mut monitor, fake) = monitor(Script {
        load_error: Some("libnvidia-ml.so.1: cannot open shared object file".into()),
        ..Default::default()
    });
    let t0 = Instant::now();
    let reading = monitor.read(t0);
    assert_eq!(reading.health, GpuHealth::Degraded);
    assert!(reading.gpus.is_empty());
    let message = reading.message.unwrap();
    assert!(message.contains("libnvidia-ml"), "{message}");
    // Retries at 1 s, then 2 s later, then 4 s later; not on every pass.
    let mut loads_at = Vec::new();
    for tenth in 1..=80 {
        let before = fake.0.lock().unwrap().loads;
        monitor.read(t0 + Duration::from_millis(tenth * 100));
        if fake.0.lock().unwrap().loads > before {
            loads_at.push(tenth);
        }
    }
    assert_eq!(loads_at, vec![10, 30, 70]);
    // Once NVML appears, readings resume.
    {
        let mut script = fake.0.lock().unwrap();
        script.load_error = None;
        script.devices = vec![Ok(h200(0, &[]))];
    }
    let reading = monitor.read(t0 + Duration::from_secs(15));
    assert_eq!(reading.health, GpuHealth::Healthy);
    assert_eq!(reading.gpus.len(), 1);
}

#[test]
fn nvml_failing_mid_run_marks_known_gpus_faulty_and_reloads() {
    let (mut monitor, fake) = monitor(Script {
        devices: vec![Ok(h200(0, &[(10, 1 << 30)]))],
        ..Default::default()
    });
    let t0 = Instant::now();
    assert_eq!(monitor.read(t0).health, GpuHealth::Healthy);
    fake.0.lock().unwrap().count = Some(Err("Unknown Error".into()));
    let reading = monitor.read(t0 + Duration::from_secs(1));
    assert_eq!(reading.health, GpuHealth::Degraded);
    assert_eq!(reading.gpus.len(), 1, "the GPU stays in the report");
    assert_eq!(reading.gpus[0].health, GpuHealth::Faulty);
    assert!(reading.gpus[0].processes.is_empty());
    assert!(
        reading
            .message
            .unwrap()
            .contains("NVML failed: Unknown Error")
    );
    fake.0.lock().unwrap().count = None;
    let loads = fake.0.lock().unwrap().loads;
    let reading = monitor.read(t0 + Duration::from_secs(3));
    assert_eq!(
        fake.0.lock().unwrap().loads,
        loads + 1,
        "NVML is loaded again"
    );
    assert_eq!(reading.gpus[0].health, GpuHealth::Healthy);
}

#[test]
fn a_vanished_gpu_is_reported_faulty_and_the_others_stay_healthy() {
    let (mut monitor, fake) = monitor(Script {
        devices: vec![Ok(h200(0, &[])), Ok(h200(1, &[(5, 1 << 30)]))],
        ..Default::default()
    });
    let t0 = Instant::now();
    monitor.read(t0);
    // NVML lists one GPU fewer.
    fake.0.lock().unwrap().devices.truncate(1);
    let reading = monitor.read(t0 + Duration::from_secs(1));
    assert_eq!(reading.health, GpuHealth::Degraded);
    assert_eq!(reading.gpus[0].health, GpuHealth::Healthy);
    assert_eq!(reading.gpus[1].health, GpuHealth::Faulty);
    assert_eq!(
        reading.gpus[1].uuid, "GPU-1",
        "reported by its last known UUID"
    );
    assert!(reading.gpus[1].processes.is_empty());
    // Or it answers GpuLost.
    fake.0.lock().unwrap().devices = vec![
        Ok(h200(0, &[])),
        Err(DeviceFault::Lost("GPU is lost".into())),
    ];
    let reading = monitor.read(t0 + Duration::from_secs(2));
    assert_eq!(reading.gpus[1].health, GpuHealth::Faulty);
    assert!(
        reading.message.unwrap().contains("GPU 1 lost"),
        "the log and status say which GPU"
    );
}
