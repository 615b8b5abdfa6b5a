//! The Hugging Face families' configs: parameter counts against the models
//! transformers builds from the same configs, and the keys each family reads.

use super::*;
use crate::predict::arch::Arch;

/// tests/data/hf-param-counts.json, written by hack/hf_param_counts.py.
fn fixture() -> Vec<serde_json::Value> {
    let text = include_str!("../../tests/data/hf-param-counts.json");
    let doc: serde_json::Value = serde_json::from_str(text).unwrap();
    doc["rows"].as_array().unwrap().clone()
}

fn arch_of(config: &serde_json::Value, seq_len: u32) -> Result<TransformerArch, PredictError> {
    arch_from_hugging_face(&HuggingFaceSpec {
        config: config.as_object().unwrap().clone(),
        seq_len,
    })
}

#[test]
fn every_family_counts_the_parameters_transformers_builds_from_the_config() {
    let rows = fixture();
    let mut wrong = Vec::new();
    for row in &rows {
        let name = row["name"].as_str().unwrap();
        let want = row["params"].as_u64().unwrap();
        let seq = row["seqLen"].as_u64().unwrap() as u32;
        match arch_of(&row["config"], seq) {
            Ok(a) => {
                let got = Arch::Transformer(a).parameter_count();
                if got != want {
                    wrong.push(format!("{name}: {got} counted, transformers has {want}"));
                }
            }
            Err(e) => wrong.push(format!("{name}: {e}")),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_fixture_covers_every_family_small_and_with_its_defaults() {
    let names: Vec<String> = fixture()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    for family in supported_model_types() {
        for variant in ["small", "defaults"] {
            let name = format!("{family}-{variant}");
            assert!(names.contains(&name), "{name} missing from the fixture");
        }
    }
    // the head_dim x heads != hidden case of the issue
    let qwen = fixture()
        .into_iter()
        .find(|r| r["name"] == "qwen2-head-dim")
        .unwrap();
    assert_eq!(qwen["params"], 596_157_440u64);
}

#[test]
fn deberta_v3_has_no_token_type_table_and_bert_must_have_one() {
    let deberta = |types: serde_json::Value| {
        serde_json::json!({"model_type": "deberta-v2", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "type_vocab_size": types})
    };
    // DeBERTa-v3's configs say 0 (the H200 run of the families found it refused).
    assert_eq!(
        arch_of(&deberta(serde_json::json!(0)), 128)
            .unwrap()
            .token_types,
        0
    );
    assert_eq!(
        arch_of(&deberta(serde_json::json!(2)), 128)
            .unwrap()
            .token_types,
        2
    );
    // BERT builds nn.Embedding(0, h) and fails on its first token type.
    let bert = serde_json::json!({"model_type": "bert", "type_vocab_size": 0});
    assert!(arch_of(&bert, 128).is_err());
}

#[test]
fn the_attention_probabilities_get_dropout_from_the_attention_keys_or_the_one_rate() {
    #[rustfmt::skip]
    let cases: [(&[(&str, f64)], bool); 6] = [
        // OPT's defaults: hidden 0.1, attention 0.0.
        (&[("dropout", 0.1), ("attention_dropout", 0.0)], false),
        (&[("dropout", 0.0), ("attention_dropout", 0.1)], true),
        // GPT-2 with only attn_pdrop on, and with it off.
        (&[("resid_pdrop", 0.0), ("embd_pdrop", 0.0), ("attn_pdrop", 0.1)], true),
        (&[("resid_pdrop", 0.1), ("embd_pdrop", 0.1), ("attn_pdrop", 0.0)], false),
        // T5's one rate covers the probabilities.
        (&[("dropout_rate", 0.1)], true),
        (&[("dropout_rate", 0.0)], false),
    ];
    for (probs, want) in cases {
        assert_eq!(attention_dropout(probs), want, "{probs:?}");
    }
}

/// Configs as transformers 5.17 writes them (`config.to_dict()`), the
/// bookkeeping keys left out: what a user pastes from a model's config.json.
fn full_config(model_type: &str) -> serde_json::Value {
    let text = match model_type {
        "llama" => {
            r#"{"attention_bias":false,"attention_dropout":0.0,"bos_token_id":1,"eos_token_id":2,
            "head_dim":64,"hidden_act":"silu","hidden_size":1024,"initializer_range":0.02,
            "intermediate_size":2816,"max_position_embeddings":4096,"mlp_bias":false,
            "model_type":"llama","num_attention_heads":16,"num_hidden_layers":8,
            "num_key_value_heads":16,"pad_token_id":null,"pretraining_tp":1,"rms_norm_eps":1e-06,
            "rope_parameters":{"rope_theta":10000.0,"rope_type":"default"},
            "tie_word_embeddings":false,"use_cache":true,"vocab_size":32000}"#
        }
        "gpt2" => {
            r#"{"activation_function":"gelu_new","attn_pdrop":0.1,"bos_token_id":50256,
            "embd_pdrop":0.1,"eos_token_id":50256,"layer_norm_epsilon":1e-05,"model_type":"gpt2",
            "n_embd":768,"n_head":12,"n_inner":null,"n_layer":12,"n_positions":1024,
            "reorder_and_upcast_attn":false,"resid_pdrop":0.1,"scale_attn_weights":true,
            "tie_word_embeddings":true,"use_cache":true,"vocab_size":50257}"#
        }
        other => panic!("no full config of {other}"),
    };
    serde_json::from_str(text).unwrap()
}

fn renamed(mut config: serde_json::Value, model_type: &str) -> serde_json::Value {
    config["model_type"] = model_type.into();
    config
}

/// The full LLaMA config also has every key Qwen2 and Qwen3 read (they read
/// fewer: no `mlp_bias`, `attention_bias` or `pretraining_tp`), and those
/// describe other models (Qwen2's query/key/value biases, Qwen3's q/k norms);
/// LLaMA reads the most of it and serves it.
#[test]
fn an_unknown_model_type_with_every_key_of_one_family_is_served_by_that_family() {
    for family in ["llama", "gpt2"] {
        let config = full_config(family);
        let known = arch_of(&config, 512).unwrap();
        let served = arch_of(&renamed(config, "in_house_lm"), 512)
            .unwrap_or_else(|e| panic!("{family} under another name: {e}"));
        assert!(same_model(&known, &served), "{family}: a different model");
        assert_eq!(
            served.family,
            format!("{family} (by the keys of model_type 'in_house_lm')")
        );
    }
}

#[test]
fn an_unknown_model_type_is_refused_when_a_key_the_family_reads_is_missing() {
    // Every key but one that every family of its kind reads: the default for
    // it may not be the model's.
    for (family, drop) in [("llama", "num_key_value_heads"), ("gpt2", "n_inner")] {
        let mut config = renamed(full_config(family), "in_house_lm");
        config.as_object_mut().unwrap().remove(drop);
        let err = arch_of(&config, 512).unwrap_err().to_string();
        assert!(
            err.contains("no supported family reads only keys this config has")
                && err.contains("supported: gpt2, llama")
                && err.contains("Profiling")
                && err.contains("memory.request"),
            "{family} without {drop}: {err}"
        );
    }
    // A known model_type reads the library's defaults for absent keys, as before.
    let mut llama = full_config("llama");
    llama.as_object_mut().unwrap().remove("mlp_bias");
    assert!(arch_of(&llama, 512).is_ok());
}

#[test]
fn an_unknown_model_type_whose_keys_fit_two_different_models_is_refused_naming_both() {
    let mut both = full_config("llama");
    for (k, v) in full_config("gpt2").as_object().unwrap() {
        both.as_object_mut()
            .unwrap()
            .entry(k.clone())
            .or_insert(v.clone());
    }
    let err = arch_of(&renamed(both, "hybrid"), 512)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("several families") && err.contains("gpt2") && err.contains("llama"),
        "{err}"
    );
}

