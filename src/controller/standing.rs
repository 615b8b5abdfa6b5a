//! The placement engine kept from one cycle to the next, in step with the
//! [`Ledger`]: built once for an inventory (`Placer::new`, the faulty GPUs'
//! reservations, then every ledger entry), it then follows only the entries
//! that changed. A cycle used to build it anew for every plan, which cost
//! restoring every placement and, worse, a cold policy: its scores are
//! cached per node until the node changes, so a standing engine measures
//! only the nodes that changed since the last plan.
//!
//! The policy learns the job mix from every entry when it is restored and
//! from every waiting job it is asked to place. A new inventory (a node
//! joined, left, went stale or changed its GPUs) builds it again.

use std::collections::{HashMap, HashSet};

use super::cluster_view::ClusterView;
use super::ledger::{EntryKey, Ledger};
use super::scheduler::{Verdict, observe_running};
use crate::place::{Inventory, PlaceError, Placement, Placer, Policy, PolicyKind};

/// The standing engine.
pub struct StandingPlacer {
    placer: Placer,
    kind: PolicyKind,
    /// The view it was built for.
    inventory: Inventory,
    reserved: Vec<Placement>,
    /// Which ledger entry holds each engine id, and the reverse.
    holder: HashMap<String, EntryKey>,
    held: HashMap<EntryKey, String>,
    /// Entries the engine did not take: a node not in the inventory, a
    /// placement that does not fit it, or an id another entry holds.
    unrestored: HashSet<EntryKey>,
}

/// The seed of the policy's random choices.
const SEED: u64 = 42;

impl StandingPlacer {
    /// An engine over `view` holding every entry of `ledger`.
    pub fn build(
        view: &ClusterView,
        ledger: &Ledger,
        kind: PolicyKind,
    ) -> Result<Self, PlaceError> {
        let mut placer = Placer::new(&view.inventory, Policy::new(kind, SEED))?;
        for placement in &view.reserved {
            if let Err(error) = placer.restore(placement) {
                tracing::debug!(%error, job = %placement.job_id, "reservation not restored");
            }
        }
        let mut standing = Self {
            placer,
            kind,
            inventory: view.inventory.clone(),
            reserved: view.reserved.clone(),
            holder: HashMap::new(),
            held: HashMap::new(),
            unrestored: HashSet::new(),
        };
        let mut keys: Vec<&EntryKey> = ledger.entries().map(|(k, _)| k).collect();
        keys.sort();
        for key in keys {
            standing.restore(key.clone(), ledger);
        }
        Ok(standing)
    }

    /// True when it was built for this view's inventory and reservations.
    pub fn fits(&self, view: &ClusterView) -> bool {
        self.inventory == view.inventory && self.reserved == view.reserved
    }

    /// The engine, to plan on.
    pub fn placer_mut(&mut self) -> &mut Placer {
        &mut self.placer
    }

    /// The engine.
    pub fn placer(&self) -> &Placer {
        &self.placer
    }

    /// The policy it was built with.
    pub fn kind(&self) -> PolicyKind {
        self.kind
    }

    /// Entries the engine does not hold.
    pub fn unrestored(&self) -> usize {
        self.unrestored.len()
    }

    /// Follows the ledger's entries that changed since it last did
    /// (`Ledger::take_changed`).
    pub fn follow(&mut self, ledger: &mut Ledger) {
        let mut changed = ledger.take_changed();
        changed.sort();
        let mut freed = false;
        let moved = self.move_held(&changed, ledger, &mut freed);
        for key in &changed {
            if !moved.contains(key) {
                freed |= self.drop_entry(key);
            }
        }
        for key in changed {
            if !moved.contains(&key) && ledger.entry(&key).is_some() {
                self.restore(key, ledger);
            }
        }
        if freed {
            self.retry(ledger);
        }
    }

