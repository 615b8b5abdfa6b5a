//! The budget watchdog's decision: which pods to stop.
//!
//! A pod is stopped when its processes on one GPU together use more than its
//! budget (per GPU, from the placement the controller recorded on the pod)
//! plus a tolerance, continuously for at least a grace period, and when they
//! use a GPU the placement did not give it at all (its budget there is zero).
//! Each new episode over the limit is stopped again: a process the pod starts
//! after a stop gets no free pass. Only processes mapped to a pod are ever
//! considered, so a process of another pod or of no pod is never part of an
//! order.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How strict the watchdog is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WatchdogConfig {
    /// Share of the budget a pod may exceed it by (0.05: 5 %).
    pub tolerance: f64,
    /// How long a pod must stay over before it is stopped.
    pub grace: Duration,
}

impl Default for WatchdogConfig {
    fn default() -> Self {
        Self {
            tolerance: 0.05,
            grace: Duration::from_secs(5),
        }
    }
}

/// Which pod (or, in local mode, which watched process) a usage belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Owner {
    /// Pod UID (local mode: `local-<pid>`).
    pub uid: String,
    /// Pod namespace (local mode: empty).
    pub namespace: String,
    /// Pod name (local mode: `pid-<pid>`).
    pub name: String,
}

/// What one pod uses on one GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct PodGpuUsage {
    /// The pod.
    pub owner: Owner,
    /// The GPU's UUID.
    pub gpu: String,
    /// The pod's budget per GPU, bytes; `None`: not watched.
    pub budget_bytes: Option<u64>,
    /// False when vramfit did not give the pod this GPU: any use of it is
    /// over budget.
    pub given: bool,
    /// Bytes its processes use on this GPU together.
    pub used_bytes: u64,
    /// Host PIDs of its processes on this GPU.
    pub pids: Vec<u32>,
}

/// An order to stop a pod.
#[derive(Clone, Debug, PartialEq)]
pub struct StopOrder {
    /// The pod.
    pub owner: Owner,
    /// The GPU it exceeded its budget on.
    pub gpu: String,
    /// Bytes used when the decision was made.
    pub used_bytes: u64,
    /// Its budget.
    pub budget_bytes: u64,
    /// Host PIDs to stop: the pod's processes on every GPU.
    pub pids: Vec<u32>,
    /// Why, in words (goes to the OOM report).
    pub reason: String,
}

/// The watchdog's memory between two readings.
#[derive(Debug)]
pub struct Watchdog {
    config: WatchdogConfig,
    /// Since when each (pod, GPU) has been over its limit; an order starts
    /// the count again.
    over_since: HashMap<(Owner, String), Instant>,
    stopped: HashSet<String>,
}

impl Watchdog {
    /// A watchdog with `config`.
    pub fn new(config: WatchdogConfig) -> Self {
        Self {
            config,
            over_since: HashMap::new(),
            stopped: HashSet::new(),
        }
    }

    /// The limit of a budget: budget plus tolerance.
    pub fn limit(&self, budget: u64) -> u64 {
        (budget as f64 * (1.0 + self.config.tolerance.max(0.0))).floor() as u64
    }

    /// Takes one reading and returns the pods to stop now. A pod that falls
    /// back under its limit, or that was just ordered stopped, starts its
    /// grace period again when it is (still) over it: every episode over the
    /// limit is stopped, the first and any after it.
    pub fn observe(&mut self, now: Instant, usage: &[PodGpuUsage]) -> Vec<StopOrder> {
        let mut over_now = HashSet::new();
        let mut orders: Vec<StopOrder> = Vec::new();
        for entry in usage {
            let budget = match (entry.given, entry.budget_bytes) {
                (false, _) => 0,
                (true, Some(budget)) => budget,
                (true, None) => continue,
            };
            if entry.used_bytes <= self.limit(budget) {
                continue;
            }
            let key = (entry.owner.clone(), entry.gpu.clone());
            let since = *self.over_since.entry(key.clone()).or_insert(now);
            over_now.insert(key);
            let over_for = now.saturating_duration_since(since);
            if over_for < self.config.grace || orders.iter().any(|o| o.owner == entry.owner) {
                continue;
            }
            let mut pids: Vec<u32> = usage
                .iter()
                .filter(|u| u.owner == entry.owner)
                .flat_map(|u| u.pids.iter().copied())
                .collect();
            pids.sort_unstable();
            pids.dedup();
            orders.push(StopOrder {
                owner: entry.owner.clone(),
                gpu: entry.gpu.clone(),
                used_bytes: entry.used_bytes,
                budget_bytes: budget,
                pids,
                reason: if entry.given {
                    format!(
                        "used {} on GPU {} for {:.1} s, over its budget of {} plus {:.0} % tolerance",
                        human(entry.used_bytes),
                        entry.gpu,
                        over_for.as_secs_f64(),
                        human(budget),
                        self.config.tolerance * 100.0
                    )
                } else {
                    format!(
                        "used {} for {:.1} s on GPU {}, which its placement did not give it",
                        human(entry.used_bytes),
                        over_for.as_secs_f64(),
                        entry.gpu
                    )
                },
            });
        }
        self.over_since.retain(|key, _| over_now.contains(key));
        for order in &orders {
            self.stopped.insert(order.owner.uid.clone());
            // The next episode over the limit is timed from this order.
            self.over_since
                .retain(|(owner, _), _| *owner != order.owner);
        }
        orders
    }

    /// True when the pod was ordered stopped at least once.
    pub fn has_stopped(&self, uid: &str) -> bool {
        self.stopped.contains(uid)
    }

    /// Forgets pods that no longer exist, so the set stays small.
    pub fn retain_pods(&mut self, alive: impl Fn(&str) -> bool) {
        self.stopped.retain(|uid| alive(uid));
    }
}

fn human(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
#[path = "watchdog_tests.rs"]
mod tests;