#[test]
fn families_that_describe_the_same_model_from_the_same_keys_are_one_match() {
    let a = arch_of(&full_config("llama"), 512).unwrap();
    let mut b = a.clone();
    b.family = "another".into();
    assert!(same_model(&a, &b));
    b.layers += 1;
    assert!(!same_model(&a, &b));
}

#[test]
fn t5s_gated_gelu_is_gelu_new_and_its_other_projections_are_not() {
    // transformers maps `gated-gelu` to gelu_new; `gated-silu` and a plain
    // `gelu` run one fused op
    for (proj, gated, gelu_new) in [
        ("gated-gelu", true, true),
        ("gated-silu", true, false),
        ("gelu", false, false),
        ("relu", false, false),
    ] {
        let config = serde_json::json!({"model_type": "t5", "d_model": 64, "num_layers": 1,
            "num_heads": 2, "d_kv": 32, "d_ff": 128, "vocab_size": 1000,
            "feed_forward_proj": proj});
        let t = arch_of(&config, 16).unwrap();
        assert_eq!(t.mlp == MlpKind::Swiglu, gated, "{proj}");
        assert_eq!(t.layout.gate_gelu_new, gelu_new, "{proj}");
    }
}

#[test]
fn phi3s_projections_have_no_bias_whatever_attention_bias_says() {
    // Phi3Attention builds qkv_proj and o_proj with bias=False; LLaMA's
    // o_proj follows `attention_bias`
    let count = |model_type: &str, bias: bool| {
        let config = serde_json::json!({"model_type": model_type, "num_hidden_layers": 1,
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
            "intermediate_size": 128, "vocab_size": 1000, "attention_bias": bias});
        Arch::Transformer(arch_of(&config, 16).unwrap()).parameter_count()
    };
    assert_eq!(count("phi3", true), count("phi3", false));
    assert_eq!(count("llama", true), count("llama", false) + 3 * 64 + 64);
}

