use super::*;

#[test]
fn same_seed_gives_same_stream_and_different_seeds_differ() {
    let a: Vec<u64> = (0..4)
        .scan(SeededRng::new(42), |r, _| Some(r.next_u64()))
        .collect();
    let b: Vec<u64> = (0..4)
        .scan(SeededRng::new(42), |r, _| Some(r.next_u64()))
        .collect();
    let c: Vec<u64> = (0..4)
        .scan(SeededRng::new(43), |r, _| Some(r.next_u64()))
        .collect();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn below_stays_in_range_and_reaches_every_value() {
    let mut rng = SeededRng::new(7);
    let mut seen = [false; 5];
    for _ in 0..1000 {
        let x = rng.below(5) as usize;
        seen[x] = true;
    }
    assert!(seen.iter().all(|&s| s));
}

#[test]
fn unit_stays_in_the_half_open_interval_and_spreads_over_it() {
    let mut rng = SeededRng::new(11);
    let draws: Vec<f64> = (0..2000).map(|_| rng.unit()).collect();
    assert!(draws.iter().all(|&x| (0.0..1.0).contains(&x)));
    assert!(draws.iter().any(|&x| x < 0.1) && draws.iter().any(|&x| x > 0.9));
    let mean = draws.iter().sum::<f64>() / draws.len() as f64;
    assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
    // The top 53 bits of the same stream.
    let bits = SeededRng::new(11).next_u64();
    assert_eq!(draws[0], (bits >> 11) as f64 / (1u64 << 53) as f64);
}

#[test]
fn shuffle_is_a_permutation() {
    let mut v: Vec<u32> = (0..100).collect();
    SeededRng::new(1).shuffle(&mut v);
    assert_ne!(v, (0..100).collect::<Vec<_>>());
    v.sort_unstable();
    assert_eq!(v, (0..100).collect::<Vec<_>>());
}
