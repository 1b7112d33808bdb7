//! What operators watch: the chart's alerts, unit-tested with `promtool test rules` firing and not
//! firing, and the Grafana dashboard's shape (variables on every query, units on every panel, names
//! the binary exports). The demo runs the dashboard's queries against a real Prometheus.

use std::collections::BTreeSet;
use std::process::Command;

use common::helm::{alerts, find, run, template};
use common::prometheus::{Query, dashboard, dashboard_queries};
use serde_json::{Value, json};

const ALERT_TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/alerts/rules.test.yaml");
const POD_MONITOR_ALERT_TESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/alerts/pod-monitor.test.yaml");
const ALERTS_PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference/alerts.md");
const LINT_EXCLUSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/.lint");
/// Where the binary names its metrics: the shared ones, and the conntrack repair's own.
const METRICS_SOURCES: [&str; 2] = [
    concat!(env!("CARGO_MANIFEST_DIR"), "/src/metrics.rs"),
    concat!(env!("CARGO_MANIFEST_DIR"), "/src/conntrack/metrics.rs"),
];

/// The values `tests/alerts/rules.test.yaml` was written for.
const ALERT_VALUES: [&str; 2] = [
    "metrics.prometheusRule.enabled=true",
    "metrics.prometheusRule.alertLabels.team=storage",
];

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
    let source: String = METRICS_SOURCES
        .iter()
        .map(|path| std::fs::read_to_string(path).unwrap())
        .collect();
    let unknown: Vec<String> = exprs
        .iter()
        .flat_map(|expr| metric_names(expr))
        .filter(|name| !source.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        unknown.is_empty(),
        "{what} use metrics the binary does not define (src/metrics.rs, src/conntrack/metrics.rs): {unknown:?}"
    );
}

