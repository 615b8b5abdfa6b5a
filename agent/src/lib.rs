//! vramfit's node agent: the daemon that reports a node's GPUs in its
//! `GpuNode` status and enforces pod budgets, probes of the GPU, the
//! allocator's CUDA backend and the allocator benchmark. Everything that needs a GPU sits behind the
//! `cuda` feature; the rest (result types, verdict rules, the benchmark's
//! size mix) is plain code that builds and tests anywhere. The simulated
//! node (the `sim` module: `run --simulate`, `bench agents`) is for tests, benchmarks
//! and the demo and sits behind the `sim` feature, off in the shipped agent.

pub mod bench;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod daemon;
pub mod gpu;
pub mod node;
pub mod probe;
#[cfg(feature = "sim")]
pub mod sim;

/// The agent's one error type.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The binary was built without GPU support.
    #[error("this vramfit-agent was built without the `cuda` feature")]
    NoCuda,
    /// The binary was built without the simulated node.
    #[error(
        "{what}: this vramfit-agent was built without the simulated node (the `sim` feature); \
         build one with `cargo build -p vramfit-agent --features sim`, or run the \
         vramfit-agent-sim image"
    )]
    NoSim {
        /// What asked for it (a flag, a subcommand).
        what: &'static str,
    },
    /// A CUDA library cudarc loads at run time is not there (cudarc would
    /// panic on its first call).
    #[error(
        "{library} not found by the dynamic loader (LD_LIBRARY_PATH, /etc/ld.so.cache); {hint}"
    )]
    MissingLibrary {
        /// The library, in words.
        library: &'static str,
        /// Where it usually comes from.
        hint: &'static str,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver call {call} failed: {detail}")]
    Cuda {
        /// The call.
        call: &'static str,
        /// The driver's words.
        detail: String,
    },
    /// Compiling the probe kernels failed.
    #[error("compiling the probe kernels failed: {0}")]
    Kernel(String),
    /// The allocator failed.
    #[error(transparent)]
    Alloc(#[from] vramfit::alloc::AllocError),
}

/// `Result` with [`AgentError`].
pub type Result<T, E = AgentError> = std::result::Result<T, E>;
