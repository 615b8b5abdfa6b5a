use super::*;

const GIB: u64 = 1 << 30;

fn owner(name: &str) -> Owner {
    Owner {
        uid: format!("uid-{name}"),
        namespace: "ml".into(),
        name: name.into(),
    }
}

fn usage(name: &str, gpu: &str, budget: Option<u64>, used: u64, pids: &[u32]) -> PodGpuUsage {
    PodGpuUsage {
        owner: owner(name),
        gpu: gpu.into(),
        budget_bytes: budget,
        given: true,
        used_bytes: used,
        pids: pids.to_vec(),
    }
}

fn watchdog() -> Watchdog {
    Watchdog::new(WatchdogConfig {
        tolerance: 0.05,
        grace: Duration::from_secs(5),
    })
}

#[test]
fn a_pod_over_budget_plus_tolerance_for_the_grace_period_is_stopped() {
    let mut dog = watchdog();
    let t0 = Instant::now();
    let over = [usage("big", "GPU-0", Some(20 * GIB), 22 * GIB, &[101])];
    // (seconds after t0, expect an order)
    for (at, stop) in [
        (0, false),
        (2, false),
        (4, false),
        (5, true),
        (6, false),
        (9, false),
    ] {
        let orders = dog.observe(t0 + Duration::from_secs(at), &over);
        assert_eq!(orders.len(), usize::from(stop), "at {at} s: {orders:?}");
    }
    assert!(dog.has_stopped("uid-big"));
}

#[test]
fn usage_within_tolerance_or_a_short_spike_is_not_stopped() {
    let mut dog = watchdog();
    let t0 = Instant::now();
    let budget = 20 * GIB;
    let readings = [
        (0, 21 * GIB), // within 5 %
        (3, 23 * GIB), // over: grace starts
        (6, 20 * GIB), // back under: grace resets
        (7, 23 * GIB), // over again
        (11, 23 * GIB),
    ];
    for (at, used) in readings {
        let orders = dog.observe(
            t0 + Duration::from_secs(at),
            &[usage("p", "GPU-0", Some(budget), used, &[7])],
        );
        assert!(orders.is_empty(), "at {at} s");
    }
    let orders = dog.observe(
        t0 + Duration::from_secs(12),
        &[usage("p", "GPU-0", Some(budget), 23 * GIB, &[7])],
    );
    assert_eq!(orders.len(), 1, "5 s after it exceeded again");
}

#[test]
fn only_the_offending_pods_processes_are_ordered_stopped() {
    let mut dog = watchdog();
    let t0 = Instant::now();
    let readings = [
        // The offender, with a process on a second GPU too.
        usage("big", "GPU-0", Some(10 * GIB), 15 * GIB, &[101, 102]),
        usage("big", "GPU-1", Some(10 * GIB), 2 * GIB, &[103]),
        // A neighbour on the same GPU within its budget.
        usage("small", "GPU-0", Some(10 * GIB), 9 * GIB, &[201]),
        // A pod without a budget annotation: never watched.
        usage("free", "GPU-0", None, 100 * GIB, &[301]),
    ];
    dog.observe(t0, &readings);
    let orders = dog.observe(t0 + Duration::from_secs(5), &readings);
    assert_eq!(orders.len(), 1, "{orders:?}");
    let order = &orders[0];
    assert_eq!(order.owner, owner("big"));
    assert_eq!(order.pids, vec![101, 102, 103]);
    assert_eq!((order.used_bytes, order.budget_bytes), (15 * GIB, 10 * GIB));
    assert!(order.reason.contains("GPU-0"), "{}", order.reason);
}

#[test]
fn the_budget_is_per_gpu_not_summed_over_gpus() {
    let mut dog = watchdog();
    let t0 = Instant::now();
    let readings = [
        usage("ddp", "GPU-0", Some(10 * GIB), 9 * GIB, &[1]),
        usage("ddp", "GPU-1", Some(10 * GIB), 9 * GIB, &[2]),
    ];
    dog.observe(t0, &readings);
    assert!(
        dog.observe(t0 + Duration::from_secs(60), &readings)
            .is_empty()
    );
}

#[test]
fn zero_tolerance_limit_is_the_budget() {
    let dog = Watchdog::new(WatchdogConfig {
        tolerance: 0.0,
        grace: Duration::ZERO,
    });
    assert_eq!(dog.limit(10 * GIB), 10 * GIB);
    assert_eq!(watchdog().limit(100), 105);
}

/// A pod whose process survives a stop, or that starts another one that
/// goes over again, is stopped again: one grace period after the last order.
#[test]
fn every_episode_over_the_limit_is_stopped_not_only_the_first() {
    let mut dog = watchdog();
    let t0 = Instant::now();
    let over = [usage("big", "GPU-0", Some(20 * GIB), 22 * GIB, &[101])];
    let again = [usage("big", "GPU-0", Some(20 * GIB), 22 * GIB, &[102])];
    assert!(dog.observe(t0, &over).is_empty());
    assert_eq!(dog.observe(t0 + Duration::from_secs(5), &over).len(), 1);
    // Within a grace period of the order: the kill is under way.
    assert!(dog.observe(t0 + Duration::from_secs(6), &again).is_empty());
    assert!(dog.observe(t0 + Duration::from_secs(9), &again).is_empty());
    let orders = dog.observe(t0 + Duration::from_secs(11), &again);
    assert_eq!(orders.len(), 1, "the second episode");
    assert_eq!(orders[0].pids, vec![102]);
}

/// A GPU the placement did not give the pod has a budget of zero there,
/// whatever the pod's budget on its own GPUs.
#[test]
fn any_use_of_a_gpu_not_given_is_stopped() {
    let mut dog = watchdog();
    let t0 = Instant::now();
    let mut stray = usage("p", "GPU-1", Some(20 * GIB), 1 << 20, &[7]);
    stray.given = false;
    let readings = [usage("p", "GPU-0", Some(20 * GIB), 10 * GIB, &[6]), stray];
    assert!(dog.observe(t0, &readings).is_empty());
    let orders = dog.observe(t0 + Duration::from_secs(5), &readings);
    assert_eq!(orders.len(), 1, "{orders:?}");
    assert_eq!(
        (orders[0].gpu.as_str(), orders[0].budget_bytes),
        ("GPU-1", 0)
    );
    assert_eq!(orders[0].pids, vec![6, 7]);
    assert!(
        orders[0].reason.contains("did not give it"),
        "{}",
        orders[0].reason
    );
    // Without a budget at all (not watched) it is still stopped there.
    let mut bare = usage("q", "GPU-1", None, 1 << 20, &[8]);
    bare.given = false;
    dog.observe(t0, std::slice::from_ref(&bare));
    assert_eq!(dog.observe(t0 + Duration::from_secs(5), &[bare]).len(), 1);
}
