//! The Helm chart, for real: `helm lint`, `helm template` with default and non-default values,
//! `helm install` into the local control plane with a `kubectl auth can-i` matrix of what each
//! ServiceAccount may and may not do, and `helm uninstall` cleaning up.

#[path = "chart/attacker.rs"]
mod attacker;

use common::accounts::{SignIn, config_from};
use common::controller::ControllerArgs;
use common::drbd::{resource, slice_addresses};
use common::helm::{CHART, admitted, alerts, find, objects, packaged_chart, run, template};
use common::process::Process;
use common::{SERVICE_ENDPOINT, TestEnv, eventually, serving, tool};
use serde_json::{Value, json};

const WAIT: std::time::Duration = std::time::Duration::from_secs(30);

const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/shared-volume-controller.json");
const MONITORING_CRDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/monitoring-crds.yaml");

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"].as_str()
}

#[test]
#[ignore = "needs helm: run `make test`"]
fn the_chart_lints_and_renders_defaults_and_overrides() {
    run(tool("helm").args(["lint", "--strict", CHART]));
    let defaults = template(&[]);
    the_controller_runs_locked_down(&defaults);
    the_agent_runs_on_the_host_and_stays_through_a_drain(&defaults);
    for kind in ["Deployment", "DaemonSet"] {
        let pod = &defaults.iter().find(|o| o["kind"] == kind).unwrap()["spec"]["template"]["spec"];
        assert_eq!(pod["enableServiceLinks"], false, "no Service links in the environment");
    }
    the_writers_are_narrowed_and_put_first_in_line(&defaults);
    the_conntrack_repair_runs_everywhere_with_net_admin_alone(&defaults);
    the_dashboard_ships_and_no_monitor_unasked(&defaults);
    overrides_render();
    typos_are_refused_by_the_schema();
}

