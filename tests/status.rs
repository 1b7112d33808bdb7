//! `status` against a live control plane: a leading controller, an agent per node, one served
//! claim. Its JSON names the leader, each agent with its heartbeat and DRBD report, and the claim
//! with its condition, mount endpoint and primary node; its table says the same for people.

use std::time::Duration;

use common::drbd::{healthy, three_nodes};
use common::eventually;
use common::linstor_nfs::advertise;
use serde_json::{Value, json};

const AGENT_SELECTOR: &str = "app.kubernetes.io/name=shared-volume-controller,app.kubernetes.io/component=agent";

/// Runs `status` with `args` as the cluster's admin: its stdout, or why it failed.
fn status(namespace: &str, args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_shared-volume-controller"))
        .args(["status", "--namespace", namespace, "--agent-selector", AGENT_SELECTOR])
        .args(args)
        .output()
        .unwrap();
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn status_shows_the_leader_the_agents_and_each_served_claim() {
    let (env, nodes, pv) = three_nodes("status").await;
    healthy(&nodes, &[&pv], 0);
    let mut processes = vec![env.start_leading_controller().await];
    for node in &nodes {
        let agent = env.start_agent(node, &[]).await;
        env.agent_pod(&node.name, &agent, None).await;
        processes.push(agent);
    }
    repair_pod_that_cannot_pull_its_image(&env, &nodes[2].name).await;
    env.bound_rwx_claim_served_by_linstor_nfs("theirs").await;
    advertise(&env, &env.pv_name("theirs"), &nodes[1].name, "10.244.1.7", 2050).await;

    let view: Value = eventually(
        "a status with the leader and the served claim",
        Duration::from_secs(60),
        || async {
            let view: Value = serde_json::from_str(&status(&env.ns, &["-o", "json"]).ok()?).ok()?;
            let claim = view["claims"]
                .as_array()?
                .iter()
                .find(|c| c["namespace"] == env.ns.as_str() && c["name"] == "data")?
                .clone();
            let reported = view["agents"]
                .as_array()?
                .iter()
                .all(|a| a["heartbeatSecondsAgo"].is_number() && a["drbdReportedSecondsAgo"].is_number());
            (view["leader"]["fresh"] == true && claim["ready"] == "True" && reported).then_some(view)
        },
    )
    .await;
    assert_eq!(view["namespace"], env.ns.as_str());
    let agents = view["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 3, "{view:#}");
    for agent in agents {
        assert_eq!(agent["ready"], true, "{agent}");
        assert_eq!(agent["taints"], json!([]), "{agent}");
    }
    let primaries: Vec<&Value> = agents.iter().filter(|a| a["primaries"] == 1).collect();
    assert_eq!(primaries.len(), 1, "node a alone is Primary: {view:#}");
    assert_eq!(primaries[0]["node"], nodes[0].name.as_str());
    let claim = view["claims"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["namespace"] == env.ns.as_str())
        .unwrap();
    assert_eq!(claim["volume"], pv.as_str());
    assert_eq!(claim["reason"], "Served");
    assert_eq!(claim["primaryNode"], nodes[0].name.as_str());
    let mount = env.pv_annotation(&pv, common::MOUNT_ENDPOINT).await.unwrap();
    assert_eq!(claim["mountEndpoint"], mount.as_str());
    assert!(claim["lastMove"].is_null(), "nothing moved: {claim}");

    let text = status(&env.ns, &[]).unwrap();
    assert!(
        text.starts_with(&format!("Leader ({}/shared-volume-controller): held by", env.ns)),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{}/data", env.ns)))
        .unwrap_or_else(|| panic!("a line for the claim: {text}"));
    for cell in ["True", "Served", mount.as_str(), nodes[0].name.as_str()] {
        assert!(line.contains(cell), "{cell} in {line}");
    }
    the_repair_that_cannot_pull_is_listed(&view, &text, &nodes[2].name);
    linstors_own_claim_is_listed(&view, &text, &env.ns);
    let refused = status("no-such-namespace-here", &["--lease-name", "x"]).map(|_| ());
    assert!(
        refused.is_ok(),
        "an empty namespace is an empty view, not an error: {refused:?}"
    );
    common::drbd::teardown(env, processes).await;
}

/// The plugin takes kubectl's `--context`, and reads only variables of its own: a kubeconfig whose
/// current context points nowhere still works with `--context` naming the good one, and a shell's
/// `OUTPUT` or `POD_NAMESPACE` changes nothing while `SHARED_VOLUME_OUTPUT` does.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn the_plugin_takes_kubectls_context_and_only_its_own_variables() {
    let env = common::setup("status-context").await;
    let admin = common::accounts::admin_kubeconfig();
    let mut config: Value = serde_yaml::from_str(&std::fs::read_to_string(&admin).unwrap()).unwrap();
    let good = config["current-context"].as_str().unwrap().to_owned();
    let mut nowhere = config["clusters"][0].clone();
    nowhere["name"] = json!("nowhere");
    nowhere["cluster"]["server"] = json!("https://127.0.0.1:1");
    config["clusters"].as_array_mut().unwrap().push(nowhere);
    let mut broken = config["contexts"][0].clone();
    broken["name"] = json!("broken");
    broken["context"]["cluster"] = json!("nowhere");
    config["contexts"].as_array_mut().unwrap().push(broken);
    config["current-context"] = json!("broken");
    let path = std::env::temp_dir().join(format!("svc-e2e-{}-contexts.kubeconfig", env.ns));
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    let run = |args: &[&str], vars: &[(&str, &str)]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_shared-volume-controller"))
            .args(["status", "--namespace", &env.ns, "--kubeconfig"])
            .arg(&path)
            .args(args)
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };
    assert!(!run(&[], &[]).0, "the current context points nowhere");
    let (ok, table) = run(
        &["--context", &good],
        &[("OUTPUT", "json"), ("POD_NAMESPACE", "elsewhere")],
    );
    assert!(ok, "--context names the good one");
    assert!(
        serde_json::from_str::<Value>(&table).is_err(),
        "OUTPUT is not the plugin's: {table}"
    );
    let (ok, json) = run(&["--context", &good], &[("SHARED_VOLUME_OUTPUT", "json")]);
    assert!(ok && serde_json::from_str::<Value>(&json).is_ok(), "{json}");
    std::fs::remove_file(&path).unwrap();
    env.cleanup().await;
}

/// A pod of the conntrack repair on `node`, labelled as the chart labels it, that the kubelet
/// cannot start: its image cannot be pulled.
async fn repair_pod_that_cannot_pull_its_image(env: &common::TestEnv, node: &str) {
    use k8s_openapi::api::core::v1::Pod;
    let name = format!("conntrack-{node}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "app.kubernetes.io/name": "shared-volume-controller",
            "app.kubernetes.io/component": "conntrack"}},
        "spec": {"nodeName": node, "containers": [{"name": "conntrack", "image": "registry.invalid/conntrack"}]},
    }))
    .unwrap();
    let pods = env.api::<Pod>();
    pods.create(&Default::default(), &pod).await.unwrap();
    let status = json!({"status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "conntrack", "image": "registry.invalid/conntrack", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}});
    pods.patch_status(&name, &Default::default(), &kube::api::Patch::Merge(status))
        .await
        .unwrap();
}

fn the_repair_that_cannot_pull_is_listed(view: &Value, text: &str, node: &str) {
    let repairs = view["repairs"].as_array().unwrap();
    assert_eq!(repairs.len(), 1, "{view:#}");
    assert_eq!(repairs[0]["node"], node);
    assert_eq!(repairs[0]["ready"], false);
    assert_eq!(repairs[0]["notRunning"], "ImagePullBackOff");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{node}  conntrack-")))
        .unwrap_or_else(|| panic!("a line for the repair: {text}"));
    assert!(line.contains("NO") && line.ends_with("ImagePullBackOff"), "{line}");
}

/// A claim LINSTOR CSI serves itself is listed apart, with its export; no agent here reports its
/// resource, so no primary.
fn linstors_own_claim_is_listed(view: &Value, text: &str, namespace: &str) {
    let theirs = view["servedByLinstor"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["namespace"] == namespace && c["name"] == "theirs")
        .unwrap_or_else(|| panic!("LINSTOR's claim: {view:#}"));
    assert!(
        theirs["export"].as_str().unwrap().starts_with("nfs://linstor-csi-nfs"),
        "{theirs}"
    );
    assert!(theirs["primaryNode"].is_null(), "{theirs}");
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{namespace}/theirs")))
        .unwrap_or_else(|| panic!("a line for LINSTOR's claim: {text}"));
    assert_eq!(theirs["server"], "10.244.1.7:2050", "{theirs}");
    assert!(theirs["since"].is_string(), "{theirs}");
    assert!(
        line.contains("nfs://linstor-csi-nfs") && line.contains("10.244.1.7:2050"),
        "{line}"
    );
}
