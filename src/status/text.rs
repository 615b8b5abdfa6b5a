//! `vramfit status` in a terminal: bars and tables, colour only when asked
//! (on a TTY).

use std::fmt::Write as _;

use super::{ClusterStatus, GpuView, JobOnGpu, fraction};
use crate::api::GpuHealth;
use crate::quantity::human_bytes;

/// Width of a memory bar in cells.
pub const BAR_WIDTH: usize = 30;

#[derive(Clone, Copy)]
enum Paint {
    Bold,
    Dim,
    Green,
    Yellow,
    Red,
}

struct Pen {
    color: bool,
}

impl Pen {
    fn paint(&self, paint: Paint, text: &str) -> String {
        if !self.color {
            return text.to_string();
        }
        let code = match paint {
            Paint::Bold => "1",
            Paint::Dim => "2",
            Paint::Green => "32",
            Paint::Yellow => "33",
            Paint::Red => "31",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }
}

/// A bar of `BAR_WIDTH` cells, `#` for the filled part and `.` for the rest;
/// a part over the whole fills it and ends in `!`.
pub fn bar(part: u64, whole: u64) -> String {
    let filled = (fraction(part, whole) * BAR_WIDTH as f64).round() as usize;
    let mut cells = "#".repeat(filled) + &".".repeat(BAR_WIDTH - filled);
    if part > whole && whole > 0 {
        cells.pop();
        cells.push('!');
    }
    format!("[{cells}]")
}

fn level(part: u64, whole: u64) -> Paint {
    let f = if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    };
    if f > 0.95 {
        Paint::Red
    } else if f > 0.8 {
        Paint::Yellow
    } else {
        Paint::Green
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.0}%", part as f64 * 100.0 / whole as f64)
    }
}

fn ago(seconds: Option<i64>) -> String {
    match seconds {
        None => "never".into(),
        Some(s) if s < 0 => "in the future".into(),
        Some(s) if s < 120 => format!("{s}s ago"),
        Some(s) if s < 7200 => format!("{}m ago", s / 60),
        Some(s) if s < 172_800 => format!("{}h ago", s / 3600),
        Some(s) => format!("{}d ago", s / 86_400),
    }
}

fn age(seconds: Option<i64>) -> String {
    match seconds {
        None => "-".into(),
        Some(s) if s < 120 => format!("{}s", s.max(0)),
        Some(s) if s < 7200 => format!("{}m", s / 60),
        Some(s) if s < 172_800 => format!("{}h", s / 3600),
        Some(s) => format!("{}d", s / 86_400),
    }
}

/// Lays out rows under a header, each column as wide as its widest cell;
/// `paint` may colour a cell after padding (so colour never shifts columns).
fn table(
    out: &mut String,
    indent: &str,
    header: &[&str],
    rows: &[Vec<String>],
    pen: &Pen,
    paint: impl Fn(usize, usize) -> Option<Paint>,
) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let last = header.len() - 1;
    let line = |cells: Vec<String>| {
        let mut text = indent.to_string();
        for (i, cell) in cells.into_iter().enumerate() {
            text.push_str(&cell);
            if i < last {
                text.push_str("  ");
            }
        }
        text.trim_end().to_string()
    };
    let head = header
        .iter()
        .enumerate()
        .map(|(i, h)| pen.paint(Paint::Dim, &format!("{h:<w$}", w = widths[i])))
        .collect();
    let _ = writeln!(out, "{}", line(head));
    for (r, row) in rows.iter().enumerate() {
        let cells = row
            .iter()
            .enumerate()
            .map(|(i, cell)| {
                let padded = if i == last {
                    cell.clone()
                } else {
                    format!("{cell:<w$}", w = widths[i])
                };
                match paint(r, i) {
                    Some(p) => pen.paint(p, &padded),
                    None => padded,
                }
            })
            .collect();
        let _ = writeln!(out, "{}", line(cells));
    }
}

