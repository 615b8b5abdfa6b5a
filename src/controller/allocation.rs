//! The GpuNodes' `status.allocation` (committed, free and used GPU memory,
//! the columns of `kubectl get gn`), written by a task of its own instead of
//! by the scheduling cycle.
//!
//! Nothing in vramfit reads `status.allocation` back: the scheduler works
//! from the jobs' recorded placements and the agents' GPU reports, so the
//! allocation is a display, and how fresh it is decides nothing. That makes
//! it safe to write it late. Each node's allocation is written
//!
//! - at most once per [`MIN_INTERVAL`]: the changes a burst of placements
//!   makes to one node within that time are coalesced into one write, sent
//!   when the interval is over;
//! - when only the measured `used` memory moved by less than [`USED_STEP`]
//!   since the last write, only once that write is [`USED_REFRESH`] old (the
//!   agent's exact figures are in the same object, `status.gpus[].usedBytes`);
//! - by at most [`WRITE_CONCURRENCY`] requests at a time, none of them
//!   holding up a scheduling cycle.
//!
//! A failed write is tried again after [`MIN_INTERVAL`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::fence::Fence;
use crate::Result;
use crate::api::{GpuNode, NodeAllocation, PlacementStatus, TrainingJob};
use kube::runtime::watcher::Event;

/// Shortest time between two writes of one node's allocation.
pub const MIN_INTERVAL: Duration = Duration::from_secs(5);

/// A change of the measured memory alone smaller than this (summed over the
/// node's GPUs) is not worth a write of its own...
pub const USED_STEP: u64 = 1 << 30;

/// ...until the last write is this old.
pub const USED_REFRESH: Duration = Duration::from_secs(60);

/// Allocation writes in flight at once.
pub const WRITE_CONCURRENCY: usize = 4;

/// How long the task sleeps when nothing is due and nothing wakes it; the
/// heartbeat-driven parts of the allocation (a node going stale frees none
/// of its memory) change without a scheduling cycle.
const IDLE_RECHECK: Duration = Duration::from_secs(30);

/// Field manager of the `allocation` the controller writes into GpuNode status
/// (the agent owns the rest of the status).
pub const FIELD_MANAGER: &str = "vramfit-controller-allocation";

/// The allocation a node should show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// What goes into `status.allocation`.
    pub allocation: NodeAllocation,
    /// The measured memory behind `allocation.used`, in bytes.
    pub used_bytes: u64,
}

/// What was last written to one node, and when it was last tried.
#[derive(Clone, Debug)]
pub struct NodeState {
    /// The last allocation written successfully (none: the writes so far failed).
    pub written: Option<Wanted>,
    /// When the last write was sent, whether it worked or not.
    pub last_attempt: Instant,
}

/// When the node's allocation should next be written: `None` when nothing
/// needs writing. `in_status` is what the GpuNode shows now (the watch cache).
pub fn due(
    wanted: &Wanted,
    state: Option<&NodeState>,
    in_status: Option<&NodeAllocation>,
    now: Instant,
) -> Option<Instant> {
    if in_status == Some(&wanted.allocation) {
        return None;
    }
    let Some(state) = state else {
        // Nothing written since this controller started: write once now.
        return Some(now);
    };
    let earliest = state.last_attempt + MIN_INTERVAL;
    let Some(written) = &state.written else {
        return Some(earliest);
    };
    if in_status != Some(&written.allocation)
        || shown_apart_from_used(&written.allocation) != shown_apart_from_used(&wanted.allocation)
    {
        // The controller's own figures moved (or the status lost the last
        // write): write when the interval allows.
        return Some(earliest);
    }
    if written.used_bytes.abs_diff(wanted.used_bytes) >= USED_STEP {
        Some(earliest)
    } else {
        Some(state.last_attempt + USED_REFRESH)
    }
}

/// The allocation without its measured part.
fn shown_apart_from_used(allocation: &NodeAllocation) -> NodeAllocation {
    NodeAllocation {
        used: String::new(),
        ..allocation.clone()
    }
}

/// The allocation every reported node should show, by node name.
pub fn wanted<J, N>(
    jobs: &[J],
    gpu_nodes: &[N],
    now: Timestamp,
    heartbeat_ttl: SignedDuration,
) -> Vec<(String, Wanted)>
where
    J: std::borrow::Borrow<TrainingJob>,
    N: std::borrow::Borrow<GpuNode>,
{
    let (nodes, _) = crate::status::node_views(jobs, gpu_nodes, now, heartbeat_ttl);
    nodes
        .iter()
        .map(|node| {
            let wanted = Wanted {
                allocation: crate::status::node_allocation(node),
                used_bytes: node.gpus.iter().map(|g| g.measured_bytes).sum(),
            };
            (node.name.clone(), wanted)
        })
        .collect()
}

