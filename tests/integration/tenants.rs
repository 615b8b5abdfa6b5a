//! The attacks of docs/security.md that a tenant tries through the API server,
//! one test per attack, against a real kube-apiserver + etcd.
//!
//! The chart's admission policies and RBAC are rendered (`helm template`, the
//! default values, as `hack/chart-test.sh` renders them) and applied to a
//! control plane of this suite's own ([`PrivateControlPlane`]): the policies
//! are cluster-wide and would refuse the training pods that the other suites'
//! controllers create on the shared one. No kube-controller-manager runs
//! there, so the test does what its ClusterRole aggregation controller does
//! for `view`, `edit` and `admin` ([`aggregate`]); tenants are then bound to
//! the default roles in their namespaces, as a cluster admin binds them.
//!
//! Each attack is made by the identity a tenant has: a user impersonated with
//! `Impersonate-User` (and the ServiceAccounts of the chart where the attack
//! is theirs). A refusal counts only when the policy's own message says so,
//! and each test also makes the request that must pass (without the offending
//! field, or by the identity allowed to make it), so that none holds
//! vacuously.
//!
//! No test here is `#[ignore]`d: an attack that got through would be, its
//! reason naming the missing defence and the test that holds it meanwhile.
//! What admission cannot see (attack 2a's `envFrom`) is left to the test
//! that holds it elsewhere (attack 2c, the controller's explicit values).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use serde_json::{Value, json};
use vramfit::api::free_form::{MAX_DEPTH, too_deep};
use vramfit::api::{GpuNode, Phase, TrainingJob};

use crate::controlplane::{self, PrivateControlPlane};
use crate::driver::{GIB, TestCluster, free_port, http_get, mlp_job, vramfit_bin};

/// The release as `hack/chart-test.sh` installs it.
const RELEASE_NAMESPACE: &str = "vramfit-system";
/// The version of the local control plane (helm assumes an old one otherwise).
const KUBE_VERSION: &str = "1.34.4";
const CONTROLLER_SA: &str = "system:serviceaccount:vramfit-system:vramfit-controller";
const AGENT_SA: &str = "system:serviceaccount:vramfit-system:vramfit-agent";
/// The admission policies of charts/vramfit/templates/tenancy.yaml.
const POD_SECURITY: &str = "vramfit-trainingjob-pod-security";
const BOUNDS: &str = "vramfit-trainingjob-bounds";
const GPU_ACCESS: &str = "vramfit-gpu-access";
const OWN_NODE: &str = "vramfit-agent-own-node";
/// The key the API server puts the node of a node-bound ServiceAccount token under.
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

// --- the control plane with the chart ----------------------------------------

static PLANE: OnceLock<PrivateControlPlane> = OnceLock::new();

/// The kubeconfig (admin) of this suite's control plane, started on first use
/// with the chart's RBAC and admission policies in force.
fn plane() -> &'static Path {
    PLANE
        .get_or_init(|| {
            let plane = PrivateControlPlane::start("tenants");
            install_chart(plane.kubeconfig());
            plane
        })
        .kubeconfig()
}

/// Runs `command` with `stdin`: its stdout, or its stderr when it fails.
fn output(command: &mut Command, stdin: Option<&str>) -> Result<String, String> {
    let mut child = command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(text.as_bytes())
            .expect("writing stdin");
    }
    let out = child.wait_with_output().expect("waiting for the command");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `kubectl ARGS` against the control plane of `kubeconfig`.
fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    output(
        Command::new("kubectl")
            .env("KUBECONFIG", kubeconfig)
            .args(args),
        stdin,
    )
}

/// Renders the chart with the values chart-test uses first (the defaults),
/// applies it, aggregates the default roles and waits until each of the four
/// admission policies answers.
fn install_chart(kubeconfig: &Path) {
    let helm = output(
        Command::new("bash")
            .arg(repo_root().join("hack/tools.sh"))
            .arg("helm"),
        None,
    )
    .unwrap_or_else(|e| panic!("hack/tools.sh helm: {e}"));
    let rendered = output(
        Command::new(helm.trim())
            .args(["template", "vramfit"])
            .arg(repo_root().join("charts/vramfit"))
            .args([
                "--kube-version",
                KUBE_VERSION,
                "--namespace",
                RELEASE_NAMESPACE,
                // /ui behind TokenReview and SubjectAccessReview (attack 7).
                "--set",
                "controller.ui.authentication=kubernetes",
            ]),
        None,
    )
    .unwrap_or_else(|e| panic!("helm template: {e}"));
    for policy in [POD_SECURITY, BOUNDS, GPU_ACCESS, OWN_NODE] {
        assert!(
            rendered.contains(&format!("name: {policy}\n")),
            "the default rendering has no {policy}"
        );
    }
    for ns in [RELEASE_NAMESPACE, "tenants-probe"] {
        kubectl(kubeconfig, &["create", "namespace", ns], None)
            .unwrap_or_else(|e| panic!("namespace {ns}: {e}"));
    }
    kubectl(kubeconfig, &["apply", "-f", "-"], Some(&rendered))
        .unwrap_or_else(|e| panic!("applying the chart: {e}"));
    // `edit` takes `view`'s rules and `admin` `edit`'s: in that order.
    for role in ["view", "edit", "admin"] {
        aggregate(kubeconfig, role);
    }
    wait_policies(kubeconfig);
}

/// What kube-controller-manager's ClusterRole aggregation controller does:
/// the rules of `role` become those of every ClusterRole its
/// `aggregationRule` selects (the chart's roles by their labels).
fn aggregate(kubeconfig: &Path, role: &str) {
    let get = |args: &[&str]| -> Value {
        serde_json::from_str(&kubectl(kubeconfig, args, None).unwrap_or_else(|e| panic!("{e}")))
            .expect("kubectl prints JSON")
    };
    let aggregated = get(&["get", "clusterrole", role, "-o", "json"]);
    let selectors = aggregated["aggregationRule"]["clusterRoleSelectors"]
        .as_array()
        .unwrap_or_else(|| panic!("{role} is not aggregated: {aggregated}"))
        .clone();
    let mut rules: Vec<Value> = Vec::new();
    for selector in selectors {
        let labels: Vec<String> = selector["matchLabels"]
            .as_object()
            .expect("matchLabels")
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().expect("a label value")))
            .collect();
        let roles = get(&["get", "clusterroles", "-l", &labels.join(","), "-o", "json"]);
        for item in roles["items"].as_array().expect("items") {
            for rule in item["rules"].as_array().into_iter().flatten() {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
        }
    }
    let patch = json!({ "rules": rules }).to_string();
    kubectl(
        kubeconfig,
        &["patch", "clusterrole", role, "--type=merge", "-p", &patch],
        None,
    )
    .unwrap_or_else(|e| panic!("aggregating {role}: {e}"));
}

