use super::*;

const KUBECONFIG: &str = r#"
apiVersion: v1
kind: Config
clusters:
- name: one
  cluster: {server: "https://127.0.0.1:6443"}
- name: two
  cluster: {server: "https://10.0.0.2:443"}
users:
- name: u
  user: {token: secret}
contexts:
- name: first
  context: {cluster: one, user: u, namespace: ml}
- name: second
  context: {cluster: two, user: u}
current-context: first
"#;

#[tokio::test]
async fn the_file_and_the_context_named_choose_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config");
    std::fs::write(&path, KUBECONFIG).unwrap();
    let args = |context: Option<&str>| KubeArgs {
        kubeconfig: Some(path.clone()),
        context: context.map(str::to_string),
    };
    let current = args(None).config().await.unwrap();
    assert_eq!(current.cluster_url.to_string(), "https://127.0.0.1:6443/");
    assert_eq!(current.default_namespace, "ml");
    let second = args(Some("second")).config().await.unwrap();
    assert_eq!(second.cluster_url.to_string(), "https://10.0.0.2:443/");

    let missing = args(Some("third")).config().await.unwrap_err();
    assert!(format!("{missing:#}").contains("third"), "{missing:#}");
    let absent = KubeArgs {
        kubeconfig: Some(dir.path().join("nope")),
        context: None,
    };
    let err = absent.config().await.unwrap_err();
    assert!(format!("{err:#}").contains("nope"), "{err:#}");
}
