use super::*;
use std::path::Path;

fn job(spec: Value) -> Value {
    as_document(spec.as_object().unwrap().clone())
}

fn valid_spec() -> Value {
    serde_json::json!({
        "gpus": 1,
        "batch": {"global": 64, "micro": 8},
        "model": {"transformer": {"layers": 12, "hidden": 768, "heads": 12,
                                  "vocab": 50257, "seqLen": 1024},
                  "precision": "amp-bf16", "optimizer": "adamw"},
        "memory": {"request": "20Gi", "headroom": 0.05},
        "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}
    })
}

fn errors_of(spec: Value) -> Vec<String> {
    validate_training_job(&job(spec)).expect_err("invalid")
}

#[test]
fn a_valid_job_passes_with_its_defaults_filled_in() {
    let checked = validate_training_job(&job(valid_spec())).unwrap();
    assert_eq!(checked["spec"]["batch"]["minMicro"], 1);
    assert_eq!(checked["spec"]["maxOOMRetries"], 4);
}

#[test]
fn a_typo_in_a_field_name_is_refused_with_its_path() {
    let mut spec = valid_spec();
    spec["model"]["optimiser"] = "adamw".into();
    assert_eq!(
        errors_of(spec),
        ["spec.model.optimiser: unknown field \"optimiser\""]
    );
}

#[test]
fn types_bounds_and_enums_are_checked_with_the_path() {
    let cases = [
        ("/gpus", serde_json::json!("two"), "spec.gpus"),
        ("/gpus", serde_json::json!(0), "spec.gpus"),
        ("/batch/micro", serde_json::json!(-8), "spec.batch.micro"),
        (
            "/model/optimizer",
            serde_json::json!("lion"),
            "spec.model.optimizer",
        ),
        (
            "/memory/headroom",
            serde_json::json!(2.0),
            "spec.memory.headroom",
        ),
    ];
    for (pointer, bad, path) in cases {
        let mut spec = valid_spec();
        *spec.pointer_mut(pointer).unwrap() = bad.clone();
        let errors = errors_of(spec);
        assert!(
            errors.iter().any(|e| e.starts_with(&format!("{path}: "))),
            "{pointer} = {bad}: {errors:?}"
        );
    }
}

#[test]
fn cel_rules_are_evaluated_after_the_defaults() {
    let mut spec = valid_spec();
    spec["batch"]["global"] = 60.into();
    assert_eq!(
        errors_of(spec),
        [
            "spec.batch.global: Invalid value: batch.global must be divisible by batch.micro * gpus (gradient accumulation = global / (micro * gpus))"
        ]
    );
    // minMicro defaults to 1, which the rule sees.
    let mut spec = valid_spec();
    spec["batch"]["micro"] = 1.into();
    spec["batch"]["global"] = 8.into();
    assert!(validate_training_job(&job(spec)).is_ok());
    let mut spec = valid_spec();
    spec["batch"]["minMicro"] = 16.into();
    assert_eq!(
        errors_of(spec),
        ["spec.batch.minMicro: Invalid value: batch.minMicro must not exceed batch.micro"]
    );
}

#[test]
fn the_quantity_rule_accepts_positive_quantities_only() {
    for (request, ok) in [
        ("20Gi", true),
        ("24000Mi", true),
        ("1.5G", true),
        ("0", false),
        ("-1Gi", false),
        ("twenty", false),
        (" 20Gi", false),
    ] {
        let mut spec = valid_spec();
        spec["memory"]["request"] = request.into();
        let result = validate_training_job(&job(spec));
        assert_eq!(result.is_ok(), ok, "{request:?}: {result:?}");
        if let Err(errors) = result {
            assert!(errors[0].starts_with("spec.memory.request: "), "{errors:?}");
        }
    }
}

#[test]
fn a_template_that_requests_gpus_or_a_node_is_refused_naming_the_field() {
    let mut spec = valid_spec();
    spec["template"]["spec"]["containers"][0]["resources"] =
        serde_json::json!({"limits": {"nvidia.com/gpu": 1}});
    let errors = errors_of(spec);
    assert!(
        errors[0].starts_with("spec.template.spec.containers[0].resources.limits.nvidia.com/gpu: "),
        "{errors:?}"
    );
    let mut spec = valid_spec();
    spec["template"]["spec"]["initContainers"] = serde_json::json!([{"name": "i", "image": "i", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]);
    let errors = errors_of(spec);
    assert!(
        errors[0].starts_with(
            "spec.template.spec.initContainers[0].resources.requests.nvidia.com/gpu: "
        ),
        "{errors:?}"
    );
    let mut spec = valid_spec();
    spec["template"]["spec"]["nodeName"] = "gpu-1".into();
    assert_eq!(
        errors_of(spec),
        ["spec.template.spec.nodeName: must not be set; vramfit chooses the node"]
    );
    // A template whose fields have the wrong type names the field too.
    let mut spec = valid_spec();
    spec["template"]["spec"]["containers"][0]["ports"] = "8080".into();
    let errors = errors_of(spec);
    assert!(
        errors[0].starts_with("spec.template.spec.containers[0].ports: "),
        "{errors:?}"
    );
}

#[test]
fn every_invalid_manifest_is_refused_naming_the_field_the_api_server_names() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 22, "{files:?}");
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let field = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect-field: "))
            .unwrap()
            .trim();
        let document: Value = serde_saphyr::from_str(&text).unwrap();
        match validate_training_job(&document) {
            Ok(_) => failures.push(format!("{}: accepted", path.display())),
            Err(errors) => {
                if !errors.iter().any(|e| e.contains(field)) {
                    failures.push(format!("{}: {field} not in {errors:?}", path.display()));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_examples_are_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for document in text.split("\n---") {
            let document: Value = match serde_saphyr::from_str(document) {
                Ok(d) => d,
                Err(_) => continue,
            };
            if document.get("kind").and_then(Value::as_str) == Some("TrainingJob") {
                let result = validate_training_job(&document);
                assert!(result.is_ok(), "{}: {result:?}", path.display());
            }
        }
    }
}
