use super::*;
use crate::predict::job::parse_job;
use crate::predict::{default_gpu, gpu_profile};

/// An MLP job with the given batch (set after parsing, so a batch the
/// schema refuses can be tried too).
fn job(global: u32, micro: u32, min_micro: u32, gpus: u32) -> JobInput {
    let mut j =
        parse_job("{batch: {global: 8, micro: 8}, model: {mlp: {layers: 2, hidden: 64}}}").unwrap();
    j.gpus = gpus;
    j.batch.global = global;
    j.batch.micro = micro;
    j.batch.min_micro = min_micro;
    j
}

#[test]
fn the_micro_batches_divide_the_per_gpu_batch_from_the_floor_up() {
    let cases = [
        ((12, 4, 1, 1), vec![1, 2, 3, 4, 6, 12]),
        ((12, 4, 3, 1), vec![3, 4, 6, 12]),
        ((16, 4, 1, 2), vec![1, 2, 4, 8]),
        ((10, 5, 1, 3), vec![]),
        ((7, 7, 1, 1), vec![1, 7]),
    ];
    for ((global, micro, min, gpus), want) in cases {
        assert_eq!(
            micro_batches(&job(global, micro, min, gpus)),
            want,
            "{global} {micro} {min} {gpus}"
        );
    }
}

#[test]
fn each_shape_keeps_the_global_batch_and_is_timed_against_the_jobs_micro_batch() {
    let curve = StepTimeCurve::new(vec![(1, 8.0), (4, 2.0), (16, 1.5)]).unwrap();
    let j = job(32, 4, 1, 2);
    let rows = shapes(&j, default_gpu(), None, &curve).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.micro_batch).collect::<Vec<_>>(),
        [1, 2, 4, 8, 16]
    );
    for r in &rows {
        assert_eq!(r.micro_batch * r.grad_accum * 2, 32, "{r:?}");
        let with_headroom = (r.predicted_bytes as f64 * (1.0 + j.headroom())).ceil() as u64;
        assert_eq!(r.budget_bytes, with_headroom, "headroom: {r:?}");
        assert!(r.budget_bytes > r.predicted_bytes + (1 << 20), "{r:?}");
        assert_eq!(
            r.relative_step_time,
            curve.step_seconds(r.micro_batch) / 2.0
        );
    }
    let at = |m: u32| rows.iter().find(|r| r.micro_batch == m).unwrap();
    assert_eq!(at(4).relative_step_time, 1.0);
    assert_eq!(at(1).relative_step_time, 4.0);
    // The same job on a GPU too small for any shape: none fits.
    let mut huge = job(32, 4, 1, 1);
    huge.model.mlp.as_mut().unwrap().hidden = 65536;
    huge.model.mlp.as_mut().unwrap().layers = 16;
    let t4 = gpu_profile("T4").unwrap();
    let rows = shapes(&huge, t4, None, &curve).unwrap();
    assert!(rows.iter().all(|r| !r.fits_gpu), "{rows:?}");
    assert!(rows.iter().all(|r| r.budget_bytes > t4.capacity_bytes));
    assert!(shapes(&job(10, 5, 1, 3), default_gpu(), None, &curve).is_err());
}
