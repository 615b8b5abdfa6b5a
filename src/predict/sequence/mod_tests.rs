//! The generated sequence of a tiny transformer, tensor by tensor where
//! PyTorch's own code says what each tensor is: the inputs, the embeddings,
//! the head and the loss, the weights' gradients, the rotary tables, the
//! eager mask and the cuBLAS workspaces.
//!
//! Sizes are chosen so that the tensors named here have sizes no other
//! tensor has: 15 tokens (3 x 5, odd, so never a power of two), hidden 24,
//! vocabulary 1000.

use super::*;
use crate::api::{Attention, ModelSpec, Optimizer, Precision, TransformerSpec};
use crate::predict::resolve_arch;

const MICRO: u64 = 3;
const SEQ: u64 = 5;
const N: u64 = MICRO * SEQ;
const H: u64 = 24;
const HEADS: u64 = 2;
const V: u64 = 1000;

fn model(extra: serde_json::Value) -> ModelSpec {
    let mut spec = serde_json::json!({
        "layers": 2, "hidden": H, "heads": HEADS, "vocab": V, "seqLen": SEQ
    });
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let t: TransformerSpec = serde_json::from_value(spec).unwrap();
    ModelSpec {
        transformer: Some(t),
        ..ModelSpec::default()
    }
}

pub(super) fn run(precision: Precision) -> RunShape {
    RunShape {
        reduce: None,
        micro_batch: MICRO,
        grad_accum: 1,
        precision,
        optimizer: Optimizer::Sgd,
        checkpointing: false,
        attention: Attention::Sdpa,
        zero_stage: 0,
        gpus: 1,
        cublas_workspace: 0,
    }
}

fn events_of(model: &ModelSpec, run: &RunShape) -> (Vec<TensorEvent>, Vec<ParamTensorSizes>) {
    let arch = resolve_arch(model).unwrap();
    let params = arch
        .param_tensors()
        .iter()
        .map(|p| ParamTensorSizes {
            numel: p.numel(),
            layer: p.layer,
            matmul_weight: p.matmul_weight,
        })
        .collect();
    (training_events(&arch, run), params)
}

struct ParamTensorSizes {
    numel: u64,
    layer: Option<u32>,
    matmul_weight: bool,
}

/// Sizes of the allocations of `category`, in order.
pub(super) fn sizes(evs: &[TensorEvent], category: Category) -> Vec<u64> {
    evs.iter()
        .filter_map(|e| match *e {
            TensorEvent::Alloc {
                bytes, category: c, ..
            } if c == category => Some(bytes),
            _ => None,
        })
        .collect()
}

pub(super) fn count(sizes: &[u64], bytes: u64) -> usize {
    sizes.iter().filter(|&&b| b == bytes).count()
}

#[test]
fn a_step_begins_with_the_token_ids_the_labels_and_the_embeddings() {
    // ids and labels (int64), then the embedding lookup; GPT-2 adds the
    // learned positions (a new tensor), BERT the token types and its norm
    // (plus the norm's saved statistics) before the first block.
    let cases = [
        (
            "learned positions",
            serde_json::json!({}),
            vec![N * 8, N * 8, N * H * 4, N * H * 4],
        ),
        (
            "rotary: nothing added to the embedding",
            serde_json::json!({"positional": "rotary"}),
            vec![N * 8, N * 8, N * H * 4],
        ),
        (
            "an encoder",
            serde_json::json!({"kind": "encoder"}),
            vec![
                N * 8,
                N * 8,
                N * H * 4,
                N * H * 4,
                N * H * 4,
                N * 8,
                N * H * 4,
            ],
        ),
    ];
    for (case, extra, expected) in cases {
        let (evs, _) = events_of(&model(extra), &run(Precision::Fp32));
        let acts = sizes(&evs, Category::Activations);
        assert_eq!(acts[..expected.len()], expected[..], "{case}");
        // The next one is the first block's, never one of these again.
        assert_ne!(acts[expected.len()], N * 8, "{case}");
    }
    // Under autocast the lookup is in the weights' dtype (fp32) and the
    // residual stream stays fp32.
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::AmpBf16));
    assert_eq!(
        sizes(&evs, Category::Activations)[..4],
        [N * 8, N * 8, N * H * 4, N * H * 4]
    );
    // Pure bf16 weights: everything in two bytes.
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::Bf16));
    assert_eq!(
        sizes(&evs, Category::Activations)[..4],
        [N * 8, N * 8, N * H * 2, N * H * 2]
    );
}

/// The activations allocated just before the loss (the first 512-byte one)
/// and just after it.
fn around_the_loss(evs: &[TensorEvent], before: usize, after: usize) -> (Vec<u64>, Vec<u64>) {
    let acts = sizes(evs, Category::Activations);
    let loss = acts.iter().position(|&b| b == 512).expect("a loss");
    (
        acts[loss + 1 - before..=loss].to_vec(),
        acts[loss + 1..loss + 1 + after].to_vec(),
    )
}