/// The API server loads admission policies from a watch: until each of the
/// chart's refuses what it is about (named in its answer), none is relied on.
fn wait_policies(kubeconfig: &Path) {
    let gpu_pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "probe", "namespace": "tenants-probe"},
        "spec": {"containers": [{"name": "t", "image": "i",
            "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}]}});
    let mut privileged = training_job(
        "probe",
        json!({"containers": [{"name": "t", "image": "i",
        "securityContext": {"privileged": true}}]}),
    );
    privileged["metadata"]["namespace"] = json!("tenants-probe");
    let mut deep = training_job("probe", plain_template());
    deep["metadata"]["namespace"] = json!("tenants-probe");
    deep["spec"]["template"]["spec"]["x"] = nested(40);
    let gpu_node = GpuNode::test("probe").manifest();
    let checks = [
        (GPU_ACCESS, gpu_pod, None),
        (POD_SECURITY, privileged, None),
        (BOUNDS, deep, None),
        (OWN_NODE, gpu_node, Some(AGENT_SA)),
    ];
    for (policy, object, user) in checks {
        let deadline = Instant::now() + Duration::from_secs(60);
        let text = object.to_string();
        loop {
            let mut args = vec!["create", "--dry-run=server", "-f", "-"];
            if let Some(user) = user {
                args.extend(["--as", user]);
            }
            let answer = kubectl(kubeconfig, &args, Some(&text));
            if matches!(&answer, Err(e) if e.contains(&format!("ValidatingAdmissionPolicy '{policy}'")))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{policy} is not in force after 60 s: {answer:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

// --- identities --------------------------------------------------------------

/// A client of the suite's control plane as `user` (impersonated by the
/// admin), in `groups` and with `extra` user information.
async fn client_as(user: &str, groups: &[&str], extra: &[(&str, &str)]) -> Client {
    let kubeconfig = Kubeconfig::read_from(plane()).expect("kubeconfig parses");
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig is usable");
    config.auth_info.impersonate = Some(user.to_string());
    if !groups.is_empty() {
        config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
    }
    if !extra.is_empty() {
        let mut map: HashMap<String, Vec<String>> = HashMap::new();
        for (k, v) in extra {
            map.entry(k.to_string()).or_default().push(v.to_string());
        }
        config.auth_info.impersonate_user_extra = Some(map);
    }
    Client::try_from(config).expect("client builds")
}

/// A tenant: an authenticated user with no rights but its role bindings.
async fn tenant(user: &str) -> Client {
    client_as(user, &["system:authenticated"], &[]).await
}

/// The chart's controller, by its ServiceAccount (the API server adds the
/// ServiceAccount groups).
async fn controller_sa() -> Client {
    client_as(CONTROLLER_SA, &[], &[]).await
}

async fn admin() -> Client {
    controlplane::client_of(plane()).await
}

/// Creates namespace `ns` and binds each (user, default ClusterRole) in it,
/// as a cluster admin gives a team its namespace; waits until the API
/// server's authorizer has the bindings.
async fn tenant_namespace(ns: &str, bindings: &[(&str, &str)]) {
    let admin = admin().await;
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let object = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    match namespaces.create(&PostParams::default(), &object).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("namespace {ns}: {e}"),
    }
    let role_bindings: Api<RoleBinding> = Api::namespaced(admin.clone(), ns);
    for (user, role) in bindings {
        let binding = serde_json::from_value(json!({
            "metadata": {"name": format!("{user}-{role}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
        }))
        .unwrap();
        match role_bindings.create(&PostParams::default(), &binding).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("binding {user} to {role} in {ns}: {e}"),
        }
        wait_allowed(&admin, user, ns, "get").await;
    }
}

/// Waits until `user` may `verb` TrainingJobs in `ns` (a SubjectAccessReview).
async fn wait_allowed(admin: &Client, user: &str, ns: &str, verb: &str) {
    let reviews: Api<SubjectAccessReview> = Api::all(admin.clone());
    let review: SubjectAccessReview = serde_json::from_value(json!({"spec": {
        "user": user, "groups": ["system:authenticated"],
        "resourceAttributes": {"namespace": ns, "verb": verb,
            "group": "vramfit.dev", "resource": "trainingjobs"}}}))
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .expect("SubjectAccessReview");
        if answer.status.is_some_and(|s| s.allowed) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{user} still may not {verb} trainingjobs in {ns}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// --- objects ------------------------------------------------------------------

fn training_jobs(client: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("vramfit.dev", "v1alpha1", "TrainingJob");
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

fn gpu_nodes(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("vramfit.dev", "v1alpha1", "GpuNode");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

fn plain_template() -> Value {
    json!({"containers": [{"name": "t", "image": "i"}]})
}

/// A TrainingJob whose pod template's spec is `spec`.
fn training_job(name: &str, spec: Value) -> Value {
    TrainingJob::test(name).template_spec(spec).manifest()
}

fn pod(name: &str, spec: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

fn pod_with_annotation(name: &str, key: &str, value: &str) -> Pod {
    serde_json::from_value(
        json!({"metadata": {"name": name, "annotations": {key: value}},
        "spec": plain_template()}),
    )
    .unwrap()
}

fn dynamic(object: Value) -> DynamicObject {
    serde_json::from_value(object).expect("a Kubernetes object")
}

/// `[[ ... [{"y": 1}] ... ]]`: the object `levels` levels down (1: the
/// object itself), for a few dozen levels; deeper ones are text only
/// ([`with_deep`]): serde_json recurses through a `Value`, and 2,000 levels
/// of it overflow a test thread's stack.
fn nested(levels: usize) -> Value {
    let mut value = json!({"y": 1});
    for _ in 1..levels {
        value = json!([value]);
    }
    value
}

/// The placeholder [`with_deep`] replaces.
const DEEP: &str = "@deep";

/// The JSON text of `object` with its string `"@deep"` replaced by
/// [`nested`]`(levels)` written out as text.
fn with_deep(object: &Value, levels: usize) -> Vec<u8> {
    let text = object.to_string();
    let placeholder = format!("\"{DEEP}\"");
    assert!(text.contains(&placeholder), "{text}");
    let wrap = levels.saturating_sub(1);
    let deep = format!("{}{{\"y\":1}}{}", "[".repeat(wrap), "]".repeat(wrap));
    text.replacen(&placeholder, &deep, 1).into_bytes()
}

/// Creates the TrainingJob of JSON text `body` in `ns`, sent and answered as
/// text (an answer nested 2,000 deep is not parsed).
async fn create_text(
    client: &Client,
    ns: &str,
    params: &PostParams,
    body: Vec<u8>,
) -> Result<String, kube::Error> {
    let request = kube::core::Request::new(format!(
        "/apis/vramfit.dev/v1alpha1/namespaces/{ns}/trainingjobs"
    ));
    client
        .request_text(request.create(params, body).expect("a request"))
        .await
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

fn dry_run_patch() -> PatchParams {
    PatchParams {
        dry_run: true,
        ..PatchParams::default()
    }
}

// --- answers ------------------------------------------------------------------

/// The request was refused by the admission policy `policy`, with `text` in
/// its message.
fn assert_refused_by<T: std::fmt::Debug>(
    what: &str,
    answer: Result<T, kube::Error>,
    policy: &str,
    text: &str,
) {
    match answer {
        Err(kube::Error::Api(status)) => assert!(
            status
                .message
                .contains(&format!("ValidatingAdmissionPolicy '{policy}'"))
                && status.message.contains(text),
            "{what}: refused, but not by {policy} with {text:?}: {status:?}"
        ),
        Err(e) => panic!("{what}: {e}"),
        Ok(object) => panic!(
            "{what}: accepted (the attack gets through): {}",
            short(&object)
        ),
    }
}

/// The request was refused by RBAC: `user` may not `verb` `resource`.
fn assert_forbidden<T: std::fmt::Debug>(
    what: &str,
    answer: Result<T, kube::Error>,
    user: &str,
    verb: &str,
    resource: &str,
) {
    match answer {
        Err(kube::Error::Api(status)) => assert!(
            status.code == 403
                && status.message.contains(&format!(
                    "User \"{user}\" cannot {verb} resource \"{resource}\""
                )),
            "{what}: refused, but not by RBAC: {status:?}"
        ),
        Err(e) => panic!("{what}: {e}"),
        Ok(object) => panic!(
            "{what}: allowed (the attack gets through): {}",
            short(&object)
        ),
    }
}

/// The start of an answer's debug form (a whole object says too much).
fn short(answer: &impl std::fmt::Debug) -> String {
    let text = format!("{answer:?}");
    match text.char_indices().nth(300) {
        Some((at, _)) => format!("{}...", &text[..at]),
        None => text,
    }
}

fn assert_accepted<T>(what: &str, answer: Result<T, kube::Error>) -> T {
    answer.unwrap_or_else(|e| panic!("{what}: refused, and must not be: {e}"))
}

// --- the attacks ----------------------------------------------------------------

/// Attack 1: a tenant's TrainingJob whose pod template asks for the host
/// (privileged, hostPath, host namespaces, host ports, capabilities beyond
/// the baseline set, an unmasked /proc, no seccomp, unsafe sysctls), which
/// the controller would create with its own rights. Each is refused by
/// `vramfit-trainingjob-pod-security` (Pod Security baseline); the same
/// template without the field is accepted.
#[tokio::test]
async fn attack_1_a_template_asking_for_the_host_is_refused() {
    let ns = "tn-1";
    tenant_namespace(ns, &[("alice-1", "edit")]).await;
    let alice = training_jobs(&tenant("alice-1").await, ns);
    let c = |extra: Value| {
        let mut container = json!({"name": "t", "image": "i"});
        container
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        container
    };
    let attacks = [
        (
            "privileged",
            json!({"containers": [c(json!({"securityContext": {"privileged": true}}))]}),
            "privileged containers are not allowed (Pod Security baseline): t",
        ),
        (
            "a privileged ephemeral container",
            json!({"containers": [c(json!({}))], "ephemeralContainers": [{"name": "e", "image": "i",
                "securityContext": {"privileged": true}}]}),
            "privileged containers are not allowed (Pod Security baseline): e",
        ),
        (
            "hostPath /",
            json!({"containers": [c(json!({}))], "volumes": [{"name": "root", "hostPath": {"path": "/"}}]}),
            "hostPath volumes are not allowed (Pod Security baseline): root",
        ),
        (
            "hostPID",
            json!({"hostPID": true, "containers": [c(json!({}))]}),
            "hostNetwork, hostPID and hostIPC are not allowed",
        ),
        (
            "hostNetwork",
            json!({"hostNetwork": true, "containers": [c(json!({}))]}),
            "hostNetwork, hostPID and hostIPC are not allowed",
        ),
        (
            "hostIPC",
            json!({"hostIPC": true, "containers": [c(json!({}))]}),
            "hostNetwork, hostPID and hostIPC are not allowed",
        ),
        (
            "SYS_ADMIN in an init container",
            json!({"initContainers": [{"name": "s", "image": "i",
                "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}], "containers": [c(json!({}))]}),
            "capabilities beyond the baseline set are not allowed",
        ),
        (
            "a hostPort",
            json!({"containers": [c(json!({"ports": [{"containerPort": 22, "hostPort": 22}]}))]}),
            "hostPort is not allowed",
        ),
        (
            "procMount Unmasked",
            json!({"containers": [c(json!({"securityContext": {"procMount": "Unmasked"}}))]}),
            "procMount must be Default",
        ),
        (
            "seccomp Unconfined",
            json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}, "containers": [c(json!({}))]}),
            "seccompProfile.type must be RuntimeDefault or Localhost, Unconfined is not allowed",
        ),
        (
            "an unsafe sysctl",
            json!({"securityContext": {"sysctls": [{"name": "kernel.core_pattern", "value": "|/x"}]},
                "containers": [c(json!({}))]}),
            "only the safe sysctls are allowed",
        ),
    ];
    for (what, spec, message) in attacks {
        let job = dynamic(training_job("host", spec));
        assert_refused_by(
            what,
            alice.create(&dry_run(), &job).await,
            POD_SECURITY,
            message,
        );
    }
    // Without the offending fields (and with what baseline allows: a
    // capability of its set, an emptyDir) the same tenant's job is stored.
    let allowed = json!({"containers": [c(json!({"securityContext": {"capabilities": {"add": ["NET_BIND_SERVICE"]}},
        "ports": [{"containerPort": 22}]}))], "volumes": [{"name": "scratch", "emptyDir": {}}]});
    assert_accepted(
        "the same job without the host",
        alice
            .create(
                &PostParams::default(),
                &dynamic(training_job("plain", allowed)),
            )
            .await,
    );
}

/// Attack 1 (the controls of Pod Security baseline beyond the host's
/// namespaces and devices): a template that disables AppArmor (the field, in
/// a container or an init container, or the annotation of
/// `spec.template.metadata`), runs as SELinux type `spc_t` (a
/// super-privileged container) or as another SELinux user, or points a
/// probe or a lifecycle hook at another host (the kubelet connects from the
/// node). Pod Security baseline refuses each in a pod of the tenant's own
/// (checked here in a namespace that enforces it), and
/// `vramfit-trainingjob-pod-security` refuses the TrainingJob, with its own
/// message. What baseline allows of the same controls (AppArmor
/// RuntimeDefault and Localhost, the annotation `runtime/default` and
/// `localhost/*`, the SELinux types of containers with a level, a probe
/// without a host, the sysctls `net.ipv4.tcp_rmem`/`tcp_wmem`) passes both,
/// so the policy asks no more than baseline; ephemeral containers, which no
/// pod may have on create, are held by the policy alone.
#[tokio::test]
async fn attack_1_what_baseline_refuses_in_a_pod_is_refused_in_a_template() {
    let ns = "tn-1-baseline";
    tenant_namespace(ns, &[("alice-1b", "edit")]).await;
    let namespaces: Api<Namespace> = Api::all(admin().await);
    namespaces
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "baseline"}}})),
        )
        .await
        .expect("labelling the namespace");
    let alice = tenant("alice-1b").await;
    let jobs = training_jobs(&alice, ns);
    let pods: Api<Pod> = Api::namespaced(alice.clone(), ns);
    let c = |extra: Value| {
        let mut container = json!({"name": "t", "image": "i"});
        container
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        container
    };
    let init = |extra: Value| json!([{"name": "s", "image": "i", "securityContext": extra}]);
    let apparmor = "container.apparmor.security.beta.kubernetes.io/t";
    let unconfined =
        "appArmorProfile.type must be RuntimeDefault or Localhost, Unconfined is not allowed";
    let selinux_type = "seLinuxOptions.type must be container_t, container_init_t, container_kvm_t or container_engine_t";
    let selinux_user = "SELinux user and role may not be set";
    let hosts = "probes and lifecycle hooks may not set host (Pod Security baseline): t";
    let refused = [
        (
            "AppArmor Unconfined for the pod",
            json!({}),
            json!({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}, "containers": [c(json!({}))]}),
            unconfined,
        ),
        (
            "AppArmor Unconfined in an init container",
            json!({}),
            json!({"initContainers": init(json!({"appArmorProfile": {"type": "Unconfined"}})),
                "containers": [c(json!({}))]}),
            unconfined,
        ),
        (
            "the AppArmor annotation unconfined",
            json!({"annotations": {apparmor: "unconfined"}}),
            plain_template(),
            "AppArmor profiles must be runtime/default or localhost/*, unconfined is not allowed (Pod Security baseline): container.apparmor.security.beta.kubernetes.io/t",
        ),
        (
            "SELinux type spc_t for the pod",
            json!({}),
            json!({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}, "containers": [c(json!({}))]}),
            selinux_type,
        ),
        (
            "SELinux type spc_t in an init container",
            json!({}),
            json!({"initContainers": init(json!({"seLinuxOptions": {"type": "spc_t"}})),
                "containers": [c(json!({}))]}),
            selinux_type,
        ),
        (
            "an SELinux user",
            json!({}),
            json!({"containers": [c(json!({"securityContext": {"seLinuxOptions": {"user": "system_u"}}}))]}),
            selinux_user,
        ),
        (
            "an SELinux role",
            json!({}),
            json!({"securityContext": {"seLinuxOptions": {"role": "system_r"}}, "containers": [c(json!({}))]}),
            selinux_user,
        ),
        (
            "a liveness probe to another host",
            json!({}),
            json!({"containers": [c(json!({"livenessProbe": {"httpGet": {"host": "169.254.169.254", "port": 80, "path": "/"}}}))]}),
            hosts,
        ),
        (
            "a readiness probe to a node's kubelet",
            json!({}),
            json!({"containers": [c(json!({"readinessProbe": {"tcpSocket": {"host": "10.0.0.2", "port": 10250}}}))]}),
            hosts,
        ),
        (
            "a preStop hook to another host",
            json!({}),
            json!({"containers": [c(json!({"lifecycle": {"preStop": {"httpGet": {"host": "10.0.0.1", "port": 80}}}}))]}),
            hosts,
        ),
    ];
    for (what, metadata, spec, message) in refused {
        // What the tenant cannot get in a pod of their own...
        let mut own: Pod =
            serde_json::from_value(json!({"metadata": metadata.clone(), "spec": spec.clone()}))
                .unwrap();
        own.metadata.name = Some("own".into());
        match pods.create(&dry_run(), &own).await {
            Err(kube::Error::Api(s)) if s.message.contains("violates PodSecurity \"baseline") => {}
            other => panic!(
                "{what}: Pod Security baseline did not refuse the pod: {}",
                short(&other)
            ),
        }
        // ...is not had through a TrainingJob either.
        let mut job = training_job("gap", spec);
        job["spec"]["template"]["metadata"] = metadata;
        assert_refused_by(
            what,
            jobs.create(&dry_run(), &dynamic(job)).await,
            POD_SECURITY,
            message,
        );
    }
    // Ephemeral containers: the same controls, held by the policy (a pod
    // gets them only through its subresource, never from a template).
    let ephemeral = |security: Value| {
        json!({"containers": [c(json!({}))],
            "ephemeralContainers": [{"name": "e", "image": "i", "securityContext": security}]})
    };
    for (what, spec, message) in [
        (
            "AppArmor Unconfined in an ephemeral container",
            ephemeral(json!({"appArmorProfile": {"type": "Unconfined"}})),
            unconfined,
        ),
        (
            "SELinux type spc_t in an ephemeral container",
            ephemeral(json!({"seLinuxOptions": {"type": "spc_t"}})),
            selinux_type,
        ),
    ] {
        assert_refused_by(
            what,
            jobs.create(&dry_run(), &dynamic(training_job("gap", spec)))
                .await,
            POD_SECURITY,
            message,
        );
    }
    // What baseline allows of the same controls passes both.
    let allowed = [
        (
            "AppArmor RuntimeDefault and Localhost",
            json!({}),
            json!({"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}},
                "containers": [c(json!({"securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "trainer"}}}))]}),
        ),
        (
            "the AppArmor annotations runtime/default and localhost/*",
            json!({"annotations": {apparmor: "runtime/default",
                "container.apparmor.security.beta.kubernetes.io/s": "localhost/trainer"}}),
            json!({"initContainers": [{"name": "s", "image": "i"}], "containers": [c(json!({}))]}),
        ),
        (
            "the SELinux types of containers, a level, empty user and role",
            json!({}),
            json!({"securityContext": {"seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2", "user": "", "role": ""}},
                "initContainers": init(json!({"seLinuxOptions": {"type": "container_init_t"}})),
                "containers": [c(json!({"securityContext": {"seLinuxOptions": {"type": "container_kvm_t"}}}))]}),
        ),
        (
            "probes and hooks without a host, tcp_rmem and tcp_wmem",
            json!({}),
            json!({"securityContext": {"sysctls": [{"name": "net.ipv4.tcp_rmem", "value": "4096 87380 6291456"},
                    {"name": "net.ipv4.tcp_wmem", "value": "4096 87380 6291456"}]},
                "containers": [c(json!({"livenessProbe": {"httpGet": {"port": 8080, "path": "/healthz"}},
                "readinessProbe": {"tcpSocket": {"host": "", "port": 8080}},
                "lifecycle": {"preStop": {"httpGet": {"port": 8080, "path": "/stop"}}}}))]}),
        ),
    ];
    for (what, metadata, spec) in allowed {
        let mut own: Pod =
            serde_json::from_value(json!({"metadata": metadata.clone(), "spec": spec.clone()}))
                .unwrap();
        own.metadata.name = Some("own".into());
        assert_accepted(
            &format!("{what}: a pod of her own"),
            pods.create(&dry_run(), &own).await,
        );
        let mut job = training_job("allowed", spec);
        job["spec"]["template"]["metadata"] = metadata;
        assert_accepted(
            &format!("{what}: a TrainingJob"),
            jobs.create(&dry_run(), &dynamic(job)).await,
        );
    }
}

/// Attack 1c: a tenant reads, changes or deletes another tenant's
/// TrainingJobs. The chart's TrainingJob roles aggregate into `edit` and
/// `view`, bound per namespace: alice (edit in her namespace) can do none of
/// it in bob's, bob can in his, carol (view in bob's) reads only, and no
/// tenant writes a job's status (its placement) itself.
#[tokio::test]
async fn attack_1c_a_tenant_cannot_read_or_change_another_tenants_jobs() {
    let (alice_ns, bob_ns) = ("tn-1c-alice", "tn-1c-bob");
    tenant_namespace(alice_ns, &[("alice-1c", "edit")]).await;
    tenant_namespace(bob_ns, &[("bob-1c", "edit"), ("carol-1c", "view")]).await;
    let alice = tenant("alice-1c").await;
    let bob = training_jobs(&tenant("bob-1c").await, bob_ns);
    let carol = training_jobs(&tenant("carol-1c").await, bob_ns);
    let alice_in_bobs = training_jobs(&alice, bob_ns);
    let alice_own = training_jobs(&alice, alice_ns);
    let job = dynamic(training_job("bobs", plain_template()));
    assert_accepted(
        "bob creates his job",
        bob.create(&PostParams::default(), &job).await,
    );
    let label = Patch::Merge(json!({"metadata": {"labels": {"owner": "alice"}}}));
    let status = Patch::Merge(json!({"status": {"phase": "Placed"}}));

    assert_forbidden(
        "alice gets bob's job",
        alice_in_bobs.get("bobs").await,
        "alice-1c",
        "get",
        "trainingjobs",
    );
    assert_forbidden(
        "alice lists bob's namespace",
        alice_in_bobs.list(&ListParams::default()).await,
        "alice-1c",
        "list",
        "trainingjobs",
    );
    assert_forbidden(
        "alice watches bob's namespace",
        alice_in_bobs
            .watch(&kube::api::WatchParams::default(), "0")
            .await
            .map(|_| ()),
        "alice-1c",
        "watch",
        "trainingjobs",
    );
    assert_forbidden(
        "alice lists every namespace",
        training_jobs_all(&alice).list(&ListParams::default()).await,
        "alice-1c",
        "list",
        "trainingjobs",
    );
    assert_forbidden(
        "alice patches bob's job",
        alice_in_bobs
            .patch("bobs", &PatchParams::default(), &label)
            .await,
        "alice-1c",
        "patch",
        "trainingjobs",
    );
    assert_forbidden(
        "alice creates a job in bob's namespace",
        alice_in_bobs
            .create(
                &PostParams::default(),
                &dynamic(training_job("alices", plain_template())),
            )
            .await,
        "alice-1c",
        "create",
        "trainingjobs",
    );
    assert_forbidden(
        "alice deletes bob's job",
        alice_in_bobs
            .delete("bobs", &DeleteParams::default())
            .await
            .map(|_| ()),
        "alice-1c",
        "delete",
        "trainingjobs",
    );
    // carol, bob's viewer, reads his job and changes nothing.
    assert_accepted("carol gets bob's job", carol.get("bobs").await);
    assert_accepted(
        "carol lists bob's namespace",
        carol.list(&ListParams::default()).await,
    );
    assert_forbidden(
        "carol patches bob's job",
        carol.patch("bobs", &PatchParams::default(), &label).await,
        "carol-1c",
        "patch",
        "trainingjobs",
    );
    assert_forbidden(
        "carol deletes bob's job",
        carol
            .delete("bobs", &DeleteParams::default())
            .await
            .map(|_| ()),
        "carol-1c",
        "delete",
        "trainingjobs",
    );
    // A job's status (its placement, budget) is the controller's: its own
    // author does not write it either.
    assert_forbidden(
        "bob writes his job's status",
        bob.patch_status("bobs", &PatchParams::default(), &status)
            .await,
        "bob-1c",
        "patch",
        "trainingjobs/status",
    );
    // In her own namespace alice does all of it.
    assert_accepted(
        "alice creates her job",
        alice_own
            .create(
                &PostParams::default(),
                &dynamic(training_job("alices", plain_template())),
            )
            .await,
    );
    assert_accepted("alice gets her job", alice_own.get("alices").await);
    assert_accepted(
        "alice patches her job",
        alice_own
            .patch("alices", &PatchParams::default(), &label)
            .await,
    );
    assert_accepted(
        "alice deletes her job",
        alice_own.delete("alices", &DeleteParams::default()).await,
    );
    // And bob in his: the refusals above were about who asked.
    assert_accepted("bob gets his job", bob.get("bobs").await);
    assert_accepted(
        "bob patches his job",
        bob.patch("bobs", &PatchParams::default(), &label).await,
    );
    assert_accepted(
        "bob deletes his job",
        bob.delete("bobs", &DeleteParams::default()).await,
    );
}

fn training_jobs_all(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("vramfit.dev", "v1alpha1", "TrainingJob");
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// Attack 2a: a tenant's pod names a GPU itself, by the NRI plugin's CDI
/// annotation, containerd's `cdi.k8s.io/*` or an `env` entry named
/// `NVIDIA_VISIBLE_DEVICES` (a value or a `valueFrom`, in a container or an
/// init container), when created or added later. Each is refused by
/// `vramfit-gpu-access`; the tenant's plain pod is accepted, and the
/// controller's ServiceAccount creates the same pods.
///
/// The variable brought by `envFrom` (a ConfigMap or Secret key, or a
/// `prefix` that makes the name) is out of admission's sight: the policy
/// cannot read the ConfigMap, and it may change after the pod is admitted.
/// The node holds it (row 2b of docs/security.md: the NRI plugin replaces
/// `NVIDIA_VISIBLE_DEVICES` in every container, whatever its source; Go
/// tests in hack/node/containerd), and in a training pod the controller's
/// explicit value, which Kubernetes gives precedence over `envFrom`
/// ([`attack_2c_a_template_asking_for_gpus_by_other_keys_gets_only_the_placed_one`]).
#[tokio::test]
async fn attack_2a_a_pod_naming_a_gpu_itself_is_refused() {
    let ns = "tn-2a";
    tenant_namespace(ns, &[("alice-2a", "edit")]).await;
    let alice: Api<Pod> = Api::namespaced(tenant("alice-2a").await, ns);
    let controller: Api<Pod> = Api::namespaced(controller_sa().await, ns);
    let cdi = "may not carry CDI device annotations";
    let visible = "a container may not set NVIDIA_VISIBLE_DEVICES";
    let env = json!([{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]);
    let attacks = [
        (
            "the NRI plugin's annotation",
            pod_with_annotation(
                "gpu",
                "cdi-devices.noderesource.dev/container.t",
                "- nvidia.com/gpu=GPU-x",
            ),
            cdi,
        ),
        (
            "the NRI plugin's pod-wide annotation",
            pod_with_annotation(
                "gpu",
                "cdi-devices.noderesource.dev/pod",
                "- nvidia.com/gpu=GPU-x",
            ),
            cdi,
        ),
        (
            "containerd's CDI annotation",
            pod_with_annotation("gpu", "cdi.k8s.io/gpu", "nvidia.com/gpu=all"),
            cdi,
        ),
        (
            "NVIDIA_VISIBLE_DEVICES",
            pod(
                "gpu",
                json!({"containers": [{"name": "t", "image": "i", "env": env}]}),
            ),
            visible,
        ),
        (
            "NVIDIA_VISIBLE_DEVICES in an init container",
            pod(
                "gpu",
                json!({"initContainers": [{"name": "s", "image": "i", "env": env}],
                "containers": [{"name": "t", "image": "i"}]}),
            ),
            visible,
        ),
        (
            "NVIDIA_VISIBLE_DEVICES from a ConfigMap key (valueFrom)",
            pod(
                "gpu",
                json!({"containers": [{"name": "t", "image": "i", "env": [{"name": "NVIDIA_VISIBLE_DEVICES",
                    "valueFrom": {"configMapKeyRef": {"name": "gpus", "key": "devices"}}}]}]}),
            ),
            visible,
        ),
    ];
    for (what, object, message) in &attacks {
        assert_refused_by(
            &format!("alice's pod with {what}"),
            alice.create(&dry_run(), object).await,
            GPU_ACCESS,
            message,
        );
        assert_accepted(
            &format!("the controller's pod with {what}"),
            controller.create(&dry_run(), object).await,
        );
    }
    // Her plain pod is stored; the annotation added to it afterwards is
    // refused as well (an UPDATE).
    assert_accepted(
        "alice's plain pod",
        alice
            .create(&PostParams::default(), &pod("plain", plain_template()))
            .await,
    );
    let add = Patch::Merge(json!({"metadata": {"annotations": {
        "cdi-devices.noderesource.dev/container.t": "- nvidia.com/gpu=GPU-x"}}}));
    assert_refused_by(
        "alice adds the annotation to her pod",
        alice.patch("plain", &PatchParams::default(), &add).await,
        GPU_ACCESS,
        cdi,
    );
    assert_accepted(
        "alice adds another annotation to her pod",
        alice
            .patch(
                "plain",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"team": "nlp"}}})),
            )
            .await,
    );
    // `kubectl debug` adds a container through the pods/ephemeralcontainers
    // subresource, which the policy matches too (anyone granted it; here
    // the admin, whom the policy holds as well).
    let admin_pods: Api<Pod> = Api::namespaced(admin().await, ns);
    let debug = |env: Value| {
        Patch::Strategic(json!({"spec": {"ephemeralContainers": [
            {"name": "debug", "image": "i", "env": env}]}}))
    };
    assert_refused_by(
        "a debug container with NVIDIA_VISIBLE_DEVICES added through pods/ephemeralcontainers",
        admin_pods
            .patch_subresource(
                "ephemeralcontainers",
                "plain",
                &dry_run_patch(),
                &debug(env.clone()),
            )
            .await,
        GPU_ACCESS,
        visible,
    );
    assert_accepted(
        "a debug container without it",
        admin_pods
            .patch_subresource(
                "ephemeralcontainers",
                "plain",
                &dry_run_patch(),
                &debug(json!([{"name": "TERM", "value": "xterm"}])),
            )
            .await,
    );
}

/// Attack 2d: a tenant's pod grants itself a placement or a budget, which the
/// node agent would enforce, when created or added later. Refused by
/// `vramfit-gpu-access`; the controller's ServiceAccount creates such pods.
#[tokio::test]
async fn attack_2d_a_pod_granting_itself_a_placement_or_a_budget_is_refused() {
    let ns = "tn-2d";
    tenant_namespace(ns, &[("alice-2d", "edit")]).await;
    let alice: Api<Pod> = Api::namespaced(tenant("alice-2d").await, ns);
    let controller: Api<Pod> = Api::namespaced(controller_sa().await, ns);
    let message = "vramfit.dev/placement and vramfit.dev/budget-bytes are written by the vramfit controller only";
    let placement = json!({"node": "n", "gpus": [{"index": 0, "uuid": "GPU-x"}],
        "budgetBytes": 1u64 << 40, "memoryFraction": 1.0, "attempt": 1})
    .to_string();
    let grants = [
        ("vramfit.dev/placement", placement.as_str()),
        ("vramfit.dev/budget-bytes", "999999999999"),
    ];
    for (key, value) in grants {
        let object = pod_with_annotation("granted", key, value);
        assert_refused_by(
            &format!("alice's pod with {key}"),
            alice.create(&dry_run(), &object).await,
            GPU_ACCESS,
            message,
        );
        assert_accepted(
            &format!("the controller's pod with {key}"),
            controller.create(&dry_run(), &object).await,
        );
    }
    assert_accepted(
        "alice's plain pod",
        alice
            .create(&PostParams::default(), &pod("plain", plain_template()))
            .await,
    );
    for (key, value) in grants {
        let grant = Patch::Merge(json!({"metadata": {"annotations": {key: value}}}));
        assert_refused_by(
            &format!("alice adds {key} to her pod"),
            alice.patch("plain", &PatchParams::default(), &grant).await,
            GPU_ACCESS,
            message,
        );
    }
    assert_accepted(
        "alice adds another annotation to her pod",
        alice
            .patch(
                "plain",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"team": "nlp"}}})),
            )
            .await,
    );
}

/// Attack 2c (through the controller): a tenant's TrainingJob template that
/// asks for GPUs itself, by the NRI plugin's annotations (pod-wide, per
/// container), a placement or budget annotation and `NVIDIA_VISIBLE_DEVICES`
/// in its containers. The real controller, running as the chart's
/// ServiceAccount (which `vramfit-gpu-access` lets write them), creates a
/// pod that carries the placement's GPU and budget only.
#[tokio::test]
async fn attack_2c_a_template_asking_for_gpus_gets_only_the_placed_one() {
    let (cluster, _controller, _kubeconfig) = controller_as_its_service_account("tn2c").await;
    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let mut job = mlp_job("greedy", 64, 8, 1, None);
    job["spec"]["template"] = json!({
        "metadata": {"annotations": {
            "cdi-devices.noderesource.dev/pod": "- nvidia.com/gpu=GPU-other",
            "cdi-devices.noderesource.dev/container.train": "- nvidia.com/gpu=GPU-other",
            "cdi-devices.noderesource.dev/container.setup": "- nvidia.com/gpu=GPU-other",
            "vramfit.dev/budget-bytes": "999999999999",
            "vramfit.dev/placement": json!({"node": node, "gpus": [{"index": 0, "uuid": "GPU-other"}],
                "budgetBytes": 1u64 << 40, "memoryFraction": 1.0, "attempt": 1}).to_string(),
            "team": "nlp"}},
        "spec": {
            "initContainers": [{"name": "setup", "image": "i", "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}],
            "containers": [{"name": "train", "image": "trainer", "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                {"name": "VRAMFIT_MEMORY_FRACTION", "value": "1.0"}],
                "resources": {"requests": {"cpu": "2", "memory": "8Gi"}}}]}
    });
    let (job, pod) = tenant_job_and_its_pod(&cluster, "alice-2c", job).await;
    let placement = job.status.unwrap().placement.expect("placed");
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let devices: Vec<(&String, &String)> = annotations
        .iter()
        .filter(|(k, _)| k.starts_with("cdi-devices.noderesource.dev/"))
        .collect();
    let gpu = &placement.gpus[0].uuid;
    assert_eq!(
        devices,
        [(
            &"cdi-devices.noderesource.dev/container.train".to_string(),
            &format!("- nvidia.com/gpu={gpu}\n")
        )],
        "{annotations:?}"
    );
    assert_eq!(
        annotations["vramfit.dev/budget-bytes"],
        placement.budget_bytes.to_string()
    );
    let recorded: Value =
        serde_json::from_str(&annotations["vramfit.dev/placement"]).expect("placement JSON");
    assert_eq!(recorded["gpus"][0]["uuid"], json!(gpu));
    assert_eq!(recorded["node"], json!(node));
    assert_eq!(
        annotations["team"], "nlp",
        "the template's own annotations stay"
    );
    let spec = pod.spec.expect("pod spec");
    let visible = |c: &k8s_openapi::api::core::v1::Container| -> Vec<String> {
        c.env
            .iter()
            .flatten()
            .filter(|v| v.name == "NVIDIA_VISIBLE_DEVICES")
            .map(|v| v.value.clone().unwrap_or_default())
            .collect()
    };
    assert_eq!(visible(&spec.containers[0]), std::slice::from_ref(gpu));
    // An init container gets no GPU: the template's "all" is replaced by
    // the controller's explicit "void".
    assert_eq!(
        visible(&spec.init_containers.expect("init containers")[0]),
        ["void"]
    );
    let fraction: Vec<&str> = spec.containers[0]
        .env
        .iter()
        .flatten()
        .filter(|v| v.name == "VRAMFIT_MEMORY_FRACTION")
        .map(|v| v.value.as_deref().unwrap_or_default())
        .collect();
    assert_eq!(fraction.len(), 1);
    assert_ne!(fraction[0], "1.0");
}

/// Attack 2c (the sources a template's keys alone do not show): a template
/// with containerd's `cdi.k8s.io/*` annotation, and `NVIDIA_VISIBLE_DEVICES`
/// brought by `envFrom` of a ConfigMap in its container and its init
/// container, which no admission policy can see (attack 2a). The controller
/// drops `cdi.k8s.io/*` as it drops `cdi-devices.noderesource.dev/*`, keeps
/// the `envFrom` sources (a tenant's own settings) and sets
/// `NVIDIA_VISIBLE_DEVICES` explicitly in every container, the placed GPU in
/// the training container and "void" in the init container: an explicit
/// variable wins over any `envFrom` source, so neither gets another GPU.
#[tokio::test]
async fn attack_2c_a_template_asking_for_gpus_by_other_keys_gets_only_the_placed_one() {
    let (cluster, _controller, _kubeconfig) = controller_as_its_service_account("tn2cg").await;
    cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let admin_maps: Api<ConfigMap> = Api::namespaced(cluster.client.clone(), &cluster.namespace);
    let config: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "gpus"}, "data": {"NVIDIA_VISIBLE_DEVICES": "all"}}),
    )
    .unwrap();
    admin_maps
        .create(&PostParams::default(), &config)
        .await
        .expect("ConfigMap");
    let from_config = json!([{"configMapRef": {"name": "gpus"}}]);
    let mut job = mlp_job("greedy", 64, 8, 1, None);
    job["spec"]["template"]["metadata"] =
        json!({"annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}});
    job["spec"]["template"]["spec"]["containers"][0]["envFrom"] = from_config.clone();
    job["spec"]["template"]["spec"]["initContainers"] = json!([{"name": "setup", "image": "i",
        "envFrom": from_config}]);
    let (placed, pod) = tenant_job_and_its_pod(&cluster, "alice-2cg", job).await;
    let gpu = placed.status.unwrap().placement.expect("placed").gpus[0]
        .uuid
        .clone();
    let annotations = pod.metadata.annotations.unwrap_or_default();
    let kept: Vec<&String> = annotations
        .keys()
        .filter(|k| k.starts_with("cdi.k8s.io/"))
        .collect();
    assert!(kept.is_empty(), "the controller's pod carries {kept:?}");
    let spec = pod.spec.expect("spec");
    let init = spec.init_containers.expect("init containers");
    for (container, want) in [(&spec.containers[0], gpu.as_str()), (&init[0], "void")] {
        let visible: Vec<Option<String>> = container
            .env
            .iter()
            .flatten()
            .filter(|v| v.name == "NVIDIA_VISIBLE_DEVICES")
            .map(|v| v.value.clone())
            .collect();
        assert!(
            container.env_from.is_some() && visible == [Some(want.to_string())],
            "{}: NVIDIA_VISIBLE_DEVICES {visible:?} beside envFrom {:?}, want {want:?}",
            container.name,
            container.env_from
        );
    }
}

/// A kubeconfig of the suite's control plane that impersonates `user`
/// (removed when the returned path is dropped).
fn impersonating(user: &str, name: &str) -> tempfile::TempPath {
    let mut kubeconfig = Kubeconfig::read_from(plane()).expect("kubeconfig parses");
    for named in &mut kubeconfig.auth_infos {
        if let Some(auth) = named.auth_info.as_mut() {
            auth.impersonate = Some(user.to_string());
        }
    }
    let path = tempfile::Builder::new()
        .prefix(&format!("vramfit-{name}-controller-"))
        .suffix(".kubeconfig")
        .tempfile()
        .expect("a temporary file")
        .into_temp_path();
    std::fs::write(&path, serde_json::to_string(&kubeconfig).unwrap()).expect("kubeconfig");
    path
}

/// A test cluster on the suite's control plane whose controller runs as the
/// chart's ServiceAccount (a kubeconfig that impersonates it, removed when
/// the returned path is dropped), under the chart's RBAC and admission
/// policies.
async fn controller_as_its_service_account(
    name: &str,
) -> (
    TestCluster,
    crate::driver::ControllerProcess,
    tempfile::TempPath,
) {
    let cluster = TestCluster::on(name, plane()).await;
    let path = impersonating(CONTROLLER_SA, name);
    let controller =
        cluster.start_logged_controller_via(&path, &["--no-leader-election"], "127.0.0.1:0");
    (cluster, controller, path)
}

/// `user` (edit in the cluster's namespace) applies `job`; the job once
/// placed and the pod the controller made for it.
async fn tenant_job_and_its_pod(
    cluster: &TestCluster,
    user: &str,
    job: Value,
) -> (TrainingJob, Pod) {
    tenant_namespace(&cluster.namespace, &[(user, "edit")]).await;
    let name = job["metadata"]["name"].as_str().unwrap().to_string();
    let jobs = training_jobs(&tenant(user).await, &cluster.namespace);
    assert_accepted(
        "the tenant's job",
        jobs.create(&PostParams::default(), &dynamic(job)).await,
    );
    let placed = cluster.wait_phase(&name, Phase::Placed).await;
    let pod = cluster.wait_pod(&format!("{name}-a1")).await;
    (placed, pod)
}

/// Attack 8: a compromised agent writes another node's GpuNode (forged OOM
/// reports or usage). With a token bound to node a, the agent's
/// ServiceAccount writes node a's GpuNode and its status, and neither of node
/// b's, nor creates another node's; a token bound to no node writes none.
/// Refused by `vramfit-agent-own-node`; the controller is not held to it.
#[tokio::test]
async fn attack_8_an_agent_writes_the_gpunode_of_its_own_node_only() {
    let admin = admin().await;
    let (a, b) = ("tn8-node-a", "tn8-node-b");
    for node in [a, b] {
        let object = dynamic(GpuNode::test(node).manifest());
        match gpu_nodes(&admin)
            .create(&PostParams::default(), &object)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("GpuNode {node}: {e}"),
        }
    }
    let agent_of = |node: &'static str| async move {
        gpu_nodes(&client_as(AGENT_SA, &[], &[(NODE_NAME_EXTRA, node)]).await)
    };
    let agent_a = agent_of(a).await;
    let agent_b = agent_of(b).await;
    let unbound = gpu_nodes(&client_as(AGENT_SA, &[], &[]).await);
    let write = Patch::Merge(json!({"metadata": {"annotations": {"forged": "yes"}}}));
    let params = dry_run_patch();

    assert_accepted(
        "agent of a writes a",
        agent_a.patch(a, &params, &write).await,
    );
    assert_accepted(
        "agent of a writes a's status",
        agent_a.patch_status(a, &params, &write).await,
    );
    let other = format!("an agent writes its own node's GpuNode only: {b} is not {a}");
    assert_refused_by(
        "agent of a writes b",
        agent_a.patch(b, &params, &write).await,
        OWN_NODE,
        &other,
    );
    assert_refused_by(
        "agent of a writes b's status",
        agent_a.patch_status(b, &params, &write).await,
        OWN_NODE,
        &other,
    );
    let new = dynamic(GpuNode::test("tn8-node-c").manifest());
    assert_refused_by(
        "agent of a creates c",
        agent_a.create(&dry_run(), &new).await,
        OWN_NODE,
        &format!("tn8-node-c is not {a}"),
    );
    assert_refused_by(
        "an agent token bound to no node writes a",
        unbound.patch(a, &params, &write).await,
        OWN_NODE,
        "is not the node of a node-bound token",
    );
    // b's own agent writes b; the controller writes any GpuNode's status.
    assert_accepted(
        "agent of b writes b",
        agent_b.patch_status(b, &params, &write).await,
    );
    let controller = gpu_nodes(&controller_sa().await);
    assert_accepted(
        "the controller writes b's status",
        controller.patch_status(b, &params, &write).await,
    );
}

