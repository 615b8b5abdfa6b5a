//! What one reader may see of the cluster view: the `/ui` page, behind
//! Kubernetes authentication, shows a user the jobs of the namespaces where
//! they may list TrainingJobs, and the GPU nodes only when they may list
//! GpuNodes. Pure: the answers of the API server's access reviews in, the
//! restricted view out.

use std::collections::{BTreeMap, BTreeSet};

use super::{ClusterStatus, totals};

/// The namespaces whose jobs a reader sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Namespaces {
    /// Every namespace (may list TrainingJobs cluster-wide).
    All,
    /// These only.
    Only(BTreeSet<String>),
}

impl Namespaces {
    fn contains(&self, namespace: &str) -> bool {
        match self {
            Namespaces::All => true,
            Namespaces::Only(set) => set.contains(namespace),
        }
    }
}

/// What a reader may see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Whose jobs.
    pub namespaces: Namespaces,
    /// Every GPU node and its figures; without it, only the GPUs that run
    /// one of the reader's jobs.
    pub gpu_nodes: bool,
}

impl Access {
    /// The whole view (an admin, or no authentication configured).
    pub fn everything() -> Self {
        Access {
            namespaces: Namespaces::All,
            gpu_nodes: true,
        }
    }

    /// From the access reviews' answers: `all` (list TrainingJobs in every
    /// namespace), each namespace asked about with its answer, and `gpu_nodes`
    /// (list GpuNodes). None when the reader may see nothing at all.
    pub fn from_reviews(
        all: bool,
        namespaces: impl IntoIterator<Item = (String, bool)>,
        gpu_nodes: bool,
    ) -> Option<Self> {
        let namespaces = if all {
            Namespaces::All
        } else {
            Namespaces::Only(
                namespaces
                    .into_iter()
                    .filter_map(|(ns, allowed)| allowed.then_some(ns))
                    .collect(),
            )
        };
        let nothing = matches!(&namespaces, Namespaces::Only(set) if set.is_empty());
        (!nothing || gpu_nodes).then_some(Access {
            namespaces,
            gpu_nodes,
        })
    }
}

/// Phase counts summed over namespaces.
pub(super) fn sum_phases<'a>(
    counts: impl Iterator<Item = &'a BTreeMap<String, usize>>,
) -> BTreeMap<String, usize> {
    let mut sum = BTreeMap::new();
    for by_phase in counts {
        for (phase, n) in by_phase {
            *sum.entry(phase.clone()).or_default() += n;
        }
    }
    sum
}

/// `view` as `access` lets its reader see it. Jobs of other namespaces go
/// (from the GPUs, the orphans, the queue, the retries and the phase
/// counts). A reader of GpuNodes keeps every GPU with its figures (memory
/// committed and measured are the node's, whoever uses it); any other
/// reader keeps only the GPUs that run one of their jobs, and the totals are
/// summed over those.
pub fn restrict(mut view: ClusterStatus, access: &Access) -> ClusterStatus {
    if access == &Access::everything() {
        return view;
    }
    let sees = |ns: &str| access.namespaces.contains(ns);
    for node in &mut view.nodes {
        for gpu in &mut node.gpus {
            gpu.jobs.retain(|j| sees(&j.namespace));
        }
    }
    if !access.gpu_nodes {
        for node in &mut view.nodes {
            node.gpus.retain(|g| !g.jobs.is_empty());
        }
        view.nodes.retain(|n| !n.gpus.is_empty());
        view.totals = totals(&view.nodes);
    }
    view.orphans.retain(|j| sees(&j.namespace));
    view.waiting.retain(|j| sees(&j.namespace));
    view.retries.retain(|r| sees(&r.namespace));
    view.phases_by_namespace.retain(|ns, _| sees(ns));
    view.phases = sum_phases(view.phases_by_namespace.values());
    view
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
