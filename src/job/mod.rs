//! The job contract: what an attempt of a TrainingJob is, below the
//! controller. The controller, `vramfit run --local`, the node agent and the
//! status view all build on it; nothing here talks to the API server.
//!
//! - [`attempt`]: what follows an attempt (done, retry at which shape, fail),
//!   the one decision of the controller's loop and `vramfit run --local`'s.
//! - [`backoff`]: the next batch shape after an OOM (the global batch kept).
//! - [`exit`]: how an attempt ended, from its pod or process.
//! - [`budget`]: an attempt's budget from the prediction and learned peaks.
//! - [`signature`]: what makes two jobs "the same model" for learned peaks.
//! - [`keys`]: a training pod's labels, annotations, name and stats folder.
//! - [`env`]: the `VRAMFIT_*` variables of an attempt, built once.
//! - [`shape_file`]: `shape-<pid>.json`, the shape a process reports.

pub mod attempt;
pub mod backoff;
pub mod budget;
pub mod env;
pub mod exit;
pub mod keys;
pub mod shape_file;
pub mod signature;
