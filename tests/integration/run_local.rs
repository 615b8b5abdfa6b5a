//! `vramfit run --local` end to end: the real binary runs a stand-in training
//! script through the real Python helper (python/), which fakes the OOM at large
//! micro-batches. Without a GPU the peaks read "n/a".

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use vramfit::api::TrainingJob;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn write_job(dir: &Path, micro: u32, min_micro: u32, retries: u32) -> PathBuf {
    let path = dir.join("job.yaml");
    let job = TrainingJob::test("local-tiny-decoder")
        .namespace("ml")
        .max_oom_retries(retries)
        .batch(64, micro)
        .min_micro(min_micro)
        .model(
            json!({"transformer": {"kind": "decoder", "layers": 2, "hidden": 256, "heads": 4,
                                      "vocab": 1000, "seqLen": 512},
                      "precision": "fp32", "optimizer": "adamw"}),
        )
        .template_spec(json!({"containers": [{"name": "train", "image": "x"}]}));
    std::fs::write(&path, job.manifest().to_string()).unwrap();
    path
}

struct Run {
    code: i32,
    report: Value,
    attempts_env: Vec<Value>,
    stderr: String,
}

fn run_local(micro: u32, min_micro: u32, retries: u32, fits: u32, absorb_above: u32) -> Run {
    let dir = tempdir();
    let job = write_job(&dir, micro, min_micro, retries);
    let log = dir.join("attempts.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_vramfit"))
        .args(["run", "--local"])
        .arg(&job)
        .arg("--workdir")
        .arg(dir.join("work"))
        .args(["-o", "json", "--", "python3"])
        .arg(repo().join("tests/data/run-local/train.py"))
        .env("PYTHONPATH", repo().join("python"))
        .env("FAKE_FITS_MICRO", fits.to_string())
        .env("FAKE_ABSORB_ABOVE", absorb_above.to_string())
        .env("FAKE_LOG", &log)
        .env("PATH", path_without_nvidia_smi())
        .output()
        .expect("vramfit runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON object ({e}); stderr:\n{stderr}"));
    let attempts_env = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    Run {
        code: out.status.code().unwrap_or(-1),
        report,
        attempts_env,
        stderr,
    }
}

/// The tests describe a machine without a GPU, even on one that has a GPU.
fn path_without_nvidia_smi() -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|dir| !Path::new(dir).join("nvidia-smi").exists())
        .collect::<Vec<_>>()
        .join(":")
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "vramfit-run-local-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn shapes(report: &Value) -> Vec<(u64, u64, String)> {
    report["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["microBatch"].as_u64().unwrap(),
                a["gradAccum"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn run_local_halves_micro_on_oom_until_the_job_fits() {
    let run = run_local(32, 1, 4, 8, 0);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.report["outcome"], "Succeeded");
    assert_eq!(
        shapes(&run.report),
        [
            (32, 2, "OutOfMemory".into()),
            (16, 4, "OutOfMemory".into()),
            (8, 8, "Succeeded".into())
        ]
    );
    let attempts = run.report["attempts"].as_array().unwrap();
    assert!(
        attempts[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("CUDA out of memory. Tried to allocate 32 GiB"),
        "{}",
        attempts[0]
    );
    // Each attempt is predicted again at its own micro-batch.
    let budgets: Vec<u64> = attempts
        .iter()
        .map(|a| a["budgetBytes"].as_u64().unwrap())
        .collect();
    assert!(
        budgets[0] > budgets[1] && budgets[1] > budgets[2],
        "{budgets:?}"
    );
    assert!(attempts.iter().all(|a| a["measuredPeakBytes"].is_null()));
    assert!(run.stderr.contains("peak n/a"), "{}", run.stderr);
    // The process saw the node protocol's variables, the global batch unchanged.
    let seen: Vec<(&str, &str, &str, &str)> = run
        .attempts_env
        .iter()
        .map(|e| {
            (
                e["VRAMFIT_MICRO_BATCH"].as_str().unwrap(),
                e["VRAMFIT_GRAD_ACCUM"].as_str().unwrap(),
                e["VRAMFIT_GLOBAL_BATCH"].as_str().unwrap(),
                e["VRAMFIT_ATTEMPT"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("32", "2", "64", "1"),
            ("16", "4", "64", "2"),
            ("8", "8", "64", "3")
        ]
    );
    assert_eq!(
        run.attempts_env[2]["VRAMFIT_BUDGET_BYTES"]
            .as_str()
            .unwrap(),
        budgets[2].to_string()
    );
}

#[test]
fn run_local_stops_at_min_micro_with_the_reason() {
    let run = run_local(32, 16, 4, 8, 0);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.report["outcome"], "Failed");
    assert_eq!(shapes(&run.report).len(), 2);
    let message = run.report["message"].as_str().unwrap();
    assert!(message.contains("minMicro 16"), "{message}");
}

#[test]
fn run_local_stops_after_max_oom_retries() {
    let run = run_local(32, 1, 1, 4, 0);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(shapes(&run.report).len(), 2);
    let message = run.report["message"].as_str().unwrap();
    assert!(message.contains("maxOOMRetries 1"), "{message}");
}

#[test]
fn run_local_continues_from_the_shape_the_process_absorbed() {
    // Attempt 1 absorbs 32 -> 16 itself, then runs out at 16: the next attempt
    // starts at 8, not at 16 again.
    let run = run_local(32, 1, 4, 8, 16);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        shapes(&run.report),
        [(32, 2, "OutOfMemory".into()), (8, 8, "Succeeded".into())]
    );
    let first = &run.report["attempts"][0];
    assert_eq!(first["finalShape"], "16x4");
    assert_eq!(first["absorbedOoms"][0]["fromMicro"], 32);
    assert_eq!(first["absorbedOoms"][0]["toAccum"], 4);
}