#[test]
fn the_head_keeps_the_logits_and_the_fp32_log_softmax_for_the_loss() {
    // fp32: the last block's output is normed, projected to the vocabulary,
    // log-softmaxed, and the loss is a scalar (one 512-byte block). Backward
    // starts with the log-softmax's and the logits' gradients, then the
    // head's input gradient and the residual stream's.
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::Fp32));
    let (before, after) = around_the_loss(&evs, 5, 4);
    assert_eq!(before, [N * 8, N * H * 4, N * V * 4, N * V * 4, 512]);
    assert_eq!(after, [N * V * 4, N * V * 4, N * H * 4, N * H * 4]);

    // Autocast: the normed output is cast for the head's matmul, the
    // logits come out in bf16 and are upcast to fp32 for the log-softmax;
    // in backward the logits' gradient goes back to bf16, and the head's
    // matmul makes its (tied) weight's bf16 gradient first.
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::AmpBf16));
    let (before, after) = around_the_loss(&evs, 7, 4);
    assert_eq!(
        before,
        [
            N * 8,
            N * H * 4,
            N * H * 2,
            N * V * 2,
            N * V * 4,
            N * V * 4,
            512
        ]
    );
    assert_eq!(after, [N * V * 4, N * V * 4, N * V * 2, V * H * 2]);

    // BERT's head: a dense layer and its GELU before the norm.
    let (evs, _) = events_of(
        &model(serde_json::json!({"kind": "encoder"})),
        &run(Precision::Fp32),
    );
    let (before, _) = around_the_loss(&evs, 7, 0);
    assert_eq!(
        before,
        [
            N * 8,
            N * H * 4,
            N * H * 4,
            N * H * 4,
            N * V * 4,
            N * V * 4,
            512
        ]
    );
}

/// Where the first step's tensor allocated by the event at `at` is freed.
fn freed_at(evs: &[TensorEvent], at: usize) -> usize {
    let TensorEvent::Alloc { id, .. } = evs[at] else {
        panic!("{:?} is no allocation", evs[at]);
    };
    at + evs[at..]
        .iter()
        .position(|e| *e == TensorEvent::Free { id })
        .expect("freed")
}

/// The event index of the first step's allocation of `bytes` (an
/// activation) after event `from`.
fn next_alloc(evs: &[TensorEvent], from: usize, bytes: u64) -> usize {
    from + evs[from..]
        .iter()
        .position(|e| {
            matches!(e, TensorEvent::Alloc { bytes: b, category: Category::Activations, .. } if *b == bytes)
        })
        .expect("allocated")
}

#[test]
fn the_logits_live_in_the_forwards_variable_until_it_returns_the_loss() {
    // Under autocast `logits.float()` makes the fp32 copy; the bf16 logits
    // stay until the forward returns, after the loss.
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::AmpBf16));
    let logits = next_alloc(&evs, 0, N * V * 2);
    let loss = next_alloc(&evs, 0, 512);
    assert!(freed_at(&evs, logits) > loss, "freed before the loss");
}

#[test]
fn a_decoders_residual_gradient_is_one_tensor_through_the_backward() {
    // The final norm's input gradient is autograd's buffer for the
    // residual stream: each block's sum passes it on and its norms'
    // gradients are added into it, so it goes only after the embeddings'
    // gradients. A post-norm encoder's sums feed its norms: the head's
    // residual gradient goes within the last block's backward.
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::Fp32));
    let loss = next_alloc(&evs, 0, 512);
    let residual = next_alloc(&evs, next_alloc(&evs, loss, N * H * 4) + 1, N * H * 4);
    let residual = next_alloc(&evs, residual + 1, N * H * 4);
    let table = next_alloc(&evs, loss, V * H * 4);
    assert!(
        freed_at(&evs, residual) > table,
        "the decoder's goes before the table"
    );
    let (evs, _) = events_of(
        &model(serde_json::json!({"kind": "encoder"})),
        &run(Precision::Fp32),
    );
    let loss = next_alloc(&evs, 0, 512);
    let residual = next_alloc(&evs, next_alloc(&evs, loss, N * H * 4) + 1, N * H * 4);
    let first_ffn_grad = next_alloc(&evs, loss, N * F * 4);
    let qkv_grad = next_alloc(&evs, first_ffn_grad, N * 3 * H * 4);
    assert!(
        freed_at(&evs, residual) < qkv_grad,
        "the encoder's lives on"
    );
    // and its head has no final norm whose backward makes a new tensor:
    // the head's input gradient and the residual's only
    let between = sizes(&evs[loss..first_ffn_grad], Category::Activations);
    assert_eq!(count(&between, N * H * 4), 2, "{between:?}");
}

#[test]
fn the_embeddings_gradients_come_after_the_blocks() {
    // The position table's gradient is made by the embedding's backward,
    // after every block's weights'.
    let (evs, params) = events_of(
        &model(serde_json::json!({"tiedEmbeddings": false})),
        &run(Precision::Fp32),
    );
    let grads: Vec<u64> = evs
        .iter()
        .filter_map(|e| match e {
            TensorEvent::Alloc {
                bytes,
                category: Category::Gradients,
                ..
            } => Some(*bytes),
            _ => None,
        })
        .take(params.len())
        .collect();
    let mut last = grads[grads.len() - 2..].to_vec();
    last.sort_unstable();
    // the position table's and the word table's, last
    assert_eq!(last, [SEQ * H * 4, V * H * 4], "{grads:?}");
}

