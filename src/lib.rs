//! vramfit: run deep-learning training jobs on shared GPUs without running out of
//! memory. See DESIGN.md for how the parts fit together.

pub mod alloc;
pub mod api;
pub mod cli;
pub mod crdgen;

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
    /// YAML output failed.
    #[error("yaml: {0}")]
    Yaml(String),
}

/// Result with the crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
