//! The `vramfit` command line: argument types and the commands that are plain
//! functions of their inputs. `main.rs` only parses and dispatches.

pub mod alloc;

use clap::ValueEnum;

/// How a command prints its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// One JSON object (the shapes in DESIGN.md).
    #[default]
    Json,
    /// A table for people.
    Table,
}