#[test]
fn rotary_positions_with_grouped_heads_keep_no_view_of_the_projection() {
    // q, k and v are views of the qkv projection's output; with rotary
    // positions and grouped heads the attention reads the rotated q and
    // copies of k and v, so that output (and the rotated k) go in forward.
    let kvd = H / HEADS;
    for (kv_heads, kept) in [(1, false), (2, true)] {
        let llama = model(serde_json::json!({
            "positional": "rotary", "norm": "rmsnorm", "mlp": "swiglu", "kvHeads": kv_heads
        }));
        let (evs, _) = events_of(&llama, &run(Precision::Fp32));
        let loss = next_alloc(&evs, 0, 512);
        let width = H + 2 * kv_heads * kvd;
        let qkv = next_alloc(&evs, 0, N * width * 4);
        assert_eq!(freed_at(&evs, qkv) > loss, kept, "kv heads {kv_heads}");
    }
    // In backward the rotated q, which the attention kept, goes when the
    // attention's node has run, before the projection's gradient is made.
    let one = model(serde_json::json!({
        "layers": 1, "positional": "rotary", "norm": "rmsnorm", "mlp": "swiglu", "kvHeads": 1
    }));
    let (evs, _) = events_of(&one, &run(Precision::Fp32));
    let loss = next_alloc(&evs, 0, 512);
    let width = N * (H + 2 * kvd) * 4;
    // q's rotation: three temporaries, then the result
    let mut q = next_alloc(&evs, 0, width);
    for _ in 0..4 {
        q = next_alloc(&evs, q + 1, N * H * 4);
    }
    let g_qkv = next_alloc(&evs, loss, width);
    assert!(
        freed_at(&evs, q) < g_qkv,
        "the rotated q outlives the attention's node"
    );
}

#[test]
fn the_embedding_gradient_is_a_dense_table_once_a_micro_step() {
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::Fp32));
    // One micro-step in each optimizer step.
    let steps = STEPS_GENERATED as usize;
    assert_eq!(count(&sizes(&evs, Category::Activations), V * H * 4), steps);
    let mut accumulating = run(Precision::Fp32);
    accumulating.grad_accum = 3;
    let (evs, _) = events_of(&model(serde_json::json!({})), &accumulating);
    // A table a micro-step, and in each step's two later micro-steps the
    // temporary that adds the table into the existing .grad.
    assert_eq!(
        count(&sizes(&evs, Category::Activations), V * H * 4),
        3 * steps + 2 * steps
    );
}

/// The model's building: the events before the first step's token ids.
fn build_events(evs: &[TensorEvent]) -> &[TensorEvent] {
    let first_ids = evs
        .iter()
        .position(|e| {
            matches!(e, TensorEvent::Alloc { bytes, category: Category::Activations, .. } if *bytes == N * 8)
        })
        .unwrap();
    &evs[..first_ids]
}

#[test]
fn building_the_model_allocates_its_weights_and_the_rotary_tables() {
    // The reference modules are made on the GPU in fp32, the rotary tables
    // among them; in pure bf16 `model.to(dtype)` then makes each tensor's
    // copy and frees its fp32 original, in the same order.
    for precision in [Precision::Fp32, Precision::Bf16] {
        let weight = if precision == Precision::Fp32 { 4 } else { 2 };
        let (evs, params) = events_of(
            &model(serde_json::json!({"positional": "rotary", "tiedEmbeddings": false})),
            &run(precision),
        );
        let table = SEQ * (H / HEADS);
        let mut made: Vec<u64> = params.iter().map(|p| p.numel * 4).collect();
        made.extend([table * 4, table * 4]);
        let build = build_events(&evs);
        let allocs: Vec<u64> = build
            .iter()
            .filter_map(|e| match e {
                TensorEvent::Alloc { bytes, .. } => Some(*bytes),
                TensorEvent::Free { .. } => None,
            })
            .collect();
        assert_eq!(allocs[..made.len()], made, "{precision:?}: made in fp32");
        let converted = &build[made.len()..];
        if precision == Precision::Fp32 {
            assert!(converted.is_empty(), "nothing to convert");
            continue;
        }
        assert_eq!(converted.len(), 2 * made.len(), "a copy and a free each");
        for (i, pair) in converted.chunks(2).enumerate() {
            match pair {
                [TensorEvent::Alloc { bytes, .. }, TensorEvent::Free { id }] => {
                    assert_eq!(*bytes, made[i] / 4 * weight, "tensor {i}");
                    assert_eq!(u64::from(*id), i as u64, "its fp32 original goes");
                }
                _ => panic!("tensor {i}: {pair:?}"),
            }
        }
    }
}

#[test]
fn fsdps_reference_modules_are_made_on_the_meta_device_in_their_dtype() {
    // calibrate_zero.py makes them on the meta device for stages 2 and 3:
    // no fp32 originals, no head weight before the tie.
    for zero_stage in [2, 3] {
        let mut r = run(Precision::Bf16);
        (r.zero_stage, r.gpus) = (zero_stage, 2);
        let (evs, _) = events_of(&model(serde_json::json!({})), &r);
        let first_free = evs
            .iter()
            .position(|e| matches!(e, TensorEvent::Free { .. }))
            .unwrap();
        let built: Vec<u64> = evs[..first_free]
            .iter()
            .filter_map(|e| match e {
                TensorEvent::Alloc {
                    bytes,
                    category: Category::Parameters,
                    ..
                } => Some(*bytes),
                _ => None,
            })
            .collect();
        assert!(
            !built.contains(&(V * H * 4)),
            "stage {zero_stage}: {built:?}"
        );
    }
}

#[test]
fn a_tied_heads_own_weight_is_made_and_freed_before_the_tie() {
    // nn.Linear makes the head's weight, then the tie replaces it.
    for (tied, want) in [(true, vec![V * H * 4]), (false, vec![])] {
        let (evs, params) = events_of(
            &model(serde_json::json!({"tiedEmbeddings": tied})),
            &run(Precision::Fp32),
        );
        let build = build_events(&evs);
        let extra: Vec<u64> = build
            .iter()
            .skip(params.len())
            .filter_map(|e| match e {
                TensorEvent::Alloc { bytes, .. } => Some(*bytes),
                TensorEvent::Free { .. } => None,
            })
            .collect();
        assert_eq!(extra, want, "tied {tied}");
        if tied {
            assert!(
                matches!(build.last(), Some(TensorEvent::Free { id }) if u64::from(*id) == params.len() as u64),
                "freed at once: {:?}",
                build.last()
            );
        }
    }
}

