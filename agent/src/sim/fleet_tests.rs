use super::*;

#[test]
fn request_counters_are_summed_by_verb_and_resource() {
    let text = r#"# HELP apiserver_request_total Counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="vramfit.dev",resource="gpunodes",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 120
apiserver_request_total{code="409",component="apiserver",dry_run="",group="vramfit.dev",resource="gpunodes",scope="resource",subresource="status",verb="APPLY",version="v1alpha1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 7
apiserver_request_duration_seconds_bucket{le="0.1"} 5
"#;
    let totals = request_totals(text);
    assert_eq!(
        totals[&("APPLY".into(), "gpunodes".into(), "status".into())],
        123.0
    );
    assert_eq!(totals[&("WATCH".into(), "pods".into(), String::new())], 7.0);
    assert_eq!(totals.len(), 2);
    assert_eq!(sender("APPLY", "gpunodes", "status"), "agent");
    assert_eq!(sender("PATCH", "pods", "status"), "simulated kubelet");
    assert_eq!(sender("POST", "pods", ""), "benchmark driver");
}
