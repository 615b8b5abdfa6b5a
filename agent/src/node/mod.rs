//! The node agent's pure parts: what `/proc` says about a GPU process, the
//! budget watchdog's decision and whether a status is worth writing.

pub mod procfs;
pub mod publish;
pub mod watchdog;
