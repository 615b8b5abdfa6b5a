use super::*;
use crate::predict::gpu_profile;

fn h200() -> &'static GpuProfile {
    gpu_profile("H200").unwrap()
}

#[test]
fn the_built_in_measurements_give_the_five_kinds_with_their_curves() {
    let kinds = parse_kinds(H200_STEP_TIMES, h200()).unwrap();
    let names: Vec<&str> = kinds.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["bert", "gpt2", "llama-1b", "resnet50", "vit-b-16"]);
    let llama = &kinds[2];
    assert_eq!(llama.global, 32);
    // micro 32 ran out of memory on the H200: not a point of the curve.
    assert_eq!(llama.micros().collect::<Vec<_>>(), [1, 2, 4, 8, 16]);
    assert!(llama.peak_at(32).is_none());
    // Peaks grow with the micro-batch (ViT's first two differ by noise
    // only) and include the CUDA context.
    let context = context_bytes(h200(), 1);
    for k in &kinds {
        assert!(k.peak.last().unwrap().1 > k.peak[0].1, "{}", k.name);
        assert!(k.peak[0].1 > context);
    }
    assert!(kinds[0].spec.is_some() && kinds[1].spec.is_some() && llama.spec.is_some());
    assert!(
        kinds[3].spec.is_none() && kinds[4].spec.is_none(),
        "vision kinds go through profiles"
    );
}

#[test]
fn the_largest_micro_within_a_room_is_the_largest_measured_that_fits() {
    let kinds = parse_kinds(H200_STEP_TIMES, h200()).unwrap();
    let gpt2 = &kinds[1];
    let p8 = gpt2.peak_at(8).unwrap();
    assert_eq!(gpt2.largest_micro_within(p8), Some(8));
    assert_eq!(gpt2.largest_micro_within(p8 - 1), Some(4));
    assert_eq!(gpt2.largest_micro_within(1), None);
}

#[test]
fn predictions_come_from_the_predictor_for_language_kinds_and_the_measurement_otherwise() {
    let kinds = parse_kinds(H200_STEP_TIMES, h200()).unwrap();
    let gpt2 = &kinds[1];
    let predicted = gpt2.predicted_peak(8, h200()).unwrap();
    assert_ne!(
        predicted,
        gpt2.peak_at(8).unwrap(),
        "the predictor, not the measurement"
    );
    let measured = gpt2.peak_at(8).unwrap() as f64;
    assert!(
        (predicted as f64 / measured - 1.0).abs() < 0.5,
        "{predicted} vs {measured}"
    );
    let resnet = &kinds[3];
    assert_eq!(
        resnet.predicted_peak(16, h200()).unwrap(),
        resnet.peak_at(16).unwrap()
    );
    assert!(resnet.predicted_peak(3, h200()).is_err());
}

#[test]
fn bad_measurements_are_refused_with_the_line() {
    let err = parse_kinds("{\"model\": \"x\"}", h200()).unwrap_err();
    assert!(err.contains("line 1"), "{err}");
    let err = parse_kinds("", h200()).unwrap_err();
    assert!(err.contains("no step-time"), "{err}");
    let two = "{\"model\": \"m\", \"micro\": 1, \"global\": 8, \"medianStepSeconds\": 1.0, \"peakReservedBytes\": 10}\n{\"model\": \"m\", \"micro\": 2, \"global\": 16, \"medianStepSeconds\": 1.0, \"peakReservedBytes\": 20}";
    assert!(
        parse_kinds(two, h200())
            .unwrap_err()
            .contains("global batches 8 and 16")
    );
    let no_time = "{\"model\": \"m\", \"micro\": 1, \"global\": 8, \"peakReservedBytes\": 10}";
    assert!(
        parse_kinds(no_time, h200())
            .unwrap_err()
            .contains("medianStepSeconds")
    );
}

#[test]
fn a_model_gets_the_curve_of_its_family() {
    let model = |yaml: &str| -> crate::api::ModelSpec { serde_saphyr::from_str(yaml).unwrap() };
    let cases = [
        (
            "{huggingFace: {seqLen: 8, config: {model_type: gpt2}}}",
            Some("gpt2"),
        ),
        (
            "{huggingFace: {seqLen: 8, config: {model_type: qwen3}}}",
            Some("llama-1b"),
        ),
        (
            "{huggingFace: {seqLen: 8, config: {model_type: mistral}}}",
            Some("llama-1b"),
        ),
        (
            "{huggingFace: {seqLen: 8, config: {model_type: roberta}}}",
            Some("bert"),
        ),
        ("{huggingFace: {seqLen: 8, config: {model_type: t5}}}", None),
        ("{huggingFace: {seqLen: 8, config: {}}}", None),
        (
            "{transformer: {kind: encoder, layers: 2, hidden: 8, heads: 2, vocab: 10, seqLen: 4}}",
            Some("bert"),
        ),
        (
            "{transformer: {layers: 2, hidden: 8, heads: 2, vocab: 10, seqLen: 4}}",
            Some("gpt2"),
        ),
        ("{mlp: {layers: 2, hidden: 8}}", None),
        ("{auto: {}}", None),
    ];
    for (yaml, want) in cases {
        assert_eq!(kind_for(&model(yaml)), want, "{yaml}");
    }
    // Every name it gives is a measured kind.
    let kinds = parse_kinds(H200_STEP_TIMES, crate::predict::default_gpu()).unwrap();
    for name in ["gpt2", "llama-1b", "bert"] {
        assert!(kinds.iter().any(|k| k.name == name), "{name}");
    }
}
