use super::*;
use crate::api::GpuHealth;
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;

fn start() -> Timestamp {
    "2026-06-01T12:00:00Z".parse().unwrap()
}

fn ttl() -> SignedDuration {
    SignedDuration::from_secs(120)
}

fn gpu_node(name: &str, heartbeat: Timestamp, gpus: usize) -> Arc<GpuNode> {
    let node = (0..gpus).fold(GpuNode::test(name).gpus(json!([])), |node, i| {
        node.gpu("H200", 141 * GIB)
            .uuid(&format!("GPU-{name}-{i}"))
            .used(0)
            .health("Healthy")
    });
    Arc::new(
        node.status_fields(json!({"gpuCount": gpus}))
            .heartbeat(&heartbeat.to_string())
            .build(),
    )
}

fn node(name: &str, spec: Value, cpu: &str) -> Arc<Node> {
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": spec,
            "status": {"allocatable": {"cpu": cpu, "memory": "512Gi"}}
        }))
        .unwrap(),
    )
}

/// The watch caches as a cycle sees them.
struct World {
    gpu_nodes: Vec<Arc<GpuNode>>,
    nodes: Vec<Arc<Node>>,
    now: Timestamp,
}

impl World {
    fn gpu_node_mut(&mut self, name: &str) -> &mut GpuNode {
        let found = self
            .gpu_nodes
            .iter_mut()
            .find(|n| n.metadata.name.as_deref() == Some(name))
            .unwrap();
        Arc::make_mut(found)
    }

    fn beat(&mut self, name: &str) {
        let now = self.now.to_string();
        self.gpu_node_mut(name).status.as_mut().unwrap().heartbeat = Some(now);
    }

    fn later(&mut self, seconds: i64) {
        self.now = self
            .now
            .checked_add(SignedDuration::from_secs(seconds))
            .unwrap();
    }

    fn full(&self) -> ClusterView {
        let gpu_nodes: Vec<&GpuNode> = self.gpu_nodes.iter().map(|n| n.as_ref()).collect();
        let nodes: Vec<&Node> = self.nodes.iter().map(|n| n.as_ref()).collect();
        cluster_view(&gpu_nodes, &nodes, self.now, ttl())
    }
}

