//! config/monitoring, checked as far as can be without promtool or Grafana: every alert is
//! complete and links a runbook section that exists, the dashboard parses and every panel
//! queries something, and every `teamgpu_*` series the rules and the dashboard read is one the
//! operator exports (a renamed metric would otherwise leave an alert silent forever).

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

const RUNBOOK: &str = "https://github.com/teamgpu/teamgpu/blob/main/docs/troubleshooting.md#";

fn repo_file(path: &str) -> String {
    let full = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn rules() -> Value {
    serde_saphyr::from_str(&repo_file("config/monitoring/prometheusrule.yaml"))
        .expect("prometheusrule.yaml is one YAML document")
}

fn alerts() -> Vec<Value> {
    let rules = rules();
    rules["spec"]["groups"]
        .as_array()
        .expect("spec.groups is a list")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("each group has rules").clone())
        .collect()
}

fn dashboard() -> Value {
    serde_json::from_str(&repo_file("config/monitoring/teamgpu-dashboard.json"))
        .expect("the dashboard is JSON")
}

/// Every panel, also those nested in collapsed rows.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels is a list") {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// The anchor GitHub gives a Markdown heading.
fn github_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn troubleshooting_anchors() -> BTreeSet<String> {
    repo_file("docs/troubleshooting.md")
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| github_anchor(l.trim_start_matches('#')))
        .collect()
}

/// `(`, `[`, `{` and quotes pair up: what a typo in a hand-written expression breaks first.
fn balanced(expr: &str) -> bool {
    let mut stack = Vec::new();
    let mut quote = None;
    for c in expr.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'' | '`') => quote = Some(c),
            (None, '(' | '[' | '{') => stack.push(c),
            (None, ')') if stack.pop() != Some('(') => return false,
            (None, ']') if stack.pop() != Some('[') => return false,
            (None, '}') if stack.pop() != Some('{') => return false,
            _ => {}
        }
    }
    stack.is_empty() && quote.is_none()
}

#[test]
fn every_alert_has_an_expression_a_duration_a_severity_and_a_runbook_section() {
    let rules = rules();
    assert_eq!(rules["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rules["kind"], "PrometheusRule");
    let anchors = troubleshooting_anchors();
    let alerts = alerts();
    let mut names = BTreeSet::new();
    for rule in &alerts {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        assert!(names.insert(name), "alert {name} is defined twice");
        let expr = rule["expr"].as_str().unwrap_or_default();
        assert!(!expr.trim().is_empty(), "{name} has no expr");
        assert!(
            balanced(expr),
            "{name}: unbalanced brackets or quotes in {expr}"
        );
        let duration = rule["for"].as_str().unwrap_or_default();
        assert!(
            duration.len() > 1
                && duration[..duration.len() - 1]
                    .chars()
                    .all(|c| c.is_ascii_digit())
                && duration.ends_with(['s', 'm', 'h']),
            "{name}: `for` must be a duration like 5m, not {:?}",
            rule["for"]
        );
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["critical", "warning", "info"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation]
                    .as_str()
                    .is_some_and(|s| !s.trim().is_empty()),
                "{name} has no {annotation}"
            );
        }
        let runbook = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        let anchor = runbook
            .strip_prefix(RUNBOOK)
            .unwrap_or_else(|| panic!("{name}: runbook_url {runbook:?} is not in {RUNBOOK}"));
        assert_eq!(
            anchor,
            name.to_lowercase(),
            "{name}: the runbook is the alert's own section"
        );
        assert!(
            anchors.contains(anchor),
            "{name}: docs/troubleshooting.md has no heading with anchor #{anchor}"
        );
    }
    // What the operator team asked to be alerted on.
    for wanted in [
        "TeamgpuOperatorDown",
        "TeamgpuOperatorNotReady",
        "TeamgpuNoLeader",
        "TeamgpuReconcileErrors",
        "TeamgpuTeamBelowGuarantee",
        "TeamgpuOvercommitted",
        "TeamgpuConflict",
        "TeamgpuDevicesUsedOutsideTeams",
    ] {
        assert!(names.contains(wanted), "no alert {wanted}: {names:?}");
    }
}

