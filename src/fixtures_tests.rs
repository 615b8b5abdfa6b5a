use super::*;

#[test]
fn the_default_job_and_each_setter() {
    let plain = job("a").build();
    assert_eq!(plain.metadata.name.as_deref(), Some("a"));
    assert_eq!(plain.metadata.namespace.as_deref(), Some("ml"));
    assert_eq!(plain.metadata.uid.as_deref(), Some("uid-a"));
    assert_eq!((plain.spec.batch.global, plain.spec.batch.micro), (8, 8));
    assert_eq!(plain.spec.gpus, 1);
    assert!(plain.status.is_none());

    let built = job("b")
        .namespace("team")
        .created("2026-01-01T00:00:00Z")
        .meta("uid", Value::Null)
        .gpus(2)
        .priority(5)
        .batch(64, 16)
        .budget(7)
        .build();
    assert_eq!(built.metadata.namespace.as_deref(), Some("team"));
    assert!(built.metadata.creation_timestamp.is_some());
    assert!(built.metadata.uid.is_none());
    assert_eq!((built.spec.gpus, built.spec.priority), (2, 5));
    assert_eq!((built.spec.batch.global, built.spec.batch.micro), (64, 16));
    let status = built.status.unwrap();
    assert_eq!((status.attempt, status.budget_bytes), (1, Some(7)));

    let running = job("c").phase(Phase::Running).build();
    assert_eq!(running.status.unwrap().phase, Phase::Running);
}