fn shape(job: &JobOnGpu) -> String {
    match (job.micro_batch, job.grad_accum) {
        (Some(m), Some(a)) => format!("{m}x{a}"),
        (Some(m), None) => format!("{m}x?"),
        _ => "-".into(),
    }
}

fn opt_bytes(bytes: Option<u64>) -> String {
    bytes.map_or_else(|| "-".into(), human_bytes)
}

fn gpu_block(out: &mut String, gpu: &GpuView, pen: &Pen) {
    let health = match gpu.health {
        GpuHealth::Healthy => pen.paint(Paint::Green, "Healthy"),
        GpuHealth::Degraded => pen.paint(Paint::Yellow, "Degraded"),
        GpuHealth::Faulty => pen.paint(Paint::Red, "Faulty"),
    };
    let _ = writeln!(
        out,
        "  {} {}  {}  {}",
        pen.paint(Paint::Bold, &format!("GPU {}", gpu.index)),
        gpu.model,
        human_bytes(gpu.capacity_bytes),
        health
    );
    let committed = pen.paint(
        level(gpu.committed_bytes, gpu.capacity_bytes),
        &bar(gpu.committed_bytes, gpu.capacity_bytes),
    );
    let _ = writeln!(
        out,
        "    committed {committed} {:>10} {:>4}  free {}",
        human_bytes(gpu.committed_bytes),
        percent(gpu.committed_bytes, gpu.capacity_bytes),
        human_bytes(gpu.free_bytes)
    );
    let measured = pen.paint(
        level(gpu.measured_bytes, gpu.capacity_bytes),
        &bar(gpu.measured_bytes, gpu.capacity_bytes),
    );
    let _ = writeln!(
        out,
        "    measured  {measured} {:>10} {:>4}",
        human_bytes(gpu.measured_bytes),
        percent(gpu.measured_bytes, gpu.capacity_bytes)
    );
    if gpu.jobs.is_empty() {
        let _ = writeln!(out, "    {}", pen.paint(Paint::Dim, "no jobs"));
        return;
    }
    job_table(out, "    ", &gpu.jobs, pen, false);
}

fn job_table(out: &mut String, indent: &str, jobs: &[JobOnGpu], pen: &Pen, with_place: bool) {
    let mut header = vec![
        "JOB",
        "BUDGET",
        "MEASURED",
        "MICROxACCUM",
        "ATTEMPT",
        "PHASE",
    ];
    if with_place {
        header.push("WHERE");
    }
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let mut row = vec![
                format!("{}/{}", j.namespace, j.name),
                human_bytes(j.budget_bytes),
                opt_bytes(j.measured_bytes),
                shape(j),
                j.attempt.to_string(),
                format!("{:?}", j.phase),
            ];
            if with_place {
                row.push(format!("{} GPU {}", j.node, j.gpu));
            }
            row
        })
        .collect();
    table(out, indent, &header, &rows, pen, |r, c| {
        let job = &jobs[r];
        match c {
            2 if job.measured_bytes.is_some_and(|m| m > job.budget_bytes) => Some(Paint::Red),
            4 if job.attempt > 1 => Some(Paint::Yellow),
            _ => None,
        }
    });
}