/// Where the sequence's cuBLAS workspaces are made (event indices).
pub(in crate::predict) fn workspaces_at(evs: &[TensorEvent]) -> Vec<usize> {
    evs.iter()
        .enumerate()
        .filter(|(_, e)| {
            matches!(
                e,
                TensorEvent::Alloc {
                    category: Category::Workspace,
                    ..
                }
            )
        })
        .map(|(i, _)| i)
        .collect()
}

/// The tensors of `bytes` bytes still alive after `evs`.
pub(in crate::predict) fn alive_of_size(
    evs: &[TensorEvent],
    bytes: u64,
) -> std::collections::HashSet<u32> {
    let mut alive = std::collections::HashSet::new();
    for e in evs {
        match *e {
            TensorEvent::Alloc { id, bytes: b, .. } if b == bytes => {
                alive.insert(id);
            }
            TensorEvent::Free { id } => {
                alive.remove(&id);
            }
            TensorEvent::Alloc { .. } => {}
        }
    }
    alive
}

#[test]
fn the_backward_threads_workspace_comes_after_the_losss_blocks_are_freed() {
    // cuBLAS makes it at the head's matmul, the backward's first: after the
    // loss's logits-sized blocks are freed, right before the head's input
    // gradient (recorded on the H200 for the reference GPT-2: made before
    // the loss's backward, it split a cached logits block, -7.4 % -> -0.1 %).
    for precision in [Precision::Fp32, Precision::AmpBf16] {
        let mut with = run(precision);
        with.cublas_workspace = 1 << 20;
        let (evs, _) = events_of(&model(serde_json::json!({})), &with);
        let workspaces = workspaces_at(&evs);
        assert_eq!(workspaces.len(), 2, "forward's and backward's");
        let at = workspaces[1];
        let c = if precision == Precision::Fp32 { 4 } else { 2 };
        assert!(
            matches!(evs[at + 1], TensorEvent::Alloc { bytes, .. } if bytes == N * H * c),
            "{precision:?}: right before the head's input gradient: {:?}",
            evs[at + 1]
        );
        let alive = alive_of_size(&evs[..at], N * V * 4);
        // the matmul's own grad_output only (fp32 without autocast)
        let held = usize::from(precision == Precision::Fp32);
        assert_eq!(
            alive.len(),
            held,
            "{precision:?}: fp32 logits-sized blocks alive: {alive:?}"
        );
    }
}

#[test]
fn a_checkpointed_forward_keeps_autocasts_casts_until_the_loss() {
    // Autocast casts a weight at its matmul and caches the copy until the
    // forward leaves its context, after the loss: in a checkpointed block's
    // first forward nothing else keeps them. One layer, so the block's four
    // matmul weights are the casts made before the head's.
    let m = model(serde_json::json!({"layers": 1, "tiedEmbeddings": false}));
    let weights = [3 * H * H, H * H, H * 4 * H, 4 * H * H].map(|e| e * 2);
    for ckpt in [true, false] {
        let mut r = run(Precision::AmpBf16);
        r.checkpointing = ckpt;
        let (evs, _) = events_of(&m, &r);
        let first_step = &evs[build_events(&evs).len()..];
        let loss = first_step
            .iter()
            .position(|e| matches!(e, TensorEvent::Alloc { bytes: 512, .. }))
            .unwrap();
        let casts: Vec<(usize, u32, u64)> = first_step[..loss]
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match *e {
                TensorEvent::Alloc {
                    id,
                    bytes,
                    category: Category::Parameters,
                    ..
                } => Some((i, id, bytes)),
                _ => None,
            })
            .take(4)
            .collect();
        assert_eq!(
            casts.iter().map(|c| c.2).collect::<Vec<_>>(),
            weights,
            "ckpt {ckpt}"
        );
        let freed_at = |id: u32| {
            first_step
                .iter()
                .position(|e| *e == TensorEvent::Free { id })
                .unwrap()
        };
        for &(_, id, bytes) in &casts {
            assert!(freed_at(id) > loss, "ckpt {ckpt}: the {bytes} B copy kept");
        }
        // made one at a time, each at its matmul, with activations between
        let apart = casts.windows(2).all(|w| w[1].0 > w[0].0 + 1);
        assert_eq!(apart, ckpt, "ckpt {ckpt}: {casts:?}");
    }
}

/// A one-block model's checkpointed forward in fp32 as `+bytes` (an
/// activation made) and `-bytes` (one freed), from the block's first norm
/// to the logits (not included), the head's final norm's output last.
fn checkpointed_forward(extra: serde_json::Value, attention: Attention) -> String {
    checkpointed_forward_in(extra, attention, Precision::Fp32)
}

/// [`checkpointed_forward`] in `precision`.
fn checkpointed_forward_in(
    extra: serde_json::Value,
    attention: Attention,
    precision: Precision,
) -> String {
    let mut spec = serde_json::json!({"layers": 1, "tiedEmbeddings": false});
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let m = model(spec);
    let mut r = run(precision);
    r.checkpointing = true;
    r.attention = attention;
    let (evs, _) = events_of(&m, &r);
    let logits = N * V * if precision == Precision::Fp32 { 4 } else { 2 };
    // the ids, the targets and the embeddings (plus the learned positions' sum)
    let learned = m.transformer.as_ref().unwrap().positional == crate::api::PositionalKind::Learned;
    let skip = 3 + usize::from(learned);
    let mut bytes = std::collections::HashMap::new();
    let mut words = Vec::new();
    let mut acts = 0;
    for e in &evs[build_events(&evs).len()..] {
        match *e {
            TensorEvent::Alloc { bytes: b, .. } if b == logits => break,
            TensorEvent::Alloc {
                id,
                bytes: b,
                category: Category::Activations,
                ..
            } => {
                acts += 1;
                if acts > skip {
                    bytes.insert(id, b);
                    words.push(format!("+{b}"));
                }
            }
            TensorEvent::Free { id } => {
                if let Some(b) = bytes.get(&id) {
                    words.push(format!("-{b}"));
                }
            }
            TensorEvent::Alloc { .. } => {}
        }
    }
    words.join(" ")
}

