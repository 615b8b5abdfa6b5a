//! The controller's read-only `/ui` page: the same view as `vramfit status`,
//! one self-contained HTML page (no script, no external resource) that reloads
//! itself.

use std::fmt::Write as _;

use super::{ClusterStatus, GpuView, JobOnGpu, fraction};
use crate::api::GpuHealth;
use crate::quantity::human_bytes;

/// Escapes text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "
body{font-family:system-ui,sans-serif;margin:1.5rem;color:#1b1f24;background:#f6f8fa}
h1{font-size:1.4rem;margin:0 0 .3rem}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
.summary{color:#57606a;margin-bottom:1rem}
.node{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:.8rem 1rem;margin:.8rem 0}
.node h3{margin:0 0 .4rem;font-size:1rem}.stale{color:#9a6700;font-weight:600}
.gpu{margin:.6rem 0 .9rem}.gpu-title{font-weight:600}
.bar{position:relative;height:1.1rem;width:100%;max-width:44rem;background:#eaeef2;border-radius:3px;margin:.25rem 0;overflow:hidden}
.bar .committed{position:absolute;top:0;left:0;height:100%;background:#54aeff}
.bar .measured{position:absolute;top:25%;left:0;height:50%;background:#1a7f37}
.bar .over{background:#cf222e}
.legend{font-size:.85rem;color:#57606a}
table{border-collapse:collapse;font-size:.9rem;margin:.3rem 0}
th,td{text-align:left;padding:.2rem .8rem .2rem 0;border-bottom:1px solid #eaeef2}
th{color:#57606a;font-weight:500}td:first-child{white-space:nowrap}
.key{display:inline-block;width:.8rem;height:.8rem;border-radius:2px;vertical-align:middle;margin:0 .25rem 0 .6rem}
.Healthy{color:#1a7f37}.Degraded{color:#9a6700}.Faulty{color:#cf222e}
.none{color:#57606a}
";

fn pct(part: u64, whole: u64) -> String {
    format!("{:.1}", fraction(part, whole) * 100.0)
}

fn shape(job: &JobOnGpu) -> String {
    match (job.micro_batch, job.grad_accum) {
        (Some(m), Some(a)) => format!("{m}x{a}"),
        _ => "-".into(),
    }
}

fn jobs_table(out: &mut String, jobs: &[JobOnGpu], with_place: bool) {
    out.push_str("<table class=\"jobs\"><tr><th>job</th><th>budget</th><th>measured</th><th>micro x accum</th><th>attempt</th><th>phase</th>");
    if with_place {
        out.push_str("<th>where</th>");
    }
    out.push_str("</tr>");
    for j in jobs {
        let _ = write!(
            out,
            "<tr class=\"job\" data-job=\"{ns}/{name}\"><td>{ns}/{name}</td><td>{budget}</td><td>{measured}</td><td>{shape}</td><td>{attempt}</td><td>{phase:?}</td>",
            ns = escape(&j.namespace),
            name = escape(&j.name),
            budget = human_bytes(j.budget_bytes),
            measured = j.measured_bytes.map_or_else(|| "-".into(), human_bytes),
            shape = shape(j),
            attempt = j.attempt,
            phase = j.phase,
        );
        if with_place {
            let _ = write!(out, "<td>{} GPU {}</td>", escape(&j.node), j.gpu);
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

fn gpu_block(out: &mut String, node: &str, gpu: &GpuView) {
    let health = match gpu.health {
        GpuHealth::Healthy => "Healthy",
        GpuHealth::Degraded => "Degraded",
        GpuHealth::Faulty => "Faulty",
    };
    let over = if gpu.measured_bytes > gpu.committed_bytes && gpu.committed_bytes > 0 {
        " over"
    } else {
        ""
    };
    let _ = write!(
        out,
        "<div class=\"gpu\" id=\"gpu-{node}-{index}\" data-committed-bytes=\"{c}\" data-measured-bytes=\"{m}\" data-capacity-bytes=\"{t}\">\
<div class=\"gpu-title\">GPU {index} &middot; {model} &middot; {total} &middot; <span class=\"{health}\">{health}</span></div>\
<div class=\"bar\" title=\"committed {committed}, measured {measured}\">\
<div class=\"committed\" style=\"width:{cp}%\"></div><div class=\"measured{over}\" style=\"width:{mp}%\"></div></div>\
<div class=\"legend\">committed {committed} ({cp}%) &middot; measured {measured} ({mp}%) &middot; free {free}</div>",
        node = escape(node),
        index = gpu.index,
        c = gpu.committed_bytes,
        m = gpu.measured_bytes,
        t = gpu.capacity_bytes,
        model = escape(&gpu.model),
        total = human_bytes(gpu.capacity_bytes),
        committed = human_bytes(gpu.committed_bytes),
        measured = human_bytes(gpu.measured_bytes),
        free = human_bytes(gpu.free_bytes),
        cp = pct(gpu.committed_bytes, gpu.capacity_bytes),
        mp = pct(gpu.measured_bytes, gpu.capacity_bytes),
    );
    if gpu.jobs.is_empty() {
        out.push_str("<div class=\"none\">no jobs</div>");
    } else {
        jobs_table(out, &gpu.jobs, false);
    }
    out.push_str("</div>");
}

/// The page; it reloads itself every `refresh_seconds`.
pub fn render(status: &ClusterStatus, refresh_seconds: u32) -> String {
    let mut out = String::new();
    let t = &status.totals;
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta http-equiv=\"refresh\" content=\"{refresh_seconds}\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>vramfit status</title><style>{STYLE}</style></head><body>\
<h1>vramfit status</h1><div class=\"summary\" id=\"summary\">{gpus} usable GPUs &middot; committed {committed} of {total} ({cp}%) &middot; measured {measured} &middot; {phases} &middot; updated <time>{time}</time>, every {refresh_seconds} s</div>",
        gpus = t.gpus,
        committed = human_bytes(t.committed_bytes),
        total = human_bytes(t.capacity_bytes),
        cp = pct(t.committed_bytes, t.capacity_bytes),
        measured = human_bytes(t.measured_bytes),
        phases = escape(
            &status
                .phases
                .iter()
                .map(|(p, n)| format!("{n} {p}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        time = escape(&status.time),
    );
    out.push_str("<h2>GPUs</h2><div class=\"legend\">bars:<span class=\"key\" style=\"background:#54aeff\"></span>committed (budgets of the jobs placed)<span class=\"key\" style=\"background:#1a7f37\"></span>measured (in use, from the node agent)<span class=\"key\" style=\"background:#cf222e\"></span>measured above committed</div>");
    if status.nodes.is_empty() {
        out.push_str("<p class=\"none\">No GpuNodes: no node agent has reported.</p>");
    }
    for node in &status.nodes {
        let _ = write!(
            out,
            "<section class=\"node\" id=\"node-{name}\"><h3>{name}",
            name = escape(&node.name)
        );
        if let Some(mode) = &node.agent_mode {
            let _ = write!(out, " <span class=\"none\">({})</span>", escape(mode));
        }
        if !node.fresh {
            out.push_str(" <span class=\"stale\">stale heartbeat: nothing is placed here</span>");
        }
        if node.cordoned {
            out.push_str(" <span class=\"stale\">cordoned</span>");
        }
        out.push_str("</h3>");
        for gpu in &node.gpus {
            gpu_block(&mut out, &node.name, gpu);
        }
        out.push_str("</section>");
    }
    if !status.orphans.is_empty() {
        out.push_str("<h2>Placed on GPUs no GpuNode reports</h2>");
        jobs_table(&mut out, &status.orphans, true);
    }
    let _ = write!(
        out,
        "<h2>Waiting ({})</h2><div id=\"waiting\">",
        status.waiting.len()
    );
    if status.waiting.is_empty() {
        out.push_str("<p class=\"none\">none</p>");
    } else {
        out.push_str("<table><tr><th>job</th><th>priority</th><th>GPUs</th><th>budget</th><th>attempt</th><th>reason</th></tr>");
        for w in &status.waiting {
            let _ = write!(
                out,
                "<tr class=\"waiting\" data-job=\"{ns}/{name}\"><td>{ns}/{name}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                w.priority,
                w.gpus,
                w.budget_bytes.map_or_else(|| "-".into(), human_bytes),
                w.attempt,
                escape(&w.reason),
                ns = escape(&w.namespace),
                name = escape(&w.name),
            );
        }
        out.push_str("</table>");
    }
    let _ = write!(
        out,
        "</div><h2>Recent OOM retries ({})</h2><div id=\"retries\">",
        status.retries.len()
    );
    if status.retries.is_empty() {
        out.push_str("<p class=\"none\">none</p>");
    } else {
        out.push_str("<table><tr><th>job</th><th>attempt</th><th>kind</th><th>micro x accum</th><th>when</th><th>message</th></tr>");
        for r in &status.retries {
            let _ = write!(
                out,
                "<tr class=\"retry\" data-job=\"{ns}/{name}\"><td>{ns}/{name}</td><td>{}</td><td>{}</td><td>{} &rarr; {}</td><td>{}</td><td>{}</td></tr>",
                r.attempt,
                escape(&r.kind),
                escape(&r.from),
                escape(r.to.as_deref().unwrap_or("?")),
                escape(r.time.as_deref().unwrap_or("-")),
                escape(r.message.as_deref().unwrap_or("")),
                ns = escape(&r.namespace),
                name = escape(&r.name),
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</div></body></html>\n");
    out
}

/// The page shown when the API server cannot be read; it keeps reloading.
pub fn error_page(message: &str, refresh_seconds: u32) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta http-equiv=\"refresh\" content=\"{refresh_seconds}\"><title>vramfit status</title>\
<style>{STYLE}</style></head><body><h1>vramfit status</h1>\
<p class=\"stale\" id=\"error\">{}</p></body></html>\n",
        escape(message)
    )
}