#[test]
fn the_library_stacks_the_experts_into_two_parameters_whose_casts_are_not_cached() {
    // transformers' MoE blocks hold gate_up (experts, 2 x ffn, hidden) and
    // down (experts, hidden, ffn), as the H200's recorded runs allocate them
    // (Mixtral: 128 and 64 MiB per block in fp32, not 24 tensors)
    for (model_type, experts, ffn_key) in [
        ("mixtral", "num_local_experts", "intermediate_size"),
        ("qwen2_moe", "num_experts", "moe_intermediate_size"),
    ] {
        let mut config = serde_json::json!({"model_type": model_type, "num_hidden_layers": 2,
            "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
            "intermediate_size": 96, "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48, "num_experts_per_tok": 2,
            "vocab_size": 1000});
        config[experts] = serde_json::json!(4);
        let f = config[ffn_key].as_u64().unwrap();
        let t = arch_of(&config, 16).unwrap();
        let params = t.param_tensors();
        let stacked: Vec<_> = params
            .iter()
            .filter(|p| (p.rows, p.cols) == (4 * 2 * f, 64) || (p.rows, p.cols) == (4 * 64, f))
            .collect();
        assert_eq!(stacked.len(), 2 * 2, "{model_type}");
        assert!(stacked.iter().all(|p| !p.matmul_weight), "{model_type}");
        // no expert-sized matrix of its own
        assert!(
            !params.iter().any(|p| (p.rows, p.cols) == (f, 64)),
            "{model_type}"
        );
    }
}