#[test]
fn a_checkpointed_blocks_first_forward_keeps_nothing_but_its_input() {
    // Without autograd each tensor dies where the reference module drops
    // it: a norm's statistics at once, an input's cast after its matmul,
    // the attention's locals and the first norm's output when Attn
    // returns, the projection after the residual sum, the MLP's first
    // product after its activation, the sum when the block returns; then
    // the head's final norm (with autograd: its statistics kept).
    let (nh, nf, lse) = (N * H * 4, N * 4 * H * 4, MICRO * HEADS * SEQ * 4);
    let gpt = format!(
        "+{nh} +{s2} -{s2} +{qkv} +{nh} +{lse} -{lse} +{nh} -{qkv} -{nh} -{nh} +{nh} -{nh} \
         +{nh} +{s2} -{s2} +{nf} +{nf} -{nf} +{nh} -{nf} -{nh} +{nh} -{nh} -{nh} \
         +{s2} +{nh}",
        s2 = N * 8,
        qkv = N * 3 * H * 4,
    );
    let gpt: Vec<&str> = gpt.split_whitespace().collect();
    assert_eq!(
        checkpointed_forward(serde_json::json!({}), Attention::Sdpa),
        gpt.join(" ")
    );
    // LLaMA-style: one statistic, rotary on q and k (three temporaries and
    // the result each), k and v expanded to every head (the projection's
    // output and the rotated k then let go), SwiGLU.
    let kvd = H / HEADS;
    let (f, kv) = (N * 4 * H * 4, N * kvd * 4);
    let llama = format!(
        "+{nh} +{n4} -{n4} +{qkv} +{nh} +{nh} +{nh} +{nh} -{nh} -{nh} -{nh} \
         +{kv} +{kv} +{kv} +{kv} -{kv} -{kv} -{kv} +{nh} +{nh} -{qkv} -{kv} +{nh} +{lse} -{lse} +{nh} \
         -{nh} -{nh} -{nh} -{nh} -{nh} +{nh} -{nh} \
         +{nh} +{n4} -{n4} +{f} +{f} -{f} +{f} +{f} -{f} -{f} +{nh} -{f} -{nh} +{nh} -{nh} -{nh} \
         +{n8} +{nh}",
        n4 = N * 4,
        n8 = N * 8,
        qkv = N * (H + 2 * kvd) * 4,
    );
    let llama: Vec<&str> = llama.split_whitespace().collect();
    assert_eq!(
        checkpointed_forward(
            serde_json::json!({"positional": "rotary", "norm": "rmsnorm", "mlp": "swiglu",
                "kvHeads": 1, "ffn": 4 * H}),
            Attention::Sdpa
        ),
        llama.join(" ")
    );
    // Rotary positions without grouped heads: v is a view of the
    // projection's output, read by the attention, so it stays until Attn
    // returns.
    let words = checkpointed_forward(
        serde_json::json!({"positional": "rotary", "norm": "rmsnorm"}),
        Attention::Sdpa,
    );
    let words: Vec<&str> = words.split_whitespace().collect();
    let at = |w: String| words.iter().position(|x| *x == w).unwrap();
    assert!(
        at(format!("-{}", N * 3 * H * 4)) > at(format!("+{lse}")),
        "{words:?}"
    );
    // Eager in a decoder: the scores, scaled, masked and softmaxed (kept in
    // `att` until Attn returns), the product and the heads' merged copy.
    let s = S2 * 4;
    let eager = format!(
        "+{nh} +{s2} -{s2} +{qkv} +{s} +{s} -{s} +{s} -{s} +{s} -{s} +{nh} +{nh} -{nh} +{nh} \
         -{qkv} -{s} -{nh} -{nh} +{nh} -{nh}",
        s2 = N * 8,
        qkv = N * 3 * H * 4,
    );
    let got = checkpointed_forward(serde_json::json!({}), Attention::Eager);
    assert!(
        got.starts_with(&eager.split_whitespace().collect::<Vec<_>>().join(" ")),
        "{got}"
    );
    // Under autocast a matmul's fp32 input is cast for it and the cast dies
    // with it; the MLP's products stay bf16, so the down projection's input
    // needs none.
    let amp = format!(
        "+{nh} +{s2} -{s2} +{ch} +{qkv} -{ch} +{ch} +{lse} -{lse} +{ch} -{qkv} -{ch} -{nh} \
         +{nh} -{ch} +{nh} +{s2} -{s2} +{ch} +{f2} -{ch} +{f2} -{f2} +{ch} -{f2} -{nh} +{nh} -{ch} -{nh}",
        s2 = N * 8,
        ch = N * H * 2,
        qkv = N * 3 * H * 2,
        f2 = N * 4 * H * 2,
    );
    let got = checkpointed_forward_in(serde_json::json!({}), Attention::Sdpa, Precision::AmpBf16);
    assert!(
        got.starts_with(&amp.split_whitespace().collect::<Vec<_>>().join(" ")),
        "{got}"
    );
}

