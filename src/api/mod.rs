//! The vramfit API: `TrainingJob` and `GpuNode` in `vramfit.dev/v1alpha1`.

pub mod free_form;
pub mod gpu_node;
pub mod model;
pub mod schema;
pub mod training_job;
pub mod validate;

pub use gpu_node::*;
pub use model::*;
pub use training_job::*;
