use super::*;
use serde_json::json;
use std::cell::Cell;

fn node(name: &str, gpus: &[(&str, u64)], heartbeat: &str) -> GpuNode {
    gpus.iter()
        .fold(
            GpuNode::test(name).heartbeat(heartbeat).gpus(json!([])),
            |node, (model, total)| node.gpu(model, *total),
        )
        .build()
}

/// How many times each event sequence, followed by two lookups, computes
/// the models: 1 when the second lookup is served from the cache.
#[test]
fn only_a_change_of_the_gpus_drops_the_cached_models() {
    let a = |heartbeat| node("a", &[("H100", 80)], heartbeat);
    let cases: Vec<(&str, Vec<Event<GpuNode>>, u32)> = vec![
        ("a heartbeat keeps them", vec![Event::Apply(a("t2"))], 1),
        (
            "another capacity drops them",
            vec![Event::Apply(node("a", &[("H100", 94)], "t2"))],
            2,
        ),
        (
            "another model drops them",
            vec![Event::Apply(node("a", &[("H200", 80)], "t2"))],
            2,
        ),
        (
            "a new node drops them",
            vec![Event::Apply(node("b", &[("H100", 80)], "t1"))],
            2,
        ),
        ("a deleted node drops them", vec![Event::Delete(a("t1"))], 2),
        ("a relist drops them", vec![Event::Init], 2),
        ("the end of a relist drops them", vec![Event::InitDone], 2),
    ];
    for (name, events, want) in cases {
        let cache = GpuModelCache::default();
        cache.observe(&Event::Apply(a("t1")));
        let computed = Cell::new(0);
        let compute = || {
            computed.set(computed.get() + 1);
            vec![("H100".to_string(), 80)]
        };
        assert_eq!(cache.get_or_compute(compute), [("H100".to_string(), 80)]);
        for event in &events {
            cache.observe(event);
        }
        cache.get_or_compute(compute);
        assert_eq!(computed.get(), want, "{name}");
    }
}

#[test]
fn models_computed_across_a_change_are_not_kept() {
    let cache = GpuModelCache::default();
    let old = cache.get_or_compute(|| {
        // The GpuNodes change while the old models are computed.
        cache.observe(&Event::Apply(node("a", &[("H200", 141)], "t1")));
        vec![("H100".to_string(), 80)]
    });
    assert_eq!(old, [("H100".to_string(), 80)]);
    let now = cache.get_or_compute(|| vec![("H200".to_string(), 141)]);
    assert_eq!(now, [("H200".to_string(), 141)]);
}