/// Which blocks attend through a sliding window, as each family's config
/// class and modelling code decide: the window's default, null for none,
/// the family's pattern of windowed blocks, and the `layer_types` list
/// transformers 5 writes, which overrides the pattern.
#[test]
fn each_family_reads_its_sliding_window_and_the_blocks_it_covers() {
    use serde_json::json;
    let cases: Vec<(serde_json::Value, u64, Vec<u64>)> = vec![
        (
            json!({"model_type": "mistral", "num_hidden_layers": 3}),
            4096,
            vec![0, 1, 2],
        ),
        (
            json!({"model_type": "mistral", "num_hidden_layers": 3, "sliding_window": null}),
            0,
            vec![],
        ),
        (
            json!({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 1024}),
            1024,
            vec![0, 1],
        ),
        (
            json!({"model_type": "mixtral", "num_hidden_layers": 2}),
            0,
            vec![],
        ),
        (
            json!({"model_type": "mixtral", "num_hidden_layers": 2, "sliding_window": 512}),
            512,
            vec![0, 1],
        ),
        (
            json!({"model_type": "phi3", "num_hidden_layers": 2}),
            0,
            vec![],
        ),
        (
            json!({"model_type": "phi3", "num_hidden_layers": 2, "sliding_window": 2047}),
            2047,
            vec![0, 1],
        ),
        // Gemma 2: every second block counted from 1 attends globally
        (
            json!({"model_type": "gemma2", "num_hidden_layers": 4}),
            4096,
            vec![0, 2],
        ),
        // Gemma 3: every sixth, or every `sliding_window_pattern`-th
        (
            json!({"model_type": "gemma3_text", "num_hidden_layers": 7, "sliding_window": 512}),
            512,
            vec![0, 1, 2, 3, 4, 6],
        ),
        (
            json!({"model_type": "gemma3_text", "num_hidden_layers": 4,
                "sliding_window_pattern": 2}),
            4096,
            vec![0, 2],
        ),
        (
            json!({"model_type": "gemma3_text", "num_hidden_layers": 3, "layer_types":
                ["full_attention", "sliding_attention", "full_attention"]}),
            4096,
            vec![1],
        ),
        // Qwen: only with use_sliding_window, from max_window_layers on
        (
            json!({"model_type": "qwen2", "num_hidden_layers": 4}),
            0,
            vec![],
        ),
        (
            json!({"model_type": "qwen2", "num_hidden_layers": 4, "sliding_window": 256}),
            0,
            vec![],
        ),
        (
            json!({"model_type": "qwen2", "num_hidden_layers": 4, "use_sliding_window": true,
                "max_window_layers": 2}),
            4096,
            vec![2, 3],
        ),
        (
            json!({"model_type": "qwen3", "num_hidden_layers": 4, "use_sliding_window": true,
                "sliding_window": 256, "max_window_layers": 0}),
            256,
            vec![0, 1, 2, 3],
        ),
        (
            json!({"model_type": "qwen2", "num_hidden_layers": 2, "use_sliding_window": true,
                "sliding_window": 0}),
            0,
            vec![],
        ),
        // LLaMA has no window, whatever the config says
        (
            json!({"model_type": "llama", "num_hidden_layers": 2, "sliding_window": 256}),
            0,
            vec![],
        ),
    ];
    for (config, window, layers) in cases {
        let a = arch_of(&config, 512).unwrap_or_else(|e| panic!("{config}: {e}"));
        assert_eq!(
            (a.layout.sliding_window, a.layout.sliding_layers),
            (window, layers),
            "{config}"
        );
    }
    for (config, want) in [
        (
            json!({"model_type": "qwen2_moe", "use_sliding_window": true}),
            "use_sliding_window = true is not described analytically",
        ),
        (
            json!({"model_type": "mistral", "num_hidden_layers": 2,
                "layer_types": ["sliding_attention"]}),
            "layer_types must be a list of one attention type per block",
        ),
        (
            json!({"model_type": "mistral", "sliding_window": "wide"}),
            "sliding_window must be a positive integer",
        ),
        // the released StarCoder2 models' dropouts are not described
        (
            json!({"model_type": "starcoder2", "residual_dropout": 0.1}),
            "residual_dropout above 0 is not described analytically",
        ),
    ] {
        let err = arch_of(&config, 512).unwrap_err().to_string();
        assert!(err.contains(want), "{config}: {err}");
    }
}

/// A block attends through its window's mask once the sequence reaches the
/// window (transformers skips the mask below it), and only a windowed block.
#[test]
fn a_block_is_windowed_from_a_sequence_as_long_as_its_window() {
    let config = serde_json::json!({"model_type": "gemma2", "num_hidden_layers": 2,
        "sliding_window": 512});
    for (seq, block, want) in [
        (511, 0, false),
        (512, 0, true),
        (4096, 0, true),
        (4096, 1, false),
    ] {
        let a = arch_of(&config, seq).unwrap();
        assert_eq!(a.windowed_block(block), want, "seq {seq} block {block}");
    }
}
