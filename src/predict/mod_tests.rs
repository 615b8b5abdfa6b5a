//! Tests of the predictor, including the committed H200 calibration data as a
//! regression test.

use super::bench::{BenchRow, bench_predict, error_stats};
use super::job::{parse_job, predict_job};
use super::*;
use crate::api::{Attention, HuggingFaceSpec, ModelSpec, TransformerSpec};

const CALIBRATION: &str = include_str!("../../data/calibration/h200.jsonl");
const ZERO_CALIBRATION: &str = include_str!("../../data/calibration/h200x2-zero.jsonl");
const GPT2_PROFILE: &str =
    include_str!("../../data/profiles/gpt2s-s1024-b8-ampbf16-adamw.profile.json");
const LLAMA_PROFILE: &str =
    include_str!("../../data/profiles/llama1b-s2048-b4-bf16-adamw.profile.json");

fn gpt2_small() -> ModelSpec {
    let t: TransformerSpec = serde_json::from_value(serde_json::json!({
        "layers": 12, "hidden": 768, "heads": 12, "vocab": 50257, "seqLen": 1024
    }))
    .unwrap();
    ModelSpec {
        transformer: Some(t),
        ..ModelSpec::default()
    }
}

fn one_gpu(micro: u32) -> JobShape {
    JobShape {
        gpus: 1,
        global_batch: micro,
        micro_batch: micro,
    }
}

#[test]
fn gpt2_small_parameter_count_matches_pytorch() {
    assert_eq!(
        resolve_arch(&gpt2_small()).unwrap().parameter_count(),
        124_439_808
    );
}

#[test]
fn every_calibration_model_has_the_parameter_count_pytorch_measured() {
    for line in CALIBRATION.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let model: ModelSpec = serde_json::from_value(v["spec"]["model"].clone()).unwrap();
        let want = v["measured"]["parameters"].as_u64().unwrap();
        assert_eq!(
            resolve_arch(&model).unwrap().parameter_count(),
            want,
            "{}",
            v["name"]
        );
    }
}

/// Fails naming every measured configuration predicted off by more than `bound`.
fn assert_every_row_within(rows: &[crate::predict::bench::BenchRow], bound: f64) {
    let off: Vec<String> = rows
        .iter()
        .filter(|r| r.relative_error.abs() > bound)
        .map(|r| format!("{}: {:+.1}%", r.name, 100.0 * r.relative_error))
        .collect();
    assert!(off.is_empty(), "{off:?}");
}

#[test]
fn the_calibration_set_is_predicted_within_its_recorded_figures() {
    // The reference modules' 40 runs: median 0.6 %, none under beyond 5 %;
    // the largest error is GPT-2 small with checkpointing at micro 16
    // (+15.9 %: the replay takes one more logits segment in the second step
    // than the recorded history, data/calibration/h100-reference-histories).
    let report = bench_predict(CALIBRATION, None).unwrap();
    assert!(report.rows.len() >= 30);
    assert_every_row_within(&report.rows, 0.16);
    let all = error_stats(&report.rows, None);
    assert!(all.median <= 0.01, "{all:?}");
    assert!(all.under_predictions.is_empty(), "{all:?}");
    let held_out = error_stats(&report.rows, Some("holdout"));
    assert!(
        held_out.median <= 0.03 && held_out.p90 <= 0.07,
        "{held_out:?}"
    );
}

#[test]
fn recorded_profiles_replay_within_five_percent_of_the_measured_peak() {
    for text in [GPT2_PROFILE, LLAMA_PROFILE] {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        let micro = v["microBatch"].as_u64().unwrap() as u32;
        let p = predict_from_profile(text, &one_gpu(micro), default_gpu()).unwrap();
        let measured = v["measured"]["nvmlPeakBytes"].as_u64().unwrap() as f64;
        let err = (p.peak_bytes as f64 - measured) / measured;
        assert!(err.abs() <= 0.05, "{}: {err}", v["source"]);
    }
}

#[test]
fn a_profile_books_what_outlives_its_step_apart_from_the_steps_transients() {
    // Two allocations: 64 MiB kept to the end, 32 MiB freed within the step.
    let text = r#"{"format":"vramfit.profile/v1","microBatch":1,
        "sizes":[67108864,33554432],"events":[0,1,-2]}"#;
    let p = predict_from_profile(text, &one_gpu(1), default_gpu()).unwrap();
    assert_eq!(p.breakdown.persistent, 64 << 20);
    assert_eq!(p.breakdown.activations, 32 << 20);
    assert_eq!(p.breakdown.parameters, 0);
    let table = crate::predict::output::prediction_table(&p);
    assert!(table.contains("persistent state"), "{table}");
    assert!(!table.contains("parameters"), "{table}");

    // GPT-2 small (124 M parameters) with AdamW: the fp32 weights and both
    // moments outlive the step; the peak's transients are the activations.
    let p = predict_from_profile(GPT2_PROFILE, &one_gpu(8), default_gpu()).unwrap();
    assert!(
        p.breakdown.persistent >= 124_000_000 * 4 * 3,
        "{:?}",
        p.breakdown
    );
    assert!(p.breakdown.activations > 0, "{:?}", p.breakdown);
}

#[test]
fn a_profile_cannot_predict_a_larger_micro_batch() {
    let err = predict_from_profile(GPT2_PROFILE, &one_gpu(16), default_gpu()).unwrap_err();
    assert!(err.to_string().contains("micro-batch 8"), "{err}");
}