/// `promtool check rules` on the alerts of `rule`, then `promtool test rules` with `tests`.
fn promtool_test(rule: &Value, tests: &str) {
    let dir = std::env::temp_dir().join(format!("svc-alerts-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&dir).unwrap();
    let groups = json!({"groups": rule["spec"]["groups"]});
    std::fs::write(dir.join("rules.yaml"), serde_yaml::to_string(&groups).unwrap()).unwrap();
    // The runbooks are the alerts page at the chart's own tag: the tests name it ${CHART_VERSION}.
    let expected = std::fs::read_to_string(tests).unwrap();
    let expected = expected.replace("${CHART_VERSION}", &common::docs::chart_version());
    std::fs::write(dir.join("rules.test.yaml"), expected).unwrap();
    run(Command::new("promtool")
        .current_dir(&dir)
        .args(["check", "rules", "rules.yaml"]));
    let tested = run(Command::new("promtool")
        .current_dir(&dir)
        .args(["test", "rules", "rules.test.yaml"]));
    println!("{}", String::from_utf8_lossy(&tested.stdout));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The Prometheus Operator names a PodMonitor's job after the monitor's namespace: the alerts
/// must find the components' series whatever namespace the monitors live in.
#[test]
#[ignore = "needs helm and promtool: run `make test`"]
fn the_alerts_find_the_jobs_of_monitors_in_another_namespace() {
    let rendered = template(&[
        ALERT_VALUES[0],
        "metrics.podMonitor.enabled=true",
        "metrics.podMonitor.namespace=monitoring",
    ]);
    let rule = find(&rendered, "PrometheusRule", "demo-shared-volume-controller");
    promtool_test(rule, POD_MONITOR_ALERT_TESTS);
}

#[test]
#[ignore = "needs helm and promtool: run `make test`"]
fn the_alerts_fire_when_they_should_and_only_then() {
    let rendered = template(&ALERT_VALUES);
    let rule = find(&rendered, "PrometheusRule", "demo-shared-volume-controller");
    promtool_test(rule, ALERT_TESTS);

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
    let anchors = common::docs::anchors(std::path::Path::new(ALERTS_PAGE));
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
            "{name}'s runbook {runbook} names no heading of docs/reference/alerts.md"
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
fn the_dashboard_has_the_scope_variables_with_cluster_hidden() {
    let dashboard = dashboard();
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        variables,
        [
            "datasource",
            "cluster",
            "namespace",
            "job",
            "instance",
            "node",
            "kube_proxy_job"
        ]
    );
    let cluster = &dashboard["templating"]["list"][1];
    assert_eq!(
        cluster["hide"], 2,
        "the cluster variable is hidden, as in the kube-prometheus dashboards"
    );
}

#[test]
fn every_dashboard_query_is_scoped_by_the_variables() {
    let dashboard = dashboard();
    let queries = dashboard_queries(&dashboard);
    assert!(queries.len() > 20, "{} queries", queries.len());
    let mut exprs = Vec::new();
    for Query { title, expr, .. } in &queries {
        // Every selector of the query carries every scope, so two releases never mix; kube-proxy's
        // metrics are not this release's: its job and the cluster scope them.
        let scopes: &[(&str, &str)] = if expr.contains("kubeproxy_") {
            &[("cluster", "cluster"), ("job", "kube_proxy_job")]
        } else {
            &[
                ("cluster", "cluster"),
                ("namespace", "namespace"),
                ("job", "job"),
                ("instance", "instance"),
                ("node", "node"),
            ]
        };
        for (label, variable) in scopes {
            let selectors = expr.matches('{').count();
            let scoped = expr.matches(&format!("{label}=~\"${variable}\"")).count();
            assert!(
                selectors > 0 && scoped == selectors,
                "{title}: every selector of {expr} filters {label}=~\"${variable}\""
            );
        }
        exprs.push(expr.as_str());
    }
    assert_exported(&exprs, "dashboard panels");
}

#[test]
fn every_panel_has_a_unit_and_the_data_source_variable() {
    let dashboard = dashboard();
    for panel in dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
    {
        assert!(
            panel["fieldConfig"]["defaults"]["unit"].is_string(),
            "panel {} has a unit",
            panel["title"]
        );
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "panel {}", panel["title"]);
    }
    let alive = panel(&dashboard, "HA agents alive");
    assert!(
        alive["targets"][0]["expr"].as_str().unwrap().ends_with("or vector(0)"),
        "no agent alive shows 0, not no data"
    );
    let links = dashboard["links"].as_array().unwrap();
    assert!(
        links
            .iter()
            .any(|link| link["url"].as_str().unwrap().contains("docs/reference/alerts.md"))
    );
}

/// One finding of a dashboard-linter rule: (rule, panel title or "" for the dashboard, what).
type Finding = (&'static str, String, String);

/// The rules of Grafana's dashboard-linter (github.com/grafana/dashboard-linter), each by the
/// linter's name, over the dashboard: what each finds.
fn lint(dashboard: &Value) -> Vec<Finding> {
    let mut found: Vec<Finding> = Vec::new();
    let mut finding = |rule: &'static str, panel: &str, what: String| found.push((rule, panel.to_owned(), what));
    if dashboard["editable"] != false {
        finding("uneditable-dashboard", "", "the dashboard is editable".into());
    }
    lint_variables(dashboard, &mut finding);
    lint_panels(dashboard, &mut finding);
    found
}

/// The linter's template rules: the data source, job and instance variables as it expects them,
/// every query variable reloaded on a time change and over one of the scope labels.
fn lint_variables(dashboard: &Value, finding: &mut impl FnMut(&'static str, &str, String)) {
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    let variable = |name: &str| variables.iter().find(|v| v["name"] == name);
    match variable("datasource") {
        Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" && v["label"] == "Data source" => {}
        other => finding(
            "template-datasource-rule",
            "",
            format!("datasource variable: {other:?}"),
        ),
    }
    for (rule, name) in [("template-job-rule", "job"), ("template-instance-rule", "instance")] {
        match variable(name) {
            Some(v)
                if v["type"] == "query"
                    && v["datasource"]["uid"] == "${datasource}"
                    && v["multi"] == true
                    && v["includeAll"] == true
                    && v["allValue"] == ".+" => {}
            other => finding(rule, "", format!("{name} variable: {other:?}")),
        }
    }
    let labels = ["cluster", "namespace", "job", "instance", "node"];
    for v in variables.iter().filter(|v| v["type"] == "query") {
        if v["refresh"] != 2 {
            finding(
                "template-on-time-change-reload-rule",
                "",
                format!("{} refreshes on {}", v["name"], v["refresh"]),
            );
        }
        let query = v["query"]["query"].as_str().unwrap_or_default();
        let label = query
            .rsplit_once(',')
            .map(|(_, l)| l.trim().trim_end_matches(')'))
            .unwrap_or_default();
        if !labels.contains(&label) {
            finding(
                "template-label-promql-rule",
                "",
                format!("{}: label {label:?}", v["name"]),
            );
        }
    }
}

/// The linter's panel rules: a title and description, the data source variable, a known unit,
/// queries, and each query's own rules.
fn lint_panels(dashboard: &Value, finding: &mut impl FnMut(&'static str, &str, String)) {
    for panel in dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] != "row")
    {
        let title = panel["title"].as_str().unwrap_or_default();
        if title.is_empty() || panel["description"].as_str().unwrap_or_default().is_empty() {
            finding(
                "panel-title-description-rule",
                title,
                "no title or no description".into(),
            );
        }
        let ds = &panel["datasource"]["uid"];
        if ds != "${datasource}" && ds != "$datasource" {
            finding("panel-datasource-rule", title, format!("datasource {ds}"));
        }
        let units = ["short", "s", "ms", "ops", "percentunit", "bytes", "bool_yes_no", "none"];
        if !units.contains(&panel["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or_default()) {
            finding(
                "panel-units-rule",
                title,
                format!("unit {}", panel["fieldConfig"]["defaults"]["unit"]),
            );
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            finding("panel-no-targets-rule", title, "no queries".into());
        }
        for expr in targets.iter().filter_map(|t| t["expr"].as_str()) {
            lint_expr(expr, title, finding);
        }
    }
}

fn lint_expr(expr: &str, title: &str, finding: &mut impl FnMut(&'static str, &str, String)) {
    for (rule, matcher) in [
        ("target-job-rule", "job=~\"$job\""),
        ("target-instance-rule", "instance=~\"$instance\""),
    ] {
        if expr.matches('{').count() != expr.matches(matcher).count() {
            finding(rule, title, format!("a selector without {matcher}: {expr}"));
        }
    }
    // Every range of a rate-like function is $__rate_interval.
    for function in ["rate(", "irate(", "increase("] {
        for (at, _) in expr.match_indices(function) {
            if at > 0 && expr.as_bytes()[at - 1].is_ascii_alphanumeric() {
                continue; // irate( inside "rate(" matching, or a longer name
            }
            let range = expr[at..]
                .split_once('[')
                .and_then(|(_, r)| r.split_once(']'))
                .map(|(r, _)| r);
            if range != Some("$__rate_interval") {
                finding(
                    "target-rate-interval-rule",
                    title,
                    format!("{function}…[{range:?}] in {expr}"),
                );
            }
        }
    }
    // A counter is only ever read through rate() or increase().
    for counter in expr
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.ends_with("_total") || w.ends_with("_bucket"))
    {
        let at = expr.find(counter).unwrap();
        let before = &expr[..at];
        if !(before.ends_with("rate(") || before.ends_with("increase(")) {
            finding(
                "target-counter-agg-rule",
                title,
                format!("{counter} not under rate() or increase(): {expr}"),
            );
        }
    }
}

/// The exclusions of `grafana/.lint`: (rule, panel title, or "" for the whole rule).
fn lint_exclusions() -> Vec<(String, String)> {
    let file: Value = serde_yaml::from_str(&std::fs::read_to_string(LINT_EXCLUSIONS).unwrap()).unwrap();
    let mut excluded = Vec::new();
    for (rule, exclusion) in file["exclusions"].as_object().unwrap() {
        assert!(
            exclusion["reason"].as_str().is_some_and(|r| r.len() > 20),
            "{rule}: say why"
        );
        let entries = exclusion["entries"].as_array().cloned().unwrap_or_default();
        if entries.is_empty() {
            excluded.push((rule.clone(), String::new()));
        }
        for entry in entries {
            excluded.push((rule.clone(), entry["panel"].as_str().unwrap_or_default().to_owned()));
        }
    }
    excluded
}

#[test]
fn the_dashboard_passes_the_dashboard_linters_rules() {
    let excluded = lint_exclusions();
    let findings: Vec<Finding> = lint(&dashboard())
        .into_iter()
        .filter(|(rule, panel, _)| !excluded.iter().any(|(r, p)| r == rule && (p.is_empty() || p == panel)))
        .collect();
    assert!(findings.is_empty(), "dashboard-linter findings:\n{findings:#?}");
    // Every exclusion is still needed: one that excuses nothing hides the next real finding.
    let raw = lint(&dashboard());
    for (rule, panel) in &excluded {
        assert!(
            raw.iter()
                .any(|(r, p, _)| r == rule && (panel.is_empty() || p == panel)),
            "grafana/.lint excuses {rule} on {panel:?}, which no longer needs it"
        );
    }
    // The rules find what they are for.
    let mut broken = dashboard();
    broken["editable"] = json!(true);
    broken["panels"][1]["targets"][0]["expr"] = json!("rate(storageos_drbd_agent_actions_total{job=~\"$job\"}[5m])");
    let rules: BTreeSet<&str> = lint(&broken).iter().map(|(rule, _, _)| *rule).collect();
    for rule in [
        "uneditable-dashboard",
        "target-rate-interval-rule",
        "target-instance-rule",
    ] {
        assert!(
            rules.contains(rule),
            "{rule} finds nothing in a dashboard that breaks it: {rules:?}"
        );
    }
}

/// The dashboard's panel titled `title`.
fn panel(dashboard: &Value, title: &str) -> Value {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["title"] == title)
        .unwrap_or_else(|| panic!("a panel {title}"))
        .clone()
}

/// The color of `value` by the panel's thresholds.
fn color(thresholds: &Value, value: f64) -> String {
    let mut color = String::new();
    for step in thresholds["steps"].as_array().unwrap() {
        if step["value"].is_null() || step["value"].as_f64().unwrap() <= value {
            color = step["color"].as_str().unwrap().to_owned();
        }
    }
    color
}

#[test]
fn the_top_row_turns_red_when_it_should() {
    let dashboard = dashboard();
    let panel = |title: &str| panel(&dashboard, title);
    let leaders = panel("Controller leaders");
    let thresholds = &leaders["fieldConfig"]["defaults"]["thresholds"];
    let colors: Vec<String> = [0.0, 1.0, 2.0, 3.0].iter().map(|v| color(thresholds, *v)).collect();
    assert_eq!(colors, ["red", "green", "red", "red"]);
    assert!(
        leaders["fieldConfig"]["defaults"]["mappings"]
            .to_string()
            .contains("No leader")
    );
    let waiting = &panel("Claims waiting for a mount endpoint")["fieldConfig"]["defaults"]["thresholds"];
    assert_eq!(
        (color(waiting, 0.0), color(waiting, 1.0)),
        ("green".into(), "red".into())
    );
    assert_ne!(
        color(
            &panel("Agents in dry run")["fieldConfig"]["defaults"]["thresholds"],
            1.0
        ),
        "green"
    );
    let piraeus = panel("Piraeus HA Controller pods");
    assert_eq!(
        color(&piraeus["fieldConfig"]["defaults"]["thresholds"], 1.0),
        "red",
        "a second HA controller racing the agents"
    );
    assert_eq!(color(&piraeus["fieldConfig"]["defaults"]["thresholds"], 0.0), "green");
    let alive = panel("HA agents alive");
    assert_eq!(
        color(&alive["fieldConfig"]["defaults"]["thresholds"], 0.0),
        "red",
        "no agent alive"
    );
    let down = &alive["fieldConfig"]["overrides"][0];
    assert_eq!(down["matcher"]["options"], "down");
    assert_eq!(color(&down["properties"][0]["value"], 1.0), "red", "an agent down");
}

#[test]
fn rows_and_legends_name_what_users_look_for() {
    let dashboard = dashboard();
    let rows: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["type"] == "row")
        .map(|p| p["title"].as_str().unwrap())
        .collect();
    assert_eq!(
        rows,
        [
            "Overview",
            "Shared-volume controller",
            "HA agents",
            "Clients' data path",
            "Processes"
        ]
    );
    let legends: Vec<&str> = dashboard_queries_legends(&dashboard);
    // kube-proxy's instance label is its node's name (kube-prometheus relabels it so).
    assert!(
        legends
            .iter()
            .all(|l| !l.contains("{{instance}}") || l.starts_with("kube-proxy on")),
        "legends name nodes: {legends:?}"
    );
    assert!(legends.iter().any(|l| l.contains("{{node}}")), "{legends:?}");
}

fn dashboard_queries_legends(dashboard: &Value) -> Vec<&str> {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["legendFormat"].as_str())
        .collect()
}
