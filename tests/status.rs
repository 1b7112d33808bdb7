//! `status` against a live control plane: a leading controller, an agent per node, one served
//! claim. Its JSON names the leader, each agent with its heartbeat and DRBD report, and the claim
//! with its condition, mount endpoint and primary node; its table says the same for people.

mod common;

use std::time::Duration;

use common::drbd::{healthy, three_nodes};
use common::eventually;
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
    let refused = status("no-such-namespace-here", &["--lease-name", "x"]).map(|_| ());
    assert!(
        refused.is_ok(),
        "an empty namespace is an empty view, not an error: {refused:?}"
    );
    common::drbd::teardown(env, processes).await;
}