/// The writer task: wakes when the scheduling cycle says placements may have
/// changed (`wake`), or when a coalesced write falls due, and writes what is
/// due. Runs for the life of the controller; ends with the fence's error once
/// this replica may no longer write as the leader (no write goes out after).
pub async fn run(
    client: Client,
    jobs: Store<TrainingJob>,
    gpu_nodes: Store<GpuNode>,
    wake: Arc<Notify>,
    fence: Arc<Fence>,
    heartbeat_ttl: SignedDuration,
) -> Result<()> {
    let api: Api<GpuNode> = Api::all(client);
    let mut states: HashMap<String, NodeState> = HashMap::new();
    let mut next = Instant::now() + IDLE_RECHECK;
    loop {
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep_until(next) => {}
        }
        fence.check()?;
        let job_list = jobs.state();
        let node_list = gpu_nodes.state();
        let in_status: HashMap<String, Option<NodeAllocation>> = node_list
            .iter()
            .map(|n| {
                let current = n.status.as_ref().and_then(|s| s.allocation.clone());
                (n.name_any(), current)
            })
            .collect();
        let wanted = wanted(&job_list, &node_list, Timestamp::now(), heartbeat_ttl);
        drop((job_list, node_list));
        let now = Instant::now();
        let (writes, wake_at) = plan(wanted, &states, &in_status, now);
        next = wake_at;
        let results: Vec<(String, Wanted, bool)> = futures::stream::iter(writes)
            .map(|(name, want)| {
                let (api, fence) = (api.clone(), fence.clone());
                async move {
                    let ok = fence.check().is_ok() && write(&api, &name, &want.allocation).await;
                    (name, want, ok)
                }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .collect()
            .await;
        record(&mut states, results, &in_status, now);
    }
}

/// The writes due at `now` (node, allocation) and when the task should look
/// again: the earliest write due later, or [`IDLE_RECHECK`] from now.
/// `in_status` is each GpuNode's allocation as the watch cache shows it.
pub fn plan(
    wanted: Vec<(String, Wanted)>,
    states: &HashMap<String, NodeState>,
    in_status: &HashMap<String, Option<NodeAllocation>>,
    now: Instant,
) -> (Vec<(String, Wanted)>, Instant) {
    let mut next = now + IDLE_RECHECK;
    let mut writes = Vec::new();
    for (name, want) in wanted {
        let current = in_status.get(&name).and_then(Option::as_ref);
        match due(&want, states.get(&name), current, now) {
            Some(at) if at <= now => writes.push((name, want)),
            Some(at) => next = next.min(at),
            None => {}
        }
    }
    (writes, next)
}

/// Keeps the outcome of the writes sent at `now` (`true`: it worked), and
/// forgets the nodes no longer in `in_status` (deleted GpuNodes).
pub fn record(
    states: &mut HashMap<String, NodeState>,
    results: Vec<(String, Wanted, bool)>,
    in_status: &HashMap<String, Option<NodeAllocation>>,
    now: Instant,
) {
    states.retain(|name, _| in_status.contains_key(name));
    for (name, want, ok) in results {
        let state = states.entry(name).or_insert(NodeState {
            written: None,
            last_attempt: now,
        });
        state.last_attempt = now;
        if ok {
            state.written = Some(want);
        }
    }
}

async fn write(api: &Api<GpuNode>, name: &str, allocation: &NodeAllocation) -> bool {
    let patch = serde_json::json!({
        "apiVersion": <GpuNode as kube::Resource>::api_version(&()),
        "kind": <GpuNode as kube::Resource>::kind(&()),
        "status": {"allocation": allocation},
    });
    match api
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
    {
        Ok(_) => true,
        Err(error) => {
            tracing::warn!(%error, node = name, "could not write the GpuNode allocation");
            false
        }
    }
}

/// The recorded placement of each job as the watch saw it last, so that a
/// job placed, moved or ended wakes the writer as soon as its status is in
/// the cache, instead of at the next scheduling cycle (the cycle that made
/// the placement ran before its status was written, so `kubectl get gn`
/// lagged by up to a cycle).
#[derive(Default)]
pub struct PlacementWatch {
    placements: HashMap<String, PlacementStatus>,
    /// The placements of a relist under way.
    relisting: Option<HashMap<String, PlacementStatus>>,
}

impl PlacementWatch {
    /// Takes in one watch event; true when a recorded placement changed
    /// (or a relist ended), so the allocations may have.
    pub fn observe(&mut self, event: &Event<TrainingJob>) -> bool {
        fn placement(job: &TrainingJob) -> Option<PlacementStatus> {
            job.status.as_ref()?.recorded_placement().cloned()
        }
        let uid = |job: &TrainingJob| job.metadata.uid.clone().unwrap_or_default();
        match event {
            Event::Apply(job) => {
                let now = placement(job);
                let before = match &now {
                    Some(p) => self.placements.insert(uid(job), p.clone()),
                    None => self.placements.remove(&uid(job)),
                };
                before != now
            }
            Event::Delete(job) => self.placements.remove(&uid(job)).is_some(),
            Event::Init => {
                self.relisting = Some(HashMap::new());
                false
            }
            Event::InitApply(job) => {
                if let Some(p) = placement(job) {
                    self.relisting.get_or_insert_default().insert(uid(job), p);
                }
                false
            }
            Event::InitDone => {
                if let Some(relist) = self.relisting.take() {
                    self.placements = relist;
                }
                true
            }
        }
    }
}

#[cfg(test)]
#[path = "allocation_tests.rs"]
mod tests;
