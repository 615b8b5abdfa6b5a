//! The scheduling cycle's ledger, kept from one cycle to the next: every
//! placement that holds memory (recorded in a job's status, assigned by the
//! cycle and not yet recorded, or held by a pod of a deleted job), the jobs
//! that wait, the pods whose placement no status records and the pods to
//! delete.
//!
//! The cycle used to rebuild all of it from the watch caches every time
//! (`recorded_placements`, `Assignments::pending_ledger`,
//! `pod_ledger::read_pods` and a filter over every job), which at 50,000
//! jobs cost more than the placing. [`Ledger::sync`] compares the caches'
//! objects with the ones it saw last (the caches hand out the same `Arc`
//! for an unchanged object) and recomputes only what changed: a job, its
//! pods, or its assignments ([`Assignments`] notes whose changed).
//! Everything here is pure; [`full_rebuild`] is the old computation, which
//! the tests and debug builds check it against ([`Ledger::snapshot`]).

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::cluster_view::{job_key, recorded_placement};
use super::pod_ledger::{self, OrphanPod, PodPlacement, pod_placement};
use super::scheduler::{Locked, current_attempt, is_waiting, recorded, recorded_placements};
use crate::api::{Phase, PlacementStatus, TrainingJob};
use crate::place::Placement;
use crate::place::memo::WordHasher;

/// Where a ledger entry comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntryKey {
    /// The placement a job's status records (by [`job_id`]).
    Recorded(String),
    /// An assignment of the cycle not yet recorded (job UID, attempt).
    Pending(String, u32),
    /// The pod of a deleted job (its UID, else `namespace/name`).
    Orphan(String),
}

/// What the ledger holds, in a fixed order: compared with [`full_rebuild`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// Every placement that holds memory, sorted.
    pub placements: Vec<Placement>,
    /// The waiting jobs ([`job_id`]), sorted.
    pub waiting: Vec<String>,
    /// Pods no status or assignment records: (job UID, attempt, placement).
    pub unrecorded: Vec<(String, u32, PlacementStatus)>,
    /// Pods of deleted jobs to delete, sorted.
    pub to_delete: Vec<OrphanPod>,
}

/// The ledger's key of a job: its UID, or (without one, as in tests) its
/// `namespace/name` behind a character no UID has.
pub fn job_id(job: &TrainingJob) -> String {
    match job.metadata.uid.as_deref() {
        Some(uid) => uid.to_string(),
        None => format!("\u{0}{}", job_key(job)),
    }
}

/// The ledger's key of a pod: its UID, or (without one, as in tests) its
/// `namespace/name` behind a character no UID has.
fn pod_id(pod: &Pod) -> String {
    match pod.metadata.uid.as_deref() {
        Some(uid) => uid.to_string(),
        None => format!(
            "\u{0}{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or_default(),
            pod.metadata.name.as_deref().unwrap_or_default()
        ),
    }
}

/// The UID of the TrainingJob that controls the pod.
fn owner_uid(pod: &Pod) -> Option<String> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "TrainingJob")
        .map(|o| o.uid.clone())
}

struct JobEntry {
    job: Arc<TrainingJob>,
    /// Attempts with a pending entry.
    pending: Vec<u32>,
}

struct PodEntry {
    pod: Arc<Pod>,
    owner: Option<String>,
    /// The pod's placement, read the first time it is needed.
    placement: Option<Option<PodPlacement>>,
}

/// Where a sync last saw an object the ledger holds.
#[derive(Clone, Copy)]
struct Seen {
    /// The sync, and the object's place in that sync's list.
    pass: u64,
    index: usize,
}

/// The address of the object an `Arc` points to: the ledger holds a clone
/// of every `Arc` it keys by address, so no other object can have it.
fn address<T>(object: &Arc<T>) -> usize {
    Arc::as_ptr(object) as usize
}

type ByAddress = HashMap<usize, Seen, BuildHasherDefault<WordHasher>>;

/// The ledger (see the module's documentation).
#[derive(Default)]
pub struct Ledger {
    syncs: u64,
    jobs: HashMap<String, JobEntry>,
    pods: HashMap<String, PodEntry>,
    /// Where each held job and pod object was last seen, by address: an
    /// unchanged object is found without reading it.
    job_seen: ByAddress,
    pod_seen: ByAddress,
    /// Pods by the UID of the job that controls them.
    pods_of: HashMap<String, HashSet<String>>,
    entries: HashMap<EntryKey, Placement>,
    committed: u64,
    waiting: HashSet<String>,
    unrecorded: HashMap<String, (String, u32, PlacementStatus)>,
    to_delete: HashMap<String, OrphanPod>,
    phases: HashMap<Phase, i64>,
    /// Entries changed since [`Ledger::take_changed`].
    changed: HashSet<EntryKey>,
    dirty_jobs: HashSet<String>,
    dirty_pods: HashSet<String>,
}