#[test]
fn a_team_below_its_guarantee_alerts_only_while_it_waits_for_devices_for_15_minutes() {
    let alerts = alerts();
    let rule = alerts
        .iter()
        .find(|r| r["alert"] == "TeamgpuTeamBelowGuarantee")
        .expect("the alert exists");
    let expr = rule["expr"].as_str().expect("expr");
    for series in [
        "teamgpu_team_allocated_devices",
        "teamgpu_team_effective_guarantee_devices",
        "teamgpu_team_pending_devices",
    ] {
        assert!(expr.contains(series), "{expr} does not read {series}");
    }
    assert!(
        expr.split_whitespace().any(|w| w == "and"),
        "both conditions must hold: {expr}"
    );
    assert_eq!(rule["for"], "15m");
}

#[test]
fn the_dashboard_parses_and_every_panel_queries_something() {
    let dashboard = dashboard();
    assert!(dashboard["title"].is_string());
    assert!(dashboard["uid"].is_string());
    let variables: BTreeSet<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    let panels = panels(&dashboard);
    let mut ids = BTreeSet::new();
    let mut exprs = String::new();
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(
            ids.insert(panel["id"].as_i64()),
            "panel id of {title} reused"
        );
        if panel["type"] == "row" {
            if let Some(repeat) = panel["repeat"].as_str() {
                assert!(variables.contains(repeat), "row {title} repeats ${repeat}");
            }
            continue;
        }
        let targets = panel["targets"].as_array().map(Vec::as_slice);
        assert!(
            targets.is_some_and(|t| !t.is_empty()),
            "panel {title} has no targets"
        );
        for target in targets.unwrap_or_default() {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "a target of {title} has no expr");
            assert!(balanced(expr), "{title}: unbalanced {expr}");
            exprs.push_str(expr);
            exprs.push('\n');
        }
        for variable in ["team", "sharing_policy"] {
            if format!("{title}{exprs}").contains(&format!("${variable}")) {
                assert!(variables.contains(variable), "${variable} is not defined");
            }
        }
    }
    // Per team and per sharing policy, what the readers asked to see.
    for series in [
        "teamgpu_team_guaranteed_devices",
        "teamgpu_team_entitlement_devices",
        "teamgpu_team_allocated_devices",
        "teamgpu_team_borrowed_devices",
        "teamgpu_team_pending_devices",
        "teamgpu_evictions_total",
        "teamgpu_sharing_policy_capacity_devices",
    ] {
        assert!(
            exprs.contains(series),
            "the dashboard does not show {series}"
        );
    }
}

/// The `teamgpu_*` names in a PromQL text.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while let Some(at) = text[i..].find("teamgpu_") {
        let start = i + at;
        let mut end = start + "teamgpu_".len();
        while end < bytes.len() && ident(bytes[end]) {
            end += 1;
        }
        if start == 0 || !ident(bytes[start - 1]) {
            names.insert(text[start..end].to_owned());
        }
        i = end;
    }
    names
}

/// Series that exist only after an event a test cannot cause through teamgpu's public API (an
/// eviction): written here until `Metrics` can list every family it registers.
const CREATED_ON_FIRST_EVENT: [&str; 2] =
    ["teamgpu_evictions_total", "teamgpu_evictions_refused_total"];

