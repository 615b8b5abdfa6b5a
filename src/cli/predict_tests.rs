use super::*;
use crate::api::TrainingJob;

fn args(file: PathBuf) -> PredictArgs {
    PredictArgs {
        file,
        gpu: None,
        profile: None,
        micro: None,
        fit: None,
        events_out: None,
        shapes: false,
        output: OutputFormat::Json,
    }
}

#[test]
fn events_out_writes_a_profile_that_predicts_the_same_allocated_peak() {
    let dir = std::env::temp_dir().join(format!("vramfit-events-out-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut a = args(examples.join("llama-1b-hf.yaml"));
    let out = dir.join("llama.profile.json");
    a.events_out = Some(out.clone());
    let direct: serde_json::Value = serde_json::from_str(&run(&a).unwrap()).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("vramfit.profile/v1"));
    // the same sequence as a profile: a profile job, predicted from the file
    let job = std::fs::read_to_string(examples.join("llama-1b-hf.yaml")).unwrap();
    let mut doc: serde_json::Value = serde_saphyr::from_str(&job).unwrap();
    doc["spec"]["model"] = serde_json::json!({
        "profile": {"configMapRef": {"name": "p", "key": "profile.json"}}
    });
    let profiled = dir.join("profiled.json");
    std::fs::write(&profiled, doc.to_string()).unwrap();
    let mut b = args(profiled);
    b.profile = Some(out);
    let replayed: serde_json::Value = serde_json::from_str(&run(&b).unwrap()).unwrap();
    assert_eq!(replayed["allocatedBytes"], direct["allocatedBytes"]);
    // a profile job writes its profile as replayed: the workspaces the
    // capture only names are allocations there, and the file alone predicts
    // the same reserve
    let capture =
        examples.join("../data/profiles/heldout-h200/tv-vgg11_bn-i224-b32-fp32-sgdm.profile.json");
    let captured: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&capture).unwrap()).unwrap();
    let named = captured["cublasWorkspaceAt"].as_array().unwrap().len()
        + captured["convolutions"].as_array().unwrap().len();
    assert!(named > 2);
    b.profile = Some(capture);
    let replayed_out = dir.join("replayed.json");
    b.events_out = Some(replayed_out.clone());
    let first: serde_json::Value = serde_json::from_str(&run(&b).unwrap()).unwrap();
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&replayed_out).unwrap()).unwrap();
    let allocs = |d: &serde_json::Value| {
        d["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e.as_i64().unwrap() >= 0)
            .count()
    };
    assert!(allocs(&written) >= allocs(&captured) + named);
    assert!(written.get("cublasWorkspaceAt").is_none());
    b.profile = Some(replayed_out);
    b.events_out = None;
    let second: serde_json::Value = serde_json::from_str(&run(&b).unwrap()).unwrap();
    assert_eq!(second["reservedBytes"], first["reservedBytes"]);
    assert_eq!(second["allocatedBytes"], first["allocatedBytes"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_job_with_a_request_and_a_model_not_predicted_prints_the_budget_the_controller_uses() {
    let dir = tempfile::tempdir().unwrap();
    let job = TrainingJob::test("q3")
        .model(serde_json::json!({"huggingFace": {"seqLen": 512,
                                  "config": {"model_type": "falcon", "hidden_size": 512}}}))
        .template_spec(serde_json::json!({"containers": [{"name": "t", "image": "x"}]}));
    let with_request = dir.path().join("with.yaml");
    let manifest = job.clone().request("20Gi").manifest();
    std::fs::write(&with_request, manifest.to_string()).unwrap();
    let out = run(&args(with_request.clone())).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["budgetBytes"], 20u64 << 30);
    assert_eq!(v["source"], "request");
    assert!(v["reason"].as_str().unwrap().contains("falcon"), "{out}");
    let table = run(&PredictArgs {
        output: OutputFormat::Table,
        ..args(with_request)
    })
    .unwrap();
    assert!(
        table.starts_with("budget 20.0 GiB per GPU from spec.memory.request"),
        "{table}"
    );

    // Without a request the error stays, and names both ways out.
    let without = dir.path().join("without.yaml");
    std::fs::write(&without, job.manifest().to_string()).unwrap();
    let err = format!("{:#}", run(&args(without)).unwrap_err());
    assert!(err.contains("spec.memory.request"), "{err}");
    assert!(err.contains("python -m vramfit.profile"), "{err}");
}

#[test]
fn a_prediction_larger_than_the_gpu_warns_with_what_would_make_it_fit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job.yaml");
    let job = |micro: u32| {
        format!(
            "spec:\n  batch: {{global: 64, micro: {micro}}}\n  model:\n    transformer: {{layers: 12, \
             hidden: 768, heads: 12, vocab: 50257, seqLen: 1024}}\n    precision: fp32\n  \
             template: {{spec: {{containers: [{{name: t, image: x}}]}}}}\n"
        )
    };
    let on_t4 = |output| PredictArgs {
        gpu: Some("T4".into()),
        output,
        ..args(path.clone())
    };
    std::fs::write(&path, job(64)).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&run(&on_t4(OutputFormat::Json)).unwrap()).unwrap();
    assert_eq!(v["fitsGpu"], false);
    let advice = v["advice"].as_str().unwrap();
    assert!(advice.contains("more than a T4 has"), "{advice}");
    assert!(advice.contains("it would fit a T4"), "{advice}");
    let table = run(&on_t4(OutputFormat::Table)).unwrap();
    assert!(table.contains("\nwarning: needs "), "{table}");

    std::fs::write(&path, job(1)).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&run(&on_t4(OutputFormat::Json)).unwrap()).unwrap();
    assert_eq!(v["fitsGpu"], true);
    assert!(v.get("advice").is_none());
    assert!(
        !run(&on_t4(OutputFormat::Table))
            .unwrap()
            .contains("warning")
    );
}

