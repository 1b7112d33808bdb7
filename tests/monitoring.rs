//! What operators watch: the chart's alerts, unit-tested with `promtool test rules` firing and not
//! firing, and the Grafana dashboard's shape (variables on every query, units on every panel, names
//! the binary exports). The demo runs the dashboard's queries against a real Prometheus.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

use common::helm::{find, run, template};
use common::prometheus::{dashboard, dashboard_queries};
use serde_json::{Value, json};

const ALERT_TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/alerts/rules.test.yaml");
const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
const METRICS_SOURCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/metrics.rs");

/// The values `tests/alerts/rules.test.yaml` was written for.
const ALERT_VALUES: [&str; 2] = [
    "metrics.prometheusRule.enabled=true",
    "metrics.prometheusRule.alertLabels.team=storage",
];

fn alerts(rule: &Value) -> Vec<&Value> {
    rule["spec"]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("rules"))
        .collect()
}

fn alert_names(rule: &Value) -> BTreeSet<String> {
    alerts(rule)
        .iter()
        .map(|alert| alert["alert"].as_str().expect("alert name").to_owned())
        .collect()
}

/// The `storageos_…` metric names a PromQL expression uses (histogram suffixes dropped).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(start) = rest.find("storageos_") {
        let name: String = rest[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[start + name.len()..];
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .map_or(name.clone(), str::to_owned);
        names.insert(name);
    }
    names
}

/// Fails unless the binary defines every metric name `exprs` use: a misspelt name gives an alert
/// or a panel that is silent forever, and promtool cannot see that.
fn assert_exported(exprs: &[&str], what: &str) {
    let source = std::fs::read_to_string(METRICS_SOURCE).unwrap();
    let unknown: Vec<String> = exprs
        .iter()
        .flat_map(|expr| metric_names(expr))
        .filter(|name| !source.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        unknown.is_empty(),
        "{what} use metrics src/metrics.rs does not define: {unknown:?}"
    );
}

/// GitHub's anchors of the README's headings.
fn readme_anchors() -> BTreeSet<String> {
    std::fs::read_to_string(README)
        .unwrap()
        .lines()
        .filter(|line| line.starts_with('#'))
        .map(|line| {
            line.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[test]
#[ignore = "needs helm and promtool: run `make test`"]
fn the_alerts_fire_when_they_should_and_only_then() {
    let rendered = template(&ALERT_VALUES);
    let rule = find(&rendered, "PrometheusRule", "demo-shared-volume-controller");
    let dir = std::env::temp_dir().join(format!("svc-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let groups = json!({"groups": rule["spec"]["groups"]});
    std::fs::write(dir.join("rules.yaml"), serde_yaml::to_string(&groups).unwrap()).unwrap();
    std::fs::copy(ALERT_TESTS, dir.join("rules.test.yaml")).unwrap();
    run(Command::new("promtool")
        .current_dir(&dir)
        .args(["check", "rules", "rules.yaml"]));
    let tested = run(Command::new("promtool")
        .current_dir(&dir)
        .args(["test", "rules", "rules.test.yaml"]));
    println!("{}", String::from_utf8_lossy(&tested.stdout));
    std::fs::remove_dir_all(&dir).unwrap();

    // Every alert is tested both ways.
    let tests: Value = serde_yaml::from_str(&std::fs::read_to_string(ALERT_TESTS).unwrap()).unwrap();
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|test| test["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    for name in alert_names(rule) {
        let of_this: Vec<bool> = cases
            .iter()
            .filter(|case| case["alertname"] == name.as_str())
            .map(|case| case["exp_alerts"].as_array().is_some_and(|alerts| !alerts.is_empty()))
            .collect();
        assert!(
            of_this.contains(&true) && of_this.contains(&false),
            "{name} needs a case where it fires and one where it does not: {of_this:?}"
        );
    }

    // What on-call reads, and where the runbook is.
    let anchors = readme_anchors();
    let mut exprs = Vec::new();
    for alert in alerts(rule) {
        let name = alert["alert"].as_str().unwrap();
        for key in ["summary", "description", "runbook_url"] {
            assert!(alert["annotations"][key].is_string(), "{name} has no {key}");
        }
        let runbook = alert["annotations"]["runbook_url"].as_str().unwrap();
        let anchor = runbook.rsplit_once('#').map(|(_, anchor)| anchor).unwrap_or_default();
        assert!(
            anchors.contains(anchor),
            "{name}'s runbook {runbook} names no heading of README.md"
        );
        assert!(
            ["critical", "warning", "info"].contains(&alert["labels"]["severity"].as_str().unwrap_or_default()),
            "{name} has a severity"
        );
        exprs.push(alert["expr"].as_str().unwrap());
    }
    assert_exported(&exprs, "alerts");

    // Opt-in, and only for the parts installed.
    assert!(!template(&[]).iter().any(|o| o["kind"] == "PrometheusRule"));
    let agent_only = template(&[ALERT_VALUES[0], "controller.enabled=false"]);
    let names = alert_names(find(&agent_only, "PrometheusRule", "demo-shared-volume-controller"));
    assert!(
        names.iter().all(|name| !name.starts_with("SharedVolumeController")),
        "{names:?}"
    );
    assert!(names.contains("SharedVolumeAgentDown"));
    let labelled = template(&[ALERT_VALUES[0], "metrics.prometheusRule.labels.release=prometheus"]);
    let rule = find(&labelled, "PrometheusRule", "demo-shared-volume-controller");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
}

#[test]
fn every_dashboard_query_is_scoped_by_the_variables_and_every_panel_has_a_unit() {
    let dashboard = dashboard();
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(variables, ["datasource", "cluster", "namespace", "job", "instance"]);
    let cluster = &dashboard["templating"]["list"][1];
    assert_eq!(
        cluster["hide"], 2,
        "the cluster variable is hidden, as in the kube-prometheus dashboards"
    );

    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() > 20, "{} queries", queries.len());
    let mut exprs = Vec::new();
    for (title, expr) in &queries {
        for variable in ["cluster", "namespace", "job", "instance"] {
            // Every selector of the query carries every scope, so two releases never mix.
            let selectors = expr.matches('{').count();
            let scoped = expr.matches(&format!("{variable}=~\"${variable}\"")).count();
            assert!(
                selectors > 0 && scoped == selectors,
                "{title}: every selector of {expr} filters {variable}=~\"${variable}\""
            );
        }
        exprs.push(expr.as_str());
    }
    assert_exported(&exprs, "dashboard panels");

    for panel in dashboard["panels"].as_array().unwrap() {
        assert!(
            panel["fieldConfig"]["defaults"]["unit"].is_string(),
            "panel {} has a unit",
            panel["title"]
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "panel {}", panel["title"]);
    }
    let alive = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|panel| panel["title"] == "HA agents alive")
        .expect("an agents-alive panel");
    assert!(
        alive["targets"][0]["expr"].as_str().unwrap().ends_with("or vector(0)"),
        "no agent alive shows 0, not no data"
    );
    let links = dashboard["links"].as_array().unwrap();
    assert!(
        links
            .iter()
            .any(|link| link["url"].as_str().unwrap().contains("README.md"))
    );
}
