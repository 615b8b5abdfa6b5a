//! vramfit: run deep-learning training jobs on shared GPUs without running out of
//! memory. See DESIGN.md for how the parts fit together.

pub use vramfit_alloc_core as alloc;
pub mod api;
pub mod cli;
pub mod controller;
pub mod crdgen;
#[cfg(any(test, feature = "testing"))]
pub mod fixtures;
pub mod job;
pub mod place;
pub mod predict;
pub mod quantity;
pub mod sim;
pub mod status;

/// Errors of the vramfit crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API: {0}")]
    Kube(#[source] kube::Error),
    /// A (de)serialisation failed.
    #[error("serialisation: {0}")]
    Json(#[source] serde_json::Error),
    /// Writing or reading a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The finalizer machinery failed (the inner error says where).
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Leader election failed.
    #[error("leader election: {0}")]
    Leadership(String),
    /// This replica lost the Lease; it stops acting at once.
    #[error("lost leadership: {0}")]
    LeadershipLost(String),
    /// A background task of the controller ended, failed or panicked.
    #[error("background task {task} stopped: {reason}")]
    TaskStopped {
        /// The task's name.
        task: &'static str,
        /// What happened.
        reason: String,
    },
    /// YAML output failed.
    #[error("yaml: {0}")]
    Yaml(String),
}

/// Result with the crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
