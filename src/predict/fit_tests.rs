use super::*;
use crate::predict::gpu_profile;

/// A LLaMA-2-7B shape in bf16 with AdamW, sequence 4096.
fn llama7b() -> ModelSpec {
    serde_json::from_value(serde_json::json!({
        "transformer": {"layers": 32, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000,
                         "seqLen": 4096, "mlp": "swiglu", "norm": "rmsnorm", "positional": "rotary",
                         "tiedEmbeddings": false},
        "precision": "bf16", "optimizer": "adamw"
    }))
    .unwrap()
}

fn shape(gpus: u32, global: u32, micro: u32) -> JobShape {
    JobShape {
        gpus,
        global_batch: global,
        micro_batch: micro,
    }
}

#[test]
fn each_change_is_predicted_and_zero_takes_the_fewest_gpus_that_fit() {
    let gpu = gpu_profile("L4").unwrap();
    let model = llama7b();
    let base = predict_model(&model, &shape(1, 64, 8), gpu)
        .unwrap()
        .peak_bytes;
    let options = fit_options(&model, &shape(1, 64, 8), gpu, gpu.capacity_bytes, 0.05);
    let changes: Vec<&str> = options.iter().map(|o| o.change.as_str()).collect();
    assert_eq!(changes[0], "model.gradientCheckpointing: true");
    assert_eq!(changes[1], "batch.micro: 1");
    assert!(
        changes[2].starts_with("model.zeroStage: 3 with gpus: "),
        "{changes:?}"
    );
    assert!(
        changes[3].ends_with("gradientCheckpointing: true and batch.micro: 1"),
        "{changes:?}"
    );
    for o in &options {
        assert!(o.peak_bytes < base, "{} does not lower the need", o.change);
    }
    // The ZeRO option is the first GPU count that fits: half as many do not.
    let fits = |p: u64| (p as f64 * 1.05).ceil() as u64 <= gpu.capacity_bytes;
    let zero = &options[3];
    assert!(fits(zero.peak_bytes), "{zero:?}");
    let gpus: u32 = zero.change["model.zeroStage: 3 with gpus: ".len()..]
        .split(',')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let sharded = ModelSpec {
        zero_stage: 3,
        gradient_checkpointing: true,
        ..model.clone()
    };
    let half = predict_model(&sharded, &shape(gpus / 2, 64, 1), gpu).unwrap();
    assert!(!fits(half.peak_bytes), "{} GPUs would do", gpus / 2);

    let advice = fit_advice(&options, gpu.capacity_bytes, 0.05, "L4");
    assert!(advice.starts_with("it would fit a L4"), "{advice}");
    assert!(advice.contains("zeroStage: 3"), "{advice}");
}

#[test]
fn a_job_no_change_rescues_says_the_least_it_would_still_need() {
    let options = vec![
        FitOption {
            change: "a".into(),
            peak_bytes: 300 << 30,
        },
        FitOption {
            change: "b".into(),
            peak_bytes: 200 << 30,
        },
    ];
    let advice = fit_advice(&options, 100 << 30, 0.0, "H200");
    assert_eq!(
        advice,
        "no single change makes it fit a H200 (100.0 GiB): the least, b, still needs 200.0 GiB per GPU"
    );
    assert_eq!(
        fit_advice(&[], 1, 0.0, "H200"),
        "no change of the spec could be predicted to fit a H200"
    );
    assert_eq!(micro_dividing(12, 8), 6);
    assert_eq!(micro_dividing(7, 8), 7);
    assert_eq!(micro_dividing(0, 8), 1);
}
