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
use crate::api::{GpuNode, NodeAllocation, TrainingJob};

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

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn wanted(committed: u64, used: u64) -> Wanted {
        Wanted {
            allocation: NodeAllocation {
                committed_bytes: committed,
                free_bytes: 80 * GIB - committed,
                committed: format!("{committed}"),
                free: format!("{}", 80 * GIB - committed),
                used: format!("{used}"),
                gpu_free: String::new(),
                jobs: 1,
            },
            used_bytes: used,
        }
    }

    fn state(written: Option<Wanted>, last_attempt: Instant) -> NodeState {
        NodeState {
            written,
            last_attempt,
        }
    }

    #[test]
    fn a_node_whose_status_already_shows_the_allocation_is_not_written() {
        let now = Instant::now();
        let want = wanted(10 * GIB, 3 * GIB);
        assert_eq!(due(&want, None, Some(&want.allocation), now), None);
        let old = wanted(5 * GIB, 3 * GIB);
        let long_ago = state(Some(old), now - 10 * USED_REFRESH);
        assert_eq!(
            due(&want, Some(&long_ago), Some(&want.allocation), now),
            None
        );
    }

    #[test]
    fn the_first_write_after_a_start_goes_out_at_once() {
        let now = Instant::now();
        let want = wanted(10 * GIB, 3 * GIB);
        assert_eq!(due(&want, None, None, now), Some(now));
        let other = wanted(20 * GIB, 3 * GIB);
        assert_eq!(due(&want, None, Some(&other.allocation), now), Some(now));
    }

    #[test]
    fn changes_within_the_interval_wait_for_its_end_and_go_out_as_one_write() {
        let written_at = Instant::now();
        let last = wanted(10 * GIB, 3 * GIB);
        let s = state(Some(last.clone()), written_at);
        // A placement one second after the last write: due when the interval ends.
        let soon = written_at + Duration::from_secs(1);
        let more = wanted(20 * GIB, 3 * GIB);
        let at = due(&more, Some(&s), Some(&last.allocation), soon).unwrap();
        assert_eq!(at, written_at + MIN_INTERVAL);
        assert!(at > soon, "not written before the interval is over");
        // Another one before then is due at the same time (one write for both).
        let even_more = wanted(30 * GIB, 3 * GIB);
        let later = written_at + Duration::from_secs(3);
        assert_eq!(
            due(&even_more, Some(&s), Some(&last.allocation), later),
            Some(written_at + MIN_INTERVAL)
        );
    }

    #[test]
    fn a_small_move_of_the_measured_memory_waits_for_the_refresh() {
        let written_at = Instant::now();
        let last = wanted(10 * GIB, 3 * GIB);
        let s = state(Some(last.clone()), written_at);
        let now = written_at + 2 * MIN_INTERVAL;
        let moved = wanted(10 * GIB, 3 * GIB + USED_STEP - 1);
        assert_eq!(
            due(&moved, Some(&s), Some(&last.allocation), now),
            Some(written_at + USED_REFRESH)
        );
        // Once the last write is that old, it goes out.
        let much_later = written_at + USED_REFRESH;
        assert!(due(&moved, Some(&s), Some(&last.allocation), much_later).unwrap() <= much_later);
    }

    #[test]
    fn a_large_move_of_the_measured_memory_is_written_after_the_interval() {
        let written_at = Instant::now();
        let last = wanted(10 * GIB, 3 * GIB);
        let s = state(Some(last.clone()), written_at);
        for moved in [3 * GIB + USED_STEP, 3 * GIB - USED_STEP] {
            let moved = wanted(10 * GIB, moved);
            assert_eq!(
                due(&moved, Some(&s), Some(&last.allocation), written_at),
                Some(written_at + MIN_INTERVAL),
                "{moved:?}"
            );
        }
    }

    #[test]
    fn a_failed_write_is_tried_again_after_the_interval() {
        let tried_at = Instant::now();
        let want = wanted(10 * GIB, 3 * GIB);
        let failed = state(None, tried_at);
        assert_eq!(
            due(&want, Some(&failed), None, tried_at),
            Some(tried_at + MIN_INTERVAL)
        );
    }

    #[test]
    fn a_status_that_lost_the_last_write_gets_it_again_even_for_a_small_move() {
        let written_at = Instant::now();
        let last = wanted(10 * GIB, 3 * GIB);
        let s = state(Some(last.clone()), written_at);
        let moved = wanted(10 * GIB, 3 * GIB + 1);
        // The GpuNode was recreated: its status has no allocation.
        assert_eq!(
            due(&moved, Some(&s), None, written_at),
            Some(written_at + MIN_INTERVAL)
        );
        // Unchanged wanted allocation, but the status shows another one.
        let other = wanted(1, 3 * GIB);
        assert_eq!(
            due(&last, Some(&s), Some(&other.allocation), written_at),
            Some(written_at + MIN_INTERVAL)
        );
    }

    fn named(name: &str, want: &Wanted) -> (String, Wanted) {
        (name.to_string(), want.clone())
    }

    fn shown(pairs: &[(&str, Option<&Wanted>)]) -> HashMap<String, Option<NodeAllocation>> {
        pairs
            .iter()
            .map(|(name, w)| (name.to_string(), w.map(|w| w.allocation.clone())))
            .collect()
    }

    #[test]
    fn a_pass_writes_what_is_due_by_now_and_wakes_for_the_earliest_later_write() {
        let now = Instant::now();
        let shows = wanted(10 * GIB, 3 * GIB);
        let moved = wanted(20 * GIB, 3 * GIB);
        let states: HashMap<String, NodeState> = [
            // Written 5 s ago: the interval is over exactly now.
            ("due-now", state(Some(shows.clone()), now - MIN_INTERVAL)),
            // Written 1 s and 3 s ago: due in 4 s and in 2 s.
            (
                "due-in-4s",
                state(Some(shows.clone()), now - Duration::from_secs(1)),
            ),
            (
                "due-in-2s",
                state(Some(shows.clone()), now - Duration::from_secs(3)),
            ),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect();
        let in_status = shown(&[
            ("up-to-date", Some(&shows)),
            ("new", None),
            ("due-now", Some(&shows)),
            ("due-in-4s", Some(&shows)),
            ("due-in-2s", Some(&shows)),
        ]);
        let all = vec![
            named("up-to-date", &shows),
            named("new", &moved),
            named("due-now", &moved),
            named("due-in-4s", &moved),
            named("due-in-2s", &moved),
        ];
        let (writes, next) = plan(all, &states, &in_status, now);
        let names: Vec<&str> = writes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["new", "due-now"]);
        assert!(writes.iter().all(|(_, w)| *w == moved));
        assert_eq!(next, now + Duration::from_secs(2));

        // Nothing due at all: look again after the idle recheck.
        let (writes, next) = plan(vec![named("up-to-date", &shows)], &states, &in_status, now);
        assert!(writes.is_empty());
        assert_eq!(next, now + IDLE_RECHECK);
        // A write due later than the idle recheck does not delay the recheck.
        let small = wanted(10 * GIB, 3 * GIB + 1);
        let recent: HashMap<String, NodeState> =
            [("n".to_string(), state(Some(shows.clone()), now))].into();
        let (writes, next) = plan(
            vec![named("n", &small)],
            &recent,
            &shown(&[("n", Some(&shows))]),
            now,
        );
        assert!(writes.is_empty());
        assert_eq!(next, now + IDLE_RECHECK, "the refresh is 60 s away");
    }

    #[test]
    fn a_pass_keeps_what_was_written_and_when_and_forgets_deleted_nodes() {
        let before = Instant::now();
        let now = before + Duration::from_secs(7);
        let old = wanted(10 * GIB, 3 * GIB);
        let new = wanted(20 * GIB, 4 * GIB);
        let mut states: HashMap<String, NodeState> = [
            ("kept", state(Some(old.clone()), before)),
            ("failed", state(Some(old.clone()), before)),
            ("deleted", state(Some(old.clone()), before)),
            ("untouched", state(Some(old.clone()), before)),
        ]
        .into_iter()
        .map(|(n, s)| (n.to_string(), s))
        .collect();
        let in_status = shown(&[
            ("kept", Some(&old)),
            ("failed", Some(&old)),
            ("untouched", Some(&old)),
            ("first", None),
            ("first-failed", None),
        ]);
        let results = vec![
            ("kept".to_string(), new.clone(), true),
            ("failed".to_string(), new.clone(), false),
            ("first".to_string(), new.clone(), true),
            ("first-failed".to_string(), new.clone(), false),
        ];
        record(&mut states, results, &in_status, now);
        let view = |name: &str| {
            let s = &states[name];
            (s.written.clone(), s.last_attempt)
        };
        assert_eq!(view("kept"), (Some(new.clone()), now));
        assert_eq!(
            view("failed"),
            (Some(old.clone()), now),
            "a failure keeps the last write"
        );
        assert_eq!(view("first"), (Some(new.clone()), now));
        assert_eq!(view("first-failed"), (None, now));
        assert_eq!(view("untouched"), (Some(old.clone()), before));
        assert!(!states.contains_key("deleted"));
        assert_eq!(states.len(), 5);
    }

    #[test]
    fn each_reported_node_wants_its_allocation_and_its_gpus_measured_memory() {
        let gpu = |index: u32, used: u64| {
            serde_json::json!({"index": index, "uuid": format!("GPU-{index}"), "model": "H200",
                               "totalBytes": 140 * GIB, "usedBytes": used, "health": "Healthy"})
        };
        let node = |name: &str, gpus: Vec<serde_json::Value>| -> GpuNode {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "vramfit.dev/v1alpha1", "kind": "GpuNode",
                "metadata": {"name": name}, "spec": {},
                "status": {"heartbeat": "2026-12-01T08:00:00Z", "gpus": gpus},
            }))
            .unwrap()
        };
        let nodes = [
            node("a", vec![gpu(0, 3 * GIB), gpu(1, 5 * GIB)]),
            node("b", vec![gpu(0, 7 * GIB)]),
        ];
        let now: Timestamp = "2026-12-01T08:00:10Z".parse().unwrap();
        let ttl = SignedDuration::from_secs(120);
        let got = super::wanted::<TrainingJob, _>(&[], &nodes, now, ttl);
        let (views, _) = crate::status::node_views::<TrainingJob, _>(&[], &nodes, now, ttl);
        let expected: Vec<(String, Wanted)> = views
            .iter()
            .zip([8 * GIB, 7 * GIB])
            .map(|(view, used)| {
                let allocation = crate::status::node_allocation(view);
                (
                    view.name.clone(),
                    Wanted {
                        allocation,
                        used_bytes: used,
                    },
                )
            })
            .collect();
        assert_eq!(got, expected);
        assert_eq!(got[0].1.allocation.free_bytes, 280 * GIB);
    }
}