impl Ledger {
    /// Follows the caches as the cycle sees them now (`jobs` with their held
    /// predictions), then what `assignments` changed.
    pub fn sync(&mut self, jobs: &[Arc<TrainingJob>], pods: &[Arc<Pod>], assignments: &mut Locked) {
        self.syncs += 1;
        let pass = self.syncs;
        let mut seen_jobs = 0;
        for (index, job) in jobs.iter().enumerate() {
            // Most jobs are the object the ledger holds: found by address.
            if let Some(seen) = self.job_seen.get_mut(&address(job)) {
                if seen.pass != pass {
                    seen_jobs += 1;
                    *seen = Seen { pass, index };
                }
                continue;
            }
            let found = match job.metadata.uid.as_deref() {
                Some(uid) => self.jobs.get_mut(uid),
                None => self.jobs.get_mut(&job_id(job)),
            };
            match found {
                // Another object of a job seen already in this list.
                Some(entry) if self.job_seen[&address(&entry.job)].pass == pass => {}
                Some(entry) => {
                    seen_jobs += 1;
                    *self.phases.entry(phase(&entry.job)).or_default() -= 1;
                    *self.phases.entry(phase(job)).or_default() += 1;
                    self.job_seen.remove(&address(&entry.job));
                    entry.job = job.clone();
                    self.job_seen.insert(address(job), Seen { pass, index });
                    self.dirty_jobs.insert(job_id(job));
                }
                None => {
                    let id = job_id(job);
                    seen_jobs += 1;
                    *self.phases.entry(phase(job)).or_default() += 1;
                    self.jobs.insert(
                        id.clone(),
                        JobEntry {
                            job: job.clone(),
                            pending: Vec::new(),
                        },
                    );
                    self.job_seen.insert(address(job), Seen { pass, index });
                    self.dirty_jobs.insert(id);
                }
            }
        }
        if self.jobs.len() > seen_jobs {
            let job_seen = &self.job_seen;
            let gone: Vec<String> = self
                .jobs
                .iter()
                .filter(|(_, e)| job_seen[&address(&e.job)].pass != pass)
                .map(|(id, _)| id.clone())
                .collect();
            for id in gone {
                if let Some(entry) = self.jobs.remove(&id) {
                    self.job_seen.remove(&address(&entry.job));
                    *self.phases.entry(phase(&entry.job)).or_default() -= 1;
                    for attempt in entry.pending {
                        self.set_entry(EntryKey::Pending(id.clone(), attempt), None);
                    }
                }
                self.dirty_jobs.insert(id);
            }
        }
        let mut seen_pods = 0;
        for (index, pod) in pods.iter().enumerate() {
            if let Some(seen) = self.pod_seen.get_mut(&address(pod)) {
                if seen.pass != pass {
                    seen_pods += 1;
                    *seen = Seen { pass, index };
                }
                continue;
            }
            let found = match pod.metadata.uid.as_deref() {
                Some(uid) => self.pods.get(uid),
                None => self.pods.get(&pod_id(pod)),
            };
            match found {
                // Another object of a pod seen already in this list.
                Some(entry) if self.pod_seen[&address(&entry.pod)].pass == pass => {}
                Some(_) | None => {
                    seen_pods += 1;
                    let id = pod_id(pod);
                    self.remove_pod(&id);
                    let owner = owner_uid(pod);
                    if let Some(owner) = &owner {
                        self.pods_of
                            .entry(owner.clone())
                            .or_default()
                            .insert(id.clone());
                    }
                    self.pod_seen.insert(address(pod), Seen { pass, index });
                    self.pods.insert(
                        id.clone(),
                        PodEntry {
                            pod: pod.clone(),
                            owner,
                            placement: None,
                        },
                    );
                    self.dirty_pods.insert(id);
                }
            }
        }
        if self.pods.len() > seen_pods {
            let pod_seen = &self.pod_seen;
            let gone: Vec<String> = self
                .pods
                .iter()
                .filter(|(_, e)| pod_seen[&address(&e.pod)].pass != pass)
                .map(|(id, _)| id.clone())
                .collect();
            for id in gone {
                self.remove_pod(&id);
                self.dirty_pods.insert(id);
            }
        }
        self.refresh(assignments);
    }

    fn remove_pod(&mut self, id: &String) {
        let Some(old) = self.pods.remove(id) else {
            return;
        };
        self.pod_seen.remove(&address(&old.pod));
        if let Some(owner) = old.owner
            && let Some(set) = self.pods_of.get_mut(&owner)
        {
            set.remove(id);
            if set.is_empty() {
                self.pods_of.remove(&owner);
            }
        }
    }