/// Attack 5b (at admission): a tenant's TrainingJob nested 2,000 levels deep
/// in its free-form `huggingFace.config` or `template`, past the JSON parser
/// of the controller's client (128 levels). Refused by
/// `vramfit-trainingjob-bounds`; the same config nested 20 levels is stored.
#[tokio::test]
async fn attack_5b_a_job_nested_2000_deep_is_refused_at_admission() {
    let ns = "tn-5b";
    tenant_namespace(ns, &[("alice-5b", "edit")]).await;
    let alice = tenant("alice-5b").await;
    let mut config = training_job("deep", plain_template());
    config["spec"]["model"] = json!({"huggingFace": {"seqLen": 128,
        "config": {"model_type": "gpt2", "x": DEEP}}});
    assert_refused_by(
        "a config nested 2,000 deep",
        create_text(&alice, ns, &dry_run(), with_deep(&config, 2000)).await,
        BOUNDS,
        "spec.model.huggingFace.config nests more than 24 levels",
    );
    let mut template = training_job("deep-template", plain_template());
    template["spec"]["template"]["spec"]["x"] = json!(DEEP);
    assert_refused_by(
        "a template nested 2,000 deep",
        create_text(&alice, ns, &dry_run(), with_deep(&template, 2000)).await,
        BOUNDS,
        "spec.template nests more than 24 levels",
    );
    // What real configs and templates nest (a few levels, a dozen) passes.
    assert_accepted(
        "a config nested 20 deep",
        create_text(&alice, ns, &PostParams::default(), with_deep(&config, 20)).await,
    );
    assert_accepted(
        "a template nested 20 deep",
        create_text(&alice, ns, &dry_run(), with_deep(&template, 20)).await,
    );
}

