use super::StepTimeCurve;

fn gpt2() -> StepTimeCurve {
    // H200, GPT-2 small at global batch 64 (docs/benchmarks/step-time.md).
    StepTimeCurve::new(vec![
        (64, 0.409),
        (1, 2.323),
        (2, 0.988),
        (4, 0.545),
        (8, 0.462),
        (16, 0.437),
        (32, 0.421),
    ])
    .unwrap()
}

#[test]
fn measured_micro_batches_give_their_measured_time() {
    let c = gpt2();
    for &(micro, seconds) in c.points() {
        assert_eq!(c.step_seconds(micro), seconds, "micro {micro}");
    }
    assert_eq!(c.points()[0].0, 1, "points are sorted");
}

#[test]
fn between_points_the_time_is_interpolated_in_log_micro() {
    let c = StepTimeCurve::new(vec![(4, 1.0), (16, 3.0)]).unwrap();
    // 8 is half-way between 4 and 16 in log2.
    assert!((c.step_seconds(8) - 2.0).abs() < 1e-12);
    let g = gpt2();
    let t = g.step_seconds(6);
    assert!(t < 0.545 && t > 0.462, "{t}");
}

#[test]
fn outside_the_measured_range_no_speed_up_is_assumed() {
    let c = StepTimeCurve::new(vec![(4, 1.0), (16, 0.5)]).unwrap();
    assert_eq!(c.step_seconds(64), 0.5, "nothing gained above the largest");
    assert_eq!(c.step_seconds(2), 2.0, "launch-bound below the smallest");
    assert_eq!(c.step_seconds(1), 4.0);
    assert_eq!(c.step_seconds(0), 4.0, "0 is taken as 1");
}

#[test]
fn relative_time_is_one_at_the_preferred_micro_batch_and_grows_below_it() {
    let c = gpt2();
    assert_eq!(c.relative(16, 16), 1.0);
    let r8 = c.relative(8, 16);
    assert!((r8 - 0.462 / 0.437).abs() < 1e-12, "{r8}");
    assert!(c.relative(1, 16) > c.relative(2, 16));
}

#[test]
fn bad_points_are_refused() {
    assert!(StepTimeCurve::new(vec![]).is_err());
    assert!(StepTimeCurve::new(vec![(0, 1.0)]).is_err());
    assert!(StepTimeCurve::new(vec![(2, 1.0), (2, 1.5)]).is_err());
    assert!(StepTimeCurve::new(vec![(2, 0.0)]).is_err());
    assert!(StepTimeCurve::new(vec![(2, f64::NAN)]).is_err());
}
