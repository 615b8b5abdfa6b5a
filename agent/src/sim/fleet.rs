//! `vramfit-agent bench agents`: many simulated agents against one API server,
//! to measure what the agents cost it. The agents run in this process, each
//! with the real loop (readings, publish decision, server-side apply, pod
//! watch, simulated kubelet); the figures are the API server's own request
//! counters (`apiserver_request_total`), read before and after a window.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, PostParams};
use serde::Serialize;
use serde_json::json;
use tokio::sync::watch;

use super::cluster::NodeResources;
use super::{parse_sim_spec, run_simulated};
use crate::daemon::RunOptions;
use crate::node::publish::PublishPolicy;

/// What to run.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// Simulated agents (one node each).
    pub agents: usize,
    /// GPUs of each node (`COUNTxMODEL`).
    pub simulate: String,
    /// Pods started on each node at the start of the window.
    pub pods_per_node: usize,
    /// How long each pod runs.
    pub pod_run: Duration,
    /// The measured window.
    pub window: Duration,
    /// Time for the agents to start before the window opens.
    pub warm_up: Duration,
    /// The agents' reading interval.
    pub interval: Duration,
    /// The agents' heartbeat.
    pub heartbeat: Duration,
    /// The agents' shortest gap between writes of byte figures alone.
    pub min_write_gap: Duration,
    /// Seed of the pods' simulated peaks.
    pub seed: u64,
}

/// Requests of one verb on one resource during the window.
#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RequestRow {
    /// `APPLY`, `PATCH`, `WATCH`, ...
    pub verb: String,
    /// `gpunodes`, `pods`, ...
    pub resource: String,
    /// `status` or empty.
    pub subresource: String,
    /// Requests in the window.
    pub requests: f64,
    /// Per node per minute.
    pub per_node_per_minute: f64,
    /// Who sends them: `agent`, `simulated kubelet` or `benchmark driver`.
    pub sender: String,
}

/// The benchmark's result.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetReport {
    /// Agents (nodes).
    pub agents: usize,
    /// GPUs per node.
    pub simulate: String,
    /// Pods per node.
    pub pods_per_node: usize,
    /// Seconds each pod ran.
    pub pod_run_seconds: f64,
    /// Seconds measured.
    pub window_seconds: f64,
    /// Agents' interval, seconds.
    pub interval_seconds: f64,
    /// Agents' heartbeat, seconds.
    pub heartbeat_seconds: f64,
    /// Agents' minimum gap for byte-only writes, seconds.
    pub min_write_gap_seconds: f64,
    /// GpuNode status writes per node per minute (the agent's steady load).
    pub gpu_node_writes_per_node_per_minute: f64,
    /// All requests the agent itself sends, per node per minute.
    pub agent_requests_per_node_per_minute: f64,
    /// Requests by verb and resource.
    pub rows: Vec<RequestRow>,
}

/// `apiserver_request_total` summed over codes and scopes, by
/// (verb, resource, subresource).
pub fn request_totals(metrics: &str) -> BTreeMap<(String, String, String), f64> {
    let mut totals = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        *totals
            .entry((label("verb"), label("resource"), label("subresource")))
            .or_insert(0.0) += value;
    }
    totals
}

async fn scrape(client: &Client) -> anyhow::Result<BTreeMap<(String, String, String), f64>> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(request_totals(&client.request_text(request).await?))
}

fn sender(verb: &str, resource: &str, subresource: &str) -> &'static str {
    match (verb, resource, subresource) {
        (_, "gpunodes", _) | ("LIST" | "WATCH", "pods", "") => "agent",
        (_, "trainingjobs", _) => "agent",
        ("PATCH", "pods", "status") | ("DELETE", "pods", "") | (_, "nodes", _) => {
            "simulated kubelet"
        }
        _ => "benchmark driver",
    }
}

