use std::time::{Duration, Instant};

use super::*;

#[test]
fn the_token_of_a_bearer_header() {
    let cases: &[(Option<&str>, Option<&str>)] = &[
        (Some("Bearer abc.def"), Some("abc.def")),
        (Some("bearer abc"), Some("abc")),
        (Some("  BEARER   abc  "), Some("abc")),
        (Some("Basic YWxpY2U6cGFzcw=="), None),
        (Some("Bearer"), None),
        (Some("Bearer   "), None),
        (Some("abc"), None),
        (Some(""), None),
        (None, None),
    ];
    for (header, want) in cases {
        assert_eq!(bearer(*header), *want, "{header:?}");
    }
}

#[test]
fn a_cached_answer_lasts_its_time_to_live() {
    let t0 = Instant::now();
    let mut cache = TtlCache::new(10);
    cache.put("a", 1, t0, Duration::from_secs(30));
    assert_eq!(cache.get(&"a", t0), Some(1));
    assert_eq!(cache.get(&"a", t0 + Duration::from_secs(29)), Some(1));
    assert_eq!(cache.get(&"a", t0 + Duration::from_secs(30)), None);
    assert_eq!(cache.get(&"b", t0), None);
    // A new answer replaces the old one and its time.
    cache.put(
        "a",
        2,
        t0 + Duration::from_secs(20),
        Duration::from_secs(30),
    );
    assert_eq!(cache.get(&"a", t0 + Duration::from_secs(45)), Some(2));
}

#[test]
fn a_full_cache_drops_the_expired_then_everything() {
    let t0 = Instant::now();
    let ttl = Duration::from_secs(10);
    let mut cache = TtlCache::new(3);
    cache.put(1, (), t0, ttl);
    cache.put(2, (), t0, ttl);
    cache.put(3, (), t0 + Duration::from_secs(5), ttl);
    // Full: 1 and 2 expired at t0 + 12 s and go; 3 stays.
    cache.put(4, (), t0 + Duration::from_secs(12), ttl);
    assert_eq!(cache.len(), 2);
    assert!(cache.get(&3, t0 + Duration::from_secs(12)).is_some());
    // Full of live entries: all go but the new one.
    cache.put(5, (), t0 + Duration::from_secs(13), ttl);
    cache.put(6, (), t0 + Duration::from_secs(13), ttl);
    assert_eq!(cache.len(), 1);
    assert!(cache.get(&6, t0 + Duration::from_secs(13)).is_some());
    // Replacing a key of a full cache drops nothing.
    let mut full = TtlCache::new(2);
    full.put(1, (), t0, ttl);
    full.put(2, (), t0, ttl);
    full.put(2, (), t0, ttl);
    assert_eq!(full.len(), 2);
    assert!(!full.is_empty());
}

/// No header: refused before any review, so no API server is needed (the
/// client points where nothing listens).
#[tokio::test]
async fn a_request_without_a_token_is_refused_without_asking() {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let reviewer = Reviewer::new(Client::try_from(config).unwrap(), Vec::new());
    for header in [None, Some("Basic x")] {
        assert!(matches!(
            reviewer.authorize(header, vec!["a".into()]).await,
            Err(Denial::Unauthenticated(_))
        ));
    }
    // With a token, the review is asked for, and the unreachable API server
    // is what answers.
    assert!(matches!(
        reviewer.authorize(Some("Bearer t"), vec![]).await,
        Err(Denial::Api(_))
    ));
}

#[tokio::test]
async fn reviews_in_flight_are_bounded() {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let reviewer = Reviewer::new(Client::try_from(config).unwrap(), Vec::new());
    let held = reviewer
        .in_flight
        .acquire_many(REVIEWS_IN_FLIGHT as u32)
        .await
        .unwrap();
    assert_eq!(
        reviewer.authorize(Some("Bearer t"), vec![]).await,
        Err(Denial::Busy)
    );
    drop(held);
    assert!(matches!(
        reviewer.authorize(Some("Bearer t"), vec![]).await,
        Err(Denial::Api(_))
    ));
}
