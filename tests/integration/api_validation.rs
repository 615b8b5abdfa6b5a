//! The API server itself rejects bad TrainingJobs, with messages that name the field.

use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject, Patch, PatchParams, ValidationDirective};
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;

use crate::controlplane;

const NAMESPACE: &str = "api-validation";

fn manifests(dir: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("readable entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

fn expectation(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("# {key}: ")))
        .unwrap_or_else(|| panic!("manifest lacks a `# {key}:` line"))
        .trim()
        .to_string()
}

async fn ensure_namespace(name: &str) {
    let status = controlplane::kubectl()
        .args(["create", "namespace", name])
        .output()
        .expect("kubectl runs");
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(
        status.status.success() || stderr.contains("AlreadyExists"),
        "creating namespace {name}: {stderr}"
    );
}

fn training_jobs(client: kube::Client, namespace: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("vramfit.dev", "v1alpha1", "TrainingJob");
    Api::namespaced_with(client, namespace, &ApiResource::from_gvk(&gvk))
}

#[tokio::test]
async fn api_server_rejects_each_invalid_manifest_naming_the_field() {
    let client = controlplane::client().await;
    ensure_namespace(NAMESPACE).await;
    let api = training_jobs(client, NAMESPACE);
    let files = manifests("tests/data/invalid");
    assert!(files.len() >= 12, "expected at least 12 invalid manifests");
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).expect("manifest readable");
        let field = expectation(&text, "expect-field");
        let message = expectation(&text, "expect-message");
        let object: DynamicObject = serde_saphyr::from_str(&text).expect("manifest is YAML");
        let name = object.metadata.name.clone().expect("manifest has a name");
        let params = PatchParams::apply("vramfit-tests").validation(ValidationDirective::Strict);
        match api.patch(&name, &params, &Patch::Apply(&object)).await {
            Ok(_) => failures.push(format!("{}: accepted", path.display())),
            Err(kube::Error::Api(status)) => {
                let said = status.message.clone();
                // Alternatives separated by `|`: server-side apply and a plain
                // create word some rejections differently.
                let names_reason = message.split('|').any(|m| said.contains(m.trim()));
                if !(said.contains(&field) && names_reason) {
                    failures.push(format!(
                        "{}: expected {field:?} and {message:?} in {said:?}",
                        path.display()
                    ));
                }
            }
            Err(other) => failures.push(format!("{}: {other}", path.display())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn kubectl_apply_of_each_invalid_manifest_fails_naming_the_field() {
    ensure_namespace(NAMESPACE).await;
    let mut failures = Vec::new();
    for path in manifests("tests/data/invalid") {
        let text = std::fs::read_to_string(&path).expect("manifest readable");
        let field = expectation(&text, "expect-field");
        let message = expectation(&text, "expect-message");
        let output = controlplane::kubectl()
            .args(["apply", "-n", NAMESPACE, "-f"])
            .arg(&path)
            .output()
            .expect("kubectl runs");
        let said = String::from_utf8_lossy(&output.stderr);
        let names_reason = message.split('|').any(|m| said.contains(m.trim()));
        if output.status.success() || !said.contains(&field) || !names_reason {
            failures.push(format!(
                "{}: expected a rejection naming {field:?} and {message:?}, got {said:?}",
                path.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn kubectl_apply_of_the_examples_succeeds_and_get_shows_the_columns() {
    controlplane::kubeconfig();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let output = controlplane::kubectl()
        .args(["apply", "-f"])
        .arg(&examples)
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl apply -f examples/ failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = controlplane::kubectl()
        .args(["get", "tj", "-n", "ml"])
        .output()
        .expect("kubectl runs");
    let table = String::from_utf8_lossy(&output.stdout);
    let header = table.lines().next().unwrap_or_default();
    for column in [
        "NAME",
        "PHASE",
        "PREDICTED",
        "NODE",
        "GPU",
        "MICROXACCUM",
        "ATTEMPT",
        "MEASURED",
        "AGE",
    ] {
        assert!(
            header.contains(column),
            "column {column} missing in {header:?}"
        );
    }
    for name in ["gpt2-small", "llama-1b", "bert-base", "mlp-8x8192"] {
        assert!(
            table.contains(name),
            "{name} missing from kubectl get tj:\n{table}"
        );
    }
}