#[test]
fn the_recomputation_casts_each_weight_at_its_matmul() {
    // Backward recomputes a checkpointed block with autocast on: each
    // weight's cast is made at its matmul, the gate's before the gate's
    // output, the up projection's after the SiLU.
    let f = 4 * H;
    let m = model(serde_json::json!({"layers": 1, "mlp": "swiglu", "ffn": f}));
    let mut r = run(Precision::AmpBf16);
    r.checkpointing = true;
    let (evs, _) = events_of(&m, &r);
    let loss = next_alloc(&evs, 0, 512);
    let words: Vec<String> = evs[loss..]
        .iter()
        .filter_map(|e| match e {
            TensorEvent::Alloc {
                bytes,
                category: Category::Parameters,
                ..
            } => Some(format!("P{bytes}")),
            TensorEvent::Alloc {
                bytes,
                category: Category::Activations,
                ..
            } => Some(format!("A{bytes}")),
            _ => None,
        })
        .collect();
    let gate = words
        .iter()
        .position(|w| *w == format!("P{}", f * H * 2))
        .expect("the gate's cast");
    let (cast, act) = (format!("P{}", f * H * 2), format!("A{}", N * f * 2));
    assert_ne!(words[gate - 1], act, "the gate's output after its cast");
    assert_eq!(
        words[gate..gate + 5],
        [cast.clone(), act.clone(), act.clone(), cast, act]
    );
}

#[test]
fn eager_attention_in_a_decoder_builds_the_causal_mask_once() {
    let mut eager = run(Precision::Fp32);
    eager.attention = Attention::Eager;
    let before_the_first_step = |evs: &[TensorEvent]| {
        let acts = sizes(evs, Category::Activations);
        let first_ids = acts.iter().position(|&b| b == N * 8).unwrap();
        acts[..first_ids].to_vec()
    };
    let (evs, _) = events_of(&model(serde_json::json!({})), &eager);
    assert_eq!(before_the_first_step(&evs), [SEQ * SEQ]);
    let (evs, _) = events_of(&model(serde_json::json!({"kind": "encoder"})), &eager);
    assert_eq!(before_the_first_step(&evs), Vec::<u64>::new(), "no mask");
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::Fp32));
    assert_eq!(before_the_first_step(&evs), Vec::<u64>::new(), "sdpa");
}

#[test]
fn each_thread_that_runs_a_matmul_gets_one_cublas_workspace() {
    // The forward's thread and autograd's, each at its first matmul, kept.
    let mut with = run(Precision::Fp32);
    with.cublas_workspace = 1 << 20;
    let (evs, _) = events_of(&model(serde_json::json!({})), &with);
    assert_eq!(sizes(&evs, Category::Workspace), [1 << 20, 1 << 20]);
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::Fp32));
    assert_eq!(sizes(&evs, Category::Workspace), Vec::<u64>::new());
}

#[test]
fn gradients_are_made_once_and_later_micro_steps_add_into_them() {
    for precision in [Precision::Fp32, Precision::AmpBf16] {
        let (evs, params) = events_of(&model(serde_json::json!({})), &run(precision));
        let grads = sizes(&evs, Category::Gradients);
        // One fp32 gradient per parameter, made in each step's backward
        // (the optimizer step sets them to None).
        let steps = STEPS_GENERATED as usize;
        assert_eq!(grads.len(), steps * params.len(), "{precision:?}");
        let all: u64 = params.iter().map(|p| p.numel * 4).sum();
        assert_eq!(
            grads.iter().sum::<u64>(),
            STEPS_GENERATED * all,
            "{precision:?}"
        );
    }
    // With accumulation, every later micro-step adds each weight's
    // gradient into .grad through an fp32 temporary of its size (under
    // autocast converted from the bf16 gradient). Counted against the same
    // model with one micro-step a step (3 micro-steps a step).
    let (_, params) = events_of(&model(serde_json::json!({})), &run(Precision::Fp32));
    let h4: Vec<&ParamTensorSizes> = params
        .iter()
        .filter(|p| p.numel == 4 * H * H && p.layer.is_some())
        .collect();
    assert!(!h4.is_empty(), "the MLP's matrices");
    for precision in [Precision::Fp32, Precision::AmpBf16] {
        let (plain, _) = events_of(&model(serde_json::json!({})), &run(precision));
        let mut accumulating = run(precision);
        accumulating.grad_accum = 3;
        let (acc, _) = events_of(&model(serde_json::json!({})), &accumulating);
        let extra = |bytes: u64| {
            count(&sizes(&acc, Category::Activations), bytes) as i64
                - 3 * count(&sizes(&plain, Category::Activations), bytes) as i64
        };
        let later_micro_steps = 2 * STEPS_GENERATED as usize;
        let fp32_temps = (later_micro_steps * h4.len()) as i64;
        assert_eq!(extra(4 * H * H * 4), fp32_temps, "{precision:?}");
        if precision == Precision::AmpBf16 {
            // Every micro-step's matmul-weight gradient comes in bf16
            // first: once a step per weight without accumulation, and no
            // more than once a micro-step with it.
            assert!(h4.iter().all(|p| p.matmul_weight));
            let bf16 = count(&sizes(&plain, Category::Activations), 4 * H * H * 2);
            assert_eq!(bf16, STEPS_GENERATED as usize * h4.len(), "bf16 gradients");
            assert_eq!(extra(4 * H * H * 2), 0, "bf16 gradients, accumulating");
        }
    }
}

