//! How the controller runs (its options) and what every reconcile shares
//! (the [`Context`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;

use super::*;
use crate::api::GpuNode;
use crate::place::PolicyKind;
use metrics::Metrics;
use scheduler::Assignments;

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Watch TrainingJobs of this namespace only (all when `None`).
    pub namespace: Option<String>,
    /// Label selector for the `Node`s and `GpuNode`s vramfit may use.
    pub node_selector: Option<String>,
    /// A `GpuNode` is trusted while its heartbeat is younger than this.
    pub heartbeat_ttl: Duration,
    /// Placement policy.
    pub policy: PolicyKind,
    /// Seconds between scheduling cycles when nothing wakes the scheduler.
    pub cycle_interval: Duration,
    /// Where `/metrics` and `/healthz` are served (none when `None`).
    pub metrics_addr: Option<SocketAddr>,
    /// Where the `/ui` page is served (none when `None`). Without
    /// `ui_auth` it shows every namespace to whoever reaches it, so by
    /// default only on loopback, reached through `kubectl port-forward`. The
    /// same address as `metrics_addr` serves both on one listener.
    pub ui_addr: Option<SocketAddr>,
    /// Who may read `/ui`.
    pub ui_auth: UiAuthMode,
    /// Lease used for leader election (none: run without election).
    pub lease: Option<LeaseOptions>,
    /// Placed statuses written at once after their pods (`status_writer`);
    /// 0 writes each in its job's reconcile.
    pub status_writers: usize,
    /// Memory-elastic placement for jobs that do not set
    /// `spec.batch.elastic`.
    pub elastic_default: bool,
    /// The compute share, percent, of jobs that do not set
    /// `spec.gpuComputePercent` (`None`: theirs is not counted).
    pub compute_default: Option<u32>,
}

/// Who may read the `/ui` page.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum UiAuthMode {
    /// Whoever reaches its address sees every namespace.
    #[default]
    None,
    /// A bearer token the API server accepts (TokenReview); its user sees
    /// the jobs of the namespaces where they may list TrainingJobs, and the
    /// GPU nodes if they may list GpuNodes (SubjectAccessReview). The
    /// token's audiences must include one of these (empty: the API
    /// server's).
    Kubernetes {
        /// Accepted token audiences.
        audiences: Vec<String>,
    },
}

/// The Lease two replicas compete for.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            namespace: None,
            node_selector: None,
            heartbeat_ttl: Duration::from_secs(120),
            policy: PolicyKind::Vramfit,
            cycle_interval: Duration::from_secs(5),
            metrics_addr: None,
            ui_addr: None,
            ui_auth: UiAuthMode::None,
            lease: None,
            status_writers: status_writer::DEFAULT_WRITERS,
            elastic_default: false,
            compute_default: None,
        }
    }
}

/// Shared state of the reconcilers and the scheduling cycle.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Where the reconciles queue their events.
    pub events: recorder::EventQueue,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Decisions of the scheduling cycle not yet written to status.
    pub assignments: Assignments,
    /// Predictions not yet written, held until the cycle's verdict.
    pub held: Arc<held::HeldPredictions>,
    /// The versions this process's own status writes produced.
    pub own_writes: Arc<held::OwnWrites>,
    /// What predictions read across all jobs, kept from the job watch.
    pub(super) index: Arc<job_index::JobIndex>,
    pub(super) gpu_nodes: Store<GpuNode>,
    /// The GPU models of `gpu_nodes`, kept until their GPUs change.
    pub(super) gpu_models_cache: model_cache::GpuModelCache,
    pub(super) pods: Store<Pod>,
    pub(super) wake: Arc<Notify>,
    /// Closed once this replica may no longer act as the leader.
    pub fence: Arc<fence::Fence>,
    /// Where placed statuses wait for the status writer.
    pub status_queue: status_writer::StatusQueue,
    /// True when the status writer writes placed statuses.
    pub defer_placed_status: bool,
    /// The pod creates in flight, which the status writer and the event
    /// sender give way to.
    pub pods_first: Arc<pods_first::PodsFirst>,
    /// Memory-elastic placement for jobs that do not set
    /// `spec.batch.elastic` (`--elastic-default`).
    pub elastic_default: bool,
    /// The compute share of jobs without `spec.gpuComputePercent`
    /// (`--default-gpu-compute-percent`).
    pub compute_default: Option<u32>,
}

