//! Human messages for jobs that do not fit, telling apart a job that no node
//! of the cluster could ever hold from one that only has to wait for room.

use super::PlaceError;
use super::inventory::JobRequest;
use super::state::{ClusterState, Demand, NodeState};

/// GPU capacities at or above this are bytes; below, abstract units (the
/// trace's thousandths of a GPU).
const BYTES_THRESHOLD: u64 = 1 << 20;

/// Why `job` (compiled as `demand`) fits nowhere right now.
pub(crate) fn explain_no_fit(
    state: &ClusterState,
    job: &JobRequest,
    demand: &Demand,
) -> PlaceError {
    match never_fits(state, job, demand) {
        Some(reason) => PlaceError::NeverFits {
            job: job.id.clone(),
            reason,
        },
        None => PlaceError::NoRoomNow {
            job: job.id.clone(),
            reason: no_room_now(state, demand),
        },
    }
}

fn serving_capacity_gpus(node: &NodeState, demand: &Demand) -> usize {
    (0..node.gpu_capacity.len())
        .filter(|&g| {
            node.gpu_capacity[g] >= demand.per_gpu
                && demand.models & (1u128 << node.gpu_model[g]) != 0
        })
        .count()
}

/// Whether the empty node could hold the job.
fn could_ever_hold(node: &NodeState, demand: &Demand) -> bool {
    node.cpu_total >= demand.cpu
        && node.mem_total >= demand.mem
        && (node.taints.is_empty() || node.view().admits(demand))
        && serving_capacity_gpus(node, demand) >= demand.gpus as usize
}

fn never_fits(state: &ClusterState, job: &JobRequest, demand: &Demand) -> Option<String> {
    let nodes = state.nodes();
    if nodes.iter().any(|n| could_ever_hold(n, demand)) {
        return None;
    }
    if demand.gpus > 0 {
        let allowed = |n: &NodeState, g: usize| demand.models & (1u128 << n.gpu_model[g]) != 0;
        let largest = nodes
            .iter()
            .flat_map(|n| {
                (0..n.gpu_capacity.len())
                    .filter(move |&g| allowed(n, g))
                    .map(move |g| (n, g))
            })
            .max_by_key(|(n, g)| n.gpu_capacity[*g]);
        let Some((node, g)) = largest else {
            return Some(format!(
                "no GPU of the allowed models ({}) in the cluster, which has {}",
                job.gpu_models.join(", "),
                state.models().join(", ")
            ));
        };
        let cap = node.gpu_capacity[g];
        if demand.per_gpu > cap {
            return Some(format!(
                "needs {} per GPU; bigger than any GPU in the cluster (largest {}: {} on {})",
                amount(demand.per_gpu, cap),
                state.models()[node.gpu_model[g] as usize],
                amount(cap, cap),
                node.name
            ));
        }
        let most = nodes
            .iter()
            .map(|n| (serving_capacity_gpus(n, demand), n))
            .max_by_key(|(c, _)| *c);
        if let Some((count, node)) = most
            && count < demand.gpus as usize
        {
            return Some(format!(
                "needs {} GPUs on one node; the most any node has is {count} ({})",
                demand.gpus, node.name
            ));
        }
    }
    let max_cpu = nodes.iter().map(|n| n.cpu_total).max().unwrap_or(0);
    if demand.cpu > max_cpu {
        return Some(format!(
            "needs {} CPU; the largest node has {}",
            cpu(demand.cpu),
            cpu(max_cpu)
        ));
    }
    let max_mem = nodes.iter().map(|n| n.mem_total).max().unwrap_or(0);
    if demand.mem > max_mem {
        return Some(format!(
            "needs {} memory; the largest node has {}",
            gib(demand.mem),
            gib(max_mem)
        ));
    }
    Some(
        "no node has the GPUs, CPU and memory together, or tolerates the job, even when empty"
            .into(),
    )
}