#[test]
fn fsdp_makes_full_size_gradients_until_the_reduce_scatter() {
    let mut fsdp = run(Precision::AmpBf16);
    (fsdp.zero_stage, fsdp.gpus) = (2, 2);
    let (evs, params) = events_of(&model(serde_json::json!({})), &fsdp);
    // Every parameter's gradient is made full size (fp32) on the default
    // stream, from a bf16 one for the matmul weights; every step.
    let acts = sizes(&evs, Category::Activations);
    for p in params.iter().filter(|p| p.numel == 4 * H * H) {
        assert!(p.matmul_weight);
    }
    let h4 = params.iter().filter(|p| p.numel == 4 * H * H).count();
    let steps = STEPS_GENERATED as usize;
    assert_eq!(count(&acts, 4 * H * H * 2), steps * h4, "bf16 gradients");
    let grads = sizes(&evs, Category::Gradients);
    assert_eq!(
        count(&grads, 4 * H * H * 4),
        steps * h4,
        "full fp32 gradients: {grads:?}"
    );
}

/// The activations of the first block's forward: those after the step's
/// first `start` ones (the inputs and embeddings), `len` of them.
fn first_block_forward(evs: &[TensorEvent], start: usize, len: usize) -> Vec<u64> {
    sizes(evs, Category::Activations)[start..start + len].to_vec()
}

/// The activations of the last block's backward, which follows the head's
/// four (see the head test) and the final norm's input gradient, `len` of
/// them; fp32, so that no weight gradient's temporary comes between.
fn last_block_backward(evs: &[TensorEvent], len: usize) -> Vec<u64> {
    let (_, after) = around_the_loss(evs, 1, 5 + len);
    assert_eq!(after[4], N * H * 4, "the final norm's input gradient");
    after[5..].to_vec()
}

const F: u64 = 4 * H;
/// Elements of one head's scores over the micro-batch.
const S2: u64 = MICRO * HEADS * SEQ * SEQ;

#[test]
fn a_gpt_block_keeps_what_its_backward_reads() {
    let block = [
        N * H * 4,               // ln_1
        N * 4 * 2,               // its mean and rstd
        N * 3 * H * 4,           // c_attn: q, k, v
        MICRO * HEADS * SEQ * 4, // SDPA's logsumexp
        N * H * 4,               // attention output
        N * H * 4,               // c_proj
        N * H * 4,               // the residual sum
        N * H * 4,               // ln_2
        N * 4 * 2,               // its mean and rstd
        N * F * 4,               // c_fc
        N * F * 4,               // GELU
        N * H * 4,               // mlp c_proj
        N * H * 4,               // the block's output
    ];
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::Fp32));
    assert_eq!(first_block_forward(&evs, 4, block.len()), block);
    // Backward, newest first: the MLP's gradients, ln_2's input gradient
    // and its input's (added into the residual's gradient in place),
    // attention's output and q, k, v gradients, the qkv gradient, ln_1's
    // and its input's (added in place too: no new tensor for the block's
    // input).
    let backward = [
        N * F * 4,
        N * F * 4,
        N * F * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * 3 * H * 4,
        N * H * 4,
        N * H * 4,
    ];
    assert_eq!(last_block_backward(&evs, backward.len()), backward);
    // Flash attention's backward accumulates the query gradient in fp32.
    let mut flash = run(Precision::Fp32);
    flash.attention = Attention::Flash;
    let (evs, _) = events_of(&model(serde_json::json!({})), &flash);
    let mut with_acc = backward[..9].to_vec();
    with_acc.push(N * H * 4);
    with_acc.extend(&backward[9..]);
    assert_eq!(last_block_backward(&evs, with_acc.len()), with_acc);
}

#[test]
fn under_autocast_a_block_casts_its_norms_outputs_and_keeps_bf16_matmul_outputs() {
    let block = [
        N * H * 4,
        N * 4 * 2,
        N * H * 2, // ln_1's output cast for c_attn
        N * 3 * H * 2,
        MICRO * HEADS * SEQ * 4,
        N * H * 2,
        N * H * 2,
        N * H * 4, // the residual stream stays fp32
        N * H * 4,
        N * 4 * 2,
        N * H * 2,
        N * F * 2,
        N * F * 2,
        N * H * 2,
        N * H * 4,
    ];
    let (evs, _) = events_of(&model(serde_json::json!({})), &run(Precision::AmpBf16));
    assert_eq!(first_block_forward(&evs, 4, block.len()), block);
}

#[test]
fn a_llama_block_rotates_q_and_k_repeats_kv_and_gates_its_mlp() {
    // RMSNorm (one statistic), rotary on q and on k (three temporaries and
    // the result each), grouped-query attention (k and v repeated to every
    // head), SwiGLU (gate, up, SiLU and their product).
    let (f, kv_heads) = (40, 1);
    let kvd = kv_heads * (H / HEADS);
    let llama = model(serde_json::json!({
        "positional": "rotary", "norm": "rmsnorm", "mlp": "swiglu",
        "kvHeads": kv_heads, "ffn": f
    }));
    let block = [
        N * H * 4,
        N * 4,
        N * (H + 2 * kvd) * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * kvd * 4,
        N * kvd * 4,
        N * kvd * 4,
        N * kvd * 4,
        N * H * 4,
        N * H * 4,
        MICRO * HEADS * SEQ * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * 4,
        N * f * 4,
        N * f * 4,
        N * f * 4,
        N * f * 4,
        N * H * 4,
        N * H * 4,
    ];
    let (evs, _) = events_of(&llama, &run(Precision::Fp32));
    assert_eq!(first_block_forward(&evs, 3, block.len()), block);
    let backward = [
        N * f * 4,
        N * f * 4,
        N * f * 4,
        N * f * 4,
        N * f * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * H * 4,
        N * (H + 2 * kvd) * 4,
        N * H * 4,
        N * H * 4,
    ];
    assert_eq!(last_block_backward(&evs, backward.len()), backward);
}