#[test]
fn an_auto_job_is_predicted_from_the_profile_given_and_says_how_to_get_one() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("auto.yaml");
    let manifest = TrainingJob::test("a")
        .model(serde_json::json!({"auto": {}}))
        .template_spec(serde_json::json!({"containers": [{"name": "t", "image": "x"}]}))
        .manifest();
    std::fs::write(&job, manifest.to_string()).unwrap();
    let err = format!("{:#}", run(&args(job.clone())).unwrap_err());
    assert!(
        err.contains("Profiling") && err.contains("--profile FILE"),
        "{err}"
    );
    let profile = dir.path().join("p.json");
    std::fs::write(
        &profile,
        r#"{"format":"vramfit.profile/v1","microBatch":8,"sizes":[6442450944],"events":[0]}"#,
    )
    .unwrap();
    let mut with = args(job);
    with.profile = Some(profile);
    let v: serde_json::Value = serde_json::from_str(&run(&with).unwrap()).unwrap();
    assert!(v["allocatedBytes"].as_u64().unwrap() >= 6 << 30, "{v}");
}

#[test]
fn shapes_lists_every_micro_batch_with_the_measured_curve_of_the_family() {
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut a = args(examples.join("llama-1b-hf.yaml"));
    a.shapes = true;
    let v: serde_json::Value = serde_json::from_str(&run(&a).unwrap()).unwrap();
    assert!(
        v["stepTimes"]
            .as_str()
            .unwrap()
            .starts_with("measured: llama-1b"),
        "{v}"
    );
    let micros: Vec<u64> = v["shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["microBatch"].as_u64().unwrap())
        .collect();
    assert_eq!(micros, [1, 2, 4, 8, 16, 32]);
    let preferred = &v["shapes"][2];
    assert_eq!(preferred["relativeStepTime"], 1.0);
    assert!(v["shapes"][0]["relativeStepTime"].as_f64().unwrap() > 1.0);
    let mut b = args(examples.join("mlp.yaml"));
    b.shapes = true;
    b.output = OutputFormat::Table;
    let table = run(&b).unwrap();
    assert!(table.contains("bound: no measured curve"), "{table}");
}
