//! `vramfit controller`: run the operator.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use crate::controller::{ControllerOptions, LeaseOptions, UiAuthMode};
use crate::place::PolicyKind;

/// Who may read `/ui` (see [`UiAuthMode`]).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UiAuthArg {
    /// No authentication.
    None,
    /// TokenReview and SubjectAccessReview.
    Kubernetes,
}

/// Arguments of `vramfit controller`.
#[derive(Args, Debug)]
pub struct ControllerArgs {
    /// The cluster (default: in-cluster service account, else the current kubeconfig).
    #[command(flatten)]
    pub kube: super::kube_args::KubeArgs,
    /// Watch TrainingJobs in this namespace only (default: all namespaces).
    #[arg(long, env = "VRAMFIT_NAMESPACE")]
    pub namespace: Option<String>,
    /// Label selector of the Nodes and GpuNodes vramfit may place on.
    #[arg(long, env = "VRAMFIT_NODE_SELECTOR")]
    pub node_selector: Option<String>,
    /// Placement policy: random, best-fit, fgd or vramfit.
    #[arg(long, default_value = "vramfit")]
    pub policy: PolicyKind,
    /// Seconds a GpuNode heartbeat stays trusted.
    #[arg(long, default_value_t = 120)]
    pub heartbeat_ttl_seconds: u64,
    /// Seconds between scheduling cycles when nothing changes.
    #[arg(long, default_value_t = 5)]
    pub cycle_seconds: u64,
    /// Address of the Prometheus `/metrics` endpoint (and `/healthz`).
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Address of the `/ui` page. Without `--ui-auth kubernetes` it shows
    /// every namespace to whoever reaches it, so it stays on loopback unless
    /// you choose otherwise (`kubectl port-forward` reaches it); the metrics
    /// address serves both.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub ui_addr: SocketAddr,
    /// Who may read `/ui`: `none` (whoever reaches it sees everything) or
    /// `kubernetes` (a bearer token the API server accepts; its user sees
    /// the namespaces where they may list TrainingJobs, and the GPU nodes if
    /// they may list GpuNodes).
    #[arg(long, value_enum, default_value = "none")]
    pub ui_auth: UiAuthArg,
    /// With `--ui-auth kubernetes`: an audience the token must carry
    /// (repeatable; none: the API server's own).
    #[arg(long = "ui-token-audience")]
    pub ui_token_audiences: Vec<String>,
    /// Run without leader election (a single replica).
    #[arg(long)]
    pub no_leader_election: bool,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "vramfit-controller")]
    pub lease_name: String,
    /// Placed statuses written at once by a writer of their own, after the
    /// pods (0: each in its job's reconcile, right after its pod).
    #[arg(long, default_value_t = crate::controller::status_writer::DEFAULT_WRITERS)]
    pub status_writers: usize,
    /// Memory-elastic placement for jobs that do not set
    /// `spec.batch.elastic`: a job whose shape fits no GPU now starts at once
    /// with a smaller micro-batch (the same global batch) where one fits.
    #[arg(long, env = "VRAMFIT_ELASTIC_DEFAULT")]
    pub elastic_default: bool,
    /// The share of each GPU's compute, in percent (1-100), that a job which
    /// does not set `spec.gpuComputePercent` needs: the jobs on one GPU then
    /// never need more than its whole compute. Unset: such jobs share their
    /// GPU by memory alone.
    #[arg(long, env = "VRAMFIT_DEFAULT_GPU_COMPUTE_PERCENT",
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub default_gpu_compute_percent: Option<u32>,
    /// Log lines as text (colour only on a terminal) or as JSON objects.
    #[arg(long, value_enum, env = "VRAMFIT_LOG_FORMAT", default_value = "text")]
    pub log_format: crate::cli::logging::LogFormat,
}

impl ControllerArgs {
    /// The controller's options.
    pub fn options(&self) -> ControllerOptions {
        let identity =
            std::env::var("POD_NAME").unwrap_or_else(|_| format!("vramfit-{}", std::process::id()));
        ControllerOptions {
            namespace: self.namespace.clone(),
            node_selector: self.node_selector.clone(),
            heartbeat_ttl: Duration::from_secs(self.heartbeat_ttl_seconds),
            policy: self.policy,
            cycle_interval: Duration::from_secs(self.cycle_seconds.max(1)),
            metrics_addr: Some(self.metrics_addr),
            ui_addr: Some(self.ui_addr),
            ui_auth: match self.ui_auth {
                UiAuthArg::None => UiAuthMode::None,
                UiAuthArg::Kubernetes => UiAuthMode::Kubernetes {
                    audiences: self.ui_token_audiences.clone(),
                },
            },
            lease: (!self.no_leader_election).then(|| LeaseOptions {
                namespace: self.lease_namespace.clone(),
                name: self.lease_name.clone(),
                identity,
            }),
            status_writers: self.status_writers,
            elastic_default: self.elastic_default,
            compute_default: self.default_gpu_compute_percent,
        }
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
