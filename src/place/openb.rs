//! The openb trace format (alibaba/clusterdata, cluster-trace-gpu-v2023),
//! parsed from text; reading the files is the caller's business.
//!
//! Columns are found by header name, so column order does not matter and
//! extra columns are ignored.

use super::inventory::{GpuSpec, Inventory, JobRequest, NodeSpec};
use super::{PlaceError, Result};

/// Capacity of one trace GPU: the trace speaks in thousandths of a GPU
/// whatever the model.
pub const TRACE_GPU_CAPACITY: u64 = 1000;

const MIB: u64 = 1 << 20;

/// Parses a node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn parse_nodes(csv: &str) -> Result<Inventory> {
    const FILE: &str = "node list";
    let mut rows = Rows::new(
        csv,
        FILE,
        &["sn", "cpu_milli", "memory_mib", "gpu", "model"],
        &[],
    )?;
    let mut nodes = Vec::new();
    while let Some(row) = rows.next_row() {
        let gpus = row.int(3)?;
        nodes.push(NodeSpec {
            name: row.text(0).to_string(),
            cpu_milli: row.int(1)?,
            memory_bytes: row.int(2)? * MIB,
            taints: Vec::new(),
            gpus: (0..gpus)
                .map(|_| GpuSpec {
                    model: row.text(4).to_string(),
                    capacity: TRACE_GPU_CAPACITY,
                })
                .collect(),
        });
    }
    Ok(Inventory { nodes })
}

/// Parses a pod list (`name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...`).
///
/// A pod with one GPU asks for `gpu_milli` of it; a pod with several takes
/// whole GPUs (the trace's rule), so its budget is the full capacity; a pod
/// without GPUs asks for none. `gpu_spec`, when set, lists allowed models
/// separated by `|`.
pub fn parse_pods(csv: &str) -> Result<Vec<JobRequest>> {
    const FILE: &str = "pod list";
    // Some published lists (multigpu20) have no gpu_spec column: no constraint.
    let mut rows = Rows::new(
        csv,
        FILE,
        &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"],
        &["gpu_spec"],
    )?;
    let mut pods = Vec::new();
    while let Some(row) = rows.next_row() {
        let gpus = row.int(3)?;
        let milli = row.int(4)?;
        let budget = match gpus {
            0 => 0,
            1 if milli == 0 || milli > TRACE_GPU_CAPACITY => {
                return Err(row.error(format!("gpu_milli {milli} is outside 1..=1000")));
            }
            1 => milli,
            _ => TRACE_GPU_CAPACITY,
        };
        let spec = row.text(5);
        pods.push(JobRequest {
            id: row.text(0).to_string(),
            gpus: u32::try_from(gpus)
                .map_err(|_| row.error(format!("num_gpu {gpus} is too large")))?,
            gpu_budget: budget,
            // The trace's shares are the GPU units themselves.
            gpu_compute: 0,
            cpu_milli: row.int(1)?,
            memory_bytes: row.int(2)? * MIB,
            gpu_models: if spec.is_empty() {
                Vec::new()
            } else {
                spec.split('|').map(str::to_string).collect()
            },
            tolerations: Vec::new(),
        });
    }
    Ok(pods)
}

/// Requested GPU of a trace pod in milli-GPU, as the protocol counts it.
pub fn requested_milli_gpu(pod: &JobRequest) -> u64 {
    u64::from(pod.gpus) * pod.gpu_budget
}

struct Rows<'a> {
    lines: std::iter::Enumerate<std::str::Lines<'a>>,
    file: &'static str,
    columns: Vec<usize>,
}

struct Row<'a> {
    fields: Vec<&'a str>,
    columns: &'a [usize],
    file: &'static str,
    line: usize,
}

impl<'a> Rows<'a> {
    /// Columns are numbered `required` first, then `optional`; a missing
    /// optional column reads as empty text.
    fn new(csv: &'a str, file: &'static str, required: &[&str], optional: &[&str]) -> Result<Self> {
        let mut lines = csv.lines().enumerate();
        let header = lines.next().map(|(_, l)| l).unwrap_or("");
        let names: Vec<&str> = header.trim().split(',').map(str::trim).collect();
        let mut columns = required
            .iter()
            .map(|w| {
                names
                    .iter()
                    .position(|n| n == w)
                    .ok_or_else(|| PlaceError::Trace {
                        file,
                        line: 1,
                        reason: format!("header lacks column {w:?}"),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        columns.extend(
            optional
                .iter()
                .map(|w| names.iter().position(|n| n == w).unwrap_or(usize::MAX)),
        );
        Ok(Self {
            lines,
            file,
            columns,
        })
    }

    fn next_row(&mut self) -> Option<Row<'_>> {
        loop {
            let (i, line) = self.lines.next()?;
            let line = line.trim();
            if !line.is_empty() {
                return Some(Row {
                    fields: line.split(',').map(str::trim).collect(),
                    columns: &self.columns,
                    file: self.file,
                    line: i + 1,
                });
            }
        }
    }
}

impl Row<'_> {
    fn text(&self, column: usize) -> &str {
        self.fields.get(self.columns[column]).copied().unwrap_or("")
    }

    fn int(&self, column: usize) -> Result<u64> {
        let text = self.text(column);
        text.parse()
            .map_err(|_| self.error(format!("expected a non-negative integer, got {text:?}")))
    }

    fn error(&self, reason: String) -> PlaceError {
        PlaceError::Trace {
            file: self.file,
            line: self.line,
            reason,
        }
    }
}
