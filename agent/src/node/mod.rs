//! What the agent knows about its node between two readings, and the pure
//! decisions it makes: what `/proc` says about a GPU process, the counters a
//! process publishes, the status to report, the budget watchdog's decision
//! and whether a status is worth writing.

pub mod procfs;
pub mod publish;
pub mod report;
pub mod stats;
pub mod watchdog;