/// Runs the benchmark against the API server of `client` (which must have
/// the CRDs installed); removes its nodes and namespace at the end.
pub async fn bench_agents(client: Client, options: FleetOptions) -> anyhow::Result<FleetReport> {
    let spec = parse_sim_spec(&options.simulate).map_err(anyhow::Error::msg)?;
    let tag = format!("fleet{}", std::process::id());
    let namespace = tag.clone();
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}}))?,
        )
        .await?;
    let names: Vec<String> = (0..options.agents)
        .map(|i| format!("{tag}-n{i:04}"))
        .collect();
    let (stop, stopped) = watch::channel(false);
    let mut agents = Vec::new();
    for name in &names {
        let mut run = RunOptions::new(name);
        run.interval = options.interval;
        run.publish = PublishPolicy {
            heartbeat: options.heartbeat,
            min_gap: options.min_write_gap,
            ..PublishPolicy::default()
        };
        run.labels = BTreeMap::from([("vramfit.dev/pool".to_string(), tag.clone())]);
        let mut stopped = stopped.clone();
        agents.push(tokio::spawn(run_simulated(
            run,
            spec,
            options.pod_run,
            NodeResources::default(),
            Some(client.clone()),
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        )));
    }
    tokio::time::sleep(options.warm_up).await;

    let before = scrape(&client).await?;
    let opened = Instant::now();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let mut rng = options.seed.max(1);
    let mut creates = Vec::new();
    for (n, node) in names.iter().enumerate() {
        for p in 0..options.pods_per_node {
            // xorshift: the same peaks for the same seed.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let peak_gib = 8 + rng % 28;
            let gpu = p as u32 % spec.count;
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("p{n:04}-{p}"), "annotations": {
                    "vramfit.dev/budget-bytes": (40u64 << 30).to_string(),
                    "vramfit.dev/simulated-peak": format!("{peak_gib}Gi"),
                    "vramfit.dev/simulated-run": format!("{}s", options.pod_run.as_secs_f64())}},
                "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
                    "name": "train", "image": "simulated",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": super::simulated_uuid(node, gpu)}]}]}
            }))?;
            creates.push(pod);
        }
    }
    let created = futures::stream::iter(creates.into_iter().map(|pod| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &pod).await.map(|_| ()) }
    }))
    .buffer_unordered(32)
    .collect::<Vec<_>>()
    .await;
    if let Some(Err(e)) = created.into_iter().find(|r| r.is_err()) {
        tracing::warn!("creating a benchmark pod: {e}");
    }
    let left = options.window.saturating_sub(opened.elapsed());
    tokio::time::sleep(left).await;
    let after = scrape(&client).await?;
    let window = opened.elapsed().as_secs_f64();

    let _ = stop.send(true);
    for agent in agents {
        let _ = agent.await;
    }
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&namespace, &DeleteParams::default())
        .await;
    for name in &names {
        let _ = Api::<Node>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await;
        let _ = Api::<vramfit::api::GpuNode>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await;
    }

    let per = |n: f64| n / options.agents as f64 / (window / 60.0);
    let mut rows: Vec<RequestRow> = after
        .iter()
        .filter_map(|(key, total)| {
            let delta = total - before.get(key).copied().unwrap_or(0.0);
            let (verb, resource, subresource) = key;
            let counted =
                ["gpunodes", "pods", "nodes", "trainingjobs"].contains(&resource.as_str());
            (counted && delta > 0.0).then(|| RequestRow {
                verb: verb.clone(),
                resource: resource.clone(),
                subresource: subresource.clone(),
                requests: delta,
                per_node_per_minute: per(delta),
                sender: sender(verb, resource, subresource).into(),
            })
        })
        .collect();
    rows.sort_by(|a, b| b.requests.total_cmp(&a.requests));
    let writes: f64 = rows
        .iter()
        .filter(|r| r.resource == "gpunodes" && r.subresource == "status")
        .map(|r| r.requests)
        .sum();
    let agent_requests: f64 = rows
        .iter()
        .filter(|r| r.sender == "agent")
        .map(|r| r.requests)
        .sum();
    Ok(FleetReport {
        agents: options.agents,
        simulate: options.simulate,
        pods_per_node: options.pods_per_node,
        pod_run_seconds: options.pod_run.as_secs_f64(),
        window_seconds: window,
        interval_seconds: options.interval.as_secs_f64(),
        heartbeat_seconds: options.heartbeat.as_secs_f64(),
        min_write_gap_seconds: options.min_write_gap.as_secs_f64(),
        gpu_node_writes_per_node_per_minute: per(writes),
        agent_requests_per_node_per_minute: per(agent_requests),
        rows,
    })
}

#[cfg(test)]
#[path = "fleet_tests.rs"]
mod tests;
