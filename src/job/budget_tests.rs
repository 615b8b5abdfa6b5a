use super::*;
use serde_json::json;

const GIB: u64 = 1 << 30;

fn job(memory: serde_json::Value) -> TrainingJob {
    let job = TrainingJob::test("j")
        .batch(64, 8)
        .model(json!({"mlp": {"layers": 4, "hidden": 1024}}));
    if memory.is_null() {
        job.build()
    } else {
        job.spec(json!({ "memory": memory })).build()
    }
}

fn model_peak(job: &TrainingJob, micro: u32) -> u64 {
    let shape = JobShape {
        gpus: job.spec.gpus,
        global_batch: job.spec.batch.global,
        micro_batch: micro,
    };
    predict_model(&job.spec.model, &shape, default_gpu())
        .unwrap()
        .peak_bytes
}

#[test]
fn a_prediction_gets_the_headroom_on_top() {
    for (memory, headroom) in [
        (serde_json::Value::Null, 0.05),
        (json!({"headroom": 0.5}), 0.5),
        (json!({"headroom": 0.0}), 0.0),
    ] {
        let job = job(memory);
        let peak = model_peak(&job, 8);
        let budget = attempt_budget(&job, 8, None, None).unwrap();
        assert_eq!(budget.source, "model");
        assert_eq!(budget.predicted, peak);
        assert_eq!(
            budget.budget,
            (peak as f64 * (1.0 + headroom)).ceil() as u64,
            "headroom {headroom}"
        );
        assert!(budget.breakdown.is_some());
    }
}