/// Attack 5b (stored, the controller's own defence): where nothing bounds
/// the nesting at admission (a cluster without the chart's
/// `vramfit-trainingjob-bounds`, or jobs stored before it was installed: a
/// private control plane without the chart here), the API server stores one
/// job nested 2,000 levels deep in its config and one in its template. A plain JSON
/// reading of the LIST fails (what stopped the controller before); the
/// vramfit crate's `Api<TrainingJob>` reads it and `free_form::too_deep`
/// names the field; the real controller, started after them, places a plain
/// job of the same namespace, fails the deep ones as Invalid naming the
/// field, and `vramfit status` answers.
#[tokio::test]
async fn attack_5b_a_stored_deep_job_fails_alone_and_the_others_are_placed() {
    let plane = PrivateControlPlane::start("tenants-deep");
    let cluster = TestCluster::on("tn5b", plane.kubeconfig()).await;
    let ns = cluster.namespace.clone();
    let mut deep_config = mlp_job("deep-config", 64, 8, 1, None);
    deep_config["spec"]["model"] = json!({"huggingFace": {"seqLen": 128,
        "config": {"model_type": "gpt2", "x": DEEP}}});
    let mut deep_template = mlp_job("deep-template", 64, 8, 1, None);
    deep_template["spec"]["template"]["spec"]["x"] = json!(DEEP);
    for job in [&deep_config, &deep_template] {
        assert_accepted(
            "the API server stores a job nested 2,000 deep",
            create_text(
                &cluster.client,
                &ns,
                &PostParams::default(),
                with_deep(job, 2000),
            )
            .await,
        );
    }
    let list = kube::core::Request::new(format!(
        "/apis/vramfit.dev/v1alpha1/namespaces/{ns}/trainingjobs"
    ));
    let raw = cluster
        .client
        .request_text(list.list(&ListParams::default()).unwrap())
        .await
        .expect("raw LIST");
    let plain = serde_json::from_str::<Value>(&raw).expect_err("a plain reading fails");
    assert!(plain.to_string().contains("recursion limit"), "{plain}");

    let jobs = cluster
        .jobs()
        .list(&ListParams::default())
        .await
        .expect("the typed LIST reads");
    let config = jobs
        .items
        .iter()
        .find(|j| j.metadata.name.as_deref() == Some("deep-config"))
        .and_then(|j| j.spec.model.hugging_face.as_ref())
        .map(|hf| hf.config.clone())
        .expect("deep-config listed with its config");
    assert_eq!(config["model_type"], "gpt2");
    let config_path = too_deep(&config).expect("the deep field is named");
    assert_eq!(config_path, format!("x{}", "[0]".repeat(MAX_DEPTH)));
    let template = jobs
        .items
        .iter()
        .find(|j| j.metadata.name.as_deref() == Some("deep-template"))
        .map(|j| j.spec.template.clone())
        .expect("deep-template listed");
    let template_path = too_deep(&template).expect("the deep field is named");
    assert!(template_path.starts_with("spec.x[0]"), "{template_path}");

    let node = cluster.add_gpu_node("n1", &[("H100-80GB", 80 * GIB)]).await;
    let _controller = cluster.start_logged_controller(&["--no-leader-election"], "127.0.0.1:0");
    cluster.apply_job(mlp_job("plain", 64, 8, 1, None)).await;
    let placed = cluster.wait_phase("plain", Phase::Placed).await;
    let status = placed.status.unwrap();
    assert!(status.predicted_bytes.is_some_and(|b| b > 0));
    assert_eq!(status.placement.expect("placement").node, node);
    for (name, field) in [
        ("deep-config", format!("huggingFace.config.{config_path}")),
        ("deep-template", format!("spec.template.{template_path}")),
    ] {
        let job = cluster.wait_phase(name, Phase::Failed).await;
        let invalid = job
            .status
            .unwrap()
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Invalid")
            .expect("an Invalid condition");
        assert_eq!(invalid.status, "True");
        assert!(
            invalid
                .message
                .contains(&format!("{field} is nested deeper than {MAX_DEPTH} levels")),
            "{name}: {}",
            invalid.message
        );
    }
    let status = Command::new(vramfit_bin())
        .args(["status", "-n", &ns, "-o", "json"])
        .env("KUBECONFIG", plane.kubeconfig())
        .output()
        .expect("vramfit status runs");
    assert!(
        status.status.success(),
        "vramfit status: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    let view: Value = serde_json::from_slice(&status.stdout).expect("vramfit status -o json");
    assert_eq!(view["phases"], json!({"Failed": 2, "Placed": 1}), "{view}");
    assert_eq!(
        view["nodes"][0]["gpus"][0]["jobs"][0]["name"], "plain",
        "{view}"
    );
}

/// A token of ServiceAccount `name` in `ns` (created), as `kubectl create
/// token` gets one.
async fn service_account_token(ns: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin().await, ns);
    let account = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    match accounts.create(&PostParams::default(), &account).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("ServiceAccount {ns}/{name}: {e}"),
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("a token of {ns}/{name}: {e}"))
        .status
        .expect("a TokenRequest's status")
        .token
}

