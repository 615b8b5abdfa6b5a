use super::*;

/// Metrics with a sample in each (an empty family prints nothing).
fn populated() -> Metrics {
    let metrics = Metrics::default();
    metrics
        .jobs
        .get_or_create(&PhaseLabel {
            phase: "Pending".into(),
        })
        .set(1);
    metrics
        .reconcile_errors
        .get_or_create(&ErrorLabel {
            error: "conflict".into(),
        })
        .inc();
    metrics
}

/// Metric names the exposition declares (`# TYPE name kind`), with the
/// series suffixes Prometheus adds for counters and histograms.
fn exported_series() -> Vec<String> {
    let mut names = Vec::new();
    for line in populated().encode().lines() {
        let mut words = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        {
            match kind {
                "counter" => names.push(format!("{name}_total")),
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.push(format!("{name}{suffix}"));
                    }
                }
                _ => names.push(name.to_string()),
            }
        }
    }
    names
}

#[test]
fn the_grafana_dashboard_queries_only_exported_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/vramfit/dashboards/vramfit.json"
    );
    let dashboard = std::fs::read_to_string(path).expect("the chart's dashboard exists");
    let exported = exported_series();
    let mut queried = 0;
    for (start, _) in dashboard.match_indices("vramfit_") {
        let name: String = dashboard[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        // The agent's panels: held by the agent's own test
        // (daemon::metrics::tests::the_dashboard_queries_only_series_the_agent_exports).
        if name.starts_with("vramfit_agent_") {
            continue;
        }
        assert!(
            exported.contains(&name),
            "the dashboard queries {name}, which the controller does not export \
                 (exported: {exported:?})"
        );
        queried += 1;
    }
    assert!(queried >= 8, "the dashboard queries {queried} metrics");
}

#[test]
fn every_exported_metric_has_a_dashboard_panel() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/charts/vramfit/dashboards/vramfit.json"
    );
    let dashboard = std::fs::read_to_string(path).expect("the chart's dashboard exists");
    let text = populated().encode();
    assert!(text.contains("# TYPE vramfit_trainingjobs gauge"));
    for line in text.lines() {
        if let Some(name) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.split_whitespace().next())
        {
            assert!(
                dashboard.contains(name),
                "{name} is exported but not on the dashboard"
            );
        }
    }
}