    /// Recomputes what changed since the last sync or refresh: the jobs and
    /// pods [`Ledger::sync`] found changed, and the jobs whose assignments
    /// changed (a verdict recorded, an assignment forgotten).
    pub fn refresh(&mut self, assignments: &mut Locked) {
        self.dirty_jobs.extend(assignments.take_touched());
        let dirty: Vec<String> = self.dirty_jobs.drain().collect();
        for id in dirty {
            self.recompute_job(&id, assignments);
            if let Some(pods) = self.pods_of.get(&id) {
                self.dirty_pods.extend(pods.iter().cloned());
            }
        }
        let dirty: Vec<String> = self.dirty_pods.drain().collect();
        for id in dirty {
            self.recompute_pod(&id, assignments);
        }
    }

    fn recompute_job(&mut self, id: &str, assignments: &mut Locked) {
        let job = self.jobs.get(id).map(|e| e.job.clone());
        let job = job.as_deref();
        let recorded_entry = job.and_then(|j| recorded(j).map(|p| recorded_placement(j, p)));
        self.set_entry(EntryKey::Recorded(id.to_string()), recorded_entry);
        // Assignments are kept by UID; a job without one has none.
        let has_uid = job.is_none_or(|j| j.metadata.uid.is_some());
        let kept = if has_uid {
            assignments.prune(id, job)
        } else {
            Vec::new()
        };
        let old: Vec<u32> = self
            .jobs
            .get_mut(id)
            .map(|e| std::mem::take(&mut e.pending))
            .unwrap_or_default();
        for attempt in old {
            if !kept.iter().any(|(a, _)| *a == attempt) {
                self.set_entry(EntryKey::Pending(id.to_string(), attempt), None);
            }
        }
        if let Some(job) = job {
            for (attempt, placement) in &kept {
                self.set_entry(
                    EntryKey::Pending(id.to_string(), *attempt),
                    Some(recorded_placement(job, placement)),
                );
            }
            if let Some(entry) = self.jobs.get_mut(id) {
                entry.pending = kept.iter().map(|(a, _)| *a).collect();
            }
        }
        let uid = job
            .and_then(|j| j.metadata.uid.as_deref())
            .unwrap_or_default();
        let waits =
            job.is_some_and(|j| is_waiting(j, assignments.is_taken(uid, current_attempt(j))));
        if waits {
            self.waiting.insert(id.to_string());
        } else {
            self.waiting.remove(id);
        }
    }

    fn recompute_pod(&mut self, id: &String, assignments: &Locked) {
        self.unrecorded.remove(id);
        self.to_delete.remove(id);
        let mut orphan_entry = None;
        if let Some(entry) = self.pods.get_mut(id) {
            let job = entry
                .owner
                .as_ref()
                .and_then(|owner| self.jobs.get(owner))
                .map(|e| e.job.as_ref());
            // Most pods are their live job's recorded attempt.
            if job.is_none_or(pod_ledger::may_be_unrecorded) {
                let placement = entry
                    .placement
                    .get_or_insert_with(|| pod_placement(&entry.pod));
                if let Some(pod) = placement {
                    match job {
                        Some(job) => {
                            if pod_ledger::is_unrecorded(pod, job, |uid, attempt| {
                                assignments.is_taken(uid, attempt)
                            }) {
                                self.unrecorded.insert(
                                    id.clone(),
                                    (pod.job_uid.clone(), pod.attempt, pod.placement.clone()),
                                );
                            }
                        }
                        None => {
                            if !pod.ended {
                                orphan_entry = Some(pod_ledger::orphan_placement(pod));
                            }
                            if !pod.deleting {
                                self.to_delete
                                    .insert(id.clone(), pod_ledger::orphan_pod(pod));
                            }
                        }
                    }
                }
            }
        }
        self.set_entry(EntryKey::Orphan(id.clone()), orphan_entry);
    }

    fn set_entry(&mut self, key: EntryKey, placement: Option<Placement>) {
        let old = match placement {
            Some(new) => {
                if self.entries.get(&key) == Some(&new) {
                    return;
                }
                self.committed += held_bytes(&new);
                self.entries.insert(key.clone(), new)
            }
            None => self.entries.remove(&key),
        };
        match old {
            Some(old) => self.committed -= held_bytes(&old),
            None if !self.entries.contains_key(&key) => return,
            None => {}
        }
        self.changed.insert(key);
    }

    /// The entries changed since the last call (what a standing placer
    /// must follow).
    pub fn take_changed(&mut self) -> Vec<EntryKey> {
        self.changed.drain().collect()
    }