/// Attack 7: the `/ui` page, reached by anyone who can reach its address,
/// showed every namespace's jobs. With `--ui-auth kubernetes` (the chart's
/// `controller.ui.authentication`), a request needs a bearer token the API
/// server accepts, and its user sees only the jobs of the namespaces where
/// they may list TrainingJobs, and the GPU nodes only if they may list
/// GpuNodes. The controller runs cluster-wide as the chart's ServiceAccount
/// (which may review tokens and access only through the chart's
/// auth-delegator binding), as a standby: the Lease is held by another
/// replica, so it places nothing and lists what the page shows.
#[tokio::test]
async fn attack_7_the_ui_shows_a_reader_only_what_they_may_list() {
    use k8s_openapi::api::coordination::v1::Lease;
    let admin = admin().await;
    let (own, other) = ("tn7-a", "tn7-b");
    tenant_namespace(own, &[]).await;
    tenant_namespace(other, &[]).await;
    for (ns, name) in [(own, "tn7-mine"), (other, "tn7-theirs")] {
        let mut job = training_job(name, plain_template());
        job["spec"]["memory"] = json!({"request": "20Gi"});
        match training_jobs(&admin, ns)
            .create(&PostParams::default(), &dynamic(job))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => panic!("job {ns}/{name}: {e}"),
        }
        // What a controller would have written: the page lists a waiting job
        // by name.
        let waiting = json!({"status": {"phase": "Pending", "attempt": 1,
            "message": "waiting for a GPU with room"}});
        training_jobs(&admin, ns)
            .patch_status(name, &PatchParams::default(), &Patch::Merge(waiting))
            .await
            .unwrap_or_else(|e| panic!("status of {ns}/{name}: {e}"));
    }
    let node = dynamic(GpuNode::test("tn7-node").manifest());
    match gpu_nodes(&admin)
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("GpuNode tn7-node: {e}"),
    }
    // The Lease, held for an hour by a replica that is not this one.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), RELEASE_NAMESPACE);
    let now = k8s_openapi::jiff::Timestamp::now();
    let lease = serde_json::from_value(json!({
        "metadata": {"name": "tn7-lease"},
        "spec": {"holderIdentity": "another-replica", "leaseDurationSeconds": 3600,
                 "acquireTime": now, "renewTime": now},
    }))
    .unwrap();
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("Lease: {e}"),
    }
    let port = free_port();
    let kubeconfig = impersonating(CONTROLLER_SA, "tn7");
    let controller = std::process::Command::new(vramfit_bin())
        .args(["controller", "--lease-namespace", RELEASE_NAMESPACE])
        .args(["--lease-name", "tn7-lease", "--metrics-addr", "127.0.0.1:0"])
        .args([
            "--ui-addr",
            &format!("127.0.0.1:{port}"),
            "--ui-auth",
            "kubernetes",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("vramfit controller starts");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _stop = Kill(controller);
    // Identities: a viewer of the test's namespace, a ServiceAccount with no
    // rights, and a reader of every namespace and of the GPU nodes.
    let bind = |ns: String, subject: String, role: &'static str| {
        let admin = admin.clone();
        async move {
            let bindings: Api<RoleBinding> = Api::namespaced(admin, &ns);
            let binding = serde_json::from_value(json!({
                "metadata": {"name": format!("{subject}-{role}")},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": ns}],
            }))
            .unwrap();
            match bindings.create(&PostParams::default(), &binding).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => panic!("binding {subject}: {e}"),
            }
        }
    };
    let viewer = service_account_token(own, "tn7-viewer").await;
    bind(own.to_string(), "tn7-viewer".into(), "view").await;
    let nobody = service_account_token(own, "tn7-nobody").await;
    let reader = service_account_token(own, "tn7-reader").await;
    {
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        let role = serde_json::from_value(json!({
            "metadata": {"name": "tn7-reader"},
            "rules": [{"apiGroups": ["vramfit.dev"], "resources": ["trainingjobs", "gpunodes"],
                       "verbs": ["list"]}],
        }))
        .unwrap();
        let binding = serde_json::from_value(json!({
            "metadata": {"name": "tn7-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "tn7-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "tn7-reader", "namespace": own}],
        }))
        .unwrap();
        let roles: Api<ClusterRole> = Api::all(admin.clone());
        let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
        for answer in [
            roles
                .create(&PostParams::default(), &role)
                .await
                .map(|_| ()),
            bindings
                .create(&PostParams::default(), &binding)
                .await
                .map(|_| ()),
        ] {
            match answer {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => panic!("the reader's ClusterRole: {e}"),
            }
        }
    }
    for account in ["tn7-viewer", "tn7-reader"] {
        wait_allowed(
            &admin,
            &format!("system:serviceaccount:{own}:{account}"),
            own,
            "list",
        )
        .await;
    }

    // The page once it serves the reader both jobs (the API server's
    // authorizer has the bindings, the controller's caches both jobs).
    let deadline = Instant::now() + Duration::from_secs(60);
    let whole = loop {
        if let Ok((200, body)) = http_get(port, "/ui/status.json", Some(&reader))
            && body.contains("tn7-theirs")
            && body.contains("tn7-mine")
        {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the reader never saw both jobs: {:?}",
            http_get(port, "/ui/status.json", Some(&reader))
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let whole: Value = serde_json::from_str(&whole).expect("status.json is JSON");
    let node_names = |v: &Value| -> Vec<String> {
        v["nodes"].as_array().map_or(Vec::new(), |nodes| {
            nodes
                .iter()
                .filter_map(|n| n["name"].as_str().map(str::to_string))
                .collect()
        })
    };
    assert!(
        node_names(&whole).contains(&"tn7-node".to_string()),
        "the reader of GpuNodes sees the nodes: {whole}"
    );
    let count = |v: &Value| -> u64 {
        v["phases"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
    };

    let (code, body) = http_get(port, "/ui/status.json", Some(&viewer)).expect("an answer");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("tn7-mine"), "the viewer sees its job: {body}");
    assert!(
        !body.contains("tn7-theirs") && !body.contains(other),
        "the viewer sees nothing of the other namespace: {body}"
    );
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(count(&seen), 1, "its namespace's one job only: {seen}");
    assert!(
        node_names(&seen).is_empty(),
        "no GPU node for a reader who may not list them and runs nothing: {seen}"
    );
    // The same for the HTML page.
    let (code, page) = http_get(port, "/ui", Some(&viewer)).expect("an answer");
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains("tn7-mine") && !page.contains("tn7-theirs"),
        "{page}"
    );

    for (who, token, want) in [
        ("no token", None, 401),
        (
            "a token the API server never issued",
            Some("not-a-token"),
            401,
        ),
        (
            "a ServiceAccount with no rights",
            Some(nobody.as_str()),
            403,
        ),
    ] {
        for path in ["/ui", "/ui/status.json"] {
            let (code, body) = http_get(port, path, token).expect("an answer");
            assert_eq!(code, want, "{who} on {path}: {body}");
            assert!(
                !body.contains("tn7-mine") && !body.contains("tn7-theirs"),
                "{who} on {path} sees no job: {body}"
            );
        }
    }
}