type Step = (&'static str, fn(&mut World), bool);

/// Each step changes the caches; the kept view must equal a full rebuild
/// after every one, and be assembled again only when the view changed
/// (the last field).
const STEPS: &[Step] = &[
    ("nothing changes", |_| {}, false),
    ("a heartbeat of a", |w| w.beat("a"), false),
    (
        "every node beats, 60 s later",
        |w| {
            w.later(60);
            for name in ["a", "b", "c"] {
                w.beat(name);
            }
        },
        false,
    ),
    (
        "b's heartbeat goes stale",
        |w| {
            w.later(100);
            w.beat("a");
            w.beat("c");
            w.later(30);
        },
        true,
    ),
    ("b beats again", |w| w.beat("b"), true),
    (
        "c is cordoned",
        |w| w.gpu_node_mut("c").spec.cordoned = true,
        true,
    ),
    (
        "c is uncordoned",
        |w| w.gpu_node_mut("c").spec.cordoned = false,
        true,
    ),
    (
        "a's Node turns unschedulable",
        |w| {
            w.nodes[0] = node("a", json!({"unschedulable": true}), "64");
        },
        true,
    ),
    (
        "a's Node turns schedulable, with more CPU",
        |w| {
            w.nodes[0] = node("a", json!({}), "96");
        },
        true,
    ),
    (
        "a's Node is replaced by an equal object",
        |w| {
            w.nodes[0] = node("a", json!({}), "96");
        },
        false,
    ),
    (
        "b's Node is deleted",
        |w| {
            w.nodes.retain(|n| n.metadata.name.as_deref() != Some("b"));
        },
        true,
    ),
    (
        "a GpuNode d without its Node",
        |w| {
            let now = w.now;
            w.gpu_nodes.push(gpu_node("d", now, 4));
        },
        false,
    ),
    (
        "d's Node and b's come",
        |w| {
            w.nodes.push(node("d", json!({}), "32"));
            w.nodes.push(node("b", json!({}), "64"));
        },
        true,
    ),
    (
        "a GPU of a turns faulty",
        |w| {
            w.gpu_node_mut("a").status.as_mut().unwrap().gpus[1].health = GpuHealth::Faulty;
        },
        true,
    ),
    (
        "a GPU's index no longer matches its position",
        |w| {
            w.gpu_node_mut("d").status.as_mut().unwrap().gpus[3].index = 7;
        },
        true,
    ),
    (
        "c's GpuNode is deleted",
        |w| {
            w.gpu_nodes
                .retain(|n| n.metadata.name.as_deref() != Some("c"));
        },
        true,
    ),
    (
        "the lists come in another order",
        |w| {
            w.gpu_nodes.reverse();
            w.nodes.reverse();
        },
        false,
    ),
    (
        "a GpuNode without a status",
        |w| {
            w.gpu_node_mut("b").status = None;
        },
        true,
    ),
    (
        "b reports again, with a heartbeat that does not parse",
        |w| {
            let now = w.now;
            let index = w
                .gpu_nodes
                .iter()
                .position(|n| n.metadata.name.as_deref() == Some("b"))
                .unwrap();
            w.gpu_nodes[index] = gpu_node("b", now, 2);
            w.gpu_node_mut("b").status.as_mut().unwrap().heartbeat = Some("yesterday".into());
        },
        false,
    ),
    ("b beats", |w| w.beat("b"), true),
    (
        "two GpuNodes of one name",
        |w| {
            let now = w.now;
            w.gpu_nodes.push(gpu_node("a", now, 1));
        },
        true,
    ),
    (
        "the second one goes",
        |w| {
            w.gpu_nodes.pop();
        },
        true,
    ),
    ("every node goes stale", |w| w.later(600), true),
];

#[test]
fn the_kept_view_equals_a_full_rebuild_after_every_change() {
    let now = start();
    let mut world = World {
        gpu_nodes: vec![
            gpu_node("a", now, 2),
            gpu_node("b", now, 2),
            gpu_node("c", now, 8),
        ],
        nodes: vec![
            node("a", json!({}), "64"),
            node("b", json!({}), "64"),
            node("c", json!({}), "64"),
        ],
        now,
    };
    let mut kept = KeptView::default();
    let mut last = kept.update(&world.gpu_nodes, &world.nodes, world.now, ttl());
    assert_eq!(*last, world.full(), "the first view");
    assert_eq!(last.inventory.nodes.len(), 3);
    for (step, change, view_changes) in STEPS {
        change(&mut world);
        let assembled = kept.assembled();
        let view = kept.update(&world.gpu_nodes, &world.nodes, world.now, ttl());
        assert_eq!(*view, world.full(), "after {step:?}");
        assert_eq!(
            !Arc::ptr_eq(&view, &last),
            *view_changes,
            "after {step:?}: a new view exactly when it changed"
        );
        if !view_changes {
            assert_eq!(
                kept.assembled(),
                assembled,
                "after {step:?}: nothing assembled"
            );
        }
        last = view;
    }
    assert!(last.inventory.nodes.is_empty());
}

#[test]
fn a_quiet_cycle_reads_no_node_again() {
    let now = start();
    let gpu_nodes = vec![gpu_node("a", now, 2), gpu_node("b", now, 2)];
    let nodes = vec![node("a", json!({}), "64"), node("b", json!({}), "64")];
    let mut kept = KeptView::default();
    let first = kept.update(&gpu_nodes, &nodes, now, ttl());
    for _ in 0..3 {
        let again = kept.update(&gpu_nodes, &nodes, now, ttl());
        assert!(Arc::ptr_eq(&first, &again));
    }
    assert_eq!(kept.assembled(), 1);
}