#[test]
fn a_captured_profile_gets_the_gpus_cublas_workspaces_where_it_says() {
    // 1 MiB alive, freed; the workspaces are allocated before event 1 and at
    // the end, and never freed.
    let base = r#"{"format":"vramfit.profile/v1","microBatch":1,"sizes":[1048576],"events":[0,-1]"#;
    let without = predict_from_profile(&format!("{base}}}"), &one_gpu(1), default_gpu()).unwrap();
    let with = predict_from_profile(
        &format!(r#"{base},"cublasWorkspaceAt":[1,2]}}"#),
        &one_gpu(1),
        default_gpu(),
    )
    .unwrap();
    let ws = default_gpu().cublas_workspace_bytes;
    assert_eq!(without.allocated_bytes, 1 << 20);
    assert_eq!(with.allocated_bytes, 2 * ws);
    assert_eq!(with.breakdown.workspace, 2 * ws);
    let other = gpu_profile("A100-80GB").unwrap();
    let a100 = predict_from_profile(
        &format!(r#"{base},"cublasWorkspaceAt":[1,2]}}"#),
        &one_gpu(1),
        other,
    )
    .unwrap();
    assert_eq!(a100.breakdown.workspace, 2 * other.cublas_workspace_bytes);
    let err = predict_from_profile(
        &format!(r#"{base},"cublasWorkspaceAt":[3]}}"#),
        &one_gpu(1),
        default_gpu(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("position 3"), "{err}");
}

#[test]
fn a_captured_cublas_workspace_follows_its_calls_output() {
    // The capture names the position before the call's output (2 MiB, the
    // head's weight gradient); cuBLAS takes its workspace when the call
    // runs, after ATen allocated that output, as the H200's recorded runs
    // show. Before it, Qwen3 bf16's capture was 17.7 % over and Gemma 2
    // amp's 13.0 %: the workspace split the freed loss segment.
    use sequence::TensorEvent;
    let text = r#"{"format":"vramfit.profile/v1","microBatch":1,"sizes":[1048576,2097152],
        "events":[0,1,-1,-2],"cublasWorkspaceAt":[1]}"#;
    let prof = profile::parse_profile(text).unwrap();
    let events = profile::profile_events(&prof, 1, default_gpu()).unwrap();
    let sizes: Vec<Option<u64>> = events
        .iter()
        .map(|e| match *e {
            TensorEvent::Alloc { bytes, .. } => Some(bytes),
            TensorEvent::Free { .. } => None,
        })
        .collect();
    let ws = default_gpu().cublas_workspace_bytes;
    assert_eq!(
        sizes,
        [Some(1 << 20), Some(2 << 20), Some(ws), None, None],
        "{events:?}"
    );
    // A tensor the profile never frees (a weight) keeps its id: the
    // workspace's comes after every allocation's.
    let kept = r#"{"format":"vramfit.profile/v1","microBatch":1,"sizes":[1048576,2097152],
        "events":[0,1,-1],"cublasWorkspaceAt":[1]}"#;
    let events =
        profile::profile_events(&profile::parse_profile(kept).unwrap(), 1, default_gpu()).unwrap();
    let ids: Vec<u32> = events
        .iter()
        .filter_map(|e| match *e {
            TensorEvent::Alloc { id, .. } => Some(id),
            TensorEvent::Free { .. } => None,
        })
        .collect();
    assert_eq!(ids, [0, 1, 2], "{events:?}");
}

#[test]
fn a_captured_convolution_takes_its_cudnn_workspace_for_the_call_only() {
    // 1 MiB alive, then freed; the weight gradient of a depthwise 3x3
    // convolution of a channels-last 1 x 16 x 512 x 512 fp32 input (16 MiB):
    // its workspace is taken while the 1 MiB is alive.
    let conv = |at: usize, kind: &str, layout: &str| {
        format!(
            r#"{{"at":{at},"kind":"{kind}","input":[1,16,512,512],"weight":[16,1,3,3],"stride":[1,1],"padding":[1,1],"dilation":[1,1],"groups":16,"dtype":"float32","channelsLast":{layout}}}"#
        )
    };
    let call: crate::predict::conv::ConvCall =
        serde_json::from_str(&conv(1, "weight", "true")).unwrap();
    let ws = crate::predict::conv::cudnn_workspace(&call);
    assert!(ws > 100 << 20, "{ws}");
    let base = r#"{"format":"vramfit.profile/v1","microBatch":1,"sizes":[1048576],"events":[0,-1]"#;
    let predict = |convs: &[String]| {
        let text = format!(r#"{base},"convolutions":[{}]}}"#, convs.join(","));
        predict_from_profile(&text, &one_gpu(1), default_gpu())
    };
    let during = predict(&[conv(1, "weight", "true")]).unwrap();
    assert_eq!(during.allocated_bytes, (1 << 20) + ws);
    // given back after the call: two calls never hold two workspaces
    let twice = predict(&[conv(1, "weight", "true"), conv(1, "weight", "true")]).unwrap();
    assert_eq!(twice.allocated_bytes, (1 << 20) + ws);
    // after the 1 MiB is freed, the workspace alone
    let after = predict(&[conv(2, "weight", "true")]).unwrap();
    assert_eq!(after.allocated_bytes, ws);
    // a contiguous input runs ATen's kernel, the forward takes none: the
    // replay is the profile's own, reserved memory included
    let plain = predict(&[]).unwrap();
    for none in [conv(1, "weight", "false"), conv(1, "forward", "true")] {
        let p = predict(&[none]).unwrap();
        assert_eq!(p.allocated_bytes, 1 << 20);
        assert_eq!(p.reserved_bytes, plain.reserved_bytes);
    }
    let err = predict(&[conv(3, "weight", "true")]).unwrap_err();
    assert!(
        err.to_string().contains("convolutions names position 3"),
        "{err}"
    );
}

#[test]
fn a_captured_column_sum_takes_the_reduction_kernels_staging_for_the_kernel_only() {
    // 1 MiB alive, then freed; ViT-B's 2048-wide MLP bias summed over
    // 64 x 197 tokens: 132 MiB of partial sums on an H200.
    let sum = |at: usize, rows: u64| format!(r#"{{"at":{at},"rows":{rows},"outputs":2048}}"#);
    let base = r#"{"format":"vramfit.profile/v1","microBatch":1,"sizes":[1048576],"events":[0,-1]"#;
    let predict = |sums: &[String], gpu: &'static crate::predict::gpu::GpuProfile| {
        let text = format!(r#"{base},"reductions":[{}]}}"#, sums.join(","));
        predict_from_profile(&text, &one_gpu(1), gpu)
    };
    let h200 = default_gpu();
    let staging =
        crate::predict::reduce::column_sum_staging(2048, 64 * 197, 4, h200.reduce).unwrap();
    assert_eq!(staging.buffer, 132 << 20);
    let during = predict(&[sum(1, 64 * 197)], h200).unwrap();
    assert_eq!(
        during.allocated_bytes,
        (1 << 20) + staging.buffer + staging.semaphores
    );
    // given back after the kernel
    let twice = predict(&[sum(1, 64 * 197), sum(1, 64 * 197)], h200).unwrap();
    assert_eq!(twice.allocated_bytes, during.allocated_bytes);
    // another GPU's launch configuration gives another buffer
    let l4 = gpu_profile("L4").unwrap();
    let l4_staging = crate::predict::reduce::column_sum_staging(2048, 64 * 197, 4, l4.reduce)
        .map_or(0, |s| s.buffer + s.semaphores);
    assert_ne!(l4_staging, staging.buffer + staging.semaphores);
    assert_eq!(
        predict(&[sum(1, 64 * 197)], l4).unwrap().allocated_bytes,
        (1 << 20) + l4_staging
    );
    // few rows need no buffer
    let plain = predict(&[], h200).unwrap();
    let few = predict(&[sum(1, 64)], h200).unwrap();
    assert_eq!(few.allocated_bytes, 1 << 20);
    assert_eq!(few.reserved_bytes, plain.reserved_bytes);
    let err = predict(&[sum(3, 64)], h200).unwrap_err();
    assert!(
        err.to_string().contains("reductions names position 3"),
        "{err}"
    );
}

#[test]
fn malformed_profiles_are_rejected_with_the_reason() {
    let cases = [
        (
            r#"{"format":"other/v9","microBatch":1,"sizes":[512],"events":[0]}"#,
            "not supported",
        ),
        (
            r#"{"format":"vramfit.profile/v1","microBatch":1,"sizes":[512],"events":[3]}"#,
            "names size 3",
        ),
        (
            r#"{"format":"vramfit.profile/v1","microBatch":1,"sizes":[512],"events":[0,-1,-1]}"#,
            "not live",
        ),
        ("not json", "profile"),
    ];
    for (text, want) in cases {
        let err = predict_from_profile(text, &one_gpu(1), default_gpu())
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{text}: {err}");
    }
}

#[test]
fn every_two_gpu_zero_line_is_predicted_within_twelve_percent() {
    // The largest error: LLaMA-1B at stage 3 with checkpointing, +11.8 %.
    let report = bench_predict(ZERO_CALIBRATION, None).unwrap();
    assert!(report.rows.len() >= 12);
    assert_every_row_within(&report.rows, 0.12);
    let all = error_stats(&report.rows, None);
    assert!(all.median <= 0.01, "{all:?}");
    assert!(all.under_predictions.is_empty(), "{all:?}");
    let fit = error_stats(&report.rows, Some("fit"));
    assert!(fit.median <= 0.04 && fit.p90 <= 0.055, "{fit:?}");
}

/// The events of a small GPT-style model, two blocks, under amp on two GPUs.
fn two_block_events(
    zero_stage: u8,
    gpus: u64,
) -> (Vec<sequence::TensorEvent>, Vec<arch::ParamTensor>) {
    let mut model = gpt2_small();
    let t = model.transformer.as_mut().unwrap();
    (t.layers, t.hidden, t.heads, t.vocab, t.seq_len) = (2, 64, 4, 1000, 32);
    let arch = resolve_arch(&model).unwrap();
    let run = sequence::RunShape {
        reduce: None,
        micro_batch: 2,
        grad_accum: 1,
        precision: crate::api::Precision::AmpBf16,
        optimizer: crate::api::Optimizer::AdamW,
        checkpointing: false,
        attention: Attention::Sdpa,
        zero_stage,
        gpus,
        cublas_workspace: 1 << 20,
    };
    (sequence::training_events(&arch, &run), arch.param_tensors())
}

/// (allocations, largest number alive at once) of each stream's tensors.
fn per_stream(
    evs: &[sequence::TensorEvent],
) -> std::collections::HashMap<sequence::Stream, (usize, usize)> {
    use sequence::TensorEvent;
    let mut stream_of = std::collections::HashMap::new();
    let mut out: std::collections::HashMap<sequence::Stream, (usize, usize, usize)> =
        std::collections::HashMap::new();
    for e in evs {
        match *e {
            TensorEvent::Alloc { id, stream, .. } => {
                stream_of.insert(id, stream);
                let s = out.entry(stream).or_default();
                s.0 += 1;
                s.1 += 1;
                s.2 = s.2.max(s.1);
            }
            TensorEvent::Free { id } => {
                if let Some(stream) = stream_of.remove(&id) {
                    out.get_mut(&stream).unwrap().1 -= 1;
                }
            }
        }
    }
    out.into_iter()
        .map(|(k, (n, _, max))| (k, (n, max)))
        .collect()
}

#[test]
fn only_fsdp_uses_the_all_gather_and_reduce_scatter_streams() {
    use sequence::{Stream, TensorEvent};
    for (stage, gpus) in [(0, 1), (3, 1), (0, 2), (1, 2)] {
        let (evs, _) = two_block_events(stage, gpus);
        assert!(
            evs.iter().all(
                |e| !matches!(e, TensorEvent::Alloc { stream, .. } if *stream != Stream::Default)
            ),
            "stage {stage} on {gpus} GPUs"
        );
    }
    // Optimizer steps of one micro-step each; three units (root, two
    // blocks). Stage 2 gathers each unit once per step, stage 3 gathers the
    // blocks again for backward; every unit is reduce-scattered once.
    let steps = sequence::STEPS_GENERATED as usize;
    for (stage, gathers) in [(2, 3), (3, 5)] {
        let (evs, params) = two_block_events(stage, 2);
        let s = per_stream(&evs);
        assert_eq!(s[&Stream::AllGather].0, steps * gathers, "stage {stage}");
        assert_eq!(s[&Stream::ReduceScatter].0, steps * 3, "stage {stage}");
        // The reduce-scatter outputs are the sharded gradients: one per unit
        // alive at the optimizer step, half the model's fp32 bytes in all.
        assert_eq!(s[&Stream::ReduceScatter].1, 3, "stage {stage}");
        let shard: u64 = params.iter().map(|p| p.numel().div_ceil(2) * 4).sum();
        let rs: u64 = evs
            .iter()
            .take_while(|e| matches!(e, TensorEvent::Alloc { .. } | TensorEvent::Free { .. }))
            .filter_map(|e| match *e {
                TensorEvent::Alloc {
                    bytes,
                    stream: Stream::ReduceScatter,
                    ..
                } => Some(bytes),
                _ => None,
            })
            .sum();
        assert_eq!(rs, steps as u64 * shard, "stage {stage}");
        // In forward a unit's flat all-gather output is kept until the next
        // unit's copy-out, so two are alive at once, never more.
        assert_eq!(s[&Stream::AllGather].1, 2, "stage {stage}");
    }
}

#[test]
fn fsdp_stream_pools_come_on_top_of_the_default_streams_reserve() {
    let mut model = gpt2_small();
    model.zero_stage = 2;
    let arch = resolve_arch(&model).unwrap();
    let job = two_gpus(8);
    let p = predict_model(&model, &job, default_gpu()).unwrap();
    let run = sequence::RunShape {
        reduce: None,
        micro_batch: 8,
        grad_accum: 1,
        precision: model.precision,
        optimizer: model.optimizer,
        checkpointing: false,
        attention: model.attention,
        zero_stage: 2,
        gpus: 2,
        cublas_workspace: default_gpu().cublas_workspace_bytes,
    };
    let out = CachingAllocatorModel::PYTORCH
        .replay(&sequence::training_events(&arch, &run))
        .unwrap();
    // At the allocated peak (the loss of the second step) the reduce-scatter
    // pool holds the freed sharded gradients of the first step: at least
    // half the model's fp32 gradients sit idle outside the default pool.
    assert!(
        out.idle_other_streams_at_allocated_peak >= 2 * 124_439_808,
        "{out:?}"
    );
    let floor = out.allocated_peak
        + loss_block_margin(&arch, 8, 2)
        + out.idle_other_streams_at_allocated_peak;
    assert_eq!(
        p.reserved_bytes,
        out.reserved_peak.max(round_segment(floor))
    );
}

fn two_gpus(micro: u32) -> JobShape {
    JobShape {
        gpus: 2,
        global_batch: 2 * micro,
        micro_batch: micro,
    }
}

#[test]
fn zero3_on_two_gpus_saves_about_half_of_the_model_state_of_ddp() {
    let mut model = gpt2_small();
    model.precision = crate::api::Precision::Fp32;
    let ddp = predict_model(&model, &two_gpus(1), default_gpu()).unwrap();
    model.zero_stage = 3;
    let z3 = predict_model(&model, &two_gpus(1), default_gpu()).unwrap();
    // fp32 AdamW: 4 (weights) + 4 (grads) + 8 (state) bytes per parameter;
    // ZeRO-3 over two GPUs keeps half, DDP also holds its 4-byte buckets.
    let state = 16 * 124_439_808_u64;
    let saved = ddp.peak_bytes as f64 - z3.peak_bytes as f64;
    assert!(
        saved > 0.4 * state as f64 && saved < 0.85 * state as f64,
        "saved {saved} of {state}: {ddp:?} vs {z3:?}"
    );
}

#[test]
fn ddp_holds_a_flat_copy_of_the_gradients_and_nccl_memory() {
    let model = gpt2_small();
    let one = predict_model(&model, &one_gpu(1), default_gpu()).unwrap();
    let two = predict_model(&model, &two_gpus(1), default_gpu()).unwrap();
    let gpu = default_gpu();
    assert_eq!(one.breakdown.context, gpu.context_bytes);
    assert_eq!(two.breakdown.context, gpu.context_bytes + gpu.nccl_bytes);
    // amp-bf16 keeps fp32 gradients: the buckets add 4 bytes per parameter.
    let buckets = 4 * 124_439_808_u64;
    assert!(
        two.peak_bytes >= one.peak_bytes + gpu.nccl_bytes + buckets - (4 << 20),
        "{two:?} vs {one:?}"
    );
}

#[test]
fn fsdp_stage2_gathers_every_block_until_backward_stage3_one_at_a_time() {
    let mut model = gpt2_small();
    model.zero_stage = 2;
    let z2 = predict_model(&model, &two_gpus(8), default_gpu()).unwrap();
    model.zero_stage = 3;
    let z3 = predict_model(&model, &two_gpus(8), default_gpu()).unwrap();
    // At the loss, stage 2 holds every block's gathered fp32 weights
    // (85M parameters in the blocks), stage 3 none of them.
    let blocks = 4 * 12 * 7_087_872_u64;
    let diff = z2.breakdown.parameters - z3.breakdown.parameters;
    assert!(
        diff + (64 << 20) >= blocks && diff <= blocks + (64 << 20),
        "{diff} vs {blocks}"
    );
    assert!(z2.peak_bytes > z3.peak_bytes);
}

#[test]
fn zero3_shards_parameters_gradients_and_optimizer_over_gpus() {
    let mut model = gpt2_small();
    let single = predict_model(&model, &one_gpu(1), default_gpu()).unwrap();
    model.zero_stage = 3;
    let job = JobShape {
        gpus: 4,
        global_batch: 4,
        micro_batch: 1,
    };
    let sharded = predict_model(&model, &job, default_gpu()).unwrap();
    let persistent =
        |p: &Prediction| p.breakdown.parameters + p.breakdown.gradients + p.breakdown.optimizer;
    // Over 4 GPUs the shards are a quarter; the root unit (embedding table
    // and head) stays gathered at the loss, so less than half in all.
    assert!(
        persistent(&sharded) * 2 < persistent(&single),
        "{sharded:?} vs {single:?}"
    );
    assert!(sharded.peak_bytes < single.peak_bytes);
}

#[test]
fn checkpointing_lowers_the_peak_of_a_long_sequence_model() {
    let mut model = gpt2_small();
    let plain = predict_model(&model, &one_gpu(16), default_gpu()).unwrap();
    model.gradient_checkpointing = true;
    let ckpt = predict_model(&model, &one_gpu(16), default_gpu()).unwrap();
    assert!(
        ckpt.allocated_bytes < plain.allocated_bytes * 3 / 4,
        "{ckpt:?} vs {plain:?}"
    );
}

#[test]
fn eager_attention_adds_the_sequence_squared_scores() {
    let mut model = gpt2_small();
    let sdpa = predict_model(&model, &one_gpu(8), default_gpu()).unwrap();
    model.attention = Attention::Eager;
    let eager = predict_model(&model, &one_gpu(8), default_gpu()).unwrap();
    // 12 layers keep an fp32 8 x 12 x 1024 x 1024 softmax output each (the
    // backward of the loss then overlaps with part of it being freed).
    let scores: u64 = 12 * 8 * 12 * 1024 * 1024 * 4;
    assert!(
        eager.allocated_bytes >= sdpa.allocated_bytes + scores / 2,
        "{eager:?} vs {sdpa:?}"
    );
}

/// The predictor's error for a Hugging Face model given by `config`.
fn hugging_face_error(config: serde_json::Value) -> String {
    let model = ModelSpec {
        hugging_face: Some(HuggingFaceSpec {
            config: config.as_object().unwrap().clone(),
            seq_len: 512,
        }),
        ..ModelSpec::default()
    };
    predict_model(&model, &one_gpu(1), default_gpu())
        .unwrap_err()
        .to_string()
}

#[test]
fn a_mixtures_bad_expert_keys_are_refused_naming_them() {
    // transformers divides by `decoder_sparse_step`; top-k beyond the
    // experts cannot route.
    for (config, key) in [
        (
            serde_json::json!({"model_type": "qwen3_moe", "decoder_sparse_step": 0}),
            "decoder_sparse_step",
        ),
        (
            serde_json::json!({"model_type": "qwen3_moe", "mlp_only_layers": "0"}),
            "mlp_only_layers",
        ),
        (
            serde_json::json!({"model_type": "qwen3_moe", "num_local_experts": 4, "num_experts_per_tok": 8}),
            "num_experts_per_tok",
        ),
    ] {
        let err = hugging_face_error(config);
        assert!(err.contains(&format!("huggingFace.config.{key}")), "{err}");
    }
}

#[test]
fn unknown_hugging_face_model_types_name_the_supported_ones() {
    let config = serde_json::json!({"model_type": "falcon", "hidden_size": 512});
    let err = hugging_face_error(config);
    assert!(
        err.starts_with(
            "huggingFace.config.model_type 'falcon' is not described analytically, and no supported family reads only keys this config has (supported: gpt2, llama, mistral, qwen2, qwen3, phi3, bert, roberta, gemma2, gemma3_text, mixtral, qwen2_moe, granite, qwen3_moe, starcoder2, olmo2, gpt_neox, opt, t5, deberta-v2, vit); "
        ),
        "{err}"
    );
    assert!(err.contains("spec.memory.request"), "{err}");
    assert!(err.contains("profiles such a job automatically"), "{err}");
    assert!(err.contains("--profile FILE"), "{err}");
}

#[test]
fn keys_a_config_leaves_out_take_the_library_s_defaults() {
    let arch = hf_arch(serde_json::json!({"model_type": "llama", "hidden_size": 512})).unwrap();
    assert_eq!(
        (
            arch.heads,
            arch.kv_heads,
            arch.head_dim,
            arch.layers,
            arch.ffn,
            arch.vocab
        ),
        (32, 32, 16, 32, 11008, 32000)
    );
    // Mistral's default is 8 key/value heads, not one per query head.
    let arch = hf_arch(serde_json::json!({"model_type": "mistral"})).unwrap();
    assert_eq!((arch.heads, arch.kv_heads, arch.ffn), (32, 8, 14336));
    // A null is a key left out.
    let arch =
        hf_arch(serde_json::json!({"model_type": "gpt2", "n_head": null, "n_embd": 96})).unwrap();
    assert_eq!((arch.heads, arch.head_dim, arch.ffn), (12, 8, 384));
}

#[test]
fn an_empty_model_and_an_uneven_batch_are_errors_not_zeros() {
    let err = predict_model(&ModelSpec::default(), &one_gpu(1), default_gpu()).unwrap_err();
    assert!(matches!(err, PredictError::Missing(_)));
    let job = JobShape {
        gpus: 2,
        global_batch: 10,
        micro_batch: 4,
    };
    assert!(predict_model(&gpt2_small(), &job, default_gpu()).is_err());
}

#[test]
fn a_training_job_yaml_predicts_with_its_micro_batch_and_accumulation() {
    let yaml = "apiVersion: vramfit.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: g}\nspec:\n  gpus: 1\n  batch: {global: 32, micro: 8}\n  model:\n    transformer: {layers: 12, hidden: 768, heads: 12, vocab: 50257, seqLen: 1024}\n    precision: amp-bf16\n  template: {}\n";
    let job = parse_job(yaml).unwrap();
    let p = predict_job(&job, gpu_profile("h200").unwrap(), None).unwrap();
    assert_eq!((p.micro_batch, p.grad_accum), (8, 4));
    let json = output::prediction_json(&p);
    for key in [
        "peakBytes",
        "reservedBytes",
        "breakdown",
        "microBatch",
        "gradAccum",
    ] {
        assert!(json.get(key).is_some(), "{key}");
    }
    // Each part against what it must be on its own, not against the total
    // it is derived from: fp32 gradients (4 bytes per parameter), AdamW's two
    // fp32 moments (8), fp32 master weights plus bf16 copies (4 to 6).
    let b = &p.breakdown;
    let params = p.parameters;
    assert!(params > 120_000_000 && params < 130_000_000, "{params}");
    assert_eq!(b.gradients, 4 * params);
    assert_eq!(b.optimizer, 8 * params);
    assert!(b.parameters > 4 * params && b.parameters <= 6 * params);
    assert_eq!(b.context, gpu_profile("h200").unwrap().context_bytes);
    assert!(b.allocator_overhead < p.peak_bytes / 5, "{b:?}");
    // Activations follow the micro-batch; the model's state does not.
    let half = predict_job(
        &parse_job(&yaml.replace("micro: 8", "micro: 4")).unwrap(),
        gpu_profile("h200").unwrap(),
        None,
    )
    .unwrap();
    let ratio = half.breakdown.activations as f64 / b.activations as f64;
    assert!((0.4..0.6).contains(&ratio), "activations x{ratio}");
    assert_eq!(half.breakdown.optimizer, b.optimizer);
    assert!(output::prediction_table(&p).contains("allocator overhead"));
}

#[test]
fn bench_statistics_of_a_hand_made_set() {
    let row = |name: &str, err: f64| BenchRow {
        name: name.into(),
        split: "holdout".into(),
        measured_bytes: 100,
        predicted_bytes: (100.0 * (1.0 + err)) as u64,
        relative_error: err,
        source: "model",
        predicted_allocated_bytes: 0,
        measured_allocated_bytes: None,
        margin_bytes: 0,
    };
    let rows = vec![
        row("a", 0.01),
        row("b", -0.02),
        row("c", 0.03),
        row("d", -0.08),
        row("e", 0.20),
    ];
    let s = error_stats(&rows, Some("holdout"));
    assert_eq!(s.count, 5);
    assert!((s.median - 0.03).abs() < 1e-12);
    assert!((s.p90 - 0.20).abs() < 1e-12);
    assert!((s.max - 0.20).abs() < 1e-12);
    assert_eq!(s.under_predictions, vec!["d".to_string()]);
}

#[test]
fn a_family_the_analytic_path_does_not_describe_is_skipped_with_its_reason() {
    // The fifth fresh set with its StarCoder2 run renamed to a family no
    // row describes (its config lacks keys a family would need to serve it
    // by its keys) and two torchvision nets: without captures the bench
    // answers the other eighteen and says why not the three.
    let measured = include_str!("../../data/calibration/h100-fresh5.jsonl").replace(
        "\"model_type\": \"starcoder2\"",
        "\"model_type\": \"falcon\"",
    );
    let report = super::bench::bench_predict_with_profiles(&measured, None, &|_| None, false)
        .expect("the unknown families do not stop the bench");
    assert_eq!(report.rows.len(), 18);
    assert_eq!(report.skipped.len(), 3, "{:?}", report.skipped);
    assert!(
        report
            .skipped
            .iter()
            .any(|s| s.contains("'falcon' is not described analytically")),
        "{:?}",
        report.skipped
    );
}

#[test]
fn gpu_profiles_are_found_by_nvml_names_and_estimates_are_labelled() {
    assert_eq!(gpu_profile("NVIDIA H200").unwrap().name, "H200");
    assert!(gpu_profile("A100-40GB").is_some());
    assert!(gpu_profile("V100").is_none());
    let measured: Vec<_> = GPU_PROFILES
        .iter()
        .filter(|p| p.provenance == gpu::Provenance::Measured)
        .map(|p| p.name)
        .collect();
    assert_eq!(measured, ["H200", "H100-80GB"]);
}

#[test]
fn auto_micro_batch_is_the_largest_divisor_that_fits_with_headroom() {
    let text = r#"{"gpus": 2, "batch": {"global": 96, "micro": 48, "minMicro": 2},
        "model": {"transformer": {"layers": 12, "hidden": 768, "heads": 12,
                  "vocab": 50257, "seqLen": 1024}, "precision": "amp-bf16"}}"#;
    let job = parse_job(text).unwrap();
    let gpu = default_gpu();
    let peak = |m: u32| job::predict_job_at(&job, m, gpu, None).unwrap().peak_bytes;
    // Room for micro-batch 8 with 5% headroom, not for 12 (divisors of 48: ..., 8, 12, 16, ...).
    let room = (peak(8) as f64 * 1.05).ceil() as u64;
    assert!((peak(12) as f64 * 1.05) > room as f64);
    let cases = [
        (room, 0.05, 8),
        (room - 1, 0.05, 6),
        (room, 0.0, 8),
        (u64::MAX, 0.05, 48),
        ((peak(2) as f64 * 1.05).ceil() as u64, 0.05, 2),
    ];
    for (capacity, headroom, want) in cases {
        let p = job::auto_micro_batch(&job, gpu, capacity, headroom, None).unwrap();
        assert_eq!(
            (p.micro_batch, p.grad_accum),
            (want, 96 / (2 * want)),
            "{capacity} {headroom}"
        );
    }
    let err = job::auto_micro_batch(&job, gpu, peak(2), 0.05, None).unwrap_err();
    assert!(err.to_string().contains("the smallest, 2, needs"), "{err}");
    // A profile is not asked above its recorded micro-batch.
    let profiled = parse_job(
        r#"{"batch": {"global": 64, "micro": 64}, "model": {"profile": {"configMapRef": {"name": "p", "key": "k"}}}}"#,
    )
    .unwrap();
    let p = job::auto_micro_batch(&profiled, gpu, u64::MAX, 0.05, Some(GPT2_PROFILE)).unwrap();
    assert_eq!(p.micro_batch, 8, "recorded at 8");
}

#[test]
fn cpu_captured_profiles_predict_the_held_out_torchvision_runs_within_the_goal() {
    let measured = include_str!("../../data/calibration/h200-libraries.jsonl");
    let report =
        super::bench::bench_predict_with_profiles(measured, None, &profiles_in("libraries"), false)
            .unwrap();
    let tv: Vec<BenchRow> = report
        .rows
        .iter()
        .filter(|r| r.name.starts_with("tv-"))
        .cloned()
        .collect();
    assert!(tv.len() >= 17 && tv.iter().all(|r| r.source == "profile"));
    let held_out = error_stats(&tv, Some("holdout"));
    assert!(held_out.count >= 6);
    assert!(
        held_out.median <= 0.03 && held_out.p90 <= 0.06,
        "{held_out:?}"
    );
    assert!(held_out.under_predictions.is_empty(), "{held_out:?}");
}

/// The `NAME.profile.json` files of `data/profiles/DIR` (gzipped,
/// `NAME.profile.json.gz`, where not plain), by name.
fn profiles_in(dir: &str) -> impl Fn(&str) -> Option<String> {
    use std::io::Read;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/profiles")
        .join(dir);
    move |name: &str| {
        if let Ok(text) = std::fs::read_to_string(dir.join(format!("{name}.profile.json"))) {
            return Some(text);
        }
        let file = std::fs::File::open(dir.join(format!("{name}.profile.json.gz"))).ok()?;
        let mut text = String::new();
        flate2::read::GzDecoder::new(file)
            .read_to_string(&mut text)
            .ok()?;
        Some(text)
    }
}

/// The rows of a measured set predicted from the captures in
/// `data/profiles/DIR`, where there is one (the analytic path elsewhere).
fn rows_from_captures(measured: &str, dir: &str) -> Vec<BenchRow> {
    super::bench::bench_predict_with_profiles(measured, None, &profiles_in(dir), true)
        .unwrap()
        .rows
}

/// The profiles recorded on the H200 itself (`calibrate_libraries.py
/// --snapshots`: each run's own tensor sequence, gzip JSON lines), by name.
fn gpu_recorded_profiles(file: &str) -> std::collections::HashMap<String, String> {
    use std::io::Read;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data/calibration/h200-snapshot-profiles")
        .join(file);
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text.lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            (v["name"].as_str().unwrap().to_string(), line.to_string())
        })
        .collect()
}

#[test]
fn the_allocator_model_replays_the_h200s_own_sequences_to_its_reserved_peak() {
    // The runs' tensor sequences as the GPU recorded them: what is left
    // between the prediction and the measurement is the allocator model
    // alone. Every run is within 0.5 % but one (Swin-T +1.9 %). With
    // increasing synthetic addresses (cudaMalloc's go down) three were off:
    // Llama-3 8B -4.4 %, a checkpointed LLaMA -2.6 %, T5 fp32 eager -5.2 %.
    for (measured, file) in [
        (
            include_str!("../../data/calibration/h200-heldout.jsonl"),
            "heldout-profiles.jsonl.gz",
        ),
        (
            include_str!("../../data/calibration/h200-families.jsonl"),
            "families-profiles.jsonl.gz",
        ),
    ] {
        let recorded = gpu_recorded_profiles(file);
        let profile_for = |name: &str| recorded.get(name).cloned();
        let report =
            super::bench::bench_predict_with_profiles(measured, None, &profile_for, true).unwrap();
        assert_eq!(report.rows.len(), recorded.len(), "{file}");
        for row in &report.rows {
            assert_eq!(row.source, "profile", "{}", row.name);
            let bound = if row.name.starts_with("tv-swin_t") {
                0.02
            } else {
                0.005
            };
            assert!(
                row.relative_error.abs() <= bound,
                "{}: {:+.2} %",
                row.name,
                row.relative_error * 100.0
            );
        }
    }
}

#[test]
fn captures_made_with_the_measuring_machines_libraries_predict_the_transformers_runs_within_the_goal()
 {
    // CPU captures made on the GPU machine (its PyTorch and transformers),
    // against that machine's measurements: the held-out set and the
    // families set. Of the convolution nets' cuDNN workspaces only the
    // channels-last depthwise ones are modelled (docs/profile-format.md), so
    // the torchvision rows are not held to it.
    for (measured, dir, min_rows) in [
        (
            include_str!("../../data/calibration/h200-heldout.jsonl"),
            "heldout-h200",
            20,
        ),
        (
            include_str!("../../data/calibration/h200-families.jsonl"),
            "families-h200",
            20,
        ),
        (
            include_str!("../../data/calibration/h200-fresh.jsonl"),
            "fresh-h200",
            15,
        ),
        (
            include_str!("../../data/calibration/h200-fresh2.jsonl"),
            "fresh2-h200",
            19,
        ),
    ] {
        let hf: Vec<BenchRow> = rows_from_captures(measured, dir)
            .into_iter()
            .filter(|r| r.name.starts_with("hf-") && r.source == "profile")
            .collect();
        assert!(hf.len() >= min_rows, "{dir}: {} rows", hf.len());
        let stats = error_stats(&hf, None);
        assert!(
            stats.median <= 0.03 && stats.p90 <= 0.06,
            "{dir}: {stats:?}"
        );
        assert!(stats.under_predictions.is_empty(), "{dir}: {stats:?}");
    }
}

#[test]
fn captures_of_the_third_fresh_set_put_the_cublas_workspace_after_its_call() {
    // The third fresh set's CPU captures (made on the GPU machine) against
    // its H200 runs. With the cuBLAS workspace before its call's output
    // Qwen3 bf16 was +17.7 % (the workspace split a freed loss segment); it
    // is within 1 % now. Captured again with the current capture (in-place
    // accumulation, the bf16 softmax rule), DeBERTa-v3 amp eager went from
    // -15.4 % to within 1 %. Llama-3 bf16 with checkpointing was +15.6 %
    // (one loss segment apart, its allocated peak within 0.1 %) until the
    // capture stopped building the causal mask that transformers builds for
    // fake position ids (and with it the repeated grouped keys and values):
    // 0.0 % since, and no row is beyond 10 %.
    let hf: Vec<BenchRow> = rows_from_captures(
        include_str!("../../data/calibration/h200-fresh3.jsonl"),
        "fresh3-h200",
    )
    .into_iter()
    .filter(|r| r.name.starts_with("hf-") && r.source == "profile")
    .collect();
    assert_eq!(hf.len(), 18);
    let stats = error_stats(&hf, None);
    assert!(stats.median <= 0.01, "{stats:?}");
    assert!(stats.under_predictions.is_empty(), "{stats:?}");
    let beyond: Vec<&str> = hf
        .iter()
        .filter(|r| r.relative_error.abs() > 0.10)
        .map(|r| r.name.as_str())
        .collect();
    assert!(beyond.is_empty(), "{beyond:?}");
    let llama3 = hf
        .iter()
        .find(|r| r.name == "hf-llama3h-s2048-b2-bf16-adamw-sdpa-ckpt")
        .unwrap();
    assert!(llama3.relative_error.abs() <= 0.01, "{llama3:?}");
    let qwen3 = hf
        .iter()
        .find(|r| r.name == "hf-qwen3h-s4096-b1-bf16-sgdm-sdpa")
        .unwrap();
    assert!(qwen3.relative_error.abs() <= 0.01, "{qwen3:?}");
}

#[test]
fn convolution_nets_get_their_cudnn_workspaces() {
    // The torchvision rows of three sets, captured on the GPU machine's CPU
    // and measured on its H200. Without the workspaces: median 2.2 %, p90
    // 8.4 %, 9 under by more than 5 % (VGG-16-BN -8.4 %, ResNet-18 -16.4 %,
    // ConvNeXt-T -8.4 %, ResNet-34 amp -11.8 %, ...); with them (and the
    // reduction kernel's staging) none.
    let mut rows = Vec::new();
    for (measured, dir) in [
        (
            include_str!("../../data/calibration/h200-fresh.jsonl"),
            "fresh-h200",
        ),
        (
            include_str!("../../data/calibration/h200-heldout.jsonl"),
            "heldout-h200",
        ),
        (
            include_str!("../../data/calibration/h200-libraries.jsonl"),
            "libraries-h200",
        ),
    ] {
        rows.extend(
            rows_from_captures(measured, dir)
                .into_iter()
                .filter(|r| r.name.starts_with("tv-") && r.source == "profile"),
        );
    }
    assert_eq!(rows.len(), 40);
    let stats = error_stats(&rows, None);
    assert!(stats.median <= 0.03 && stats.p90 <= 0.06, "{stats:?}");
    assert!(stats.under_predictions.is_empty(), "{stats:?}");
    // the rows furthest under without them (VGG-16-BN +2.1 % since the
    // reserve is the larger of the two address orders' replays, -0.3 % before)
    for (name, within) in [
        ("tv-vgg16_bn-i224-b32-fp32-sgdm", 0.025),
        ("tv-resnet18-i224-b128-fp32-adam", 0.05),
        ("tv-convnext_small-i224-b48-fp32-sgdm", 0.02),
        ("tv-resnet34-i224-b96-ampbf16-sgdm", 0.04),
    ] {
        let row = rows.iter().find(|r| r.name == name).unwrap();
        assert!(row.relative_error.abs() <= within, "{name}: {row:?}");
    }
}

#[test]
fn bias_gradients_summed_over_the_tokens_get_the_reduction_kernels_staging() {
    // torchvision's ViT-B/16 (batch 32 fp32, 64 bf16) and ConvNeXt-T (batch
    // 32 fp32, whose MLPs are Linear layers over every pixel), captured on
    // the GPU machine's CPU: without the staging buffers -7.0, -3.2 and
    // -2.9 % under.
    let rows = rows_from_captures(
        include_str!("../../data/calibration/h200-libraries.jsonl"),
        "libraries-h200",
    );
    for (name, low, high) in [
        ("tv-vit_b_16-i224-b32-fp32-adamw", -0.05, -0.03),
        ("tv-vit_b_16-i224-b64-bf16-sgdm", -0.015, 0.015),
        ("tv-convnext_tiny-i224-b32-fp32-adamw", -0.015, 0.015),
    ] {
        let row = rows.iter().find(|r| r.name == name).unwrap();
        assert_eq!(row.source, "profile", "{name}");
        assert!(
            (low..=high).contains(&row.relative_error),
            "{name}: {row:?}"
        );
    }
}

/// The events of a Hugging Face model built from `config` (merged over a
/// tiny GPT-2, LLaMA or BERT) at sequence 64, micro-batch 8, SGD.
fn hf_events(
    config: serde_json::Value,
    precision: crate::api::Precision,
    attention: Attention,
    checkpointing: bool,
) -> Vec<sequence::TensorEvent> {
    let model = ModelSpec {
        hugging_face: Some(HuggingFaceSpec {
            config: config.as_object().unwrap().clone(),
            seq_len: 64,
        }),
        ..ModelSpec::default()
    };
    let arch = resolve_arch(&model).unwrap();
    let run = sequence::RunShape {
        reduce: None,
        micro_batch: 8,
        grad_accum: 1,
        precision,
        optimizer: crate::api::Optimizer::Sgd,
        checkpointing,
        attention,
        zero_stage: 0,
        gpus: 1,
        cublas_workspace: 0,
    };
    sequence::training_events(&arch, &run)
}

/// Requested sizes alive when the live bytes first reach their maximum.
fn live_at_peak(evs: &[sequence::TensorEvent]) -> (u64, Vec<u64>) {
    let mut live = std::collections::BTreeMap::new();
    let (mut cur, mut peak, mut at_peak) = (0u64, 0u64, Vec::new());
    for e in evs {
        match *e {
            sequence::TensorEvent::Alloc { id, bytes, .. } => {
                live.insert(id, bytes);
                cur += bytes;
                if cur > peak {
                    peak = cur;
                    at_peak = live.values().copied().collect();
                }
            }
            sequence::TensorEvent::Free { id } => cur -= live.remove(&id).expect("freed once"),
        }
    }
    (peak, at_peak)
}

fn count(sizes: &[u64], bytes: u64) -> usize {
    sizes.iter().filter(|&&b| b == bytes).count()
}

fn tiny(model_type: &str) -> serde_json::Value {
    match model_type {
        "gpt2" => serde_json::json!({"model_type": "gpt2", "n_layer": 2, "n_embd": 96,
            "n_head": 4, "n_positions": 64, "n_inner": 384, "vocab_size": 5000}),
        "llama" => serde_json::json!({"model_type": "llama", "num_hidden_layers": 2,
            "hidden_size": 96, "num_attention_heads": 4, "num_key_value_heads": 4,
            "intermediate_size": 176, "vocab_size": 5000}),
        _ => {
            serde_json::json!({"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 96,
            "num_attention_heads": 4, "intermediate_size": 384, "vocab_size": 5000})
        }
    }
}

fn with(mut base: serde_json::Value, key: &str, v: serde_json::Value) -> serde_json::Value {
    base[key] = v;
    base
}

#[test]
fn hugging_face_causal_lms_keep_the_returned_logits_and_the_fp32_upcast_at_the_peak() {
    use crate::api::Precision;
    let (n, v) = (8 * 64, 5000);
    for family in ["gpt2", "llama"] {
        let (_, at) = live_at_peak(&hf_events(
            tiny(family),
            Precision::AmpBf16,
            Attention::Sdpa,
            false,
        ));
        // `outputs.logits` (bf16) stays; the log-softmax and its two gradients are fp32
        assert_eq!(count(&at, n * v * 2), 1, "{family}");
        assert_eq!(count(&at, n * v * 4), 3, "{family}");
        let (_, at) = live_at_peak(&hf_events(
            tiny(family),
            Precision::Fp32,
            Attention::Sdpa,
            false,
        ));
        assert_eq!(
            count(&at, n * v * 4),
            4,
            "{family} fp32: logits, log-softmax, 2 gradients"
        );
    }
}

#[test]
fn bert_loss_under_autocast_keeps_low_precision_log_probabilities_and_their_fp32_copy() {
    use crate::api::Precision;
    let (n, v) = (8 * 64, 5000);
    let (_, at) = live_at_peak(&hf_events(
        tiny("bert"),
        Precision::AmpBf16,
        Attention::Sdpa,
        false,
    ));
    // CrossEntropyLoss's composite: log_softmax in the logits' dtype (kept),
    // nll_loss on autocast's fp32 copy (kept); at the peak, the nll
    // gradient in fp32 beside them
    assert_eq!((count(&at, n * v * 2), count(&at, n * v * 4)), (2, 2));
    // over the step: logits, log-probabilities, the cast-back gradient and
    // the log-softmax gradient in bf16; the copy and the nll gradient in fp32
    let created: Vec<u64> = hf_events(tiny("bert"), Precision::AmpBf16, Attention::Sdpa, false)
        .iter()
        .filter_map(|e| match e {
            sequence::TensorEvent::Alloc { bytes, .. } => Some(*bytes),
            _ => None,
        })
        .collect();
    // (one micro-step in each step)
    let steps = sequence::STEPS_GENERATED as usize;
    assert_eq!(
        (count(&created, n * v * 2), count(&created, n * v * 4)),
        (4 * steps, 2 * steps)
    );
    let (_, at) = live_at_peak(&hf_events(
        tiny("bert"),
        Precision::Bf16,
        Attention::Sdpa,
        false,
    ));
    assert_eq!((count(&at, n * v * 2), count(&at, n * v * 4)), (4, 0));
}

#[test]
fn only_the_generic_descriptions_on_several_gpus_and_the_mlp_keep_a_loss_block_beyond_the_replay() {
    // A library model's prediction is its replay: no fp32 logits-sized block
    // on top (hf-gpt2g-s1024-b8-fp32-adamw-eager-ckpt on the H200: reserved
    // 0.37 GiB above allocated, where that block is 1.53 GiB).
    // On one GPU, the prediction's reserve is the replay's.
    let reserve_is_the_replays = |model: &ModelSpec| {
        let arch = resolve_arch(model).unwrap();
        let p = predict_model(model, &one_gpu(8), default_gpu()).unwrap();
        let replayed = CachingAllocatorModel::PYTORCH
            .replay(&sequence::training_events(
                &arch,
                &run_shape(model, &one_gpu(8), default_gpu()).unwrap(),
            ))
            .unwrap();
        assert_eq!(
            p.reserved_bytes - p.breakdown.margin,
            replayed.reserved_peak
        );
    };
    let gpt2 = with(tiny("gpt2"), "vocab_size", serde_json::json!(50_000));
    let library = hf_model(gpt2, 64, "fp32", "sdpa");
    let arch = resolve_arch(&library).unwrap();
    assert_eq!(loss_block_margin(&arch, 8, 1), 0);
    assert_eq!(loss_block_margin(&arch, 8, 2), 0);
    reserve_is_the_replays(&library);
    // The repository's reference transformer keeps one block of fp32 logits
    // on several GPUs and none on one; the MLP one fp32 batch x width block.
    let generic = gpt2_small();
    let arch = resolve_arch(&generic).unwrap();
    assert_eq!(loss_block_margin(&arch, 8, 1), 0);
    assert_eq!(loss_block_margin(&arch, 8, 2), 8 * 1024 * 50257 * 4);
    reserve_is_the_replays(&generic);
    let p = predict_model(&generic, &two_gpus(8), default_gpu()).unwrap();
    assert!(p.reserved_bytes >= p.allocated_bytes + 8 * 1024 * 50257 * 4);
    let mlp = Arch::Mlp {
        layers: 2,
        hidden: 1000,
    };
    assert_eq!(loss_block_margin(&mlp, 8, 1), 8 * 1000 * 4);
}

#[test]
fn each_hugging_face_library_term_adds_memory() {
    use crate::api::Precision;
    let peak = |cfg: serde_json::Value, p: Precision, a: Attention| {
        live_at_peak(&hf_events(cfg, p, a, false)).0
    };
    let amp = Precision::AmpBf16;
    let gpt2 = tiny("gpt2");
    let full = peak(gpt2.clone(), amp, Attention::Sdpa);
    let no_dropout = ["resid_pdrop", "embd_pdrop", "attn_pdrop"]
        .iter()
        .fold(gpt2.clone(), |c, k| with(c, k, serde_json::json!(0.0)));
    let (n, h, f, layers) = (8 * 64, 96, 384, 2);
    // one byte per element of the embeddings' and both residual branches' masks
    assert_eq!(
        full - peak(no_dropout, amp, Attention::Sdpa),
        (2 * layers + 1) * n * h
    );
    // gelu_new keeps 0.5x (bf16), x in fp32, tanh and 1 + tanh (fp32) and the
    // bf16 cast of its output; the fused gelu keeps its input and output
    let gelu = with(
        gpt2.clone(),
        "activation_function",
        serde_json::json!("gelu"),
    );
    assert_eq!(
        full - peak(gelu, amp, Attention::Sdpa),
        layers * n * f * (2 + 3 * 4 - 2)
    );
    // the DynamicCache's copies of every layer's keys and values
    let no_cache = with(gpt2.clone(), "use_cache", serde_json::json!(false));
    assert_eq!(
        full - peak(no_cache, amp, Attention::Sdpa),
        layers * 2 * n * h * 2
    );
}

#[test]
fn a_llama_block_keeps_what_the_library_code_saves() {
    use crate::api::Precision;
    // SGD, gradients cleared after the step: at the loss's backward a block
    // adds its weights and what its forward kept.
    let (b, s, h, f, heads) = (8u64, 64u64, 96u64, 176u64, 4u64);
    let n = b * s;
    let weights = (4 * h * h + 3 * h * f + 2 * h) * 2;
    let lse = b * heads * s * 4;
    let per_block = |p: Precision, a: Attention| {
        let two = live_at_peak(&hf_events(tiny("llama"), p, a, false)).0;
        let cfg = with(tiny("llama"), "num_hidden_layers", serde_json::json!(3));
        live_at_peak(&hf_events(cfg, p, a, false)).0 - two
    };
    // pure bf16, fused SDPA: RMSNorm's fp32 input copy, its bf16 normalised
    // tensor and output (twice); q after rotary, the cache's keys and values,
    // the SDPA output (already contiguous: no copy) and log-sum-exp; the four
    // SwiGLU tensors; the block input dies at the residual add.
    let want = weights + n * h * (4 + 2 + 2) * 2 + n * h * 2 * 4 + lse + 4 * n * f * 2 + 2 * n * 4;
    assert_eq!(per_block(Precision::Bf16, Attention::Sdpa), want);
    // eager: the fp32 softmax and its bf16 copy instead of log-sum-exp; the
    // copy of the transposed product replaces the kernel's own output
    let s2 = b * heads * s * s;
    assert_eq!(
        per_block(Precision::Bf16, Attention::Eager),
        want - lse + s2 * (4 + 2)
    );
}

#[test]
fn the_analytic_hugging_face_path_predicts_the_library_runs() {
    let measured = include_str!("../../data/calibration/h200-libraries.jsonl");
    let report = bench_predict(measured, None).unwrap();
    let hf: Vec<BenchRow> = report
        .rows
        .iter()
        .filter(|r| r.name.starts_with("hf-") && r.split != "repeat")
        .cloned()
        .collect();
    assert_eq!(hf.len(), 42);
    assert!(hf.iter().all(|r| r.source == "model"));
    // The allocated peak, what the generated sequence decides by itself, is
    // within 2% of PyTorch's on every run.
    for r in &hf {
        let m = r.measured_allocated_bytes.unwrap() as f64;
        let err = (r.predicted_allocated_bytes as f64 - m) / m;
        assert!(
            err.abs() <= 0.02,
            "{}: allocated {:+.1}%",
            r.name,
            100.0 * err
        );
    }
    let held_out = error_stats(&hf, Some("holdout"));
    assert_eq!(held_out.count, 11);
    // p90 6.1 % since the loss follows CrossEntropyLoss's composite under
    // autocast (hf-bert-s512-b32-ampbf16 went from +5.1 % to +12.5 %; its
    // capture, with the same loss, replays to within 0.1 %: the rest of the
    // generated sequence differs there, docs/benchmarks/library-models.md).
    assert!(
        held_out.median <= 0.03 && held_out.p90 <= 0.065,
        "{held_out:?}"
    );
    // No held-out run under by more than 5% (the softmax-backward rule was
    // added after seeing one, docs/benchmarks/library-models.md). No fit row
    // below -5%: Qwen2 bf16 with checkpointing was -16.3 % while the
    // generated sequence made a block's weight gradients after its backward
    // (on the H200 they split the freed loss segment that the second step's
    // logits then did not find); made at their matmuls' nodes it is -0.0 %.
    assert!(held_out.under_predictions.is_empty(), "{held_out:?}");
    assert!(hf.iter().all(|r| r.relative_error > -0.05), "{hf:?}");
    let fit = error_stats(&hf, Some("fit"));
    assert!(fit.median <= 0.02 && fit.p90 <= 0.09, "{fit:?}");
}

#[test]
fn the_generated_sequence_written_as_a_profile_replays_to_the_same_allocated_peak() {
    let model = ModelSpec {
        hugging_face: Some(HuggingFaceSpec {
            config: tiny("llama").as_object().unwrap().clone(),
            seq_len: 64,
        }),
        precision: crate::api::Precision::AmpBf16,
        ..ModelSpec::default()
    };
    let gpu = default_gpu();
    let doc = generated_profile(&model, &one_gpu(8), gpu).unwrap();
    let replayed = predict_from_profile(&doc.to_string(), &one_gpu(8), gpu).unwrap();
    let direct = predict_model(&model, &one_gpu(8), gpu).unwrap();
    assert_eq!(replayed.allocated_bytes, direct.allocated_bytes);
    assert!(
        replayed.reserved_bytes <= direct.reserved_bytes,
        "no loss-block floor"
    );
}

/// The most tensors of exactly `bytes` alive at once.
fn most_alive(evs: &[sequence::TensorEvent], bytes: u64) -> usize {
    let mut live = std::collections::BTreeMap::new();
    let (mut n, mut most) = (0usize, 0usize);
    for e in evs {
        match *e {
            sequence::TensorEvent::Alloc { id, bytes: b, .. } => {
                live.insert(id, b);
                n += usize::from(b == bytes);
                most = most.max(n);
            }
            sequence::TensorEvent::Free { id } => n -= usize::from(live.remove(&id) == Some(bytes)),
        }
    }
    most
}

#[test]
fn softmax_backward_holds_the_gradients_of_its_output_and_of_the_scores_and_a_temporary_together() {
    use crate::api::Precision;
    // fp32 LLaMA with grouped-query heads: SDPA's math path keeps each
    // layer's fp32 probabilities; backward adds three of that size at once:
    // the gradients of its output and of the scores, and softmax backward's
    // temporary (the H200's fp32 Qwen2 and Mistral runs allocate all three;
    // without the temporary fp32 Mistral was 7.3 % under).
    let gqa = with(tiny("llama"), "num_key_value_heads", serde_json::json!(2));
    let s2 = 8 * 4 * 64 * 64 * 4;
    let evs = hf_events(gqa, Precision::Fp32, Attention::Sdpa, false);
    assert_eq!(most_alive(&evs, s2), 2 + 3);
}

#[test]
fn a_tied_heads_two_gradient_contributions_are_summed_into_a_new_tensor() {
    use crate::api::Precision;
    let table = 5000 * 96 * 2;
    // GPT-2 (tied): the weight, the head's contribution waiting in autograd's
    // buffer, the embedding's dense gradient and their sum
    let gpt2 = hf_events(tiny("gpt2"), Precision::Bf16, Attention::Sdpa, false);
    assert_eq!(most_alive(&gpt2, table), 4);
    // LLaMA (untied): embedding and head weights, each gradient created once
    let llama = hf_events(tiny("llama"), Precision::Bf16, Attention::Sdpa, false);
    assert_eq!(most_alive(&llama, table), 4);
}

#[test]
fn the_analytic_hugging_face_path_on_the_fresh_validation_runs_is_not_under() {
    // 14 transformers runs measured after the model was written, with shapes
    // and combinations in no calibration case (scripts/gpu/validate_hf.sh).
    let measured = include_str!("../../data/calibration/h200-libraries-validation.jsonl");
    let report = bench_predict(measured, None).unwrap();
    assert_eq!(report.rows.len(), 14);
    let all = error_stats(&report.rows, None);
    assert!(all.median <= 0.03 && all.p90 <= 0.06, "{all:?}");
    // Mistral amp eager was under by 5.4 % while two steps were generated:
    // its allocated peak and the sequence's first two steps matched the
    // H200's recorded ones (validation-profiles.jsonl.gz), and the H200's
    // third step took one more 1000 MiB segment for its fp32 logits. With
    // three steps generated it is within 0.5 %.
    assert!(all.under_predictions.is_empty(), "{all:?}");
    let mistral = report
        .rows
        .iter()
        .find(|r| r.name == "hf-mistral-s1024-b8-ampbf16-adam-eager")
        .unwrap()
        .without_margin();
    assert!(mistral.relative_error.abs() < 0.005, "{mistral:?}");
}

/// The optimizer term of the breakdown at the peak of an fp32 MLP (two
/// layers of `hidden`, micro-batch 1), where the optimizer step is the
/// fullest moment.
fn mlp_optimizer_at_peak(hidden: u32, optimizer: crate::api::Optimizer) -> u64 {
    let model = ModelSpec {
        mlp: Some(crate::api::MlpSpec { layers: 2, hidden }),
        optimizer,
        ..ModelSpec::default()
    };
    predict_model(&model, &one_gpu(1), default_gpu())
        .unwrap()
        .breakdown
        .optimizer
}

#[test]
fn each_optimizer_keeps_its_state_and_step_temporaries() {
    use crate::api::Optimizer::*;
    // Two layers of a 1024 x 1024 weight and a 1024 bias: n elements.
    let (w, b) = (1024u64 * 1024, 1024u64);
    let n = 2 * (w + b);
    let cases = [
        // Plain SGD keeps nothing.
        (Sgd, 0),
        // One momentum buffer, no temporary.
        (SgdMomentum, 4 * n),
        // One sum of squares (made in the constructor) plus the foreach
        // step's full-size temporary.
        (Adagrad, 4 * n + 4 * n),
        // Two moments plus the foreach temporary.
        (Adam, 8 * n + 4 * n),
        (AdamW, 8 * n + 4 * n),
        // A row and a column vector per matrix, a full vector per bias, and
        // the largest parameter's fp32 variance estimate while it is updated.
        (Adafactor, 2 * 4 * (1024 + 1024) + 2 * 4 * b + 4 * w),
        // Two 8-bit moments and two fp32 scales per 256 elements for the
        // matrices; 32-bit moments for the small biases.
        (AdamW8bit, 2 * (2 * w + 2 * (w / 256) * 4) + 2 * (2 * 4 * b)),
    ];
    for (optimizer, want) in cases {
        assert_eq!(
            mlp_optimizer_at_peak(1024, optimizer),
            want,
            "{optimizer:?}"
        );
    }
}

#[test]
fn adamw_8bit_keeps_32_bit_state_below_4096_elements() {
    // hidden 64: each weight has exactly 4096 elements (8-bit state plus one
    // scale pair per 256), each bias 64 (32-bit state).
    let per_layer = (2 * 4096 + 2 * (4096 / 256) * 4) + 2 * 4 * 64;
    assert_eq!(
        mlp_optimizer_at_peak(64, crate::api::Optimizer::AdamW8bit),
        2 * per_layer
    );
}

#[test]
fn a_jobs_headroom_is_its_own_or_the_documented_default() {
    let base = r#"{"batch": {"global": 8, "micro": 8},
        "model": {"mlp": {"layers": 2, "hidden": 64}}"#;
    let cases = [
        (format!("{base}}}"), crate::api::DEFAULT_HEADROOM),
        (format!(r#"{base}, "memory": {{"headroom": 0.25}}}}"#), 0.25),
        (
            format!(r#"{base}, "memory": {{"request": "20Gi"}}}}"#),
            0.05,
        ),
        (format!(r#"{base}, "memory": {{"headroom": 0}}}}"#), 0.0),
    ];
    for (text, want) in cases {
        let job = parse_job(&text).unwrap();
        assert_eq!(job.headroom(), want, "{text}");
    }
}

#[test]
fn auto_micro_batch_reports_a_models_own_error_instead_of_trying_smaller_batches() {
    // Only a profile's micro-batch limit lets the search go on to a smaller
    // micro-batch; an analytic model's refusal is the answer.
    let job = parse_job(
        r#"{"batch": {"global": 8, "micro": 8},
            "model": {"huggingFace": {"config": {"model_type": "falcon", "hidden_size": 512}, "seqLen": 128}}}"#,
    )
    .unwrap();
    let err = job::auto_micro_batch(&job, default_gpu(), u64::MAX, 0.05, None).unwrap_err();
    assert!(
        err.to_string()
            .contains("model_type 'falcon' is not described analytically"),
        "{err}"
    );
}

#[test]
fn captured_workspaces_never_take_the_id_of_a_profile_allocation() {
    // A free in the profile names a profile allocation, never a workspace
    // added at a cublasWorkspaceAt position, so the workspaces stay to the end.
    let ws = default_gpu().cublas_workspace_bytes;
    let mib = 1u64 << 20;
    let cases = [
        // Two allocations, the second freed after a workspace.
        ("[2,3]", 2 * ws + mib),
        // A workspace first, another between the second allocation and its
        // free, and one at the end.
        ("[0,2,3]", 3 * ws + mib),
    ];
    for (at, want) in cases {
        let text = format!(
            r#"{{"format":"vramfit.profile/v1","microBatch":1,"sizes":[1048576],
                "events":[0,0,-2],"cublasWorkspaceAt":{at}}}"#
        );
        let p = predict_from_profile(&text, &one_gpu(1), default_gpu()).unwrap();
        assert_eq!(p.allocated_bytes, want, "{at}");
        assert_eq!(p.breakdown.workspace, want - mib, "{at}");
        assert_eq!(p.breakdown.persistent, mib, "{at}");
        assert_eq!(p.breakdown.activations, 0, "{at}");
    }
}

#[test]
fn a_profile_without_grad_accum_was_recorded_without_accumulation() {
    // docs/profile-format.md: `gradAccum` defaults to 1.
    let base = r#"{"format":"vramfit.profile/v1","microBatch":2,"sizes":[512],"events":[0,-1]"#;
    let parsed = |text: String| profile::parse_profile(&text).unwrap().grad_accum;
    assert_eq!(parsed(format!("{base}}}")), 1);
    assert_eq!(parsed(format!(r#"{base},"gradAccum":4}}"#)), 4);
}

#[test]
fn a_declared_parameter_count_scales_the_model_state_and_nothing_else() {
    let mut model = ModelSpec {
        mlp: Some(crate::api::MlpSpec {
            layers: 2,
            hidden: 1024,
        }),
        ..ModelSpec::default()
    };
    let derived = resolve_arch(&model).unwrap().parameter_count();
    let base = predict_model(&model, &one_gpu(1), default_gpu()).unwrap();
    assert_eq!(base.parameters, derived);
    // Declaring the derived count changes nothing.
    model.parameters = Some(derived);
    assert_eq!(
        predict_model(&model, &one_gpu(1), default_gpu()).unwrap(),
        base
    );
    // Three times the parameters: weights, gradients and optimizer state
    // three times as large, the rest as it was, the peak grown by the
    // difference.
    model.parameters = Some(3 * derived);
    let p = predict_model(&model, &one_gpu(1), default_gpu()).unwrap();
    let (b, s) = (&p.breakdown, &base.breakdown);
    assert_eq!(p.parameters, 3 * derived);
    assert_eq!(
        (b.parameters, b.gradients, b.optimizer),
        (3 * s.parameters, 3 * s.gradients, 3 * s.optimizer)
    );
    assert_eq!(
        (b.activations, b.workspace, b.context, b.allocator_overhead),
        (s.activations, s.workspace, s.context, s.allocator_overhead)
    );
    let grown = 2 * (s.parameters + s.gradients + s.optimizer);
    assert_eq!(p.reserved_bytes, base.reserved_bytes + grown);
    assert_eq!(p.peak_bytes, base.peak_bytes + grown);
    assert_eq!(p.peak_bytes, p.reserved_bytes + b.context);
    // A third as many: smaller by the same rule.
    model.parameters = Some(derived / 3);
    let p = predict_model(&model, &one_gpu(1), default_gpu()).unwrap();
    assert!(p.breakdown.gradients.abs_diff(s.gradients / 3) <= 1);
    assert!(p.peak_bytes < base.peak_bytes);
}

#[test]
fn a_batch_shape_without_gpus_micro_batch_or_whole_accumulation_is_refused() {
    let shape = |gpus, global_batch, micro_batch| JobShape {
        gpus,
        global_batch,
        micro_batch,
    };
    let cases = [
        (
            shape(1, 8, 0),
            Err("batch.micro and gpus must be at least 1"),
        ),
        (
            shape(0, 8, 8),
            Err("batch.micro and gpus must be at least 1"),
        ),
        (
            shape(2, 12, 4),
            Err("batch.global (12) must be divisible by batch.micro * gpus (8)"),
        ),
        (shape(2, 16, 4), Ok(2)),
        (shape(3, 24, 2), Ok(4)),
        (shape(1, 5, 5), Ok(1)),
    ];
    for (job, want) in cases {
        let got = job.grad_accum().map_err(|e| e.to_string());
        assert_eq!(got, want.map_err(String::from), "{job:?}");
    }
}

#[test]
fn an_mlp_without_layers_or_width_and_a_zero_stage_above_3_are_refused() {
    for (layers, hidden) in [(0, 64), (2, 0)] {
        let model = ModelSpec {
            mlp: Some(crate::api::MlpSpec { layers, hidden }),
            ..ModelSpec::default()
        };
        let err = predict_model(&model, &one_gpu(1), default_gpu()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "mlp.layers and mlp.hidden must be at least 1"
        );
    }
    let mut model = gpt2_small();
    model.zero_stage = 4;
    let err = predict_model(&model, &one_gpu(1), default_gpu()).unwrap_err();
    assert_eq!(err.to_string(), "model.zeroStage 4 is out of range 0..3");
    model.zero_stage = 3;
    assert!(predict_model(&model, &one_gpu(1), default_gpu()).is_ok());
}

#[test]
fn only_fsdp_sequences_are_refused_as_a_generated_profile() {
    let mut model = ModelSpec {
        mlp: Some(crate::api::MlpSpec {
            layers: 2,
            hidden: 64,
        }),
        ..ModelSpec::default()
    };
    for (stage, gpus, refused) in [
        (2, 2, true),
        (3, 2, true),
        (1, 2, false),
        (2, 1, false),
        (3, 1, false),
    ] {
        model.zero_stage = stage;
        let job = JobShape {
            gpus,
            global_batch: 4 * gpus,
            micro_batch: 4,
        };
        let got = generated_profile(&model, &job, default_gpu());
        assert_eq!(
            got.is_err(),
            refused,
            "stage {stage} on {gpus} GPUs: {got:?}"
        );
        if let Ok(doc) = got {
            assert_eq!(doc["microBatch"], 4);
            assert_eq!(doc["gradAccum"], 1);
        }
    }
}

#[test]
fn gpu_profiles_hold_what_nvml_and_pytorch_report() {
    // nvidia-smi's total memory of each model, in MiB.
    let totals = [
        ("H200", 143_771),
        ("H100-80GB", 81_559),
        ("A100-80GB", 81_920),
        ("A100-40GB", 40_960),
        ("L40S", 46_068),
        ("L4", 23_034),
        ("T4", 15_360),
    ];
    assert_eq!(GPU_PROFILES.len(), totals.len());
    // PyTorch's default CUBLAS_WORKSPACE_CONFIG, `:KiB:count` pairs: ":4096:8"
    // on Hopper, ":4096:2:16:8" before it.
    let workspace = |config: &str| -> u64 {
        let n: Vec<u64> = config[1..].split(':').map(|v| v.parse().unwrap()).collect();
        n.chunks(2).map(|c| c[0] * 1024 * c[1]).sum()
    };
    for (name, mib) in totals {
        let p = gpu_profile(name).unwrap();
        assert_eq!(p.capacity_bytes, mib << 20, "{name}");
        let config = if name.starts_with('H') {
            ":4096:8"
        } else {
            ":4096:2:16:8"
        };
        assert_eq!(p.cublas_workspace_bytes, workspace(config), "{name}");
        // Context and NCCL memory: a few hundred MiB on every model.
        for bytes in [p.context_bytes, p.nccl_bytes] {
            assert!((256 << 20..=1 << 30).contains(&bytes), "{name}: {bytes}");
        }
    }
    // The H200's figures are the measured ones (docs/predictor.md).
    let h200 = default_gpu();
    assert_eq!(h200.name, "H200");
    assert_eq!(
        (h200.context_bytes, h200.nccl_bytes),
        (758 << 20, 846 << 20)
    );
}

/// The gradient allocations made while the model is built (before the first
/// activation): DDP's flat buckets.
fn ddp_buckets_of_mlp(layers: u32, zero_stage: u8, gpus: u64) -> Vec<u64> {
    let model = ModelSpec {
        mlp: Some(crate::api::MlpSpec {
            layers,
            hidden: 1024,
        }),
        ..ModelSpec::default()
    };
    let run = sequence::RunShape {
        reduce: None,
        micro_batch: 1,
        grad_accum: 1,
        precision: crate::api::Precision::Fp32,
        optimizer: crate::api::Optimizer::Sgd,
        checkpointing: false,
        attention: Attention::Sdpa,
        zero_stage,
        gpus,
        cublas_workspace: 1 << 20,
    };
    sequence::training_events(&resolve_arch(&model).unwrap(), &run)
        .into_iter()
        .take_while(|e| {
            !matches!(
                e,
                sequence::TensorEvent::Alloc {
                    category: sequence::Category::Activations,
                    ..
                }
            )
        })
        .filter_map(|e| match e {
            sequence::TensorEvent::Alloc {
                bytes,
                category: sequence::Category::Gradients,
                ..
            } => Some(bytes),
            _ => None,
        })
        .collect()
}

#[test]
fn ddp_fills_a_1_mib_bucket_first_then_25_mib_ones_from_the_last_parameter() {
    // fp32 MLP layers of a 4 MiB weight and a 4 KiB bias, taken from the
    // last: the first bucket closes at the first layer (over 1 MiB), the
    // next at the seventh (28 MiB, the first over 25 MiB); what is left is
    // the last bucket.
    let layer = (4 << 20) + (4 << 10);
    let cases: [(u32, u8, u64, &[u64]); 5] = [
        (10, 0, 2, &[layer, 7 * layer, 2 * layer]),
        (8, 0, 2, &[layer, 7 * layer]),
        (8, 1, 2, &[layer, 7 * layer]),
        // One GPU: no DDP; FSDP: no buckets.
        (8, 0, 1, &[]),
        (8, 2, 2, &[]),
    ];
    for (layers, stage, gpus, want) in cases {
        assert_eq!(
            ddp_buckets_of_mlp(layers, stage, gpus),
            want,
            "{layers} layers, stage {stage}, {gpus} GPUs"
        );
    }
}

#[test]
fn fsdp_gathers_and_reduce_scatters_the_full_flat_unit_over_every_gpu() {
    use sequence::{Category, Stream, TensorEvent};
    for stage in [2, 3] {
        let (evs, _) = two_block_events(stage, 2);
        let mut gathers = std::collections::BTreeSet::new();
        let mut outputs = std::collections::BTreeSet::new();
        let mut last_default_grad = None;
        for e in &evs {
            if let TensorEvent::Alloc {
                bytes,
                category,
                stream,
                ..
            } = *e
            {
                match (stream, category) {
                    (Stream::AllGather, _) => {
                        gathers.insert(bytes);
                    }
                    (Stream::ReduceScatter, _) => {
                        // The input, allocated just before on the default
                        // stream, is every GPU's shard of the unit.
                        assert_eq!(last_default_grad, Some(2 * bytes), "stage {stage}");
                        outputs.insert(bytes);
                    }
                    (Stream::Default, Category::Gradients) => last_default_grad = Some(bytes),
                    _ => {}
                }
            }
        }
        // The all-gather output of a unit is its shard on each of the GPUs.
        let from_outputs: std::collections::BTreeSet<u64> = outputs.iter().map(|b| 2 * b).collect();
        assert_eq!(gathers, from_outputs, "stage {stage}");
        assert_eq!(
            outputs.len(),
            2,
            "stage {stage}: the root and two equal blocks"
        );
    }
}

#[test]
fn stage_3_prefetches_the_next_block_for_backward_and_stage_2_keeps_them() {
    use sequence::{Category, Stream, TensorEvent};
    // All-gathers issued in the first step before its first gradient and
    // before its first reduce-scatter. Stage 3: the three forward gathers
    // (root, two blocks), the last block again before the loss's backward,
    // then the first block prefetched at the last one's backward. Stage 2
    // keeps every unit gathered until its backward.
    for (stage, want) in [(3, (4, 5)), (2, (3, 3))] {
        let (evs, _) = two_block_events(stage, 2);
        let gathers_before = |stop: &dyn Fn(&TensorEvent) -> bool| {
            evs.iter()
                .take_while(|e| !stop(e))
                .filter(|e| {
                    matches!(
                        e,
                        TensorEvent::Alloc {
                            stream: Stream::AllGather,
                            ..
                        }
                    )
                })
                .count()
        };
        let got = (
            gathers_before(&|e| {
                matches!(
                    e,
                    TensorEvent::Alloc {
                        category: Category::Gradients,
                        ..
                    }
                )
            }),
            gathers_before(&|e| {
                matches!(
                    e,
                    TensorEvent::Alloc {
                        stream: Stream::ReduceScatter,
                        ..
                    }
                )
            }),
        );
        assert_eq!(got, want, "stage {stage}");
    }
}

/// The first optimizer step of a two-layer MLP 8 wide at micro-batch 2
/// (SGD, one GPU, 1000-byte cuBLAS workspaces), one word per event: an
/// allocation as its category's letter (Parameters, Gradients,
/// Activations, Workspace, Optimizer) and its bytes, ids counting up from 0;
/// a free as `-id`.
fn mlp_first_step(precision: crate::api::Precision) -> String {
    use sequence::{Category, TensorEvent};
    let model = ModelSpec {
        mlp: Some(crate::api::MlpSpec {
            layers: 2,
            hidden: 8,
        }),
        ..ModelSpec::default()
    };
    let run = sequence::RunShape {
        reduce: None,
        micro_batch: 2,
        grad_accum: 1,
        precision,
        optimizer: crate::api::Optimizer::Sgd,
        checkpointing: false,
        attention: Attention::Sdpa,
        zero_stage: 0,
        gpus: 1,
        cublas_workspace: 1000,
    };
    let evs = sequence::training_events(&resolve_arch(&model).unwrap(), &run);
    let mut next = 0;
    let words: Vec<String> = evs
        .iter()
        .map(|e| match *e {
            TensorEvent::Alloc {
                id,
                bytes,
                category,
                ..
            } => {
                assert_eq!(id, next);
                next += 1;
                let c = match category {
                    Category::Parameters => 'P',
                    Category::Gradients => 'G',
                    Category::Activations => 'A',
                    Category::Workspace => 'W',
                    Category::Optimizer => 'O',
                    Category::Persistent => 'X',
                };
                format!("{c}{bytes}")
            }
            TensorEvent::Free { id } => format!("-{id}"),
        })
        .collect();
    // The first step ends at zero_grad's last free: of the first gradient
    // made (the last layer's bias gradient).
    let first_grad = evs
        .iter()
        .find_map(|e| match *e {
            TensorEvent::Alloc {
                id,
                category: Category::Gradients,
                ..
            } => Some(id),
            _ => None,
        })
        .unwrap();
    let end = words
        .iter()
        .position(|w| *w == format!("-{first_grad}"))
        .unwrap();
    words[..=end].join(" ")
}

#[test]
fn an_mlp_step_allocates_and_frees_what_autograd_does_in_order() {
    use crate::api::Precision;
    // n = 2 x 8 elements of every activation. fp32: the model (ids 0-3:
    // weight, bias, weight, bias); the input x and target y (4, 5); the
    // forward thread's workspace at the first matmul (6); each Linear's
    // output (7, 9) dies at its ReLU, whose output (8, 10) is saved; the
    // loss (11) and its gradient (12); the autograd thread's workspace at
    // the first backward matmul (13); per layer from the last: the Linear's
    // output gradient (14) replaces the incoming one, the bias then weight
    // gradients (15, 16), the input gradient (17) except for the first
    // layer, and the saved ReLU output is freed; then x, y and the loss;
    // zero_grad frees the gradients in parameter order.
    let fp32 = "P256 P32 P256 P32 A64 A64 W1000 A64 A64 -7 A64 A64 -9 A512 A64 \
                W1000 A64 -12 G32 G256 A64 -14 -10 A64 -17 G32 G256 -18 -8 \
                -4 -5 -11 -20 -19 -16 -15";
    // Pure bf16: made in fp32 (0-3), each converted (4-7) before its
    // original goes; two bytes an element, x too; the output is upcast to
    // fp32 (15) for the loss, whose fp32 gradient (17) is cast back (18).
    let bf16 = "P256 P32 P256 P32 P128 -0 P16 -1 P128 -2 P16 -3 \
                A32 A64 W1000 A32 A32 -11 A32 A32 -13 A64 A512 A64 A32 -17 -15 \
                W1000 A32 -18 G16 G128 A32 -20 -14 A32 -23 G16 G128 -24 -12 \
                -8 -9 -16 -26 -25 -22 -21";
    // AMP: fp32 weights and x; each layer's bf16 weight copy (6, 11) lives
    // until its weight gradient is made; the bf16 copy of x (7) made at the
    // first layer lives until the end of backward; a weight gradient is
    // made in bf16 (21, 26) and converted to the fp32 .grad (22, 27).
    let amp = "P256 P32 P256 P32 A64 A64 P128 A32 W1000 A32 A32 -9 P128 A32 A32 -12 \
               A64 A512 A64 A32 -16 -14 \
               W1000 A32 -17 G32 A128 G256 -21 -11 A32 -19 -13 \
               A32 -23 G32 A128 G256 -26 -6 -24 -10 -7 -4 -5 -15 -27 -25 -22 -20";
    for (precision, want) in [
        (Precision::Fp32, fp32),
        (Precision::Bf16, bf16),
        (Precision::AmpBf16, amp),
    ] {
        let want: Vec<&str> = want.split_whitespace().collect();
        assert_eq!(mlp_first_step(precision), want.join(" "), "{precision:?}");
    }
}

/// What `config` (a tiny model's config.json, see `tiny`) maps onto at
/// sequence 64.
fn hf_arch(config: serde_json::Value) -> Result<arch::TransformerArch, String> {
    hf::arch_from_hugging_face(&HuggingFaceSpec {
        config: config.as_object().unwrap().clone(),
        seq_len: 64,
    })
    .map_err(|e| e.to_string())
}

#[test]
fn each_hugging_face_family_maps_onto_its_shapes_and_library_defaults() {
    use crate::api::{MlpKind, NormKind, PositionalKind, TransformerKind};
    use arch::{HfFamily, HfImpl, TransformerArch};
    let gpt2 = TransformerArch {
        family: "gpt2".into(),
        kind: TransformerKind::Decoder,
        layers: 2,
        hidden: 96,
        heads: 4,
        kv_heads: 4,
        head_dim: 24,
        ffn: 384,
        vocab: 5000,
        seq_len: 64,
        positions: 64,
        mlp: MlpKind::Gelu,
        norm: NormKind::Layernorm,
        positional: PositionalKind::Learned,
        tied: true,
        linear_bias: true,
        qkv_bias: true,
        token_types: 0,
        // GPT-2's dropouts default to 0.1, its activation to gelu_new.
        library: Some(HfImpl {
            family: HfFamily::Gpt2,
            dropout: true,
            attn_dropout: true,
            gelu_new: true,
            use_cache: true,
            qk_norm: false,
        }),
        // `c_attn`: query, key and value weights as one tensor
        layout: arch::Layout {
            fused_qkv: true,
            ..Default::default()
        },
    };
    let llama = TransformerArch {
        family: "llama".into(),
        kind: TransformerKind::Decoder,
        layers: 2,
        hidden: 96,
        heads: 4,
        kv_heads: 4,
        head_dim: 24,
        ffn: 176,
        vocab: 5000,
        seq_len: 64,
        positions: 0,
        mlp: MlpKind::Swiglu,
        norm: NormKind::Rmsnorm,
        positional: PositionalKind::Rotary,
        tied: false,
        linear_bias: false,
        qkv_bias: false,
        token_types: 0,
        // attention_dropout defaults to 0.0.
        library: Some(HfImpl {
            family: HfFamily::Llama,
            dropout: false,
            attn_dropout: false,
            gelu_new: false,
            use_cache: true,
            qk_norm: false,
        }),
        layout: Default::default(),
    };
    let bert = TransformerArch {
        family: "bert".into(),
        kind: TransformerKind::Encoder,
        layers: 2,
        hidden: 96,
        heads: 4,
        kv_heads: 4,
        head_dim: 24,
        ffn: 384,
        vocab: 5000,
        seq_len: 64,
        positions: 512,
        mlp: MlpKind::Gelu,
        norm: NormKind::Layernorm,
        positional: PositionalKind::Learned,
        tied: true,
        linear_bias: true,
        qkv_bias: true,
        token_types: 2,
        library: Some(HfImpl {
            family: HfFamily::Bert,
            dropout: true,
            attn_dropout: true,
            gelu_new: false,
            use_cache: false,
            qk_norm: false,
        }),
        layout: Default::default(),
    };
    let without = |mut c: serde_json::Value, key: &str| {
        c.as_object_mut().unwrap().remove(key);
        c
    };
    let lib = |a: &TransformerArch| a.library.unwrap();
    let cases: Vec<(serde_json::Value, TransformerArch)> = vec![
        (tiny("gpt2"), gpt2.clone()),
        // n_inner absent: 4 x n_embd; n_positions absent: 1024.
        (
            without(
                without(
                    with(tiny("gpt2"), "n_embd", serde_json::json!(64)),
                    "n_inner",
                ),
                "n_positions",
            ),
            TransformerArch {
                hidden: 64,
                head_dim: 16,
                ffn: 256,
                positions: 1024,
                ..gpt2.clone()
            },
        ),
        (
            with(tiny("gpt2"), "n_inner", serde_json::json!(200)),
            TransformerArch {
                ffn: 200,
                ..gpt2.clone()
            },
        ),
        // A null optional field is its default.
        (
            with(tiny("gpt2"), "n_inner", serde_json::json!(null)),
            gpt2.clone(),
        ),
        (
            with(
                with(
                    tiny("gpt2"),
                    "tie_word_embeddings",
                    serde_json::json!(false),
                ),
                "use_cache",
                serde_json::json!(false),
            ),
            TransformerArch {
                tied: false,
                library: Some(HfImpl {
                    use_cache: false,
                    qk_norm: false,
                    ..lib(&gpt2)
                }),
                ..gpt2.clone()
            },
        ),
        (
            with(
                tiny("gpt2"),
                "activation_function",
                serde_json::json!("gelu"),
            ),
            TransformerArch {
                library: Some(HfImpl {
                    gelu_new: false,
                    ..lib(&gpt2)
                }),
                ..gpt2.clone()
            },
        ),
        (
            with(
                tiny("gpt2"),
                "activation_function",
                serde_json::json!("gelu_new"),
            ),
            gpt2.clone(),
        ),
        // Any of the three dropouts above 0 keeps masks; all three at 0 none.
        (
            with(
                with(tiny("gpt2"), "resid_pdrop", serde_json::json!(0.0)),
                "embd_pdrop",
                serde_json::json!(0.0),
            ),
            gpt2.clone(),
        ),
        (
            with(
                with(
                    with(tiny("gpt2"), "resid_pdrop", serde_json::json!(0.0)),
                    "embd_pdrop",
                    serde_json::json!(0.0),
                ),
                "attn_pdrop",
                serde_json::json!(0.0),
            ),
            TransformerArch {
                library: Some(HfImpl {
                    dropout: false,
                    attn_dropout: false,
                    ..lib(&gpt2)
                }),
                ..gpt2.clone()
            },
        ),
        (tiny("llama"), llama.clone()),
        // num_key_value_heads absent: one per query head; head_dim given.
        (
            with(
                without(tiny("llama"), "num_key_value_heads"),
                "head_dim",
                serde_json::json!(32),
            ),
            TransformerArch {
                head_dim: 32,
                ..llama.clone()
            },
        ),
        (
            with(tiny("llama"), "num_key_value_heads", serde_json::json!(2)),
            TransformerArch {
                kv_heads: 2,
                ..llama.clone()
            },
        ),
        (
            with(
                with(
                    with(tiny("llama"), "attention_dropout", serde_json::json!(0.1)),
                    "mlp_bias",
                    serde_json::json!(true),
                ),
                "tie_word_embeddings",
                serde_json::json!(true),
            ),
            TransformerArch {
                tied: true,
                linear_bias: true,
                // o_proj's bias follows attention_bias, not mlp_bias
                layout: arch::Layout {
                    out_bias: Some(false),
                    ..Default::default()
                },
                library: Some(HfImpl {
                    dropout: true,
                    attn_dropout: true,
                    ..lib(&llama)
                }),
                ..llama.clone()
            },
        ),
        (
            with(tiny("llama"), "attention_bias", serde_json::json!(true)),
            TransformerArch {
                qkv_bias: true,
                // and o_proj's
                layout: arch::Layout {
                    out_bias: Some(true),
                    ..Default::default()
                },
                ..llama.clone()
            },
        ),
        // Qwen2 has query/key/value biases without attention_bias; Mistral not.
        (
            with(tiny("llama"), "model_type", serde_json::json!("qwen2")),
            TransformerArch {
                family: "qwen2".into(),
                qkv_bias: true,
                ..llama.clone()
            },
        ),
        (
            with(
                with(tiny("llama"), "model_type", serde_json::json!("mistral")),
                "use_cache",
                serde_json::json!(false),
            ),
            TransformerArch {
                family: "mistral".into(),
                library: Some(HfImpl {
                    use_cache: false,
                    qk_norm: false,
                    ..lib(&llama)
                }),
                // MistralConfig's default window, over every block
                layout: arch::Layout {
                    sliding_window: 4096,
                    sliding_layers: vec![0, 1],
                    ..llama.layout.clone()
                },
                ..llama.clone()
            },
        ),
        (tiny("bert"), bert.clone()),
        (
            with(
                with(
                    tiny("bert"),
                    "max_position_embeddings",
                    serde_json::json!(128),
                ),
                "type_vocab_size",
                serde_json::json!(1),
            ),
            TransformerArch {
                positions: 128,
                token_types: 1,
                ..bert.clone()
            },
        ),
        // Either dropout above 0 keeps masks; the attention probabilities'
        // only with the attention's own above 0.
        (
            with(tiny("bert"), "hidden_dropout_prob", serde_json::json!(0.0)),
            bert.clone(),
        ),
        (
            with(
                tiny("bert"),
                "attention_probs_dropout_prob",
                serde_json::json!(0),
            ),
            TransformerArch {
                library: Some(HfImpl {
                    attn_dropout: false,
                    ..lib(&bert)
                }),
                ..bert.clone()
            },
        ),
        (
            with(
                with(tiny("bert"), "hidden_dropout_prob", serde_json::json!(0)),
                "attention_probs_dropout_prob",
                serde_json::json!(0.0),
            ),
            TransformerArch {
                library: Some(HfImpl {
                    dropout: false,
                    attn_dropout: false,
                    ..lib(&bert)
                }),
                ..bert.clone()
            },
        ),
    ];
    for (config, want) in cases {
        assert_eq!(hf_arch(config.clone()), Ok(want), "{config}");
    }
}

#[test]
fn hugging_face_fields_of_the_wrong_type_or_range_are_named() {
    let f = "huggingFace.config";
    let cases = [
        (
            serde_json::json!({"n_layer": 2}),
            format!("{f}.model_type is missing"),
        ),
        (
            with(tiny("gpt2"), "model_type", serde_json::json!(2)),
            format!("{f}.model_type must be a string"),
        ),
        (
            with(tiny("gpt2"), "n_head", serde_json::json!(0)),
            format!("{f}.n_head must be a positive integer of at most 4096"),
        ),
        (
            with(tiny("gpt2"), "n_head", serde_json::json!(-4)),
            format!("{f}.n_head must be a positive integer of at most 4096"),
        ),
        (
            with(tiny("gpt2"), "n_head", serde_json::json!("4")),
            format!("{f}.n_head must be a positive integer of at most 4096"),
        ),
        (
            with(tiny("gpt2"), "n_inner", serde_json::json!(0)),
            format!("{f}.n_inner must be a positive integer of at most 4194304"),
        ),
        (
            with(tiny("gpt2"), "n_embd", serde_json::json!(98)),
            format!("{f}.n_embd (98) must be divisible by n_head (4)"),
        ),
        (
            with(tiny("gpt2"), "use_cache", serde_json::json!("yes")),
            format!("{f}.use_cache must be a boolean"),
        ),
        (
            with(tiny("gpt2"), "attn_pdrop", serde_json::json!(1.5)),
            format!("{f}.attn_pdrop must be a number in [0, 1]"),
        ),
        (
            with(tiny("gpt2"), "embd_pdrop", serde_json::json!("0.1")),
            format!("{f}.embd_pdrop must be a number in [0, 1]"),
        ),
        (
            with(tiny("gpt2"), "activation_function", serde_json::json!(1)),
            format!("{f}.activation_function must be a string"),
        ),
        (
            with(tiny("gpt2"), "n_positions", serde_json::json!(32)),
            "gpt2: seqLen 64 exceeds the 32 learned positions".to_string(),
        ),
        // RoBERTa counts positions from pad_token_id + 1 (transformers' own
        // run fails there, inside its embeddings)
        (
            with(
                with(tiny("bert"), "model_type", serde_json::json!("roberta")),
                "max_position_embeddings",
                serde_json::json!(64),
            ),
            "roberta: seqLen 64 exceeds the 62 learned positions (64 rows, the first 2 never \
             reached: raise max_position_embeddings)"
                .to_string(),
        ),
        (
            with(
                with(
                    with(tiny("bert"), "model_type", serde_json::json!("roberta")),
                    "max_position_embeddings",
                    serde_json::json!(64),
                ),
                "pad_token_id",
                serde_json::json!(0),
            ),
            "roberta: seqLen 64 exceeds the 63 learned positions (64 rows, the first 1 never \
             reached: raise max_position_embeddings)"
                .to_string(),
        ),
        (
            with(tiny("llama"), "num_key_value_heads", serde_json::json!(3)),
            format!("{f}.num_attention_heads (4) must be divisible by num_key_value_heads (3)"),
        ),
        (
            with(tiny("llama"), "hidden_size", serde_json::json!(98)),
            format!("{f}.hidden_size (98) must be divisible by num_attention_heads (4)"),
        ),
        (
            with(tiny("bert"), "hidden_size", serde_json::json!(98)),
            format!("{f}.hidden_size (98) must be divisible by num_attention_heads (4)"),
        ),
        (
            with(tiny("bert"), "type_vocab_size", serde_json::json!(0)),
            format!("{f}.type_vocab_size must be a positive integer of at most 65536"),
        ),
    ];
    for (config, want) in cases {
        assert_eq!(hf_arch(config.clone()), Err(want), "{config}");
    }
}

/// A `transformer` spec from its JSON fields.
fn transformer_spec(fields: serde_json::Value) -> TransformerSpec {
    serde_json::from_value(fields).unwrap()
}

#[test]
fn transformer_parameters_are_created_in_module_order_with_their_shapes() {
    use arch::ParamTensor;
    let m = |rows, cols, layer: Option<u32>, matmul_weight| ParamTensor {
        sum_rows: 0,
        rows,
        cols,
        layer,
        matmul_weight,
    };
    let v = |rows, layer| m(rows, 0, layer, false);
    // a vector whose gradient the reduction kernel sums over `sum_rows` rows a sample
    let b = |rows, layer, sum_rows| ParamTensor {
        sum_rows,
        ..v(rows, layer)
    };
    let l0 = Some(0);
    let cases = [
        // GPT-2-like (LayerNorm, learned positions, tied): the embedding is
        // the head's matmul weight; biases everywhere; qkv is 8 + 2 x 8 rows;
        // the feed-forward 4 x 8 wide.
        (
            serde_json::json!({"layers": 1, "hidden": 8, "heads": 2, "vocab": 10, "seqLen": 4}),
            vec![
                m(10, 8, None, true),
                m(4, 8, None, false),
                v(8, l0),
                v(8, l0),
                m(24, 8, l0, true),
                b(24, l0, 4),
                m(8, 8, l0, true),
                b(8, l0, 4),
                v(8, l0),
                v(8, l0),
                m(32, 8, l0, true),
                b(32, l0, 4),
                m(8, 32, l0, true),
                b(8, l0, 4),
                v(8, None),
                v(8, None),
            ],
            1000,
        ),
        // LLaMA-like (RMSNorm, rotary, SwiGLU, untied, 2 key/value heads of
        // 12 / 4 = 3): no position table, no biases, qkv 12 + 2 x 6 rows,
        // gate and up projections, a separate head.
        (
            serde_json::json!({"layers": 1, "hidden": 12, "heads": 4, "kvHeads": 2, "ffn": 20,
                   "vocab": 10, "seqLen": 4, "norm": "rmsnorm", "positional": "rotary",
                   "mlp": "swiglu", "tiedEmbeddings": false}),
            vec![
                m(10, 12, None, false),
                b(12, l0, 4),
                m(24, 12, l0, true),
                m(12, 12, l0, true),
                b(12, l0, 4),
                m(20, 12, l0, true),
                m(20, 12, l0, true),
                m(12, 20, l0, true),
                b(12, None, 4),
                m(10, 12, None, true),
            ],
            1428,
        ),
        // BERT-like encoder: two token types and a LayerNorm after the
        // embeddings; the head's transform (dense + LayerNorm) and the
        // decoder's vocabulary bias.
        (
            serde_json::json!({"kind": "encoder", "layers": 1, "hidden": 8, "heads": 2, "ffn": 16,
                   "vocab": 10, "seqLen": 4}),
            vec![
                m(10, 8, None, true),
                m(4, 8, None, false),
                m(2, 8, None, false),
                v(8, None),
                v(8, None),
                v(8, l0),
                v(8, l0),
                m(24, 8, l0, true),
                b(24, l0, 4),
                m(8, 8, l0, true),
                b(8, l0, 4),
                v(8, l0),
                v(8, l0),
                m(16, 8, l0, true),
                b(16, l0, 4),
                m(8, 16, l0, true),
                b(8, l0, 4),
                m(8, 8, None, true),
                b(8, None, 4),
                v(8, None),
                v(8, None),
                b(10, None, 4),
            ],
            842,
        ),
    ];
    for (fields, want, count) in cases {
        let a = arch::Arch::Transformer(
            arch::TransformerArch::from_spec(&transformer_spec(fields.clone())).unwrap(),
        );
        assert_eq!(a.param_tensors(), want, "{fields}");
        assert_eq!(a.parameter_count(), count, "{fields}");
        assert_eq!(a.layers(), 1, "{fields}");
    }
    let mlp = arch::Arch::Mlp {
        layers: 2,
        hidden: 3,
    };
    assert_eq!(
        mlp.param_tensors(),
        [
            m(3, 3, l0, true),
            b(3, l0, 1),
            m(3, 3, Some(1), true),
            b(3, Some(1), 1),
        ]
    );
    assert_eq!((mlp.parameter_count(), mlp.layers()), (2 * (9 + 3), 2));
    assert_eq!(resolve_arch(&gpt2_small()).unwrap().layers(), 12);
}

#[test]
fn a_transformer_spec_resolves_its_defaults_from_the_norm_kind_and_positions() {
    use crate::api::{MlpKind, NormKind, PositionalKind, TransformerKind};
    let gpt = arch::TransformerArch {
        family: "transformer".into(),
        kind: TransformerKind::Decoder,
        layers: 2,
        hidden: 8,
        heads: 2,
        kv_heads: 2,
        head_dim: 4,
        ffn: 32,
        vocab: 10,
        seq_len: 4,
        positions: 4,
        mlp: MlpKind::Gelu,
        norm: NormKind::Layernorm,
        positional: PositionalKind::Learned,
        tied: true,
        linear_bias: true,
        qkv_bias: true,
        token_types: 0,
        library: None,
        layout: Default::default(),
    };
    let cases = [
        (
            serde_json::json!({"layers": 2, "hidden": 8, "heads": 2, "vocab": 10, "seqLen": 4}),
            gpt.clone(),
        ),
        // Rotary: no position table; RMSNorm: no biases.
        (
            serde_json::json!({"layers": 2, "hidden": 8, "heads": 2, "vocab": 10, "seqLen": 4,
                   "positional": "rotary", "norm": "rmsnorm", "kvHeads": 1, "ffn": 6}),
            arch::TransformerArch {
                kv_heads: 1,
                ffn: 6,
                positions: 0,
                norm: NormKind::Rmsnorm,
                positional: PositionalKind::Rotary,
                linear_bias: false,
                qkv_bias: false,
                ..gpt.clone()
            },
        ),
        // An encoder has BERT's two token types.
        (
            serde_json::json!({"kind": "encoder", "layers": 2, "hidden": 8, "heads": 2, "vocab": 10,
                   "seqLen": 4, "tiedEmbeddings": false}),
            arch::TransformerArch {
                kind: TransformerKind::Encoder,
                tied: false,
                token_types: 2,
                ..gpt.clone()
            },
        ),
    ];
    for (fields, want) in cases {
        assert_eq!(
            arch::TransformerArch::from_spec(&transformer_spec(fields.clone())),
            Ok(want),
            "{fields}"
        );
    }
}

#[test]
fn transformer_shapes_that_would_predict_nonsense_are_refused() {
    let base = serde_json::json!({"layers": 2, "hidden": 8, "heads": 4, "vocab": 10, "seqLen": 4});
    let cases = [
        (
            "heads",
            serde_json::json!(0),
            "transformer.hidden (8) must be divisible by transformer.heads (0)",
        ),
        (
            "heads",
            serde_json::json!(3),
            "transformer.hidden (8) must be divisible by transformer.heads (3)",
        ),
        (
            "kvHeads",
            serde_json::json!(0),
            "transformer.heads (4) must be divisible by transformer.kvHeads (0)",
        ),
        (
            "kvHeads",
            serde_json::json!(3),
            "transformer.heads (4) must be divisible by transformer.kvHeads (3)",
        ),
        (
            "layers",
            serde_json::json!(0),
            "transformer: layers must be at least 1",
        ),
        (
            "hidden",
            serde_json::json!(0),
            "transformer: hidden must be at least 1",
        ),
        (
            "vocab",
            serde_json::json!(0),
            "transformer: vocab must be at least 1",
        ),
        (
            "seqLen",
            serde_json::json!(0),
            "transformer: seqLen must be at least 1",
        ),
        (
            "ffn",
            serde_json::json!(0),
            "transformer: ffn must be at least 1",
        ),
    ];
    for (key, value, want) in cases {
        let spec = transformer_spec(with(base.clone(), key, value.clone()));
        assert_eq!(
            arch::TransformerArch::from_spec(&spec).map_err(|e| e.to_string()),
            Err(want.to_string()),
            "{key}: {value}"
        );
    }
    // A learned table needs a row per token; rotary positions need none.
    let learned = arch::TransformerArch::from_spec(&transformer_spec(base.clone())).unwrap();
    assert_eq!(learned.check(), Ok(()));
    let short = arch::TransformerArch {
        positions: 3,
        ..learned.clone()
    };
    assert_eq!(
        short.check().map_err(|e| e.to_string()),
        Err("transformer: seqLen 4 exceeds the 3 learned positions".to_string())
    );
    let rotary = arch::TransformerArch {
        positions: 0,
        positional: crate::api::PositionalKind::Rotary,
        ..learned
    };
    assert_eq!(rotary.check(), Ok(()));
}

/// A config is free-form: each count is bounded as the `transformer`
/// description's schema bounds it, and the error names the key, before any
/// per-layer work is allocated.
#[test]
fn a_huge_count_in_a_config_is_refused_naming_the_key() {
    let hf = |key: &str, value: serde_json::Value| {
        let mut config = serde_json::json!({
            "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
            "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000,
            "max_position_embeddings": 128
        });
        config[key] = value;
        let spec: HuggingFaceSpec =
            serde_json::from_value(serde_json::json!({"config": config, "seqLen": 128})).unwrap();
        ModelSpec {
            hugging_face: Some(spec),
            ..ModelSpec::default()
        }
    };
    assert!(
        predict_model(
            &hf("num_hidden_layers", 2.into()),
            &one_gpu(1),
            default_gpu()
        )
        .is_ok()
    );
    for (key, value, max) in [
        (
            "num_hidden_layers",
            serde_json::json!(10_000_000_000u64),
            "1024",
        ),
        ("num_hidden_layers", serde_json::json!(1025), "1024"),
        ("hidden_size", serde_json::json!(u64::MAX), "1048576"),
        ("vocab_size", serde_json::json!(1u64 << 40), "16777216"),
    ] {
        let err = predict_model(&hf(key, value), &one_gpu(1), default_gpu()).unwrap_err();
        assert_eq!(
            err,
            PredictError::Invalid(format!(
                "huggingFace.config.{key} must be a positive integer of at most {max}"
            ))
        );
    }
}

/// Sizes each within its bound can still multiply past 2^64 bytes: that is
/// an `Invalid` prediction, not a panic of the controller or a wrapped,
/// small budget.
#[test]
fn sizes_whose_product_overflows_are_invalid_not_a_panic() {
    let t: TransformerSpec = serde_json::from_value(serde_json::json!({
        "layers": 1, "hidden": 1048576, "heads": 4096, "vocab": 16777216, "seqLen": 16777216
    }))
    .unwrap();
    let model = ModelSpec {
        transformer: Some(t),
        ..ModelSpec::default()
    };
    let err = predict_model(&model, &one_gpu(1048576), default_gpu()).unwrap_err();
    assert!(
        matches!(&err, PredictError::Invalid(m) if m.contains("too large to predict")),
        "{err:?}"
    );
}

/// Parameter counts of Hugging Face configs, each the count of the model
/// transformers 5.24 builds from the same config on the meta device
/// (MaskedLM for bert and roberta, CausalLM otherwise).
#[test]
fn hugging_face_configs_count_the_parameters_transformers_builds() {
    let cases = [
        // Only `model_type`, as users paste configs: every other key takes
        // transformers' default for the family.
        (serde_json::json!({"model_type": "gpt2"}), 124_439_808),
        (serde_json::json!({"model_type": "llama"}), 6_738_415_616),
        (serde_json::json!({"model_type": "mistral"}), 7_241_732_096),
        (serde_json::json!({"model_type": "qwen2"}), 12_049_846_272),
        (serde_json::json!({"model_type": "bert"}), 109_514_298),
        // Rows of the LLaMA family (Qwen3, Phi-3) and of BERT's (RoBERTa).
        (serde_json::json!({"model_type": "qwen3"}), 12_049_461_248),
        (serde_json::json!({"model_type": "phi3"}), 3_821_079_552),
        (serde_json::json!({"model_type": "roberta"}), 124_696_665),
        (
            serde_json::json!({"model_type": "phi3", "num_key_value_heads": 8}),
            3_368_094_720,
        ),
        // `head_dim × heads` apart from the hidden size: q_proj and o_proj
        // are `heads × head_dim` wide.
        (
            serde_json::json!({"model_type": "qwen2", "hidden_size": 1024, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28,
                   "intermediate_size": 3072, "vocab_size": 151936, "tie_word_embeddings": true}),
            596_157_440,
        ),
        (
            serde_json::json!({"model_type": "mistral", "hidden_size": 5120, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 2,
                   "intermediate_size": 14336, "vocab_size": 131072}),
            1_887_462_400,
        ),
        (
            serde_json::json!({"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
                   "num_key_value_heads": 8, "num_hidden_layers": 28, "intermediate_size": 3072,
                   "tie_word_embeddings": true}),
            596_049_920,
        ),
    ];
    for (config, want) in cases {
        let transformer = hf_arch(config.clone()).unwrap();
        assert_eq!(
            arch::Arch::Transformer(transformer).parameter_count(),
            want,
            "{config}"
        );
    }
}

/// Qwen3's norms of queries and keys keep activations a LLaMA block of the
/// same shape does not.
#[test]
fn qwen3_s_query_and_key_norms_add_activations() {
    let predict = |model_type: &str| {
        let spec: HuggingFaceSpec = serde_json::from_value(serde_json::json!({"seqLen": 1024,
            "config": {"model_type": model_type, "hidden_size": 1024, "num_attention_heads": 16,
                       "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 4,
                       "intermediate_size": 3072, "vocab_size": 32000}}))
        .unwrap();
        let model = ModelSpec {
            hugging_face: Some(spec),
            precision: crate::api::Precision::AmpBf16,
            ..ModelSpec::default()
        };
        predict_model(&model, &one_gpu(8), default_gpu()).unwrap()
    };
    let (llama, qwen3) = (predict("llama"), predict("qwen3"));
    assert!(
        qwen3.breakdown.activations > llama.breakdown.activations,
        "{} <= {}",
        qwen3.breakdown.activations,
        llama.breakdown.activations
    );
}

/// A Hugging Face model of `config` at `seq_len`, in `precision`, with
/// `attention`.
fn hf_model(
    config: serde_json::Value,
    seq_len: u32,
    precision: &str,
    attention: &str,
) -> ModelSpec {
    serde_json::from_value(
        serde_json::json!({"huggingFace": {"config": config, "seqLen": seq_len},
        "precision": precision, "optimizer": "adamw", "attention": attention}),
    )
    .unwrap()
}

/// Allocations of exactly `bytes`.
fn sequence_count(evs: &[sequence::TensorEvent], bytes: u64) -> usize {
    evs.iter()
        .filter(|e| matches!(e, sequence::TensorEvent::Alloc { bytes: b, .. } if *b == bytes))
        .count()
}

#[test]
fn t5s_self_attention_under_sdpa_runs_the_math_path_in_fp32_and_its_cross_attention_the_fused_kernel()
 {
    // Its relative bias is SDPA's mask and needs a gradient: no fused kernel
    // takes it and PyTorch's math path runs, in fp32 (bf16 inputs are copied
    // up), keeping the fp32 probabilities and dropout output of every
    // self-attention. The cross-attention's bias is zeros, which need no
    // gradient: its SDPA is fused, and keeps no scores (the H200's recorded
    // runs; predicted as fused everywhere T5 was 22-30 % under, as eager
    // everywhere 3-8 % over). A checkpoint asks the zeros for a gradient.
    use crate::api::Precision;
    let t5 = serde_json::json!({"model_type": "t5", "d_model": 192, "num_layers": 2, "num_heads": 4,
        "d_kv": 48, "d_ff": 768, "vocab_size": 1000});
    // 2 encoder and 2 decoder blocks, 4 heads x 64 x 64 scores per sequence
    // (sizes no activation of the hidden or head width has)
    let scores = |micro: u64| micro * 4 * 64 * 64;
    // alive when the forward reaches its logits (512 tokens x 1000, bf16)
    let at_logits = |evs: &[sequence::TensorEvent], bytes: u64| {
        let mut live = std::collections::BTreeMap::new();
        for e in evs {
            match *e {
                sequence::TensorEvent::Alloc { id, bytes: b, .. } => {
                    if b == 512 * 1000 * 2 {
                        break;
                    }
                    live.insert(id, b);
                }
                sequence::TensorEvent::Free { id } => {
                    live.remove(&id);
                }
            }
        }
        live.values().filter(|&&b| b == bytes).count()
    };
    let kept = |attention, ckpt, width| {
        let evs = hf_events(t5.clone(), Precision::AmpBf16, attention, ckpt);
        at_logits(&evs, scores(8) * width)
    };
    // math path: probabilities and dropout output, in fp32, per self-attention
    assert_eq!(kept(Attention::Sdpa, false, 4), 2 * 4);
    assert_eq!(kept(Attention::Sdpa, false, 2), 0);
    // eager: fp32 probabilities and their bf16 copy after dropout, cross too
    assert_eq!(kept(Attention::Eager, false, 4), 6);
    assert_eq!(kept(Attention::Eager, false, 2), 6);
    // checkpointed, the cross-attention makes fp32 scores too (the first
    // forward's, up to its logits)
    let made = |ckpt| {
        let evs = hf_events(t5.clone(), Precision::AmpBf16, Attention::Sdpa, ckpt);
        let logits = evs
            .iter()
            .position(|e| matches!(e, sequence::TensorEvent::Alloc { bytes, .. } if *bytes == 512 * 1000 * 2))
            .expect("the logits");
        sequence_count(&evs[..logits], scores(8) * 4)
    };
    assert_eq!(made(false), 3 * 4, "scores, probabilities, dropout output");
    assert!(made(true) > made(false));
    // The key/value cache is the decoder's: transformers builds the encoder
    // with `use_cache = False`. Four copies per decoder block and step (its
    // self-attention's keys and values and its cross-attention's, in the
    // projections' bf16 under autocast as the recorded runs free them, 192
    // wide). Counted in the first forward, up to its logits.
    let copies = |use_cache: bool, width: u64| {
        let mut config = t5.clone();
        config["use_cache"] = serde_json::json!(use_cache);
        let evs = hf_events(config, Precision::AmpBf16, Attention::Sdpa, false);
        let logits = evs
            .iter()
            .position(|e| matches!(e, sequence::TensorEvent::Alloc { bytes, .. } if *bytes == 512 * 1000 * 2))
            .expect("the logits");
        sequence_count(&evs[..logits], 512 * 192 * width)
    };
    assert_eq!(copies(true, 2) - copies(false, 2), 4 * 2);
    assert_eq!(copies(true, 4), copies(false, 4));
    // A family without the bias keeps SDPA's fused attention.
    let peak = |config: &serde_json::Value, attention: &str| {
        predict_model(
            &hf_model(config.clone(), 512, "amp-bf16", attention),
            &one_gpu(8),
            default_gpu(),
        )
        .unwrap()
        .peak_bytes
    };
    let llama = serde_json::json!({"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 1024, "vocab_size": 1000});
    assert!(peak(&llama, "sdpa") < peak(&llama, "eager"));
}

#[test]
fn eager_scores_keep_a_dropout_mask_only_when_the_attention_has_dropout() {
    // OPT: hidden dropout 0.1 by default, attention dropout 0.0 (its fp32
    // eager run on the H200 was 27 % over with both counted).
    use crate::api::Precision;
    let opt = |attention_dropout: f64| {
        let config = serde_json::json!({"model_type": "opt", "hidden_size": 128, "num_hidden_layers": 2,
            "ffn_dim": 1024, "num_attention_heads": 4, "vocab_size": 1000, "word_embed_proj_dim": 128,
            "attention_dropout": attention_dropout});
        hf_events(config, Precision::Fp32, Attention::Eager, false)
    };
    // Every layer's 8 x 4 x 64 x 64 scores (a size the hidden dropout's
    // 512 x 128 masks do not have): the mask (1 byte) is kept by both
    // layers at once with dropout, and made by neither without.
    let scores = 8 * 4 * 64 * 64;
    assert!(most_alive(&opt(0.1), scores) >= 2);
    assert_eq!(most_alive(&opt(0.0), scores), 0);
}

#[test]
fn an_untied_heads_logits_gradient_is_released_before_its_fp32_weight_gradient() {
    // Autograd releases the head matmul's grad_output (the bf16 logits'
    // gradient) when the matmul's backward node returns; autocast's cast of
    // the weight gradient back to fp32 is a node of its own, after it. On a
    // 151,936-word vocabulary this order decides whether the fp32 gradient
    // reuses the logits gradient's block (Qwen2 held out: -9.3 % -> -0.2 %).
    use crate::api::Precision;
    use sequence::{Category, TensorEvent};
    let (rows, vocab, hidden) = (8 * 64, 5000, 96);
    let evs = hf_events(tiny("llama"), Precision::AmpBf16, Attention::Sdpa, false);
    let grad_at = evs
        .iter()
        .position(|e| {
            matches!(e, TensorEvent::Alloc { bytes, category: Category::Gradients, .. }
                if *bytes == vocab * hidden * 4)
        })
        .expect("the head's fp32 weight gradient");
    let g_logits = evs[..grad_at]
        .iter()
        .rev()
        .find_map(|e| match e {
            TensorEvent::Alloc { id, bytes, .. } if *bytes == rows * vocab * 2 => Some(*id),
            _ => None,
        })
        .expect("the logits' bf16 gradient");
    let freed_at = evs
        .iter()
        .position(|e| matches!(e, TensorEvent::Free { id } if *id == g_logits))
        .expect("freed");
    assert!(
        freed_at < grad_at,
        "freed at {freed_at}, gradient at {grad_at}"
    );
}

#[test]
fn backwards_cublas_workspace_comes_with_the_heads_matmul_after_the_loss_blocks_are_freed() {
    // cuBLAS makes the backward thread's workspace on its first use, the
    // head's matmul: between the weight's gradient and the input's, after
    // the loss's logits-sized blocks are freed (as recorded on the H200 for
    // Phi-3, DeBERTa-v2, DeBERTa-v3, Mixtral, Mistral and Qwen3). Made
    // before the loss's backward, it split a freed logits-sized block
    // (DeBERTa-v2 held out: -14.7 % -> -3.3 %).
    use crate::api::Precision;
    use sequence::TensorEvent;
    let (rows, vocab, hidden) = (8 * 64, 5000, 96);
    let model = ModelSpec {
        hugging_face: Some(HuggingFaceSpec {
            config: tiny("llama").as_object().unwrap().clone(),
            seq_len: 64,
        }),
        ..ModelSpec::default()
    };
    let run = sequence::RunShape {
        reduce: None,
        micro_batch: 8,
        grad_accum: 1,
        precision: Precision::AmpBf16,
        optimizer: crate::api::Optimizer::Sgd,
        checkpointing: false,
        attention: Attention::Sdpa,
        zero_stage: 0,
        gpus: 1,
        cublas_workspace: 32 << 20,
    };
    let evs = sequence::training_events(&resolve_arch(&model).unwrap(), &run);
    let workspaces = sequence::tests::workspaces_at(&evs);
    assert_eq!(workspaces.len(), 2, "forward's and backward's");
    let at = workspaces[1];
    assert!(
        matches!(evs[at - 1], TensorEvent::Alloc { bytes, .. } if bytes == vocab * hidden * 2),
        "right after the head's bf16 weight gradient: {:?}",
        evs[at - 1]
    );
    assert!(
        matches!(evs[at + 1], TensorEvent::Alloc { bytes, .. } if bytes == rows * hidden * 2),
        "right before the head's bf16 grad_input: {:?}",
        evs[at + 1]
    );
    let alive = sequence::tests::alive_of_size(&evs[..at], rows * vocab * 4);
    // the loss's fp32 blocks (the upcast logits, the log-probabilities and
    // their gradients) are all gone
    assert!(
        alive.is_empty(),
        "fp32 logits-sized blocks alive: {alive:?}"
    );
}

#[test]
fn phi3s_fused_projections_are_one_tensor_each_and_llamas_query_key_value_three() {
    // Phi3MLP's gate_up_proj: one weight (and one gradient and optimizer
    // state each) of 2 x intermediate rows, as the H200's recorded run
    // allocates it (11.0 MiB x 24, not 5.5 MiB x 48, in 8 layers).
    let (h, ffn) = (96u64, 176u64);
    let config = serde_json::json!({"model_type": "phi3", "num_hidden_layers": 2,
        "hidden_size": h, "num_attention_heads": 4, "num_key_value_heads": 4,
        "intermediate_size": ffn, "vocab_size": 5000});
    let model = ModelSpec {
        hugging_face: Some(HuggingFaceSpec {
            config: config.as_object().unwrap().clone(),
            seq_len: 64,
        }),
        ..ModelSpec::default()
    };
    let Arch::Transformer(t) = resolve_arch(&model).unwrap() else {
        panic!("a transformer")
    };
    let shapes: Vec<(u64, u64)> = t.param_tensors().iter().map(|p| (p.rows, p.cols)).collect();
    assert_eq!(shapes.iter().filter(|&&s| s == (2 * ffn, h)).count(), 2);
    assert_eq!(shapes.iter().filter(|&&s| s == (ffn, h)).count(), 0);
    assert_eq!(
        shapes.iter().filter(|&&s| s == (h, ffn)).count(),
        2,
        "down_proj"
    );
    // qkv_proj: one tensor too (LLaMA's are three)
    assert_eq!(shapes.iter().filter(|&&s| s == (3 * h, h)).count(), 2);
    let Arch::Transformer(llama) = resolve_arch(&ModelSpec {
        hugging_face: Some(HuggingFaceSpec {
            config: tiny("llama").as_object().unwrap().clone(),
            seq_len: 64,
        }),
        ..ModelSpec::default()
    })
    .unwrap() else {
        panic!("a transformer")
    };
    let shapes: Vec<(u64, u64)> = llama
        .param_tensors()
        .iter()
        .map(|p| (p.rows, p.cols))
        .collect();
    assert_eq!(shapes.iter().filter(|&&s| s == (3 * h, h)).count(), 0);
    assert_eq!(
        shapes.iter().filter(|&&s| s == (h, h)).count(),
        2 * 4,
        "q, k, v, o"
    );
}

/// The rows of a measured set that the analytic path predicts, as
/// predicted (the layout margin included).
fn analytic_rows(measured: &str) -> Vec<BenchRow> {
    bench_predict(measured, None)
        .unwrap()
        .rows
        .into_iter()
        .filter(|r| r.source == "model")
        .collect()
}

/// [`analytic_rows`] scored without the layout margin: what the generated
/// sequence replays to. The sets' recorded figures below are the replay's,
/// the margin has its own test
/// (`the_layout_margin_keeps_the_later_steps_loss_segments_within_five_percent`).
fn replay_rows(measured: &str) -> Vec<BenchRow> {
    analytic_rows(measured)
        .iter()
        .map(BenchRow::without_margin)
        .collect()
}

#[test]
fn the_analytic_path_meets_the_goal_on_the_fresh_set_predicted_before_it_ran() {
    // 15 transformers runs written after every rule of 2026-12-04 and
    // predicted (data/calibration/fresh-predictions.jsonl) before they ran.
    let hf = replay_rows(include_str!("../../data/calibration/h200-fresh.jsonl"));
    assert_eq!(hf.len(), 15);
    let stats = error_stats(&hf, None);
    assert!(stats.median <= 0.03 && stats.p90 <= 0.06, "{stats:?}");
    assert!(stats.under_predictions.is_empty(), "{stats:?}");
}

#[test]
fn the_analytic_path_meets_the_goal_on_the_second_fresh_set() {
    // 19 transformers runs written after the rules of 2026-12-05 and
    // predicted (data/calibration/fresh2-predictions.jsonl) before they ran:
    // median 0.7 %, p90 8.2 %, none under beyond 5 % then. Read afterwards:
    // a library model keeps no loss block beyond its replay
    // (`loss_block_margin`), which leaves 0.4 %, 1.8 %, max 2.5 %. T5's
    // cross-attention cache, read from the recorded runs since, moves T5 amp
    // bf16's third step to one 1004 MiB segment fewer than the run took
    // (replay -5.2 %): scored as predicted, with the layout margin, -3.4 %
    // (median 1.9 %, p90 3.2 %).
    let hf = analytic_rows(include_str!("../../data/calibration/h200-fresh2.jsonl"));
    assert_eq!(hf.len(), 19);
    let stats = error_stats(&hf, None);
    assert!(stats.median <= 0.02 && stats.p90 <= 0.035, "{stats:?}");
    assert!(stats.under_predictions.is_empty(), "{stats:?}");
}

#[test]
fn the_analytic_path_meets_the_goal_on_the_third_fresh_set() {
    // 18 transformers runs written after `loss_block_margin` and predicted
    // (data/calibration/fresh3-predictions.jsonl) before they ran: median
    // 0.4 %, p90 10.9 %, none under beyond 5 %. Two were over beyond 10 %
    // (Qwen3 bf16 with SGD-momentum +17.6 %, Mixtral bf16 +10.9 %): the
    // generated sequence's second step took one more loss segment than the
    // H200's did. With the head's backward in the recorded order (weight
    // gradient, workspace, input gradient) Qwen3 is -0.1 % and the p90 4.0 %;
    // Mixtral bf16 stays over.
    let hf = replay_rows(include_str!("../../data/calibration/h200-fresh3.jsonl"));
    assert_eq!(hf.len(), 18);
    let stats = error_stats(&hf, None);
    assert!(stats.median <= 0.01 && stats.p90 <= 0.06, "{stats:?}");
    assert!(stats.under_predictions.is_empty(), "{stats:?}");
}

#[test]
fn the_fourth_fresh_set_stays_within_its_recorded_figures() {
    // 18 transformers runs, eager attention and fp16 autocast for most,
    // predicted (data/calibration/fresh4-predictions.jsonl) before they ran:
    // median 0.4 %, p90 6.6 %, LLaMA amp eager -6.6 % under (the H200's
    // third step took a new segment for its fp32 logits; from three
    // generated steps it is -0.2 %) and BERT fp16 eager +8.3 % over (until
    // eager attention followed the recorded runs: no mask for an encoder
    // trained without one, the dropout's output held until the layer
    // returns; -0.5 % since). Every allocated peak but T5 amp's (+5.1 %) and
    // ViT's is within 0.6 %; the rows still beyond 5 % are each one loss
    // segment apart (OPT amp eager over; Mixtral amp was 6.5 % under until
    // its experts' block stopped casting the norm's output twice and making
    // a projection after the routed sum, which is the block's output: 0.1 %).
    let hf = replay_rows(include_str!("../../data/calibration/h200-fresh4.jsonl"));
    assert_eq!(hf.len(), 18);
    let stats = error_stats(&hf, None);
    assert!(stats.median <= 0.01 && stats.p90 <= 0.07, "{stats:?}");
    assert!(stats.max <= 0.07, "{stats:?}");
    assert!(stats.under_predictions.is_empty(), "{stats:?}");
    let mixtral = hf
        .iter()
        .find(|r| r.name == "hf-mixtrals4-s1024-b4-ampbf16-adamw-sdpa")
        .unwrap();
    assert!(mixtral.relative_error.abs() <= 0.01, "{mixtral:?}");
}

#[test]
fn the_gpu_machines_captures_of_every_measured_set_meet_the_goal() {
    // Every transformers run of the eight measured sets, captured on the GPU
    // machine's CPUs (its PyTorch 2.11 and transformers 5.17) with three
    // steps and the tied sums and softmax temporaries CUDA makes: each set's
    // median within 0.5 % and p90 within 6 %; none under beyond 5 %. The
    // autocast captures were made again (transformers 5.17) when mixed-dtype
    // `cat` stopped copying its narrower input as CPU autocast does: LLaMA
    // amp eager, whose fp32 value-cache copy per layer had the replay take
    // one segment fewer than the H200's third step, went -6.3 -> +0.1 %.
    let sets = [
        (
            include_str!("../../data/calibration/h200-libraries.jsonl"),
            "libraries-h200",
        ),
        (
            include_str!("../../data/calibration/h200-libraries-validation.jsonl"),
            "libraries-validation-h200",
        ),
        (
            include_str!("../../data/calibration/h200-families.jsonl"),
            "families-h200",
        ),
        (
            include_str!("../../data/calibration/h200-heldout.jsonl"),
            "heldout-h200",
        ),
        (
            include_str!("../../data/calibration/h200-fresh.jsonl"),
            "fresh-h200",
        ),
        (
            include_str!("../../data/calibration/h200-fresh2.jsonl"),
            "fresh2-h200",
        ),
        (
            include_str!("../../data/calibration/h200-fresh3.jsonl"),
            "fresh3-h200",
        ),
        (
            include_str!("../../data/calibration/h200-fresh4.jsonl"),
            "fresh4-h200",
        ),
    ];
    let mut under = Vec::new();
    let mut count = 0;
    for (measured, dir) in sets {
        // (the library set's repeat of a run alone has no capture of its own)
        let rows: Vec<BenchRow> = rows_from_captures(measured, dir)
            .into_iter()
            .filter(|r| r.name.starts_with("hf-") && r.source == "profile")
            .collect();
        count += rows.len();
        let stats = error_stats(&rows, None);
        assert!(
            stats.median <= 0.005 && stats.p90 <= 0.06,
            "{dir}: {stats:?}"
        );
        under.extend(stats.under_predictions);
    }
    assert_eq!(count, 167);
    assert!(under.is_empty(), "{under:?}");
}

/// A fresh set's error statistics: the analytic path's over its
/// transformers rows and the captures' (data/profiles/`profiles`) over every
/// row, after checking that `answered` (analytic, captured) rows were
/// predicted each way.
fn fresh_set_stats(
    measured: &str,
    profiles: &str,
    answered: (usize, usize),
) -> (
    crate::predict::bench::ErrorStats,
    crate::predict::bench::ErrorStats,
) {
    let hf = replay_rows(measured);
    assert_eq!(hf.len(), answered.0);
    let captured = rows_from_captures(measured, profiles);
    assert_eq!(captured.len(), answered.1);
    assert!(captured.iter().all(|r| r.source == "profile"));
    (error_stats(&hf, None), error_stats(&captured, None))
}

/// Asserts a set's figures: median, p90 and the largest error within the
/// bounds, none under beyond 5 %.
fn assert_within(stats: &crate::predict::bench::ErrorStats, median: f64, p90: f64, max: f64) {
    assert_within_but(stats, (median, p90, max), &[]);
}

/// [`assert_within`] with `(median, p90, max)` bounds, the rows under
/// beyond 5 % exactly `under`.
fn assert_within_but(
    stats: &crate::predict::bench::ErrorStats,
    (median, p90, max): (f64, f64, f64),
    under: &[&str],
) {
    assert!(
        stats.median <= median && stats.p90 <= p90 && stats.max <= max,
        "{stats:?}"
    );
    assert_eq!(stats.under_predictions, under, "{stats:?}");
}

#[test]
fn the_fifth_fresh_set_stays_within_its_recorded_figures() {
    // 21 runs on an H100 (its context and workspaces are the H200's),
    // analytic predictions recorded (data/calibration/fresh5-predictions.jsonl)
    // before they ran: 15 answered, median 1.0 %, p90 8.3 %, none under
    // beyond 5 % (DeBERTa-v3 amp eager +18.7 %, T5 fp32 +8.3 % over). The
    // captures made beside the runs with the capture's code of that commit
    // answer all 21, the four families only a capture describes among them
    // (OLMo 2, StarCoder2, Qwen3-MoE, Granite): median 0.0 %, p90 0.8 %, max
    // +8.2 % (Mistral amp eager), none under. Read afterwards: DeBERTa's
    // encoder holds its mask and hidden states to its end and its attention
    // frees its locals when it returns (-0.1 %); the analytic rows are then
    // median 0.8 %, p90 3.8 %, max +8.3 % (T5 fp32); with T5's attention as
    // the library runs it, Qwen3-MoE (-0.0 %) and Granite (-0.5 %)
    // described, 17 answered: median 0.5 %, p90 3.7 %, max 3.8 %; with
    // OLMo 2 (-0.4 %) and StarCoder2 (-0.0 %) described, 19.
    let (stats, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh5.jsonl"),
        "fresh5-h100",
        (19, 21),
    );
    assert_within(&stats, 0.01, 0.04, 0.04);
    assert_within(&captured, 0.005, 0.01, 0.09);
}

#[test]
fn the_sixth_fresh_set_stays_within_its_recorded_figures() {
    // 19 cases as users paste their configs (a few keys, the library's
    // defaults for the rest), run on an H100 after their analytic
    // predictions were committed (data/calibration/fresh6-predictions.jsonl);
    // 18 ran (RoBERTa fp32 at 512 tokens failed in transformers). Analytic,
    // the 15 transformers runs: median 0.5 %, p90 3.8 %, max +5.3 % (LLaMA
    // bf16 with four keys set), none under. The captures made beside the
    // runs answer all 18: median 0.1 %, p90 2.8 %, max 3.6 % (ResNet-50 amp
    // -3.6 %), none under.
    let (stats, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh6.jsonl"),
        "fresh6-h100",
        (15, 18),
    );
    assert_within(&stats, 0.01, 0.04, 0.06);
    assert_within(&captured, 0.005, 0.03, 0.04);
}

#[test]
fn the_seventh_fresh_set_stays_within_its_recorded_figures() {
    // 21 cases run on an H100 after their analytic predictions were committed
    // (data/calibration/fresh7-predictions.jsonl): 16 answered, median 0.4 %,
    // p90 14.4 %, two under beyond 5 % (DeBERTa-v2 amp eager -16.7 %, Mixtral
    // -9.6 %). Read afterwards: the routed experts' sum (Mixtral -0.0 %);
    // DeBERTa's encoder holding its mask and hidden states to its end and its
    // attention freeing its locals when it returns (+0.0 %); BERT's head
    // under autocast keeping only its cast of the encoder's output (+14.4 ->
    // -0.0 %). Qwen3-MoE, described since (-0.2 %), makes 17 answered. The
    // captures made beside the runs answer all 21.
    let (stats, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh7.jsonl"),
        "fresh7-h100",
        (17, 21),
    );
    assert_within(&stats, 0.005, 0.03, 0.05);
    assert_within(&captured, 0.005, 0.05, 0.06);
}

#[test]
fn the_eighth_fresh_set_stays_within_its_recorded_figures() {
    // 16 transformers cases written after DeBERTa's encoder, BERT's head
    // under autocast and T5's attention were read from the recorded runs,
    // run on an H100 after their analytic predictions were committed
    // (data/calibration/fresh8-predictions.jsonl): all 16 answered, median
    // 0.2 %, p90 2.5 %, max -3.2 % (T5 bf16), none under beyond 5 %. The
    // captures made beside the runs: median 0.1 %, p90 1.5 %, max 1.9 %.
    let (stats, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh8.jsonl"),
        "fresh8-h100",
        (16, 16),
    );
    assert_within(&stats, 0.005, 0.03, 0.035);
    assert_within(&captured, 0.005, 0.02, 0.02);
}

#[test]
fn the_ninth_fresh_set_stays_within_its_recorded_figures() {
    // 29 cases (24 transformers, 5 torchvision) run on an H100 after their
    // analytic predictions were committed (data/calibration/fresh9-predictions.jsonl):
    // 24 of 24 answered, median 0.7 %, p90 2.6 %, one under beyond 5 % (Phi-3
    // fp16 autocast -6.3 %, allocated exact: a fragmentation residual);
    // Mistral at 6k tokens -4.4 % and Gemma 3 with its 512-token window
    // -1.9 % were the window's masks. Read afterwards from the recorded
    // runs: the window's mask per block, its repeated keys and values, the
    // memory-efficient kernel, Gemma's fp32 norm products and its output
    // norms' fp32 copies under autocast (median 0.2 %, p90 1.9 %, Mistral
    // -0.1 %, every Gemma row within 0.1 %). The captures: all 29,
    // median 0.1 %, p90 3.6 %, VGG-16 fp32 -7.1 % under (allocated exact);
    // with the workspaces the tenth set's sweep measured for its
    // convolutions at batch 64, -0.0 % (p90 2.7 %). With every windowed
    // block's output projection given its gradient (see
    // `every_family_frees_each_tensor_once_...`), Gemma 3 with its window
    // at 2,048 x 2 in bf16 went -0.1 -> -14.7 % with its allocated peak
    // within 0.2 % (one 4 GiB loss segment short in the second step), and
    // back to -0.1 % with the head norms' inputs alive until the norms
    // return (`a_head_norms_input_lives_until_the_norm_returns`).
    let (stats, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh9.jsonl"),
        "fresh9-h100",
        (24, 29),
    );
    assert_within_but(
        &stats,
        (0.003, 0.02, 0.065),
        &["hf-phi3h9-s2048-b4-ampfp16-adamw-sdpa"],
    );
    assert_within(&captured, 0.002, 0.03, 0.045);
}

#[test]
fn the_tenth_fresh_set_stays_within_its_recorded_figures() {
    // 28 cases (22 torchvision, 6 transformers) run on an H100 after their
    // analytic predictions and the profile path's from CPU captures were
    // committed (data/calibration/fresh10-predictions.jsonl). The profile
    // path (captures beside the runs): 28 of 28, median 0.6 %, p90 3.9 %,
    // VGG-16 amp bf16 at batch 96 -6.1 % under, AlexNet +9.3 % over; every
    // fp32 VGG within 2.7 %. With the workspaces the sweeps measured (after
    // these predictions, at the runs' batch sizes among others; 15 of the 22
    // torchvision runs have every convolution in them): median 0.1 %, p90
    // 2.2 %, max +4.4 %, VGG-16 amp -0.0 %, AlexNet -0.4 %, none under. The analytic path, 6 answered: median 4.8 %,
    // three under with their allocated peaks exact (GPT-2 medium bf16 with
    // checkpointing and accumulation -12.4 %, Phi-3 fp16 autocast -6.3 %,
    // T5 fp32 eager -6.1 %): each later step's loss finds its segments held
    // by tensors the recorded runs placed there and the generated sequence
    // elsewhere. T5's cross-attention cache, read from the recorded runs
    // since (its copies held to the next forward shape the later steps'
    // layout), brings T5 fp32 eager within 1 %. Dropout's mask made before
    // its output, and freed at once in a checkpoint's first forward, as
    // CUDA's kernel does, scatters GPT-2 medium's hidden states as the run
    // does (-12.4 -> -0.7 % in the replay).
    let (stats, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh10.jsonl"),
        "fresh10-h100",
        (6, 28),
    );
    assert_within_but(
        &stats,
        (0.05, 0.07, 0.07),
        &["hf-phi3h10-s1024-b8-ampfp16-adamw-sdpa"],
    );
    assert_within(&captured, 0.002, 0.025, 0.045);
}

#[test]
fn the_eleventh_fresh_set_stays_within_its_recorded_figures() {
    // 30 cases (22 transformers, 8 torchvision) run on an H100 after both
    // paths' predictions were committed (data/calibration/fresh11-predictions.jsonl,
    // the analytic ones with the layout margin). Analytic, 22 of 22: median
    // 1.9 %, p90 5.9 %, max +8.5 % (Phi-3 bf16 with checkpointing), T5 fp32
    // eager at 256 tokens -5.9 % under; the replay alone median 0.3 %, p90
    // 4.6 %, the same row -7.6 %. The profile path from the captures made
    // beside the runs: 30 of 30, median 0.0 %, p90 2.5 %, max +6.4 % (OPT
    // fp32), none under. T5's stack ends (the embeddings' and the final
    // norms' dropouts, the encoder's output, the decoder's dense gradient
    // of the shared table) put that row's allocated peak within 2 MiB of
    // the run's: -4.8 % with the margin, -6.6 % by the replay alone.
    let (replayed, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh11.jsonl"),
        "fresh11-h100",
        (22, 30),
    );
    let t5 = ["hf-t5ek-s256-b16-fp32-adamw-eager"];
    assert_within_but(&replayed, (0.003, 0.026, 0.077), &t5);
    assert_within(&captured, 0.001, 0.026, 0.065);
    let kept = error_stats(
        &analytic_rows(include_str!("../../data/calibration/h100-fresh11.jsonl")),
        None,
    );
    assert_within_but(&kept, (0.02, 0.04, 0.086), &[]);
}

#[test]
fn the_twelfth_fresh_set_stays_within_its_recorded_figures() {
    // 24 cases (20 transformers, 4 torchvision) run on an H100 after both
    // paths' predictions were committed (data/calibration/fresh12-predictions.jsonl).
    // Analytic as recorded, 20 of 20: median 1.9 %, p90 6.0 %, max 8.2 %,
    // Gemma 2 amp bf16 eager -8.2 % under with its allocated peak exact: its
    // tied head's gradient is the weight cast's fp32 backward, kept from the
    // head to the next `zero_grad`, where the sequence kept a bf16 one and
    // summed a new tensor at the end, so the first optimizer step's states
    // took a 4000 MiB loss segment the run left free. Read from the recorded
    // runs since (that, and T5's cross-attention cache): replay median
    // 0.3 %, p90 2.5 %, none under; with the margin 1.9 %, 2.6 %, max +7.5 %
    // (BERT-large amp). The profile path from the captures made beside the
    // runs: 24 of 24, median 0.0 %, p90 1.4 %, max 4.3 %, none under.
    let (replayed, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh12.jsonl"),
        "fresh12-h100",
        (20, 24),
    );
    assert_within(&replayed, 0.004, 0.026, 0.056);
    assert_within(&captured, 0.001, 0.015, 0.045);
    let kept = error_stats(
        &analytic_rows(include_str!("../../data/calibration/h100-fresh12.jsonl")),
        None,
    );
    assert_within(&kept, 0.02, 0.027, 0.076);
}

#[test]
fn the_thirteenth_fresh_set_stays_within_its_recorded_figures() {
    // 24 cases (20 transformers, 4 torchvision) run on an H100 after both
    // paths' predictions were committed (data/calibration/fresh13-predictions.jsonl,
    // the analytic ones with the twelfth set's reading). Analytic as
    // recorded, 20 of 20: median 1.8 %, p90 2.1 %, Gemma 2 fp16 autocast
    // eager -8.9 % under with its allocated peak exact: the final softcap's
    // backward (three logit-sized gradients, the kept tanh going after the
    // second) moves the head's gradients into the loss segments the run
    // left them in. With it: median 1.8 %, p90 2.0 %, max 2.2 %, none under
    // (the replay alone 0.1 %, 0.9 %, 2.6 %; 1.3 % with T5's one cast per
    // feed-forward; dropout's mask before its output: max 3.5 %, T5-base
    // amp eager -3.5 %). The profile path from the
    // captures made beside the runs: 24 of 24, median 0.1 %, p90 2.6 %, max
    // 4.3 %, none under.
    let (replayed, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh13.jsonl"),
        "fresh13-h100",
        (20, 24),
    );
    assert_within(&replayed, 0.002, 0.01, 0.035);
    assert_within(&captured, 0.002, 0.027, 0.045);
    let kept = error_stats(
        &analytic_rows(include_str!("../../data/calibration/h100-fresh13.jsonl")),
        None,
    );
    assert_within(&kept, 0.019, 0.021, 0.023);
}

#[test]
fn the_fourteenth_fresh_set_stays_within_its_recorded_figures() {
    // 24 cases (20 transformers, 4 torchvision) run on an H100 after both
    // paths' predictions were committed (data/calibration/fresh14-predictions.jsonl).
    // Analytic as recorded, 20 of 20: median 1.9 %, p90 8.6 %, max 33 %,
    // OPT-350m bf16 eager -33.0 % under (OPT asks for its softmax in fp32,
    // kept per block: 24 x 256 MiB) and T5 bf16 eager +14.1 % over (T5's
    // runs in the scores' dtype). With both read: median 1.9 %, p90 2.2 %,
    // max 8.6 % (GPT-2 fp32 eager, its allocated peak exact), none under
    // (the replay alone 0.2 %, 2.0 %, 6.6 %; 2.4 % p90 with dropout's mask
    // before its output). The profile path from the
    // captures made beside the runs: 24 of 24, median 0.1 %, p90 3.3 %, max
    // 6.7 %, none under.
    let (replayed, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh14.jsonl"),
        "fresh14-h100",
        (20, 24),
    );
    assert_within(&replayed, 0.003, 0.025, 0.067);
    assert_within(&captured, 0.002, 0.034, 0.068);
    let kept = error_stats(
        &analytic_rows(include_str!("../../data/calibration/h100-fresh14.jsonl")),
        None,
    );
    assert_within(&kept, 0.02, 0.023, 0.087);
}

#[test]
fn the_fifteenth_fresh_set_stays_within_its_recorded_figures() {
    // 17 of its 26 cases at published full sizes (Mistral-Nemo 12B, Llama-2
    // 13B, Mistral 7B at 8k tokens, Pythia 6.9B, OPT 6.7B, four Mixtral
    // blocks, Qwen1.5-MoE, Qwen2.5-1.5B at 16k tokens, GPT-2 XL, the large
    // encoders, ViT-huge, four torchvision nets; the nine others need more
    // than 80 GB) run on an H100 after both paths' predictions were
    // committed (data/calibration/fresh15-predictions.jsonl). Analytic as
    // recorded, 13 of 13: median 2.0 %, p90 3.6 %, max -4.1 % (Mistral-Nemo:
    // the windowed blocks' output projections had no gradient; with it
    // +1.4 %, allocated exact), none under beyond 5 %. With it, the replay
    // alone: median 0.3 %, p90 1.6 %, max 2.7 %. The profile path from the
    // development machine's captures recorded before the runs: 17 of 17,
    // median 0.1 %, p90 1.1 %, max 2.7 %, none under.
    let (replayed, captured) = fresh_set_stats(
        include_str!("../../data/calibration/h100-fresh15.jsonl"),
        "fresh15-cpu",
        (13, 17),
    );
    assert_within(&replayed, 0.004, 0.017, 0.028);
    assert_within(&captured, 0.002, 0.012, 0.028);
    let kept = error_stats(
        &analytic_rows(include_str!("../../data/calibration/h100-fresh15.jsonl")),
        None,
    );
    assert_within(&kept, 0.021, 0.025, 0.037);
}

#[test]
fn opt_with_the_cache_keeps_only_its_scaled_queries_of_the_three_projections() {
    // `q_proj(x) * scaling` is a tensor of its own; the keys' and values'
    // projections die once the cache has copied them. Written as one fused
    // projection kept whole, every OPT row with SDPA was over by 1.6 to 4.6 %
    // (the eleventh set's OPT-125M defaults at 2,048 x 8 tokens in fp32:
    // 1.1 GiB of activations too many); now each is within 0.5 %, the
    // twelfth to fifteenth sets' five (measured after this) too. (OPT amp
    // bf16 eager of the fourth set stays +6.4 %, its allocated peak exact.)
    let rows: Vec<BenchRow> = every_sets_library_rows()
        .iter()
        .filter(|r| {
            r.name.starts_with("hf-opt") && r.name != "hf-opte4-s1024-b4-ampbf16-adamw-eager"
        })
        .map(BenchRow::without_margin)
        .collect();
    assert_eq!(rows.len(), 18);
    for row in &rows {
        assert!(
            row.relative_error.abs() <= 0.005,
            "{}: {:+.1} %",
            row.name,
            row.relative_error * 100.0
        );
    }
}

#[test]
fn the_reserve_is_the_larger_of_the_replays_in_either_address_order() {
    // Two H200 runs whose generated sequences reserve more in a different
    // address order: Llama-3 8B at 8,192 tokens with descending segment
    // addresses (one more loss segment), LLaMA amp with checkpointing with
    // ascending ones. Either order alone puts one of them under by more than
    // 2 % (-8.7 % and -2.7 %).
    let row = |measured: &str, name: &str| -> serde_json::Value {
        measured
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|r| r["name"] == name)
            .unwrap()
    };
    let heldout = include_str!("../../data/calibration/h200-heldout.jsonl");
    let mut larger = Vec::new();
    for row in [
        row(heldout, "hf-llama3-8b-s8192-b1-bf16-adamw-sdpa-ckpt"),
        row(heldout, "hf-llama-s1024-b4-ampbf16-adamw-sdpa-ckpt"),
    ] {
        let model: ModelSpec = serde_json::from_value(row["spec"]["model"].clone()).unwrap();
        let batch = &row["spec"]["batch"];
        let job = JobShape {
            gpus: 1,
            global_batch: batch["global"].as_u64().unwrap() as u32,
            micro_batch: batch["micro"].as_u64().unwrap() as u32,
        };
        let events = sequence::training_events(
            &resolve_arch(&model).unwrap(),
            &run_shape(&model, &job, default_gpu()).unwrap(),
        );
        let replay = |order| {
            CachingAllocatorModel::PYTORCH
                .replay_ordered(&events, order)
                .unwrap()
                .reserved_peak
        };
        let (down, up) = (
            replay(crate::alloc::AddressOrder::Descending),
            replay(crate::alloc::AddressOrder::Ascending),
        );
        larger.push(up > down);
        let p = predict_model(&model, &job, default_gpu()).unwrap();
        assert_eq!(
            p.reserved_bytes - p.breakdown.margin,
            up.max(down),
            "{}",
            row["name"]
        );
        let nvml = row["measured"]["nvmlPeakBytes"].as_u64().unwrap() as f64;
        let replayed = p.peak_bytes - p.breakdown.margin;
        let err = (replayed as f64 - nvml) / nvml;
        assert!(err.abs() < 0.02, "{}: {:+.1} %", row["name"], 100.0 * err);
        let smaller = (replayed - up.abs_diff(down)) as f64;
        assert!(
            smaller < 0.98 * nvml,
            "{}: either order alone meets it",
            row["name"]
        );
    }
    assert_eq!(larger, [false, true], "one row of each order");
}

#[test]
fn mixtures_of_experts_run_grouped_as_transformers_runs_them_on_cuda() {
    // transformers 5 runs the experts with `grouped_mm_experts_forward` on
    // CUDA: every routed token in one sorted tensor, fp32 under autocast.
    // Generated as a loop over the experts (the same bytes in many small
    // tensors) the allocated peak agreed but the reserve did not: Qwen2-MoE
    // +9.3 and +9.4 %, Mixtral bf16 +10.9 %, held-out Mixtral +5.5 %. Every
    // mixture-of-experts run of the H200 sets is within 2.5 % now (Mixtral
    // fp32 +2.5 % since its routed sum became the block's output, as
    // recorded; -0.1 % before).
    let mut rows = Vec::new();
    for measured in [
        include_str!("../../data/calibration/h200-families.jsonl"),
        include_str!("../../data/calibration/h200-heldout.jsonl"),
        include_str!("../../data/calibration/h200-fresh.jsonl"),
        include_str!("../../data/calibration/h200-fresh2.jsonl"),
        include_str!("../../data/calibration/h200-fresh3.jsonl"),
    ] {
        rows.extend(
            replay_rows(measured)
                .into_iter()
                .filter(|r| r.name.contains("mixtral") || r.name.contains("moe")),
        );
    }
    assert!(rows.len() >= 9, "{}", rows.len());
    for row in &rows {
        assert!(
            row.relative_error.abs() <= 0.025,
            "{}: {:+.1} %",
            row.name,
            row.relative_error * 100.0
        );
    }
}

/// Every measured set's single-GPU rows of a model `transformers` builds.
fn every_sets_library_rows() -> Vec<BenchRow> {
    [
        include_str!("../../data/calibration/h200-libraries.jsonl"),
        include_str!("../../data/calibration/h200-libraries-validation.jsonl"),
        include_str!("../../data/calibration/h200-families.jsonl"),
        include_str!("../../data/calibration/h200-heldout.jsonl"),
        include_str!("../../data/calibration/h200-fresh.jsonl"),
        include_str!("../../data/calibration/h200-fresh2.jsonl"),
        include_str!("../../data/calibration/h200-fresh3.jsonl"),
        include_str!("../../data/calibration/h200-fresh4.jsonl"),
        include_str!("../../data/calibration/h100-fresh5.jsonl"),
        include_str!("../../data/calibration/h100-fresh6.jsonl"),
        include_str!("../../data/calibration/h100-fresh7.jsonl"),
        include_str!("../../data/calibration/h100-fresh8.jsonl"),
        include_str!("../../data/calibration/h100-fresh9.jsonl"),
        include_str!("../../data/calibration/h100-fresh10.jsonl"),
        include_str!("../../data/calibration/h100-fresh11.jsonl"),
        include_str!("../../data/calibration/h100-fresh12.jsonl"),
        include_str!("../../data/calibration/h100-fresh13.jsonl"),
        include_str!("../../data/calibration/h100-fresh14.jsonl"),
        include_str!("../../data/calibration/h100-fresh15.jsonl"),
    ]
    .into_iter()
    .flat_map(analytic_rows)
    .filter(|r| r.name.starts_with("hf-"))
    .collect()
}

#[test]
fn the_layout_margin_keeps_the_later_steps_loss_segments_within_five_percent() {
    // Over the ten sets before the eleventh the replay alone was under by
    // more than 5 % on five of 265 rows, each with its allocated peak exact
    // and one loss segment short in a later step; 2 % of the reserve kept on
    // top left GPT-2 medium with checkpointing and accumulation (-12.4 ->
    // -10.9 %: a 785 MiB segment, 12 % of its peak) and put the median at
    // 1.9 %. The eleventh set, predicted with the margin before it ran, adds
    // T5 fp32 eager at 256 tokens (-7.6 -> -5.9 %), T5 fp32 eager's third
    // row under by 6 % or more; with OPT's projections as the library makes
    // them (1.6 to 4.6 % over before) and T5's norms and feed-forward
    // dropout: 287 rows, median 1.9 %, p90 2.6 % (nearest rank). T5's
    // cross-attention cache and its keys' width (the recorded runs free 24
    // bf16 copies per step where 12, six of them fp32, were predicted) bring
    // T5 fp32 eager at 512 tokens from -4.4 to +1.1 % and put T5 amp bf16
    // (fresh2) under in the replay alone: median 1.8 %, p90 2.5 %. The
    // twelfth set (20 rows) and the tied head's fp32 gradient under autocast
    // keep the under lists: 307 rows. The thirteenth set (20 rows, none
    // under with Gemma 2's final softcap backward) and T5's one cast per
    // feed-forward: 327 rows, median 1.8 %, p90 2.2 %. The fourteenth set
    // with the softmax's width read per family: 347 rows, the same. Dropout's
    // mask made before its output and freed at once without autograd, as
    // CUDA's kernel does: GPT-2 medium with checkpointing and accumulation
    // -10.9 -> +1.3 %, the two GPT-2 autocast SGD-momentum rows +12 -> +1.6 %.
    // T5's stack ends (see `t5_drops_out_each_feed_forward_branch_...`):
    // every T5 row 0.3-1.1 % higher, T5 fp32 eager at 256 tokens -4.8 %,
    // T5 amp bf16 (fresh2) within 5 % by the replay alone; none under.
    // The fifteenth set (13 rows at full published sizes) and the windowed
    // blocks' output-projection gradients (Mistral-Nemo at 4k tokens -4.1
    // -> +1.4 %) and the head norms' inputs alive until the norms return
    // (Gemma 3, whose window the ninth set reached at 2,048 tokens in bf16,
    // -13.0 % between the two): 360 rows, median 1.9 %, p90 2.2 %, none
    // under.
    let rows = every_sets_library_rows();
    assert_eq!(rows.len(), 360);
    let replayed: Vec<BenchRow> = rows.iter().map(BenchRow::without_margin).collect();
    let alone = error_stats(&replayed, None);
    assert_eq!(
        alone.under_predictions,
        [
            "hf-phi3h9-s2048-b4-ampfp16-adamw-sdpa",
            "hf-phi3h10-s1024-b8-ampfp16-adamw-sdpa",
            "hf-t5ek-s256-b16-fp32-adamw-eager",
        ],
        "{alone:?}"
    );
    let kept = error_stats(&rows, None);
    assert_eq!(kept.under_predictions, Vec::<String>::new(), "{kept:?}");
    assert!(kept.median <= 0.02 && kept.p90 <= 0.026, "{kept:?}");
    assert!(rows.iter().all(|r| r.margin_bytes > 0));
}

#[test]
fn only_a_library_models_prediction_keeps_the_layout_margin() {
    let gpt2 = with(tiny("gpt2"), "vocab_size", serde_json::json!(50_000));
    let library = hf_model(gpt2, 64, "fp32", "sdpa");
    let p = predict_model(&library, &one_gpu(8), default_gpu()).unwrap();
    let replayed = p.reserved_bytes - p.breakdown.margin;
    assert_eq!(
        p.breakdown.margin,
        (replayed * LAYOUT_MARGIN_PERMILLE / 1000).div_ceil(ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES
    );
    assert!(p.breakdown.margin > 0);
    assert_eq!(p.peak_bytes, p.reserved_bytes + p.breakdown.context);
    let table = output::prediction_table(&p);
    assert!(table.contains("margin"), "{table}");
    // the repository's reference transformer and a captured profile keep none
    let generic = predict_model(&gpt2_small(), &one_gpu(8), default_gpu()).unwrap();
    assert_eq!(generic.breakdown.margin, 0);
    let v: serde_json::Value = serde_json::from_str(GPT2_PROFILE).unwrap();
    let micro = v["microBatch"].as_u64().unwrap() as u32;
    let profiled = predict_from_profile(GPT2_PROFILE, &one_gpu(micro), default_gpu()).unwrap();
    assert_eq!(profiled.breakdown.margin, 0);
    assert!(
        !output::prediction_json(&profiled)["breakdown"]
            .as_object()
            .unwrap()
            .contains_key("margin")
    );
}

#[test]
fn under_autocast_a_feed_forward_keeps_one_cast_of_its_norm_per_input_projection() {
    // Each Linear casts its fp32 input itself and autograd keeps the cast:
    // T5's ReLU feed-forward (one `wi`) keeps one cast of the norm's output,
    // its gated-gelu one (`wi_0`, `wi_1`) two. With two for the ReLU one,
    // every T5 autocast row's allocated peak was high (T5-base amp bf16 at
    // 512 x 16: +151 MiB, 26 bf16 tensors of the hidden size too many at the
    // peak; with one, -130 MiB).
    // (a width no other tensor of the step has: 100 hidden, 4 heads of 24)
    let t5 = |extra: serde_json::Value| {
        let mut c = serde_json::json!({"model_type": "t5", "d_model": 100, "num_layers": 2,
            "num_heads": 4, "d_kv": 24, "d_ff": 384, "vocab_size": 5000,
            "decoder_start_token_id": 0, "dropout_rate": 0.0});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    };
    let hidden_casts = |config: serde_json::Value| {
        let evs = hf_events(
            config,
            crate::api::Precision::AmpBf16,
            Attention::Sdpa,
            false,
        );
        let logits = evs
            .iter()
            .position(|e| matches!(e, sequence::TensorEvent::Alloc { bytes, .. } if *bytes == 512 * 5000 * 2))
            .expect("the logits");
        sequence_count(&evs[..logits], 512 * 100 * 2)
    };
    let relu = hidden_casts(t5(serde_json::json!({})));
    let gated = hidden_casts(t5(serde_json::json!({"feed_forward_proj": "gated-gelu"})));
    // four blocks (two encoder, two decoder), one more cast each when gated
    assert_eq!(gated - relu, 4, "relu {relu}, gated {gated}");
}

#[test]
fn dropout_takes_its_mask_before_its_output_and_a_checkpoints_first_forward_frees_it_at_once() {
    // CUDA's native_dropout allocates the one-byte mask, then the output;
    // without autograd (a checkpointed block's first forward) nothing keeps
    // the mask. The H100's recorded GPT-2 medium bf16 run with checkpointing
    // and accumulation 2 shows both; with the output first the second
    // micro-step's hidden states landed together in a freed loss segment
    // where the run scatters them (-10.9 -> +1.3 %), and the two GPT-2
    // autocast SGD-momentum runs kept a free block too small (+12 -> +1.6 %).
    use sequence::TensorEvent;
    // (100 wide, 512 tokens: sizes no other tensor of the step has)
    let gpt2 = serde_json::json!({"model_type": "gpt2", "n_layer": 2, "n_embd": 100,
        "n_head": 4, "vocab_size": 5000, "n_positions": 64});
    let bert = serde_json::json!({"model_type": "bert", "num_hidden_layers": 2,
        "hidden_size": 100, "num_attention_heads": 4, "intermediate_size": 400,
        "vocab_size": 5000, "max_position_embeddings": 64});
    let (mask, output) = (512 * 100, 512 * 100 * 4);
    let logits = 512 * 5000 * 4;
    for (config, ckpt) in [(&gpt2, false), (&gpt2, true), (&bert, false), (&bert, true)] {
        let evs = hf_events(
            config.clone(),
            crate::api::Precision::Fp32,
            Attention::Sdpa,
            ckpt,
        );
        let forward = evs
            .iter()
            .position(|e| matches!(e, TensorEvent::Alloc { bytes, .. } if *bytes == logits))
            .expect("the logits");
        let (mut masks, mut freed_at_once) = (0, 0);
        for (i, e) in evs[..forward].iter().enumerate() {
            let TensorEvent::Alloc { id, bytes, .. } = e else {
                continue;
            };
            if *bytes != mask {
                continue;
            }
            masks += 1;
            assert!(
                matches!(evs[i + 1], TensorEvent::Alloc { bytes, .. } if bytes == output),
                "{config} ckpt {ckpt}: the output follows the mask"
            );
            freed_at_once +=
                usize::from(matches!(evs[i + 2], TensorEvent::Free { id: f } if f == *id));
        }
        // the embeddings' and each block's two residual dropouts (SDPA's
        // own dropout has no mask); the embeddings' is outside the checkpoint
        // (GPT-2, and BERT after its embeddings' LayerNorm)
        assert_eq!(masks, 1 + 2 * 2, "{config} ckpt {ckpt}");
        assert_eq!(
            freed_at_once,
            if ckpt { 2 * 2 } else { 0 },
            "{config} ckpt {ckpt}"
        );
    }
}

#[test]
fn t5s_stacks_end_as_the_library_runs_them() {
    // Each T5 stack drops out its embeddings (kept as the stack's local
    // until it returns) and ends with its norm and a dropout; the encoder's
    // output is what the cross-attentions' projections read, and the
    // decoder's embeddings make their own dense gradient of the shared
    // table in backward, held until the encoder's is summed with it; a tied
    // head reads the decoder's output rescaled. Without them every T5 row's
    // allocated peak was 30-130 MiB under the run's (T5 fp32 eager at 256
    // tokens -30 MiB, one loss segment short in the second step: -5.3 %
    // with the margin, -4.8 % with them). With them every measured T5 row
    // is within 1.5 % of its run's allocated peak, and within 16 MiB in fp32
    // without accumulation (T5-large with it: -99 MiB, the second
    // micro-step's gradients).
    let events = |scaled: bool| {
        let t5 = serde_json::json!({"model_type": "t5", "d_model": 100, "num_layers": 2,
            "num_heads": 4, "d_kv": 24, "d_ff": 384, "vocab_size": 5000,
            "decoder_start_token_id": 0, "tie_word_embeddings": scaled});
        hf_events(t5, crate::api::Precision::Fp32, Attention::Sdpa, false)
    };
    let steps = sequence::STEPS_GENERATED as usize;
    let (hidden, table) = (512 * 100 * 4, 5000 * 100 * 4);
    // v1.0's rescaled output and its gradient, each micro-step
    assert_eq!(
        sequence_count(&events(true), hidden) - sequence_count(&events(false), hidden),
        2 * steps
    );
    // the shared table, then each step the head's contribution, the
    // decoder's dense gradient, the encoder's and their sum
    assert_eq!(sequence_count(&events(true), table), 1 + 4 * steps);
    let rows: Vec<BenchRow> = every_sets_library_rows()
        .into_iter()
        .filter(|r| r.name.starts_with("hf-t5"))
        .collect();
    assert!(rows.len() >= 30, "{}", rows.len());
    for r in &rows {
        let measured = r.measured_allocated_bytes.expect("measured allocated") as f64;
        let diff = r.predicted_allocated_bytes as f64 - measured;
        assert!(
            diff.abs() <= 0.015 * measured,
            "{}: {diff:+.0} bytes",
            r.name
        );
        if r.name.contains("-fp32-") && !r.name.contains("-accum") {
            assert!(
                diff.abs() <= 16.0 * 1048576.0,
                "{}: {diff:+.0} bytes",
                r.name
            );
        }
    }
}

#[test]
fn t5_drops_out_each_feed_forward_branch_and_its_norms_keep_their_input() {
    // T5LayerFF adds `dropout(DenseReluDense(norm(x)))`: a one-byte mask of
    // the hidden size per block, beside the attentions' (one per encoder
    // block, two per decoder block).
    // (a width no other tensor of the step has: 100 hidden, 4 heads of 24)
    let t5 = serde_json::json!({"model_type": "t5", "d_model": 100, "num_layers": 2,
        "num_heads": 4, "d_kv": 24, "d_ff": 384, "vocab_size": 5000,
        "decoder_start_token_id": 0});
    let evs = hf_events(t5, crate::api::Precision::Fp32, Attention::Sdpa, false);
    let masks = sequence_count(&evs, 8 * 64 * 100);
    // (each kept tensor's gradient in the block's backward has its size),
    // and each stack's two at its ends: its embeddings' and its final
    // norm's
    assert_eq!(
        masks,
        sequence::STEPS_GENERATED as usize * (2 * (2 * 2 + 2 * 3) + 2 * 2),
        "{masks}"
    );
    // T5LayerNorm multiplies its input itself by the inverse RMS, so in
    // bf16 or fp16 each norm keeps its low-precision input (LLaMA's keeps
    // an fp32 copy instead). The H100's two pure bf16 T5 runs were 3.2 and
    // 3.5 % under without either; 0.7 and 0.6 % with both.
    let mut rows = replay_rows(include_str!("../../data/calibration/h100-fresh8.jsonl"));
    rows.extend(replay_rows(include_str!(
        "../../data/calibration/h100-fresh10.jsonl"
    )));
    let pure: Vec<&BenchRow> = rows
        .iter()
        .filter(|r| r.name.starts_with("hf-t5b"))
        .collect();
    assert_eq!(pure.len(), 2);
    for r in pure {
        assert!(
            r.relative_error.abs() <= 0.01,
            "{}: {:+.1} %",
            r.name,
            100.0 * r.relative_error
        );
    }
}