/// Attack 9: a tenant puts its jobs ahead of everyone's in the queue with the
/// highest `spec.priority` (jobs waiting for room are placed in priority
/// order). Refused by `vramfit-trainingjob-bounds` above `tenancy.maxPriority`
/// (0) unless an admin labels the namespace `vramfit.dev/max-priority`, which
/// the tenant cannot do itself; an update that leaves the priority as it was
/// passes after the admin lowers the label.
#[tokio::test]
async fn attack_9_a_tenant_cannot_jump_the_queue_with_its_priority() {
    let ns = "tn-9";
    tenant_namespace(ns, &[("alice-9", "edit")]).await;
    let alice = tenant("alice-9").await;
    let jobs = training_jobs(&alice, ns);
    let job = |name: &str, priority: i64| {
        let mut job = training_job(name, plain_template());
        job["spec"]["priority"] = json!(priority);
        dynamic(job)
    };
    let above = |p: i64, max: i64| {
        format!("spec.priority {p} is above {max}, the highest namespace {ns} may use")
    };
    assert_refused_by(
        "priority 1000000 by a tenant",
        jobs.create(&dry_run(), &job("high", 1_000_000)).await,
        BOUNDS,
        &above(1_000_000, 0),
    );
    for p in [0, -5] {
        assert_accepted(
            &format!("priority {p}"),
            jobs.create(&dry_run(), &job("plain", p)).await,
        );
    }
    // The tenant cannot raise its own namespace's limit.
    let namespaces: Api<Namespace> = Api::all(alice.clone());
    let label = |max: &str| {
        Patch::Merge(json!({"metadata": {"labels": {"vramfit.dev/max-priority": max}}}))
    };
    assert_forbidden(
        "the tenant labels its namespace",
        namespaces
            .patch(ns, &PatchParams::default(), &label("1000000"))
            .await,
        "alice-9",
        "patch",
        "namespaces",
    );
    // An admin allows 500 in this namespace; the policy sees the label once
    // the API server's namespace informer has it.
    let admin_namespaces: Api<Namespace> = Api::all(admin().await);
    admin_namespaces
        .patch(ns, &PatchParams::default(), &label("500"))
        .await
        .expect("the admin labels the namespace");
    let deadline = Instant::now() + Duration::from_secs(30);
    let stored = loop {
        match jobs
            .create(&PostParams::default(), &job("urgent", 500))
            .await
        {
            Ok(stored) => break stored,
            Err(e) => assert!(
                Instant::now() < deadline,
                "priority 500 still refused with the label: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_refused_by(
        "priority 501 with a limit of 500",
        jobs.create(&dry_run(), &job("more", 501)).await,
        BOUNDS,
        &above(501, 500),
    );
    // The admin lowers the limit: the stored job may still be updated as long
    // as its priority stays, not raised again.
    admin_namespaces
        .patch(ns, &PatchParams::default(), &label("100"))
        .await
        .expect("the admin lowers the label");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match jobs.create(&dry_run(), &job("probe", 200)).await {
            Err(_) => break,
            Ok(_) => assert!(Instant::now() < deadline, "the lowered label never applied"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let name = stored.metadata.name.clone().unwrap();
    assert_accepted(
        "an update that keeps priority 500",
        jobs.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"note": "kept"}}})),
        )
        .await,
    );
    assert_refused_by(
        "an update that moves priority 500 to 400",
        jobs.patch(
            &name,
            &dry_run_patch(),
            &Patch::Merge(json!({"spec": {"priority": 400}})),
        )
        .await,
        BOUNDS,
        &above(400, 100),
    );
}

