use super::*;

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

#[test]
fn the_ui_gets_its_own_listener_unless_it_shares_the_metrics_address() {
    let both = Pages {
        metrics: true,
        ui: true,
    };
    let metrics = Pages {
        metrics: true,
        ui: false,
    };
    let ui = Pages {
        metrics: false,
        ui: true,
    };
    let cases = [
        (
            Some("0.0.0.0:8080"),
            Some("127.0.0.1:8081"),
            vec![("0.0.0.0:8080", metrics), ("127.0.0.1:8081", ui)],
        ),
        (
            Some("127.0.0.1:9000"),
            Some("127.0.0.1:9000"),
            vec![("127.0.0.1:9000", both)],
        ),
        (Some("0.0.0.0:8080"), None, vec![("0.0.0.0:8080", metrics)]),
        (None, Some("127.0.0.1:8081"), vec![("127.0.0.1:8081", ui)]),
        (None, None, vec![]),
    ];
    for (m, u, want) in cases {
        let want: Vec<(SocketAddr, Pages)> = want.into_iter().map(|(a, p)| (addr(a), p)).collect();
        assert_eq!(listeners(m.map(addr), u.map(addr)), want, "{m:?} {u:?}");
    }
}

/// Requests within the interval share one computation of the view; the
/// first after it computes again.
#[tokio::test]
async fn the_ui_view_is_computed_at_most_once_per_interval() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let cache = ViewCache::default();
    let computed = AtomicUsize::new(0);
    let compute = || async {
        let n = computed.fetch_add(1, Ordering::SeqCst) + 1;
        Err::<crate::status::ClusterStatus, String>(format!("view {n}"))
    };
    let t0 = Instant::now();
    let second = Duration::from_secs(1);
    let interval = Duration::from_secs(2);
    assert_eq!(
        cache.get(t0, interval, compute()).await,
        Err("view 1".into())
    );
    assert_eq!(
        cache.get(t0 + second, interval, compute()).await,
        Err("view 1".into())
    );
    assert_eq!(computed.load(Ordering::SeqCst), 1);
    assert_eq!(
        cache.get(t0 + interval, interval, compute()).await,
        Err("view 2".into())
    );
    assert_eq!(computed.load(Ordering::SeqCst), 2);
}

/// Once the leader's caches are set the page is served from them: the
/// client points at a port where nothing listens, so a LIST would fail.
#[tokio::test]
async fn the_ui_reads_the_watch_caches_once_they_are_set() {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let client = Client::try_from(config).unwrap();
    let source = UiSource::new(client, &ControllerOptions::default());
    assert!(source.compute().await.is_err(), "without caches it lists");
    let (jobs, mut job_writer) = kube::runtime::reflector::store::<TrainingJob>();
    let (nodes, _node_writer) = kube::runtime::reflector::store::<GpuNode>();
    let job = TrainingJob::test("a").namespace("team-a").build();
    job_writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(job));
    assert!(source.caches.set((jobs, nodes)).is_ok());
    let view = source.compute().await.expect("served from the caches");
    assert_eq!(view.phases.get("New"), Some(&1), "{view:?}");
}