fn no_room_now(state: &ClusterState, demand: &Demand) -> String {
    let hosts: Vec<&NodeState> = state
        .nodes()
        .iter()
        .filter(|n| could_ever_hold(n, demand))
        .collect();
    if demand.gpus == 0 {
        let best = hosts
            .iter()
            .max_by_key(|n| n.cpu_free)
            .expect("a host exists");
        return format!(
            "needs {} CPU and {} memory; most free CPU {} (memory {}) on {}",
            cpu(demand.cpu),
            gib(demand.mem),
            cpu(best.cpu_free),
            gib(best.mem_free),
            best.name
        );
    }
    // Per node: how many GPUs could take one share of the job now.
    let serving_now = |n: &NodeState| {
        (0..n.gpu_free.len())
            .filter(|&g| n.view().gpu_serves(g, demand))
            .count()
    };
    let gpu_ok: Vec<&&NodeState> = hosts
        .iter()
        .filter(|n| serving_now(n) >= demand.gpus as usize)
        .collect();
    if !gpu_ok.is_empty() {
        let best = gpu_ok.iter().max_by_key(|n| n.cpu_free).expect("non-empty");
        return format!(
            "GPU room on {} node(s), but none with {} CPU and {} memory free (at most {} CPU, {} memory on {})",
            gpu_ok.len(),
            cpu(demand.cpu),
            gib(demand.mem),
            cpu(best.cpu_free),
            gib(best.mem_free),
            best.name
        );
    }
    // Memory alone would fit (which GPU room above ruled out for a job that
    // counts no compute): the GPUs' compute is what is taken.
    let memory_only = Demand {
        compute: 0,
        ..demand.clone()
    };
    let memory_room = |n: &NodeState| -> Vec<usize> {
        (0..n.gpu_free.len())
            .filter(|&g| n.view().gpu_serves(g, &memory_only))
            .collect()
    };
    if hosts
        .iter()
        .any(|n| memory_room(n).len() >= demand.gpus as usize)
    {
        let (node, left) = hosts
            .iter()
            .flat_map(|n| {
                memory_room(n)
                    .into_iter()
                    .map(move |g| (*n, n.gpu_compute_free[g]))
            })
            .max_by_key(|&(_, left)| left)
            .expect("a GPU has room for the memory");
        return format!(
            "needs {} of the compute of each of its {} GPU(s); GPUs with room for its memory have at most {} left ({})",
            percent(demand.compute),
            demand.gpus,
            percent(left),
            node.name
        );
    }
    let cap_hint = hosts
        .iter()
        .flat_map(|n| n.gpu_capacity.iter().copied())
        .max()
        .unwrap_or(0);
    if demand.gpus == 1 {
        let allowed = |n: &NodeState, g: usize| demand.models & (1u128 << n.gpu_model[g]) != 0;
        let largest = hosts
            .iter()
            .flat_map(|n| {
                (0..n.gpu_free.len())
                    .filter(move |&g| allowed(n, g))
                    .map(move |g| (*n, g))
            })
            .max_by_key(|(n, g)| n.gpu_free[*g]);
        let (node, g) = largest.expect("a host has an allowed GPU");
        return format!(
            "needs {} per GPU; largest free slot {} on {}",
            amount(demand.per_gpu, cap_hint),
            amount(node.gpu_free[g], cap_hint),
            node.name
        );
    }
    let best = hosts
        .iter()
        .max_by_key(|n| serving_now(n))
        .expect("a host exists");
    format!(
        "needs {} GPUs with {} free each on one node; at most {} on {}",
        demand.gpus,
        amount(demand.per_gpu, cap_hint),
        serving_now(best),
        best.name
    )
}

fn amount(units: u64, capacity_hint: u64) -> String {
    if capacity_hint >= BYTES_THRESHOLD {
        gib(units)
    } else {
        format!("{units} units")
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn percent(thousandths: u64) -> String {
    format!("{:.1} %", thousandths as f64 / 10.0)
}

fn cpu(milli: u64) -> String {
    format!("{:.1}", milli as f64 / 1000.0)
}