#[test]
fn eager_attention_materialises_the_scores_and_their_softmax() {
    let mut eager = run(Precision::Fp32);
    eager.attention = Attention::Eager;
    let attention = |decoder: bool, amp: bool| {
        let c = if amp { 2 } else { 4 };
        let mut v = vec![S2 * c, S2 * c]; // q k^T, scaled
        if decoder {
            v.push(S2 * c); // masked
        }
        v.push(S2 * 4); // softmax (fp32 under autocast)
        if amp {
            v.push(S2 * c); // cast back for the product with v
        }
        v.extend([N * H * c, N * H * c]); // the product, heads merged
        v
    };
    for (amp, precision) in [(false, Precision::Fp32), (true, Precision::AmpBf16)] {
        let mut shape = eager.clone();
        shape.precision = precision;
        let (evs, _) = events_of(&model(serde_json::json!({})), &shape);
        // The causal mask (built once), the step's first four, then ln_1,
        // its statistics, (the cast) and qkv.
        let before = if amp { 4 } else { 3 };
        let got = first_block_forward(&evs, 1 + 4 + before, attention(true, amp).len());
        assert_eq!(got, attention(true, amp), "decoder, amp {amp}");
    }
    let (evs, _) = events_of(&model(serde_json::json!({"kind": "encoder"})), &eager);
    let got = first_block_forward(&evs, 7 + 3, attention(false, false).len());
    assert_eq!(got, attention(false, false), "encoder: no mask");
    // Its backward: the gradients of the softmax and of the scores, fp32.
    let (evs, _) = events_of(&model(serde_json::json!({})), &eager);
    let back = last_block_backward(&evs, 11);
    assert_eq!(back[9..], [S2 * 4, S2 * 4]);
}

/// A long accumulation generates what three micro-steps a step do: the
/// later micro-steps repeat the same requests from the same live tensors.
/// (Generating all of them made a 4,096-step accumulation take minutes and
/// tens of gigabytes, in the controller's reconcile.)
#[test]
fn a_long_accumulation_generates_three_micro_steps_a_step() {
    for checkpointing in [false, true] {
        let mut three = run(Precision::AmpBf16);
        three.checkpointing = checkpointing;
        three.grad_accum = MICRO_STEPS_GENERATED;
        let (want, _) = events_of(&model(serde_json::json!({})), &three);
        for accum in [4, 4096, u64::from(u32::MAX)] {
            let mut long = three.clone();
            long.grad_accum = accum;
            let (got, _) = events_of(&model(serde_json::json!({})), &long);
            assert_eq!(got, want, "accumulation {accum}");
        }
        let mut two = three.clone();
        two.grad_accum = 2;
        assert!(events_of(&model(serde_json::json!({})), &two).0.len() < want.len());
    }
}

#[test]
fn a_bias_summed_over_many_rows_stages_partial_sums_around_its_gradient() {
    // One Linear(1024, 1024) with its bias, 4096 samples: the bias's
    // gradient sums 4096 rows of 1024 columns, which on an H200 stages 32 MiB
    // of partial sums and 32 bytes of semaphores (predict::reduce).
    let arch = Arch::Mlp {
        layers: 1,
        hidden: 1024,
    };
    let shape = |reduce| RunShape {
        micro_batch: 4096,
        precision: Precision::Fp32,
        reduce,
        ..run(Precision::Fp32)
    };
    let h200 = crate::predict::gpu_profile("H200").unwrap().reduce;
    let staged = training_events(&arch, &shape(Some(h200)));
    let plain = training_events(&arch, &shape(None));
    let allocs = |evs: &[TensorEvent]| -> Vec<(u32, u64)> {
        evs.iter()
            .filter_map(|e| match *e {
                TensorEvent::Alloc { id, bytes, .. } => Some((id, bytes)),
                TensorEvent::Free { .. } => None,
            })
            .collect()
    };
    let staging: Vec<usize> = staged
        .iter()
        .enumerate()
        .filter(|(_, e)| matches!(e, TensorEvent::Alloc { bytes, .. } if *bytes == 32 << 20))
        .map(|(i, _)| i)
        .collect();
    // Once a micro-step, one micro-step a step.
    let steps = STEPS_GENERATED as usize;
    assert_eq!(staging.len(), steps, "{staging:?}");
    assert!(allocs(&plain).iter().all(|&(_, b)| b != 32 << 20));
    assert_eq!(staged.len(), plain.len() + steps * 4);
    for &at in &staging {
        let TensorEvent::Alloc { id: buffer, .. } = staged[at] else {
            unreachable!()
        };
        let TensorEvent::Alloc {
            id: semaphores,
            bytes,
            ..
        } = staged[at + 1]
        else {
            panic!("semaphores after the buffer: {:?}", staged[at + 1]);
        };
        assert_eq!(bytes, 32);
        assert_eq!(staged[at + 2], TensorEvent::Free { id: semaphores });
        assert_eq!(staged[at + 3], TensorEvent::Free { id: buffer });
    }
    // Before the bias's gradient is created (the first step's).
    let grad = staged
        .iter()
        .position(|e| {
            matches!(
                e,
                TensorEvent::Alloc {
                    bytes: 4096,
                    category: Category::Gradients,
                    ..
                }
            )
        })
        .unwrap();
    assert_eq!(grad, staging[0] + 4);
}