impl Context {
    /// The training pod `name` in `namespace`, as the pod watch last saw it.
    pub fn cached_pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
    }

    /// Asks for a scheduling cycle soon.
    pub fn wake_scheduler(&self) {
        self.wake.notify_one();
    }

    /// Highest peak measured for a job with this model signature.
    pub fn measured_peak_for(&self, signature: &str) -> Option<u64> {
        self.index.measured_peak_for(signature)
    }

    /// The micro-batch a new job of this spec should start at, learned from
    /// jobs of the same model whose processes absorbed OOMs, with the name of
    /// the job it was learned from.
    pub fn learned_start_micro(&self, job: &TrainingJob) -> Option<(u32, String)> {
        let signature = crate::job::signature::job_signature(job, job.spec.batch.micro);
        absorbed::start_micro_below(&job.spec, self.index.smallest_backoff(&signature)?)
    }

    /// The batch shape a pod's process reports (through the node agent), when
    /// it reports one; the one with the most absorbed OOMs when there are several.
    pub fn observed_shape_for_pod(
        &self,
        node: &str,
        namespace: &str,
        pod: &str,
    ) -> Option<crate::api::ObservedShape> {
        let gpu_node = self.gpu_nodes.get(&ObjectRef::new(node))?;
        let status = gpu_node.status.as_ref()?;
        status
            .gpus
            .iter()
            .flat_map(|g| g.processes.iter())
            .filter(|p| {
                p.pod_namespace.as_deref() == Some(namespace) && p.pod_name.as_deref() == Some(pod)
            })
            .filter_map(|p| p.shape.clone())
            .max_by_key(|s| s.absorbed_ooms.len())
    }

    /// Peak the node's agent measured for a pod's processes.
    pub fn measured_for_pod(&self, node: &str, namespace: &str, pod: &str) -> Option<u64> {
        let gpu_node = self.gpu_nodes.get(&ObjectRef::new(node))?;
        let status = gpu_node.status.as_ref()?;
        status
            .gpus
            .iter()
            .flat_map(|g| g.processes.iter())
            .filter(|p| {
                p.pod_namespace.as_deref() == Some(namespace) && p.pod_name.as_deref() == Some(pod)
            })
            .map(|p| p.peak_bytes.max(p.used_bytes))
            .max()
    }

    /// The GPU models of the cluster's nodes, each with the largest capacity
    /// a GPU of that model reports, in name order.
    pub fn gpu_models(&self) -> Vec<(String, u64)> {
        self.gpu_models_cache.get_or_compute(|| {
            let mut models = std::collections::BTreeMap::<String, u64>::new();
            for node in self.gpu_nodes.state() {
                for gpu in node.status.iter().flat_map(|s| s.gpus.iter()) {
                    // Runs over every GPU (once per change of their GPUs):
                    // the name is copied only the first time its model is seen.
                    match models.get_mut(&gpu.model) {
                        Some(largest) => *largest = (*largest).max(gpu.total_bytes),
                        None => {
                            models.insert(gpu.model.clone(), gpu.total_bytes);
                        }
                    }
                }
            }
            models.into_iter().collect()
        })
    }

    /// True when the node's agent reported the pod for exceeding its budget.
    pub fn agent_reported_oom(&self, node: &str, namespace: &str, pod: &str) -> bool {
        self.gpu_nodes
            .get(&ObjectRef::new(node))
            .and_then(|n| n.status.clone())
            .is_some_and(|s| {
                s.oom_reports
                    .iter()
                    .any(|r| r.pod_namespace == namespace && r.pod_name == pod)
            })
    }
}
