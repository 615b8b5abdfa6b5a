use super::*;

#[test]
fn requests_round_up_to_512_bytes() {
    for (request, rounded) in [
        (0, 512),
        (1, 512),
        (512, 512),
        (513, 1024),
        (1 << 20, 1 << 20),
    ] {
        assert_eq!(round_request(request), rounded, "request {request}");
    }
}

#[test]
fn segment_size_follows_the_three_size_classes() {
    let mib = 1 << 20;
    for (rounded, segment) in [
        (512, 2 * mib),
        (mib, 2 * mib),
        (mib + 512, 20 * mib),
        (10 * mib - 512, 20 * mib),
        (10 * mib, 10 * mib),
        (10 * mib + 1, 12 * mib),
        (101 * mib, 102 * mib),
    ] {
        assert_eq!(segment_bytes_for(rounded), segment, "rounded {rounded}");
    }
}

#[test]
fn the_lower_of_budget_and_fraction_applies() {
    let gib = 1u64 << 30;
    let mut config = AllocatorConfig {
        budget_bytes: Some(4 * gib),
        ..Default::default()
    };
    assert_eq!(config.allowed_bytes(80 * gib), Some(4 * gib));
    assert!(config.budget_binds(80 * gib));
    config.memory_fraction = Some(0.025);
    assert_eq!(config.allowed_bytes(80 * gib), Some(2 * gib));
    assert!(!config.budget_binds(80 * gib));
    config.budget_bytes = None;
    assert_eq!(config.allowed_bytes(80 * gib), Some(2 * gib));
}

#[test]
fn policy_names_parse_both_ways() {
    for policy in [Policy::Pytorch, Policy::Vramfit] {
        assert_eq!(policy.to_string().parse::<Policy>(), Ok(policy));
    }
    assert!("best".parse::<Policy>().is_err());
}
