//! The `vramfit` command line: argument types and the commands that are plain
//! functions of their inputs. `main.rs` only parses and dispatches.

pub mod alloc;
pub mod bench;
pub mod controller;
pub mod kube_args;
pub mod logging;
pub mod predict;
pub mod run;
pub mod status;

use std::io::Read;
use std::path::Path;

use anyhow::Context as _;
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

/// Reads a text file, or standard input for `-`.
pub fn read_text(path: &Path) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}