/// Every series name the operator exports, read from its registry's text format the way
/// Prometheus reads it. A family appears there only once it has a series, so the registry is
/// filled as a running operator fills it: a plan of the built-in example (six 8-GPU nodes, the
/// sample policies) and one of each counter it counts per pass.
fn exported_names() -> BTreeSet<String> {
    use teamgpu::controller::metrics::{ControllerLabels, ErrorLabels, Metrics, WriteLabels};
    let metrics = Metrics::default();
    let state = teamgpu::cli::example::state().expect("the built-in example loads");
    let plan = teamgpu::core::plan::plan(&state);
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let statuses = teamgpu::core::effects::applied_statuses(
        &plan,
        &state.sharing_policies,
        &state.teams,
        &teamgpu::core::effects::RefusedByOwner::default(),
        &now,
    );
    metrics.observe(&plan, &statuses);
    let controller = ControllerLabels {
        controller: "teamgpu",
    };
    metrics.reconciles.get_or_create(&controller).inc();
    metrics
        .reconcile_seconds
        .get_or_create(&controller)
        .observe(0.01);
    metrics
        .errors
        .get_or_create(&ErrorLabels {
            controller: "teamgpu",
            error: "conflict",
        })
        .inc();
    metrics
        .writes
        .get_or_create(&WriteLabels {
            kind: "ResourceQuota",
            verb: "apply",
        })
        .inc();
    let text = metrics.encode();
    let mut names: BTreeSet<String> = CREATED_ON_FIRST_EVENT.map(str::to_owned).into();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            "info" => &["_info"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

#[test]
fn rules_and_dashboard_read_only_metrics_the_operator_exports() {
    let exported = exported_names();
    for known in [
        "teamgpu_reconciles_total",
        "teamgpu_reconcile_duration_seconds_bucket",
        "teamgpu_team_allocated_devices",
        "teamgpu_leader",
    ] {
        assert!(
            exported.contains(known),
            "the registry's text format was not understood: {exported:?}"
        );
    }
    let mut used = BTreeSet::new();
    for rule in alerts() {
        used.extend(metric_names(rule["expr"].as_str().unwrap_or_default()));
    }
    let dashboard = dashboard();
    for panel in panels(&dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            used.extend(metric_names(target["expr"].as_str().unwrap_or_default()));
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        used.extend(metric_names(
            variable["definition"].as_str().unwrap_or_default(),
        ));
    }
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "config/monitoring reads series teamgpu does not export: {unknown:?}\nexported: {exported:?}"
    );
}

#[test]
fn the_service_monitor_scrapes_the_metrics_service() {
    let monitor: Value =
        serde_saphyr::from_str(&repo_file("config/monitoring/servicemonitor.yaml")).unwrap();
    let service: Value = serde_saphyr::from_str(&repo_file("config/manager/service.yaml")).unwrap();
    assert_eq!(monitor["kind"], "ServiceMonitor");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("matchLabels");
    for (key, value) in selector {
        assert_eq!(
            &service["metadata"]["labels"][key], value,
            "the Service lacks label {key}={value}"
        );
    }
    let ports: Vec<&Value> = service["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .map(|p| &p["name"])
        .collect();
    for endpoint in monitor["spec"]["endpoints"].as_array().expect("endpoints") {
        assert!(
            ports.contains(&&endpoint["port"]),
            "no port {}",
            endpoint["port"]
        );
        assert_eq!(endpoint["path"], "/metrics");
    }
    assert_eq!(
        monitor["spec"]["namespaceSelector"]["matchNames"],
        serde_json::json!([service["metadata"]["namespace"]])
    );
    // Without `jobLabel`, the Prometheus Operator names the job after the Service: the alerts
    // on `up` must use that name, or they watch a job that never exists.
    assert!(monitor["spec"]["jobLabel"].is_null());
    let job = format!(
        "job=\"{}\"",
        service["metadata"]["name"].as_str().expect("named")
    );
    let on_up: Vec<Value> = alerts()
        .into_iter()
        .filter(|r| r["expr"].as_str().is_some_and(|e| e.contains("up{")))
        .collect();
    assert!(!on_up.is_empty(), "no alert on the scrape target being up");
    for rule in on_up {
        let expr = rule["expr"].as_str().unwrap_or_default();
        assert!(
            expr.contains(&job),
            "{}: {expr} does not select {job}",
            rule["alert"]
        );
    }
}
