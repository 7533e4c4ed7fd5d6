//! `deploy/` cannot drift from the code: every `pagos_…` metric that the alert rules and
//! the Grafana dashboard query is one pagos exports, and the dashboard is valid JSON
//! with a query in every panel. (`promtool check rules` and `promtool test rules`, run
//! by `.ci/run`, check the rules themselves.)

use std::collections::BTreeSet;
use std::path::Path;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The metric names `text` mentions, without the suffixes Prometheus adds to a family.
fn metrics_named_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("pagos_") {
        let before = rest[..at].chars().last();
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '/') {
            let name = &tail[..end];
            let family = ["_total", "_bucket", "_count", "_sum"]
                .iter()
                .find_map(|suffix| name.strip_suffix(suffix))
                .unwrap_or(name);
            names.insert(family.to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The families pagos exports: the `# TYPE` lines of a registry with one sample in each
/// labelled family (an empty one is not rendered at all).
fn exported() -> BTreeSet<String> {
    use pagos::metrics::{LimitLabel, RouteLabel, StateLabel};
    let metrics = pagos::metrics::Metrics::new();
    metrics.idempotency_outcome(pagos::metrics::Keyed::Payment, "new");
    metrics
        .webhook_deliveries
        .get_or_create(&pagos::metrics::OutcomeLabel {
            outcome: "delivered",
        })
        .inc();
    metrics.webhook_event("aplicado");
    metrics.webhook_records_purged("event_ids", 1);
    metrics.decision("completed");
    metrics.gateway_call("charge", "succeeded", std::time::Instant::now());
    metrics
        .payments
        .get_or_create(&StateLabel { estado: "ENVIADA" })
        .set(1);
    metrics
        .refunds
        .get_or_create(&StateLabel { estado: "ENVIADO" })
        .set(1);
    metrics
        .newest_manual_review_age
        .get_or_create(&pagos::metrics::OperationLabel {
            operation: "payment",
        })
        .set(60.0);
    metrics
        .http_responses
        .get_or_create(&RouteLabel {
            method: "GET",
            route: "/healthz".into(),
            status: 200,
        })
        .inc();
    metrics
        .http_limited
        .get_or_create(&LimitLabel {
            limit: "max_in_flight",
        })
        .inc();
    metrics
        .render()
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_metric_the_alerts_and_the_dashboard_query_is_exported() {
    let exported = exported();
    assert!(exported.contains("pagos_payments"), "{exported:?}");
    for file in [
        "deploy/prometheus/alerts.yml",
        "deploy/prometheus/alerts_test.yml",
        "deploy/grafana/pagos.json",
    ] {
        let used = metrics_named_in(&read(file));
        assert!(!used.is_empty(), "{file} queries pagos' metrics");
        let unknown: Vec<&String> = used.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{file} queries metrics pagos does not export: {unknown:?}"
        );
    }
}

#[test]
fn the_dashboard_is_json_with_a_query_in_every_panel() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/pagos.json")).expect("valid JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 8);
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or("?");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}");
        for target in targets {
            assert!(
                target["expr"]
                    .as_str()
                    .is_some_and(|e| e.contains("pagos_")),
                "{title}"
            );
        }
    }
}

#[test]
fn every_alert_names_a_runbook_that_exists() {
    let rules = read("deploy/prometheus/alerts.yml");
    let mut runbooks = 0;
    for line in rules.lines() {
        if let Some(path) = line.trim().strip_prefix("runbook: ") {
            runbooks += 1;
            assert!(
                Path::new(env!("CARGO_MANIFEST_DIR")).join(path).is_file(),
                "{path}"
            );
        }
    }
    assert_eq!(
        runbooks,
        rules.matches("- alert:").count(),
        "one runbook per alert"
    );
}
