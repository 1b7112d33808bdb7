//! The Helm chart, for real: `helm lint`, `helm template` with default and non-default values,
//! `helm install` into the local control plane with a `kubectl auth can-i` matrix of what each
//! ServiceAccount may and may not do, and `helm uninstall` cleaning up.

#[path = "chart/attacker.rs"]
mod attacker;
#[path = "chart/helm_test.rs"]
mod helm_test;
#[path = "chart/rbac.rs"]
mod rbac;
#[path = "chart/values.rs"]
mod values;

use helm_test::selftest;
use rbac::rbac_is_least_privilege;

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