/// Attack 1 in a namespace that enforces Pod Security `restricted` while
/// the chart's level is `baseline`: a template that restricted refuses
/// (root, privilege escalation, capabilities, seccomp) is refused at apply,
/// as Pod Security admission would refuse its pods, instead of being
/// accepted and failing at the pod's creation. The same template passes in a
/// namespace that enforces baseline, and a template that meets restricted
/// passes in both.
#[tokio::test]
async fn attack_1_a_namespace_that_enforces_restricted_holds_templates_to_restricted() {
    let admin_namespaces: Api<Namespace> = Api::all(admin().await);
    let enforce = |level: &str| {
        Patch::Merge(json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}}))
    };
    for (ns, level) in [("tn-1r", "restricted"), ("tn-1b", "baseline")] {
        tenant_namespace(ns, &[("alice-1r", "edit")]).await;
        admin_namespaces
            .patch(ns, &PatchParams::default(), &enforce(level))
            .await
            .unwrap_or_else(|e| panic!("labelling {ns}: {e}"));
    }
    let alice = tenant("alice-1r").await;
    let compliant = json!({"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "t", "image": "i", "securityContext": {
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]});
    let plain = |name: &str| dynamic(training_job(name, plain_template()));
    // The policy reads the label once the API server's namespace informer has it.
    let restricted = training_jobs(&alice, "tn-1r");
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        match restricted.create(&dry_run(), &plain("plain")).await {
            Err(e) => break Err::<DynamicObject, _>(e),
            Ok(_) => assert!(
                Instant::now() < deadline,
                "a plain template still accepted in a restricted namespace"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_refused_by(
        "a template with no securityContext in a restricted namespace",
        refused,
        POD_SECURITY,
        "allowPrivilegeEscalation=false (Pod Security restricted)",
    );
    assert_accepted(
        "a template that meets restricted, in a restricted namespace",
        restricted
            .create(&dry_run(), &dynamic(training_job("ok", compliant.clone())))
            .await,
    );
    let baseline = training_jobs(&alice, "tn-1b");
    assert_accepted(
        "a plain template in a baseline namespace",
        baseline.create(&dry_run(), &plain("plain")).await,
    );
    assert_accepted(
        "a template that meets restricted, in a baseline namespace",
        baseline
            .create(&dry_run(), &dynamic(training_job("ok", compliant)))
            .await,
    );
}