/// The whole view as text; `color` adds ANSI colours.
pub fn render(status: &ClusterStatus, color: bool) -> String {
    let pen = Pen { color };
    let mut out = String::new();
    let t = &status.totals;
    let phases = if status.phases.is_empty() {
        "no TrainingJobs".to_string()
    } else {
        status
            .phases
            .iter()
            .map(|(phase, n)| format!("{n} {phase}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        out,
        "{}  {}",
        pen.paint(Paint::Bold, "vramfit status"),
        status.time
    );
    let _ = writeln!(
        out,
        "{} usable GPUs: committed {} of {} ({}), measured {}; jobs: {}",
        t.gpus,
        human_bytes(t.committed_bytes),
        human_bytes(t.capacity_bytes),
        percent(t.committed_bytes, t.capacity_bytes),
        human_bytes(t.measured_bytes),
        phases
    );
    if status.nodes.is_empty() {
        let _ = writeln!(
            out,
            "\nNo GpuNodes: no node agent has reported (is the agent DaemonSet running on the GPU nodes?)"
        );
    }
    for node in &status.nodes {
        let mut facts = vec![format!("heartbeat {}", ago(node.heartbeat_age_seconds))];
        if let Some(mode) = &node.agent_mode {
            facts.push(mode.clone());
        }
        let mut line = format!(
            "\n{}  {}",
            pen.paint(Paint::Bold, &format!("NODE {}", node.name)),
            facts.join(", ")
        );
        if !node.fresh {
            line.push_str(&format!(
                "  {}",
                pen.paint(Paint::Yellow, "STALE: nothing is placed here")
            ));
        }
        if node.cordoned {
            line.push_str(&format!("  {}", pen.paint(Paint::Yellow, "CORDONED")));
        }
        let _ = writeln!(out, "{line}");
        if node.gpus.is_empty() {
            let _ = writeln!(out, "  {}", pen.paint(Paint::Dim, "no GPUs reported"));
        }
        for gpu in &node.gpus {
            gpu_block(&mut out, gpu, &pen);
        }
    }
    if !status.orphans.is_empty() {
        let _ = writeln!(
            out,
            "\n{} ({}): placed on a GPU no GpuNode reports",
            pen.paint(Paint::Yellow, "UNSEEN GPUS"),
            status.orphans.len()
        );
        job_table(&mut out, "  ", &status.orphans, &pen, true);
    }
    let _ = writeln!(
        out,
        "\n{} ({})",
        pen.paint(Paint::Bold, "WAITING"),
        status.waiting.len()
    );
    if status.waiting.is_empty() {
        let _ = writeln!(out, "  {}", pen.paint(Paint::Dim, "none"));
    } else {
        let rows: Vec<Vec<String>> = status
            .waiting
            .iter()
            .map(|w| {
                vec![
                    format!("{}/{}", w.namespace, w.name),
                    w.priority.to_string(),
                    w.gpus.to_string(),
                    opt_bytes(w.budget_bytes),
                    w.attempt.to_string(),
                    age(w.age_seconds),
                    w.reason.clone(),
                ]
            })
            .collect();
        table(
            &mut out,
            "  ",
            &[
                "JOB", "PRIORITY", "GPUS", "BUDGET", "ATTEMPT", "AGE", "REASON",
            ],
            &rows,
            &pen,
            |_, _| None,
        );
    }
    let _ = writeln!(
        out,
        "\n{} ({})",
        pen.paint(Paint::Bold, "RECENT OOM RETRIES"),
        status.retries.len()
    );
    if status.retries.is_empty() {
        let _ = writeln!(out, "  {}", pen.paint(Paint::Dim, "none"));
    } else {
        let rows: Vec<Vec<String>> = status
            .retries
            .iter()
            .map(|r| {
                vec![
                    format!("{}/{}", r.namespace, r.name),
                    r.attempt.to_string(),
                    r.kind.clone(),
                    format!("{} -> {}", r.from, r.to.as_deref().unwrap_or("?")),
                    r.time.clone().unwrap_or_else(|| "-".into()),
                    r.message
                        .as_deref()
                        .map(|m| {
                            m.lines()
                                .next()
                                .unwrap_or_default()
                                .chars()
                                .take(80)
                                .collect()
                        })
                        .unwrap_or_default(),
                ]
            })
            .collect();
        table(
            &mut out,
            "  ",
            &["JOB", "ATTEMPT", "KIND", "MICROxACCUM", "WHEN", "MESSAGE"],
            &rows,
            &pen,
            |_, c| (c == 3).then_some(Paint::Yellow),
        );
    }
    out
}