#[test]
fn the_micro_batch_of_the_attempt_is_predicted() {
    let mut job = job(serde_json::Value::Null);
    job.spec.model = serde_json::from_value(json!({"transformer": {
            "layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "seqLen": 1024}}))
    .unwrap();
    let eight = attempt_budget(&job, 8, None, None).unwrap();
    let four = attempt_budget(&job, 4, None, None).unwrap();
    assert_eq!(four.predicted, model_peak(&job, 4));
    assert!(four.predicted < eight.predicted);
}

#[test]
fn a_measurement_replaces_the_prediction_and_gets_the_headroom() {
    let job = job(json!({"headroom": 0.1}));
    let budget = attempt_budget(&job, 8, None, Some(10 * GIB)).unwrap();
    assert_eq!(budget.source, "measured");
    assert_eq!(budget.predicted, 10 * GIB);
    assert_eq!(budget.budget, (10.0 * GIB as f64 * 1.1).ceil() as u64);
}

#[test]
fn a_request_is_the_budget_without_headroom_and_beats_a_measurement() {
    let job = job(json!({"request": "20Gi", "headroom": 0.5}));
    let budget = attempt_budget(&job, 8, None, Some(10 * GIB)).unwrap();
    assert_eq!(budget.source, "request");
    assert_eq!(budget.budget, 20 * GIB);
    assert_eq!(budget.predicted, model_peak(&job, 8), "informative");
    for bad in ["0", "lots"] {
        let job = self::job(json!({"request": bad}));
        let error = attempt_budget(&job, 8, None, None).unwrap_err();
        assert!(error.contains("spec.memory.request"), "{error}");
    }
}

#[test]
fn a_profile_job_needs_its_profile_text() {
    let mut job = job(serde_json::Value::Null);
    job.spec.model =
        serde_json::from_value(json!({"profile": {"configMapRef": {"name": "p", "key": "k"}}}))
            .unwrap();
    let error = attempt_budget(&job, 8, None, None).unwrap_err();
    assert!(error.contains("spec.model.profile"), "{error}");
}

mod per_model {
    use super::*;
    use serde_json::json;

    const GIB: u64 = 1 << 30;

    fn gpt2_job(auto: bool, gpu_models: Option<Vec<&str>>) -> TrainingJob {
        let job = TrainingJob::test("j")
            .batch(64, 32)
            .auto_micro(auto)
            .model(
                json!({"transformer": {"layers": 12, "hidden": 768, "heads": 12,
                                          "vocab": 50257, "seqLen": 1024},
                          "precision": "amp-bf16"}),
            )
            .template(json!({}));
        match gpu_models {
            Some(models) => job.spec(json!({ "gpuModels": models })),
            None => job,
        }
        .build()
    }

    fn cluster() -> Vec<(String, u64)> {
        vec![
            ("H200".into(), 143_771 << 20),
            ("L4".into(), 23_034 << 20),
            ("Unknown-GPU".into(), 80 * GIB),
        ]
    }

    #[test]
    fn each_known_gpu_model_gets_its_own_prediction() {
        let job = gpt2_job(false, None);
        let budgets = gpu_model_budgets(&job, 8, false, &cluster(), None, &|_| None);
        let models: Vec<&str> = budgets.iter().map(|b| b.gpu_model.as_str()).collect();
        assert_eq!(
            models,
            ["H200", "L4"],
            "unknown models are left to the default"
        );
        for b in &budgets {
            let gpu = gpu_profile(&b.gpu_model).unwrap();
            let direct = attempt_budget_on(&job, 8, None, None, gpu).unwrap();
            assert_eq!((b.micro_batch, b.budget_bytes), (8, direct.budget));
        }
        // The L4's smaller context makes its prediction smaller.
        assert!(budgets[1].predicted_bytes < budgets[0].predicted_bytes);
        let only_l4 = gpu_model_budgets(
            &gpt2_job(false, Some(vec!["L4"])),
            8,
            false,
            &cluster(),
            None,
            &|_| None,
        );
        assert_eq!(only_l4.len(), 1);
        assert_eq!(only_l4[0].gpu_model, "L4");
        // A measurement of the micro-batch replaces the prediction.
        let measured = gpu_model_budgets(&job, 8, false, &cluster(), None, &|m| {
            (m == 8).then_some(5 * GIB)
        });
        assert_eq!(measured[0].predicted_bytes, 5 * GIB);
    }

    #[test]
    fn auto_micro_picks_per_model_the_largest_micro_batch_that_fits() {
        let job = gpt2_job(true, None);
        let budgets = gpu_model_budgets(&job, 32, true, &cluster(), None, &|_| None);
        let h200 = &budgets[0];
        let l4 = &budgets[1];
        assert!(l4.micro_batch < h200.micro_batch, "{budgets:?}");
        for b in [h200, l4] {
            let gpu = gpu_profile(&b.gpu_model).unwrap();
            let cap = cluster()
                .into_iter()
                .find(|(m, _)| *m == b.gpu_model)
                .unwrap()
                .1;
            assert!(b.budget_bytes <= cap);
            assert!(64 % b.micro_batch == 0);
            // the next larger divisor would not fit (or the cap is reached)
            if b.micro_batch < 32 {
                let next = attempt_budget_on(&job, b.micro_batch * 2, None, None, gpu).unwrap();
                assert!(
                    next.budget > cap,
                    "{}: {} fits too",
                    b.gpu_model,
                    b.micro_batch * 2
                );
            }
        }
        // Without auto the spec's micro-batch is used everywhere.
        let fixed = gpu_model_budgets(&job, 32, false, &cluster(), None, &|_| None);
        assert!(fixed.iter().all(|b| b.micro_batch == 32));
    }

    #[test]
    fn the_oom_correction_compounds_the_headroom_with_a_floor() {
        let cases = [
            (0, 0.5, 1.0),
            (1, 0.1, 1.1),
            (3, 0.1, 1.331),
            (1, 0.0, MIN_OOM_GROWTH),
            (2, 0.01, MIN_OOM_GROWTH * MIN_OOM_GROWTH),
        ];
        for (ooms, headroom, want) in cases {
            let got = oom_correction(ooms, headroom);
            assert!(
                (got - want).abs() < 1e-9,
                "{ooms} OOMs, headroom {headroom}: {got}"
            );
        }
    }
}