    /// Entries that only moved: the placement an entry that is gone held,
    /// now under another key (an assignment recorded in the job's status),
    /// is handed to that key as it stands. Releasing and restoring it would
    /// end the same, but would touch its node (whose cached scores the policy
    /// then measures again) and show the policy the job a second time. The
    /// new key must be the first changed one (in order) with the job's id, as
    /// it is the one a release and restore in order would give the id to.
    /// Returns the keys handled, gone and new.
    fn move_held(
        &mut self,
        changed: &[EntryKey],
        ledger: &Ledger,
        freed: &mut bool,
    ) -> HashSet<EntryKey> {
        let mut moved = HashSet::new();
        let mut first = HashSet::new();
        for key in changed {
            let Some(placement) = ledger.entry(key) else {
                continue;
            };
            let id = &placement.job_id;
            if !first.insert(id.as_str()) {
                continue;
            }
            let Some(from) = self.holder.get(id) else {
                continue;
            };
            if from == key
                || ledger.entry(from).is_some()
                || changed.binary_search(from).is_err()
                || self.placer.state().placement(id) != Some(placement)
            {
                continue;
            }
            let from = from.clone();
            *freed |= self.drop_entry(key);
            self.held.remove(&from);
            self.hold(key.clone(), id.clone());
            moved.insert(from);
            moved.insert(key.clone());
        }
        moved
    }

    /// After a plan and its verdicts were followed: what the plan committed
    /// for a job that no ledger entry holds (a job that waits after all)
    /// is given back.
    pub fn settle(&mut self, ledger: &Ledger, verdicts: &[(String, Verdict)]) {
        let mut freed = false;
        for (id, _) in verdicts {
            if !self.holder.contains_key(id) && self.placer.release(id).is_some() {
                freed = true;
            }
        }
        if freed {
            self.retry(ledger);
        }
    }

    /// Releases what `key` holds; true when it held something.
    fn drop_entry(&mut self, key: &EntryKey) -> bool {
        self.unrestored.remove(key);
        let Some(id) = self.held.remove(key) else {
            return false;
        };
        self.holder.remove(&id);
        self.placer.release(&id).is_some()
    }

    fn restore(&mut self, key: EntryKey, ledger: &Ledger) {
        let Some(placement) = ledger.entry(&key) else {
            return;
        };
        let id = &placement.job_id;
        if let Some(committed) = self.placer.state().placement(id) {
            if self.holder.contains_key(id) {
                // Another entry holds the id: as in a full rebuild, the
                // first one restored keeps it.
                self.unrestored.insert(key);
                return;
            }
            // The last plan's commit for this job: the entry is its verdict.
            if committed == placement {
                self.hold(key, id.clone());
                return;
            }
            self.placer.release(id);
        }
        match self.placer.restore(placement) {
            Ok(()) => {
                observe_running(&mut self.placer, placement);
                self.hold(key, placement.job_id.clone());
            }
            Err(error) => {
                tracing::debug!(%error, job = %placement.job_id, "placement not restored");
                self.unrestored.insert(key);
            }
        }
    }

    fn hold(&mut self, key: EntryKey, id: String) {
        self.holder.insert(id.clone(), key.clone());
        self.held.insert(key, id);
    }

    /// Tries the entries not held again, once something was given back.
    fn retry(&mut self, ledger: &Ledger) {
        let mut keys: Vec<EntryKey> = self.unrestored.drain().collect();
        keys.sort();
        for key in keys {
            self.restore(key, ledger);
        }
    }

    /// Differences from an engine built afresh over `view` and `ledger`
    /// (free CPU, memory and GPU memory per node, and the ids held); empty
    /// when they agree. When an entry could not be restored in either, the
    /// outcome depends on the order and nothing is compared.
    pub fn differences(&self, view: &ClusterView, ledger: &Ledger) -> Vec<String> {
        let fresh = match Self::build(view, ledger, self.kind) {
            Ok(fresh) => fresh,
            Err(error) => return vec![format!("the view does not build: {error}")],
        };
        if !fresh.unrestored.is_empty() || !self.unrestored.is_empty() {
            return Vec::new();
        }
        let mut differences = Vec::new();
        let (ours, theirs) = (self.placer.state(), fresh.placer.state());
        if ours.placed_jobs() != theirs.placed_jobs() {
            differences.push(format!(
                "{} placements held, {} in a full rebuild",
                ours.placed_jobs(),
                theirs.placed_jobs()
            ));
        }
        for (a, b) in ours.nodes().iter().zip(theirs.nodes()) {
            if (a.cpu_free, a.mem_free, &a.gpu_free) != (b.cpu_free, b.mem_free, &b.gpu_free) {
                differences.push(format!(
                    "node {}: free cpu {} mem {} gpus {:?}, full rebuild {} {} {:?}",
                    a.name, a.cpu_free, a.mem_free, a.gpu_free, b.cpu_free, b.mem_free, b.gpu_free
                ));
            }
        }
        differences
    }
}

#[cfg(test)]
#[path = "standing_tests.rs"]
mod tests;