    /// The entry of `key`, if it holds memory.
    pub fn entry(&self, key: &EntryKey) -> Option<&Placement> {
        self.entries.get(key)
    }

    /// Every entry.
    pub fn entries(&self) -> impl Iterator<Item = (&EntryKey, &Placement)> {
        self.entries.iter()
    }

    /// Number of placements that hold memory.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no placement holds memory.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// GPU memory the entries hold (a budget once per GPU).
    pub fn committed_bytes(&self) -> u64 {
        self.committed
    }

    /// Jobs by phase (a job without status counts as its default phase).
    pub fn phase_counts(&self) -> &HashMap<Phase, i64> {
        &self.phases
    }

    /// The waiting jobs, from `jobs`: the list the last [`Ledger::sync`] was
    /// given.
    pub fn waiting<'a>(&self, jobs: &'a [Arc<TrainingJob>]) -> Vec<&'a TrainingJob> {
        let mut waiting: Vec<&'a TrainingJob> = self
            .waiting
            .iter()
            .filter_map(|id| jobs.get(self.index_of(id)?))
            .map(|j| j.as_ref())
            .collect();
        waiting.sort_by_key(|j| job_key(j));
        waiting
    }

    /// The job of `id` ([`job_id`]) from `jobs`: the list the last
    /// [`Ledger::sync`] was given.
    pub fn job<'a>(&self, id: &str, jobs: &'a [Arc<TrainingJob>]) -> Option<&'a TrainingJob> {
        jobs.get(self.index_of(id)?).map(|j| j.as_ref())
    }

    /// Where the last sync saw the job of `id` in its list.
    fn index_of(&self, id: &str) -> Option<usize> {
        let job = &self.jobs.get(id)?.job;
        Some(self.job_seen.get(&address(job))?.index)
    }

    /// Attempts whose pod exists while neither their job's status nor the
    /// cycle records them (`pod_ledger`), in a fixed order.
    pub fn unrecorded(&self) -> Vec<(String, u32, PlacementStatus)> {
        let mut list: Vec<_> = self.unrecorded.values().cloned().collect();
        list.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        list
    }

    /// Pods of deleted jobs, not yet being deleted.
    pub fn to_delete(&self) -> Vec<OrphanPod> {
        let mut list: Vec<OrphanPod> = self.to_delete.values().cloned().collect();
        list.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
        list
    }

    /// What the ledger holds, for comparison with [`full_rebuild`].
    pub fn snapshot(&self) -> Snapshot {
        let mut placements: Vec<Placement> = self.entries.values().cloned().collect();
        sort_placements(&mut placements);
        let mut waiting: Vec<String> = self.waiting.iter().cloned().collect();
        waiting.sort();
        Snapshot {
            placements,
            waiting,
            unrecorded: self.unrecorded(),
            to_delete: self.to_delete(),
        }
    }
}

fn phase(job: &TrainingJob) -> Phase {
    job.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// GPU memory a placement holds: its budget on each of its GPUs.
pub fn held_bytes(placement: &Placement) -> u64 {
    placement.gpu_budget * placement.gpu_indices.len() as u64
}

fn sort_placements(placements: &mut [Placement]) {
    placements.sort_by(|a, b| {
        (
            &a.job_id,
            &a.node,
            &a.gpu_indices,
            a.gpu_budget,
            a.cpu_milli,
            a.memory_bytes,
        )
            .cmp(&(
                &b.job_id,
                &b.node,
                &b.gpu_indices,
                b.gpu_budget,
                b.cpu_milli,
                b.memory_bytes,
            ))
    });
}

/// The ledger rebuilt from everything, as the cycle did every time: what
/// [`Ledger::snapshot`] must equal after a sync over the same objects.
/// Changes nothing.
pub fn full_rebuild(jobs: &[&TrainingJob], pods: &[&Pod], assignments: &Locked) -> Snapshot {
    let from_pods = pod_ledger::read_pods(jobs, pods, |uid, attempt| {
        assignments.is_taken(uid, attempt)
    });
    let mut placements = recorded_placements(jobs.iter().copied());
    placements.extend(assignments.pending_view(jobs));
    placements.extend(from_pods.orphaned);
    sort_placements(&mut placements);
    let mut waiting: Vec<String> = jobs
        .iter()
        .filter(|job| {
            let uid = job.metadata.uid.as_deref().unwrap_or_default();
            is_waiting(job, assignments.is_taken(uid, current_attempt(job)))
        })
        .map(|job| job_id(job))
        .collect();
    waiting.sort();
    let mut unrecorded = from_pods.unrecorded;
    unrecorded.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    let mut to_delete = from_pods.to_delete;
    to_delete.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
    Snapshot {
        placements,
        waiting,
        unrecorded,
        to_delete,
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