fn the_controller_runs_locked_down(defaults: &[Value]) {
    let deployment = find(defaults, "Deployment", "demo-shared-volume-controller-controller");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert!(pod["affinity"]["podAntiAffinity"].is_object());
    let controller = &pod["containers"][0];
    assert_eq!(controller["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(controller["securityContext"]["capabilities"]["drop"][0], "ALL");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(controller["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(controller["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(env_value(controller, "LEADER_ELECT"), Some("true"));
    assert_eq!(
        env_value(controller, "STORAGE_CLASS"),
        None,
        "empty flags are left unset"
    );
    find(
        defaults,
        "PodDisruptionBudget",
        "demo-shared-volume-controller-controller",
    );
}

fn the_agent_runs_on_the_host_and_stays_through_a_drain(defaults: &[Value]) {
    let daemonset = find(defaults, "DaemonSet", "demo-shared-volume-controller-agent");
    let pod = &daemonset["spec"]["template"]["spec"];
    let agent = &pod["containers"][0];
    assert_eq!(agent["securityContext"]["privileged"], false);
    assert_eq!(
        agent["securityContext"]["capabilities"]["add"],
        serde_json::json!(["NET_ADMIN"])
    );
    assert_eq!(env_value(agent, "FAIL_OVER_TIMEOUT"), Some("5s"));
    assert_eq!(env_value(agent, "DRY_RUN"), Some("false"));
    let downward: Vec<&str> = agent["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["valueFrom"].is_object())
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(downward, ["HOST_IP", "NODE_NAME", "NODE_IP", "POD_NAMESPACE"]);
    assert_eq!(
        env_value(agent, "ADMIN_ADDR"),
        Some("[$(HOST_IP)]:9820"),
        "on the host network the agent listens on the node's own address"
    );
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    let tolerated: Vec<&str> = pod["tolerations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        tolerated,
        [
            "drbd.linbit.com/lost-quorum",
            "drbd.linbit.com/force-io-error",
            "piraeus.io/evacuate",
            "piraeus.io/evacuate"
        ],
        "the agent stays on a node being drained"
    );
}

/// The admission policies, each bound with Deny, and the accounts' own API priority level.
fn the_writers_are_narrowed_and_put_first_in_line(defaults: &[Value]) {
    let policies: Vec<&str> = defaults
        .iter()
        .filter(|o| o["kind"] == "ValidatingAdmissionPolicy")
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(policies.len(), 9, "{policies:?}");
    for policy in &policies {
        let binding = find(defaults, "ValidatingAdmissionPolicyBinding", policy);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    }
    let attachments = find(
        defaults,
        "ValidatingAdmissionPolicy",
        "storage-demo-shared-volume-controller-agent-attachments",
    );
    assert!(
        attachments["spec"]["validations"][0]["expression"]
            .as_str()
            .unwrap()
            .contains(r#"["linstor.csi.linbit.com"]"#)
    );
    assert!(
        !defaults.iter().any(|o| o["kind"] == "FlowSchema"),
        "no priority level unless asked for"
    );
    let with_priority = template(&["apiPriority.enabled=true"]);
    let flow = find(&with_priority, "FlowSchema", "storage-demo-shared-volume-controller");
    let subjects: Vec<&str> = flow["spec"]["rules"][0]["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["serviceAccount"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        subjects,
        [
            "demo-shared-volume-controller-controller",
            "demo-shared-volume-controller-agent"
        ],
        "the fail-over's writers in a priority level of their own"
    );
    assert_eq!(
        flow["spec"]["priorityLevelConfiguration"]["name"],
        "storage-demo-shared-volume-controller"
    );
    let without = template(&["admissionPolicies.enabled=false"]);
    assert!(!without.iter().any(|o| o["kind"] == "ValidatingAdmissionPolicy"));
}

fn the_dashboard_ships_and_no_monitor_unasked(defaults: &[Value]) {
    let dashboard = find(defaults, "ConfigMap", "demo-shared-volume-controller-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value =
        serde_json::from_str(dashboard["data"]["shared-volume-controller.json"].as_str().unwrap()).unwrap();
    let source: Value = serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    assert_eq!(shipped, source, "the chart ships grafana/shared-volume-controller.json");
    let copy = std::fs::read(format!("{CHART}/dashboards/shared-volume-controller.json")).unwrap();
    assert!(
        copy == std::fs::read(DASHBOARD).unwrap(),
        "charts/…/dashboards/ holds a copy of grafana/shared-volume-controller.json (no link, helm warns about links): cp grafana/shared-volume-controller.json charts/shared-volume-controller/dashboards/"
    );
    assert!(
        !defaults
            .iter()
            .any(|o| o["kind"] == "ServiceMonitor" || o["kind"] == "PodMonitor")
    );
}

fn overrides_render() {
    let custom = template(&[
        "controller.replicas=3",
        "controller.flags.storage-class=fast\\,slow",
        "controller.flags.warning-repeat-interval=20m",
        "agent.flags.dry-run=true",
        "agent.flags.node-drain-policy=evacuate",
        "agent.useNodeInternalIP=true",
        "agent.tolerations[0].operator=Exists",
        "controller.priorityClassName=system-cluster-critical",
        "agent.adminAddress=::",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prometheus",
        "dashboard.label=grafana_dashboard_custom",
        "dashboard.labelValue=yes",
        "controller.podDisruptionBudget.enabled=false",
    ]);
    let deployment = find(&custom, "Deployment", "demo-shared-volume-controller-controller");
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["priorityClassName"],
        "system-cluster-critical"
    );
    assert_eq!(
        env_value(
            &deployment["spec"]["template"]["spec"]["containers"][0],
            "STORAGE_CLASS"
        ),
        Some("fast,slow")
    );
    assert_eq!(
        env_value(
            &deployment["spec"]["template"]["spec"]["containers"][0],
            "WARNING_REPEAT_INTERVAL"
        ),
        Some("20m"),
        "a documented chart flag renders"
    );
    let agent_pod = &find(&custom, "DaemonSet", "demo-shared-volume-controller-agent")["spec"]["template"]["spec"];
    let agent = &agent_pod["containers"][0];
    assert_eq!(env_value(agent, "DRY_RUN"), Some("true"));
    assert_eq!(env_value(agent, "ADMIN_ADDR"), Some("[::]:9820"));
    assert_eq!(env_value(agent, "NODE_DRAIN_POLICY"), Some("evacuate"));
    assert!(agent["env"].as_array().unwrap().iter().all(|e| e["name"] != "NODE_IP"));
    assert_eq!(agent_pod["tolerations"].as_array().unwrap().len(), 5);
    let single = template(&["controller.replicas=1"]);
    assert!(
        !single.iter().any(|o| o["kind"] == "PodDisruptionBudget"),
        "one replica: no PodDisruptionBudget that would block draining its node"
    );
    let monitor = find(&custom, "ServiceMonitor", "demo-shared-volume-controller-controller");
    assert_eq!(monitor["metadata"]["labels"]["release"], "prometheus");
    let pod_monitors = template(&["metrics.podMonitor.enabled=true"]);
    let pod_monitor = find(&pod_monitors, "PodMonitor", "demo-shared-volume-controller-agent");
    for endpoint in [
        &pod_monitor["spec"]["podMetricsEndpoints"][0],
        &monitor["spec"]["endpoints"][0],
    ] {
        assert_eq!(
            endpoint["relabelings"][0],
            json!({"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}),
            "series carry the node they come from"
        );
    }
    let dashboard = find(&custom, "ConfigMap", "demo-shared-volume-controller-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard_custom"], "yes");
    assert!(!custom.iter().any(|o| o["kind"] == "PodDisruptionBudget"));
}

fn typos_are_refused_by_the_schema() {
    for (typo, says) in [
        (
            "agent.flags.fail-over-timout=5s",
            "additional properties 'fail-over-timout' not allowed",
        ),
        (
            "controller.flag.leader-elect=false",
            "additional properties 'flag' not allowed",
        ),
        (
            "agent.flags.node-drain-policy=evict",
            "value must be one of 'ignore', 'evacuate'",
        ),
        ("agent.flags.fail-over-timeout=five", "/agent/flags/fail-over-timeout"),
        // Host-network DaemonSets: a surge pod would bind the node's port beside the old one.
        (
            "agent.updateStrategy.rollingUpdate.maxSurge=1",
            "additional properties 'maxSurge' not allowed",
        ),
    ] {
        refused_with(&[typo], says);
    }
}

/// `kubectl auth can-i` as a ServiceAccount: does it have the permission?
fn can(sa: &str, namespace: &str, verb: &str, resource: &str) -> bool {
    let mut kubectl = tool("kubectl");
    kubectl.args(["auth", "can-i", verb, "-n", namespace, "--as", sa]);
    match resource.split_once('/') {
        Some((resource, subresource)) => kubectl.args([resource, "--subresource", subresource]),
        None => kubectl.arg(resource),
    };
    let status = kubectl.output().expect("run kubectl auth can-i").status;
    status.success()
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn the_chart_installs_with_least_privilege_rbac_and_uninstalls_cleanly() {
    let env = common::setup("chart").await;
    let release = format!("svc-{}", env.id);
    run(tool("kubectl").args(["apply", "-f", MONITORING_CRDS]));
    run(tool("kubectl").args(["wait", "--for=condition=established", "-f", MONITORING_CRDS]));
    let installed = run(&mut readme_install_command(&release, &env.ns));
    let notes = String::from_utf8_lossy(&installed.stdout);
    assert!(
        notes.contains("Next:") && notes.contains(&format!("kubectl -n {} get deploy", env.ns)),
        "NOTES.txt tells what to do next: {notes}"
    );
    assert!(
        notes.contains("WARNING: no node matches agent.nodeSelector (node-role.kubernetes.io/storage=)")
            && notes.contains("kubectl label node <storage node> node-role.kubernetes.io/storage="),
        "no node here carries the README's storage label: the notes say no agent runs: {notes}"
    );

    let name = |component: &str| format!("{release}-shared-volume-controller-{component}");
    // Cluster-wide objects carry the release namespace first.
    let cluster_name = |component: &str| format!("{}-{}", env.ns, name(component));
    let priority_level = format!("{}-{release}-shared-volume-controller", env.ns);
    let get = |kind: &str, object: &str, namespaced: bool| exists(namespaced.then_some(env.ns.as_str()), kind, object);
    for (kind, object, namespaced) in [
        ("deployment", name("controller"), true),
        ("daemonset", name("agent"), true),
        ("daemonset", name("conntrack"), true),
        ("serviceaccount", name("conntrack"), true),
        ("clusterrole", cluster_name("conntrack"), false),
        ("poddisruptionbudget", name("controller"), true),
        ("serviceaccount", name("controller"), true),
        ("serviceaccount", name("agent"), true),
        ("service", format!("{}-metrics", name("controller")), true),
        ("service", format!("{}-metrics", name("agent")), true),
        (
            "configmap",
            format!("{release}-shared-volume-controller-dashboard"),
            true,
        ),
        ("clusterrole", cluster_name("controller"), false),
        ("clusterrole", cluster_name("agent"), false),
        ("servicemonitor", name("controller"), true),
        ("servicemonitor", name("agent"), true),
        ("prometheusrule", format!("{release}-shared-volume-controller"), true),
    ] {
        assert!(get(kind, &object, namespaced), "{kind} {object} installed");
    }
    // The priority level, asked for: the API server takes both objects.
    run(tool("helm")
        .args(["upgrade", &release, packaged_chart(), "--namespace", &env.ns])
        .args(["--reuse-values", "--set", "apiPriority.enabled=true"]));
    for kind in ["flowschema", "prioritylevelconfiguration"] {
        assert!(get(kind, &priority_level, false), "{kind} {priority_level} installed");
    }

    let controller = format!("system:serviceaccount:{}:{}", env.ns, name("controller"));
    let agent = format!("system:serviceaccount:{}:{}", env.ns, name("agent"));
    let conntrack = format!("system:serviceaccount:{}:{}", env.ns, name("conntrack"));
    rbac_is_least_privilege(&env.ns, &controller, &agent, &conntrack);

    run_as_the_charts_service_accounts(&env, &controller, &agent).await;
    the_conntrack_repair_runs_as_its_account(&env, &conntrack).await;
    attacker::what_an_attacker_tries_is_refused(&env, &controller, &agent).await;

    uninstalls_cleanly(&env, &release);
    run(tool("kubectl").args(["delete", "-f", MONITORING_CRDS]));
    env.cleanup().await;
}

/// Whether `kind/object` exists (in `namespace`, or cluster-wide without one).
fn exists(namespace: Option<&str>, kind: &str, object: &str) -> bool {
    let mut kubectl = tool("kubectl");
    kubectl.args(["get", kind, object, "-o", "name"]);
    if let Some(namespace) = namespace {
        kubectl.args(["-n", namespace]);
    }
    kubectl.output().unwrap().status.success()
}

/// `helm uninstall` removes the release's objects, cluster-wide ones included, and its record.
fn uninstalls_cleanly(env: &TestEnv, release: &str) {
    let name = |component: &str| format!("{release}-shared-volume-controller-{component}");
    let cluster_name = |component: &str| format!("{}-{}", env.ns, name(component));
    let priority_level = format!("{}-{release}-shared-volume-controller", env.ns);
    let get = |kind: &str, object: &str, namespaced: bool| exists(namespaced.then_some(env.ns.as_str()), kind, object);
    run(tool("helm").args(["uninstall", release, "--namespace", &env.ns, "--wait"]));
    assert!(
        !get("clusterrole", &cluster_name("controller"), false),
        "cluster roles removed"
    );
    assert!(!get("clusterrole", &cluster_name("agent"), false));
    assert!(!get("deployment", &name("controller"), true));
    assert!(!get("daemonset", &name("agent"), true));
    assert!(!get("daemonset", &name("conntrack"), true));
    assert!(!get("clusterrole", &cluster_name("conntrack"), false));
    assert!(!get("flowschema", &priority_level, false), "the FlowSchema removed");
    let secrets_left = tool("kubectl")
        .args(["get", "secrets", "-n", &env.ns, "-l", "owner=helm", "-o", "name"])
        .output()
        .unwrap();
    assert!(secrets_left.stdout.is_empty(), "helm's release record removed");
    assert!(!get(
        "prometheusrule",
        &format!("{release}-shared-volume-controller"),
        true
    ));
}

/// (who, namespace, verb, resource, allowed): what `kubectl auth can-i` must answer.
type Permission<'a> = (&'a str, &'a str, &'a str, &'a str, bool);

/// Every account may do what its job needs and nothing of the rest, by RBAC alone.
fn rbac_is_least_privilege(ns: &str, controller: &str, agent: &str, conntrack: &str) {
    let mut matrix = controller_permissions(ns, controller);
    matrix.extend(agent_permissions(ns, agent));
    matrix.extend(conntrack_permissions(ns, conntrack));
    let wrong: Vec<String> = matrix
        .iter()
        .filter(|(who, namespace, verb, resource, allowed)| can(who, namespace, verb, resource) != *allowed)
        .map(|(who, namespace, verb, resource, allowed)| {
            format!(
                "{who} {} {verb} {resource} in {namespace}",
                if *allowed { "cannot" } else { "can" }
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "RBAC differs from least privilege:\n{}",
        wrong.join("\n")
    );
}

const ELSEWHERE: &str = "kube-system";

fn controller_permissions<'a>(ns: &'a str, controller: &'a str) -> Vec<Permission<'a>> {
    vec![
        (controller, ns, "list", "persistentvolumeclaims", true),
        (controller, ns, "watch", "persistentvolumes", true),
        (controller, ns, "patch", "persistentvolumes", true),
        (controller, ELSEWHERE, "create", "services", true),
        (controller, ELSEWHERE, "patch", "endpoints", true),
        // Its own old Endpoints where they are no longer written; an admission policy narrows it.
        (controller, ELSEWHERE, "delete", "endpoints", true),
        (controller, ELSEWHERE, "create", "endpointslices.discovery.k8s.io", true),
        (controller, ELSEWHERE, "delete", "endpointslices.discovery.k8s.io", true),
        (controller, ELSEWHERE, "create", "events.events.k8s.io", true),
        (controller, ns, "create", "leases.coordination.k8s.io", true),
        (controller, ns, "update", "leases.coordination.k8s.io", false),
        (controller, ns, "patch", "leases.coordination.k8s.io", false),
        (controller, ns, "watch", "leases.coordination.k8s.io", false),
        (controller, ELSEWHERE, "create", "leases.coordination.k8s.io", false),
        (controller, ELSEWHERE, "delete", "services", false),
        (controller, ELSEWHERE, "delete", "pods", false),
        (controller, ELSEWHERE, "create", "pods/eviction", false),
        (controller, ns, "patch", "nodes", false),
        (controller, ns, "delete", "volumeattachments.storage.k8s.io", false),
        (controller, ns, "delete", "persistentvolumes", false),
        (controller, ns, "get", "secrets", false),
    ]
}

fn agent_permissions<'a>(ns: &'a str, agent: &'a str) -> Vec<Permission<'a>> {
    vec![
        (agent, ELSEWHERE, "list", "pods", true),
        (agent, ELSEWHERE, "delete", "pods", true),
        (agent, ELSEWHERE, "create", "pods/eviction", true),
        (agent, ns, "patch", "nodes", true),
        (agent, ns, "update", "nodes", false),
        (agent, ns, "watch", "leases.coordination.k8s.io", true),
        (agent, ns, "delete", "volumeattachments.storage.k8s.io", true),
        (agent, ns, "patch", "persistentvolumes", true),
        (agent, ELSEWHERE, "patch", "endpointslices.discovery.k8s.io", true),
        (agent, ELSEWHERE, "patch", "endpoints", true),
        (agent, ELSEWHERE, "delete", "endpoints", false),
        (agent, ELSEWHERE, "create", "events.events.k8s.io", true),
        (agent, ns, "patch", "leases.coordination.k8s.io", true),
        (agent, ns, "update", "leases.coordination.k8s.io", false),
        (agent, ELSEWHERE, "patch", "leases.coordination.k8s.io", false),
        (agent, ns, "get", "volumeattachments.storage.k8s.io", false),
        (agent, ns, "get", "persistentvolumes", false),
        (agent, ELSEWHERE, "create", "services", false),
        (agent, ELSEWHERE, "delete", "services", false),
        // Allowed by RBAC, narrowed to the product's own slices by an admission policy.
        (agent, ELSEWHERE, "delete", "endpointslices.discovery.k8s.io", true),
        (agent, ns, "delete", "persistentvolumes", false),
        (agent, ns, "delete", "nodes", false),
        (agent, ELSEWHERE, "create", "pods", false),
        (agent, ns, "get", "secrets", false),
    ]
}

fn conntrack_permissions<'a>(ns: &'a str, conntrack: &'a str) -> Vec<Permission<'a>> {
    vec![
        (conntrack, ELSEWHERE, "list", "endpointslices.discovery.k8s.io", true),
        (conntrack, ELSEWHERE, "watch", "endpointslices.discovery.k8s.io", true),
        (conntrack, ELSEWHERE, "get", "endpointslices.discovery.k8s.io", false),
        (conntrack, ELSEWHERE, "patch", "endpointslices.discovery.k8s.io", false),
        (conntrack, ELSEWHERE, "get", "services", false),
        // LINSTOR CSI's Service, which its nfs-helper's slices name (`--linstor-nfs-service`).
        (conntrack, ELSEWHERE, "list", "services", true),
        (conntrack, ELSEWHERE, "watch", "services", true),
        (conntrack, ELSEWHERE, "list", "pods", false),
        (conntrack, ELSEWHERE, "create", "events.events.k8s.io", false),
        (conntrack, ns, "get", "leases.coordination.k8s.io", false),
    ]
}

/// The README's install command, run as written (through bash, as a user pastes it) but with this
/// test's release name and namespace, and the chart `hack/release-check.sh` packages in place of
/// the release's OCI artefact of the same version (`tests/docs.rs` holds the command to it).
fn readme_install_command(release: &str, namespace: &str) -> std::process::Command {
    let block = common::docs::sh_block_after("README.md", "## Install on a cluster");
    let released = format!(
        "shared-volume {}/shared-volume-controller",
        common::docs::release_setting("CHART_REPOSITORY")
    );
    assert!(
        block.contains("pod-security.kubernetes.io/enforce=privileged")
            && block.contains(&format!("\nhelm install {released}")),
        "the namespace is labelled for the agent, then the chart installed: {block}"
    );
    let command = block
        .replacen(&released, &format!("{release} {}", packaged_chart()), 1)
        .replace("storage-system", namespace);
    common::pasted(&command)
}

#[test]
#[ignore = "needs helm and helm-docs: run `make test`"]
fn the_chart_says_where_it_comes_from_and_what_it_needs() {
    let chart: Value = serde_yaml::from_str(&std::fs::read_to_string(format!("{CHART}/Chart.yaml")).unwrap()).unwrap();
    for field in ["home", "icon", "kubeVersion", "appVersion"] {
        assert!(chart[field].is_string(), "Chart.yaml has {field}");
    }
    assert!(chart["sources"].as_array().is_some_and(|s| !s.is_empty()));
    // The icon the chart names is the one in the repository.
    let icon = chart["icon"].as_str().unwrap();
    let path = icon.split_once("/main/").expect("an icon on the main branch").1;
    assert!(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path).is_file(),
        "{icon}"
    );
    // Artifact Hub lists the images the chart runs, at the chart's appVersion.
    let images: Vec<Value> =
        serde_yaml::from_str(chart["annotations"]["artifacthub.io/images"].as_str().unwrap()).unwrap();
    let values: Value =
        serde_yaml::from_str(&std::fs::read_to_string(format!("{CHART}/values.yaml")).unwrap()).unwrap();
    let app_version = chart["appVersion"].as_str().unwrap();
    let listed: Vec<&str> = images.iter().map(|i| i["image"].as_str().unwrap()).collect();
    let runs: Vec<String> = ["controller", "agent"]
        .iter()
        .map(|c| format!("{}:{app_version}", values[c]["image"]["repository"].as_str().unwrap()))
        .collect();
    assert_eq!(listed, runs);
    assert_eq!(chart["annotations"]["artifacthub.io/license"], "Apache-2.0");

    // Built against the 1.33 API: older clusters are refused with a clear message.
    let old = tool("helm")
        .args(["template", "demo", CHART, "--kube-version", "1.32.0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&old.stderr);
    assert!(
        !old.status.success() && stderr.contains("incompatible with Kubernetes v1.32.0"),
        "{stderr}"
    );
    run(tool("helm").args(["template", "demo", CHART, "--kube-version", "1.33.0"]));

    // The chart's README lists every value with its default, and is not stale.
    run(std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/hack/chart-docs.sh")).arg("--check"));
    let readme = std::fs::read_to_string(format!("{CHART}/README.md")).unwrap();
    for flag in values["agent"]["flags"].as_object().unwrap().keys() {
        let row = format!("| agent.flags.{flag} |");
        assert!(readme.contains(&row), "the chart README lists {row}");
    }
}

/// A copy of the test's kubeconfig whose user impersonates `service_account`.
fn kubeconfig_as(env: &TestEnv, service_account: &str, name: &str) -> String {
    let admin = std::env::var("KUBECONFIG").expect("KUBECONFIG");
    let path = env.kubeconfig_as(&admin, name, SignIn::Impersonating(service_account.into()));
    let secrets = tool("kubectl")
        .args(["--kubeconfig", &path, "get", "secrets", "-n", &env.ns])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&secrets.stderr).contains("forbidden"),
        "the kubeconfig must act as {service_account}"
    );
    path
}

/// The binary as each of the chart's ServiceAccounts: RBAC that is too tight shows up as a
/// missing outcome or a `forbidden` in the logs.
async fn run_as_the_charts_service_accounts(env: &TestEnv, controller_sa: &str, agent_sa: &str) {
    let as_controller = kubeconfig_as(env, controller_sa, "controller");
    let controller = Process::start_with_env(
        &format!("{}-controller", env.ns),
        &ControllerArgs::leading(&env.ns).as_strs(),
        &[("KUBECONFIG", as_controller.as_str())],
    );
    controller.wait_ready().await;
    let node = env.sim_nodes(&["node"]).await.remove(0);
    let (_, pv) = env.bound_rwx_claim("data", serving("10.77.9.9:2049")).await;
    let pv = pv.metadata.name.unwrap();
    env.published_mount_endpoint(&pv).await;
    env.wait_for_events("data", "MountEndpointPublished").await;

    let as_agent = kubeconfig_as(env, agent_sa, "agent");
    node.set(&[resource(&pv, "Primary", true, &[])]);
    env.running_pod("app", &node.name, "data", json!({}), json!({})).await;
    let agent = env
        .start_agent_with_env(&node, &[], &[("KUBECONFIG", as_agent.as_str())])
        .await;
    eventually("the endpoints at the agent's node", WAIT, || async {
        (slice_addresses(env, &pv).await == [node.ip.clone()]).then_some(())
    })
    .await;
    assert_eq!(env.pv_annotation(&pv, SERVICE_ENDPOINT).await, Some(node.endpoint()));
    let mut failing = resource(&pv, "Secondary", true, &[]);
    failing["force-io-failures"] = json!(true);
    node.set(&[failing]);
    eventually("the force-io taint and the eviction as the agent", WAIT, || async {
        let tainted = env
            .taints(&node.name)
            .await
            .iter()
            .any(|t| t == "drbd.linbit.com/force-io-error");
        let pod = env
            .api::<k8s_openapi::api::core::v1::Pod>()
            .get_opt("app")
            .await
            .unwrap();
        let evicted = pod.is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        (tainted && evicted).then_some(())
    })
    .await;

    for process in [controller, agent] {
        let log = process.log.clone();
        process.stop().await;
        let text = std::fs::read_to_string(&log).unwrap().to_lowercase();
        assert!(!text.contains("forbidden"), "RBAC too tight, see {}", log.display());
    }
}

/// The conntrack repair as the chart's account: it lists and watches the slices (ready), and its
/// log says nothing was refused.
async fn the_conntrack_repair_runs_as_its_account(env: &TestEnv, conntrack_sa: &str) {
    let as_conntrack = kubeconfig_as(env, conntrack_sa, "conntrack");
    let repair = Process::start_with_env(
        &format!("{}-conntrack", env.ns),
        &["conntrack", "--node-name", "chart-node"],
        &[("KUBECONFIG", as_conntrack.as_str())],
    );
    repair.wait_ready().await;
    let log = repair.log.clone();
    repair.stop().await;
    let text = std::fs::read_to_string(&log).unwrap().to_lowercase();
    assert!(!text.contains("forbidden"), "RBAC too tight, see {}", log.display());
}

/// The rendered repair: on the host network with NET_ADMIN and nothing else, on every node
/// unless told otherwise, and gone when turned off.
fn the_conntrack_repair_runs_everywhere_with_net_admin_alone(defaults: &[Value]) {
    let daemonset = find(defaults, "DaemonSet", "demo-shared-volume-controller-conntrack");
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true, "the host's conntrack table");
    assert_eq!(
        pod["tolerations"],
        json!([{"operator": "Exists"}]),
        "clients run on any node"
    );
    let container = &pod["containers"][0];
    assert_eq!(container["args"], json!(["conntrack"]));
    assert_eq!(
        container["securityContext"]["capabilities"],
        json!({"drop": ["ALL"], "add": ["NET_ADMIN"]})
    );
    assert_eq!(container["securityContext"]["privileged"], false);
    assert_eq!(env_value(container, "SWEEP_FOR"), Some("30s"));
    let role = find(
        defaults,
        "ClusterRole",
        "storage-demo-shared-volume-controller-conntrack",
    );
    let slices =
        json!({"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]});
    let services = json!({"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch"]});
    assert_eq!(role["rules"], json!([slices, services]), "LINSTOR CSI's Service too");
    let only_ours = template(&["conntrack.flags.linstor-nfs-service="]);
    let role = find(
        &only_ours,
        "ClusterRole",
        "storage-demo-shared-volume-controller-conntrack",
    );
    assert_eq!(role["rules"], json!([slices]), "no Services without LINSTOR's");
    let chosen = template(&["conntrack.nodeSelector.clients=yes"]);
    let pod = &find(&chosen, "DaemonSet", "demo-shared-volume-controller-conntrack")["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"], json!({"clients": "yes"}));
    let off = template(&["conntrack.enabled=false"]);
    assert!(
        !off.iter()
            .any(|o| o["metadata"]["name"].as_str().is_some_and(|n| n.contains("conntrack"))),
        "conntrack.enabled=false installs nothing of it"
    );
}

/// A client acting as `service_account`.
async fn client_as(env: &TestEnv, service_account: &str, name: &str) -> kube::Client {
    let config = config_from(&kubeconfig_as(env, service_account, name)).await;
    kube::Client::try_from(config).unwrap()
}

/// `None` when the apiserver refused the write: RBAC (403) or an admission policy (422); else
/// what went wrong, for the test's report.
fn refused<T>(what: &str, result: Result<T, kube::Error>) -> Option<String> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => None,
        Err(kube::Error::Api(status)) if status.code == 422 && status.message.contains("ValidatingAdmissionPolicy") => {
            None
        }
        Err(err) => Some(format!("{what}: failed otherwise: {err}")),
        Ok(_) => Some(format!("{what}: allowed")),
    }
}

/// `helm template` with `sets`, expected to fail with a message containing `says`.
fn refused_with(sets: &[&str], says: &str) {
    let mut helm = tool("helm");
    helm.args(["template", "demo", CHART]);
    for set in sets {
        helm.args(["--set", set]);
    }
    let refused = helm.output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains(says),
        "{sets:?} must be refused with {says:?}: {stderr}"
    );
}

#[test]
#[ignore = "needs helm: run `make test`"]
fn the_chart_refuses_values_that_contradict_each_other() {
    // Both monitors would scrape every target twice: refused, saying why.
    refused_with(
        &["metrics.serviceMonitor.enabled=true", "metrics.podMonitor.enabled=true"],
        "scraped twice",
    );
    refused_with(&["controller.image.digest=latest"], "/controller/image/digest");
}

/// The chart rendered with every escape hatch a locked-down cluster reaches for: a mirror
/// registry, a proxy and a corporate CA, spread constraints, cloud IAM annotations, its own
/// monitoring labels.
fn with_escape_hatches() -> Vec<Value> {
    template(&[
        "controller.image.registry=mirror.example.com/",
        "controller.image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "imageRegistry=mirror.example.com",
        "controller.extraEnv[0].name=HTTPS_PROXY",
        "controller.extraEnv[0].value=http://proxy:3128",
        "agent.extraEnv[0].name=SSL_CERT_FILE",
        "agent.extraEnv[0].value=/etc/ca/ca.crt",
        "agent.extraVolumes[0].name=ca",
        "agent.extraVolumes[0].configMap.name=corporate-ca",
        "agent.extraVolumeMounts[0].name=ca",
        "agent.extraVolumeMounts[0].mountPath=/etc/ca",
        "controller.extraVolumes[0].name=ca",
        "controller.extraVolumes[0].configMap.name=corporate-ca",
        "controller.extraVolumeMounts[0].name=ca",
        "controller.extraVolumeMounts[0].mountPath=/etc/ca",
        "agent.updateStrategy.rollingUpdate.maxUnavailable=10%",
        "controller.topologySpreadConstraints[0].maxSkew=1",
        "controller.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "controller.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "controller.serviceAccount.annotations.iam\\.example\\.com/role=svc",
        "agent.serviceAccount.annotations.iam\\.example\\.com/role=agent",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.namespace=monitoring",
        "metrics.serviceMonitor.scrapeTimeout=10s",
        "metrics.serviceMonitor.relabelings[0].targetLabel=cluster",
        "metrics.serviceMonitor.relabelings[0].replacement=east",
        "metrics.serviceMonitor.metricRelabelings[0].action=drop",
        "metrics.serviceMonitor.metricRelabelings[0].regex=process_.*",
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.disabledAlerts[0]=SharedVolumeAgentDryRun",
        "metrics.prometheusRule.agentSelector=job=\"my-agents\"",
    ])
}

#[test]
#[ignore = "needs helm: run `make test`"]
fn images_env_volumes_and_accounts_follow_the_escape_hatches() {
    let custom = with_escape_hatches();
    let deployment =
        &find(&custom, "Deployment", "demo-shared-volume-controller-controller")["spec"]["template"]["spec"];
    let controller = &deployment["containers"][0];
    assert_eq!(
        controller["image"],
        "mirror.example.com/shared-volume-controller/shared-volume-controller@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "the registry takes the place of the repository's own host"
    );
    assert_eq!(env_value(controller, "HTTPS_PROXY"), Some("http://proxy:3128"));
    assert_eq!(controller["volumeMounts"][0]["mountPath"], "/etc/ca");
    assert_eq!(deployment["volumes"][0]["configMap"]["name"], "corporate-ca");
    assert_eq!(
        deployment["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    let daemonset = find(&custom, "DaemonSet", "demo-shared-volume-controller-agent");
    assert_eq!(
        daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        "10%"
    );
    let agent_pod = &daemonset["spec"]["template"]["spec"];
    let agent = &agent_pod["containers"][0];
    assert_eq!(
        agent["image"], "mirror.example.com/shared-volume-controller/shared-volume-agent:0.1.0",
        "imageRegistry: one value for every component"
    );
    let repair = find(&custom, "DaemonSet", "demo-shared-volume-controller-conntrack");
    assert_eq!(
        repair["spec"]["template"]["spec"]["containers"][0]["image"],
        "mirror.example.com/shared-volume-controller/shared-volume-agent:0.1.0"
    );
    assert_eq!(env_value(agent, "SSL_CERT_FILE"), Some("/etc/ca/ca.crt"));
    let mounts: Vec<&str> = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(mounts, ["dev", "drbd-run", "ca"], "the agent's own mounts stay");
    assert_eq!(agent_pod["volumes"].as_array().unwrap().len(), 3);
    for (account, role) in [("controller", "svc"), ("agent", "agent")] {
        let sa = find(
            &custom,
            "ServiceAccount",
            &format!("demo-shared-volume-controller-{account}"),
        );
        assert_eq!(sa["metadata"]["annotations"]["iam.example.com/role"], role);
    }
}

/// The `--set` values of the install page's block that builds and pushes the images.
fn install_page_image_overrides() -> Vec<String> {
    let block = common::docs::sh_block_after("docs/how-to/install.md", "## Images");
    assert!(
        block.starts_with("make images"),
        "the install page's images block: {block}"
    );
    block
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|pair| pair[0] == "--set")
        .map(|pair| pair[1].to_owned())
        .collect()
}

/// A user who pushes the images to their own registry and sets what the install page sets gets
/// every container from there: the repair's DaemonSet, which runs the agent's image, too.
#[test]
#[ignore = "needs helm: run `make test`"]
fn the_install_pages_image_overrides_move_every_image() {
    let sets = install_page_image_overrides();
    assert!(!sets.is_empty(), "the page sets the images");
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let rendered = template(&sets);
    let images: Vec<&str> = rendered
        .iter()
        .flat_map(|object| {
            let pod = &object["spec"]["template"]["spec"];
            let containers = pod["containers"].as_array().into_iter().flatten();
            containers.chain(pod["initContainers"].as_array().into_iter().flatten())
        })
        .filter_map(|container| container["image"].as_str())
        .collect();
    assert!(images.len() >= 3, "controller, agent and repair: {images:?}");
    let left: Vec<&&str> = images
        .iter()
        .filter(|image| !image.starts_with("registry.example.com/storage/"))
        .collect();
    assert!(
        left.is_empty(),
        "images the page's overrides leave at their defaults: {left:?}"
    );

    let own = template(&[
        "conntrack.image.repository=repair.example.com/repair",
        "conntrack.image.tag=v1",
    ]);
    let repair = find(&own, "DaemonSet", "demo-shared-volume-controller-conntrack");
    assert_eq!(
        repair["spec"]["template"]["spec"]["containers"][0]["image"], "repair.example.com/repair:v1",
        "an image of the repair's own still wins"
    );
}

#[test]
#[ignore = "needs helm: run `make test`"]
fn monitoring_follows_the_escape_hatches() {
    let custom = with_escape_hatches();
    let monitor = find(&custom, "ServiceMonitor", "demo-shared-volume-controller-agent");
    assert_eq!(monitor["metadata"]["namespace"], "monitoring");
    assert_eq!(monitor["spec"]["namespaceSelector"]["matchNames"], json!(["storage"]));
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scrapeTimeout"], "10s");
    assert_eq!(
        endpoint["relabelings"][0]["targetLabel"], "node",
        "the node label first"
    );
    assert_eq!(endpoint["relabelings"][1]["targetLabel"], "cluster");
    assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
    let rule = find(&custom, "PrometheusRule", "demo-shared-volume-controller");
    let alerts = alerts(rule);
    assert!(
        alerts.iter().all(|a| a["alert"] != "SharedVolumeAgentDryRun"),
        "switched off"
    );
    let agent_down = alerts.iter().find(|a| a["alert"] == "SharedVolumeAgentDown").unwrap();
    assert_eq!(
        agent_down["expr"], "up{job=\"my-agents\"} == 0",
        "the selector as given"
    );
    assert_eq!(
        agent_down["annotations"]["runbook_url"],
        format!(
            "https://github.com/shared-volume-controller/shared-volume-controller/blob/v{}/docs/reference/alerts.md#sharedvolumeagentdown",
            common::docs::chart_version()
        ),
        "the runbook of the chart's own version, at its tag"
    );
}

#[test]
#[ignore = "needs helm: run `make test`"]
fn monitoring_takes_its_own_selectors_runbooks_and_pod_monitor() {
    let own = template(&[
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.controllerSelector=job=\"my-controller\"",
        "metrics.prometheusRule.runbookUrl=https://wiki.example.com/storage",
        "metrics.podMonitor.enabled=true",
        "metrics.podMonitor.scrapeTimeout=5s",
        "metrics.podMonitor.metricRelabelings[0].action=drop",
    ]);
    let rule = find(&own, "PrometheusRule", "demo-shared-volume-controller");
    let no_leader = &rule["spec"]["groups"][0]["rules"][0];
    assert!(
        no_leader["expr"]
            .as_str()
            .unwrap()
            .contains("storageos_shared_volume_controller_leader{job=\"my-controller\"}"),
        "{no_leader}"
    );
    assert_eq!(
        no_leader["annotations"]["runbook_url"],
        "https://wiki.example.com/storage#sharedvolumecontrollernoleader"
    );
    let pod_monitor = find(&own, "PodMonitor", "demo-shared-volume-controller-controller");
    let endpoint = &pod_monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["scrapeTimeout"], "5s");
    assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
    assert_eq!(
        pod_monitor["metadata"]["namespace"], "storage",
        "the release namespace by default"
    );
    assert!(pod_monitor["spec"]["namespaceSelector"].is_null());
}

#[test]
#[ignore = "needs helm: run `make test`"]
fn helm_test_runs_a_selftest_that_only_reads() {
    let defaults = template(&[]);
    let selftest = find(&defaults, "Pod", "demo-shared-volume-controller-selftest");
    assert_eq!(selftest["metadata"]["annotations"]["helm.sh/hook"], "test");
    let args: Vec<&str> = selftest["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "selftest");
    assert!(args.contains(&"--lease-name=shared-volume-controller"), "{args:?}");
    assert!(
        args.contains(&"--agent-selector=app.kubernetes.io/name=shared-volume-controller,app.kubernetes.io/instance=demo,app.kubernetes.io/component=agent"),
        "{args:?}"
    );
    let policies = args.iter().find(|a| a.starts_with("--policies=")).unwrap();
    assert_eq!(policies.split(',').count(), 9, "{policies}");
    let role = find(&defaults, "Role", "demo-shared-volume-controller-selftest");
    let verbs: Vec<&Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["verbs"].as_array().unwrap())
        .collect();
    assert!(
        verbs.iter().all(|v| *v == "get" || *v == "list"),
        "read only: {verbs:?}"
    );
    assert!(
        !template(&["helmTest.enabled=false"])
            .iter()
            .any(|o| o["metadata"]["name"] == "demo-shared-volume-controller-selftest")
    );
}

/// The `helm test` pod's arguments, as the chart renders them for `release` in `namespace`.
fn selftest_args(release: &str, namespace: &str) -> Vec<String> {
    let rendered = run(tool("helm").args([
        "template",
        release,
        CHART,
        "--namespace",
        namespace,
        "--show-only",
        "templates/tests/selftest.yaml",
    ]));
    let objects = objects(&rendered.stdout);
    let pod = objects.iter().find(|o| o["kind"] == "Pod").expect("the selftest pod");
    pod["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// Runs the binary with `args` (as the test pod would, but as the admin): (passed, output).
fn selftest(args: &[String], namespace: &str) -> (bool, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_shared-volume-controller"))
        .args(args)
        .env("POD_NAMESPACE", namespace)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn helm_test_passes_on_a_working_install_and_names_what_is_broken() {
    let (env, nodes, _pv) = common::drbd::three_nodes("selftest").await;
    let release = env.release();
    let args = selftest_args(&release, &env.ns);
    let controller = env.start_leading_controller().await;
    let mut agents = Vec::new();
    for node in &nodes[..2] {
        let agent = env.start_agent(node, &[]).await;
        env.agent_pod(&node.name, &agent, Some(&release)).await;
        agents.push(agent);
    }
    // The conntrack repair on the host, seen as its DaemonSet's pod on node a.
    let repair_args = ["conntrack", "--node-name", &nodes[0].name, "--kube-proxy-metrics", ""];
    let repair = env.start_as("conntrack", &format!("{}-conntrack", env.ns), &repair_args, &[]);
    repair.wait_ready().await;
    env.component_pod("conntrack", &nodes[0].name, &repair, Some(&release))
        .await;
    // The leader Lease may take a renewal to appear.
    let passed = eventually("a passing selftest", WAIT, || async {
        let (passed, output) = selftest(&args, &env.ns);
        passed.then_some(output)
    })
    .await;
    assert!(passed.contains("all 13 checks passed"), "{passed}");

    // An agent down, the repair down, and a policy unbound: each named.
    let stopped = agents.remove(1);
    stopped.stop().await;
    repair.stop().await;
    let binding = format!("{}-{release}-shared-volume-controller-leases", env.ns);
    run(tool("kubectl").args(["delete", "validatingadmissionpolicybinding", &binding]));
    let (passed, output) = selftest(&args, &env.ns);
    assert!(!passed, "{output}");
    let failures: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failures.len(), 3, "{output}");
    assert!(failures[0].contains(&format!("agent-{}", nodes[1].name)), "{output}");
    assert!(
        failures[1].contains(&format!("repair {}/conntrack-{}", env.ns, nodes[0].name)),
        "{output}"
    );
    assert!(
        failures[2].contains(&binding) && failures[2].contains("no binding"),
        "{output}"
    );
    agents.push(controller);
    env.remove_chart_permissions(&common::accounts::admin_kubeconfig());
    common::drbd::teardown(env, agents).await;
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn in_a_baseline_namespace_the_agent_is_refused_and_notes_say_so() {
    let env = common::setup("chart-psa").await;
    let release = format!("psa-{}", env.id);
    let label = |level: &str| {
        run(tool("kubectl").args([
            "label",
            "namespace",
            &env.ns,
            &format!("pod-security.kubernetes.io/enforce={level}"),
            "--overwrite",
        ]));
    };
    label("baseline");
    let installed = run(tool("helm").args(["install", &release, packaged_chart(), "--namespace", &env.ns]));
    let notes = String::from_utf8_lossy(&installed.stdout);
    assert!(
        notes.contains("WARNING: Pod Security") && notes.contains("\"baseline\""),
        "NOTES warn that the agent will not run: {notes}"
    );
    let manifest = run(tool("helm").args(["get", "manifest", &release, "--namespace", &env.ns]));
    let objects = objects(&manifest.stdout);
    let agent = &find(
        &objects,
        "DaemonSet",
        &format!("{release}-shared-volume-controller-agent"),
    )["spec"]["template"];
    let controller = &find(
        &objects,
        "Deployment",
        &format!("{release}-shared-volume-controller-controller"),
    )["spec"]["template"];

    // What the DaemonSet controller would meet creating the agent's pods here.
    let refusal = admitted(agent, &env.ns, "agent").expect_err("baseline refuses the agent");
    for says in [
        "violates PodSecurity \"baseline:latest\"",
        "hostNetwork",
        "hostPath",
        "NET_ADMIN",
    ] {
        assert!(refusal.contains(says), "{says}: {refusal}");
    }
    admitted(controller, &env.ns, "controller").expect("the controller fits baseline");
    label("restricted");
    admitted(controller, &env.ns, "controller").expect("and restricted");
    label("privileged");
    admitted(agent, &env.ns, "agent").expect("privileged admits the agent");
    let upgraded = run(tool("helm").args(["upgrade", &release, packaged_chart(), "--namespace", &env.ns]));
    assert!(
        !String::from_utf8_lossy(&upgraded.stdout).contains("WARNING: Pod Security"),
        "no warning once the namespace is privileged"
    );
    run(tool("helm").args(["uninstall", &release, "--namespace", &env.ns, "--wait"]));
    env.cleanup().await;
}

/// The install page's split: the agent and the controller as two releases of the same name in two
/// namespaces. Both install (cluster-wide names carry the namespace), each holds only its own
/// components' admission policies, `helm test`'s policy checks pass for each, and uninstalling one
/// leaves the other's cluster-wide objects alone.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn the_controller_and_the_agent_install_as_two_releases() {
    let agents = common::setup("chart-split-agent").await;
    let controllers = common::setup("chart-split-controller").await;
    let release = "shared-volume";
    let install = |namespace: &str, sets: &[&str]| {
        let mut helm = tool("helm");
        helm.args(["install", release, packaged_chart(), "--namespace", namespace]);
        for set in sets {
            helm.args(["--set", set]);
        }
        run(&mut helm);
    };
    install(&agents.ns, &["controller.enabled=false"]);
    install(&controllers.ns, &["agent.enabled=false", "conntrack.enabled=false"]);

    let policies = |namespace: &str| -> Vec<String> {
        let listed = run(tool("kubectl").args(["get", "validatingadmissionpolicies", "-o", "name"]));
        let prefix = format!(
            "validatingadmissionpolicy.admissionregistration.k8s.io/{namespace}-{release}-shared-volume-controller-"
        );
        String::from_utf8_lossy(&listed.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix).map(str::to_owned))
            .collect()
    };
    let of_agents = policies(&agents.ns);
    for policy in [
        "agent-node-taints",
        "agent-attachments",
        "conntrack-read-only",
        "leases",
    ] {
        assert!(of_agents.iter().any(|p| p == policy), "{policy} in {of_agents:?}");
    }
    assert!(!of_agents.iter().any(|p| p == "claim-status"), "{of_agents:?}");
    let of_controllers = policies(&controllers.ns);
    assert!(of_controllers.iter().any(|p| p == "claim-status"), "{of_controllers:?}");
    for policy in ["agent-node-taints", "agent-attachments", "conntrack-read-only"] {
        assert!(!of_controllers.iter().any(|p| p == policy), "{of_controllers:?}");
    }

    for (env, sets) in [
        (&agents, vec!["controller.enabled=false"]),
        (&controllers, vec!["agent.enabled=false", "conntrack.enabled=false"]),
    ] {
        let mut helm = tool("helm");
        helm.args(["template", release, CHART, "--namespace", &env.ns]);
        helm.args(["--show-only", "templates/tests/selftest.yaml"]);
        for set in sets {
            helm.args(["--set", set]);
        }
        let rendered = objects(&run(&mut helm).stdout);
        let pod = rendered.iter().find(|o| o["kind"] == "Pod").expect("the selftest pod");
        let args: Vec<String> = pod["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        let (_, output) = selftest(&args, &env.ns);
        let checked: Vec<&str> = output.lines().filter(|l| l.contains("admission policy")).collect();
        assert!(!checked.is_empty(), "{output}");
        assert!(checked.iter().all(|l| l.starts_with("ok")), "{output}");
    }

    run(tool("helm").args(["uninstall", release, "--namespace", &agents.ns, "--wait"]));
    assert!(policies(&agents.ns).is_empty(), "the agents' release took its policies");
    assert_eq!(
        policies(&controllers.ns),
        of_controllers,
        "and left the controller's alone"
    );
    run(tool("helm").args(["uninstall", release, "--namespace", &controllers.ns, "--wait"]));
    assert!(policies(&controllers.ns).is_empty());
    agents.cleanup().await;
    controllers.cleanup().await;
}
