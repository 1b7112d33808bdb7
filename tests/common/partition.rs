//! A partition whose sides notice it at different times, for the liveness test and the
//! benchmark's P3p. Node a, the primary of a shared volume, is cut off from b and c. b and c
//! notice at once and b is promoted with c's vote; a's DRBD (DRBD's default net options: up to
//! 10.5 s late) notices the a–b drop 4 s later, still Primary with quorum through c as far as it
//! knows, and then the a–c drop 4 s after that, and loses quorum. The controller and three agents
//! run throughout.

use std::time::{Duration, Instant};

use serde_json::json;

use super::drbd::{SimNode, WAIT, healthy, lost, resource, slice_addresses, suspended, teardown, three_nodes};
use super::{SERVICE_ENDPOINT, TestEnv, eventually};

/// What the partition showed.
pub struct Staggered {
    /// Whether a had published itself back before it lost quorum.
    pub published_back: bool,
    /// From a's last DRBD change (its quorum lost) to the PV and the EndpointSlice naming b.
    pub settled: Duration,
    /// Whether the endpoint then stayed at b for 3 s.
    pub stayed: bool,
    /// b's held publications at the end (its gauge).
    pub held_at_end: f64,
}

/// Plays the partition for `test` and cleans up.
pub async fn staggered_partition(test: &str) -> Staggered {
    let (env, nodes, pv) = three_nodes(test).await;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    for node in &nodes {
        node.set_net_options(json!({}));
    }
    healthy(&nodes, &[&pv], 0);
    let mut processes = vec![env.start_namespace_controller().await];
    for node in &nodes {
        processes.push(env.start_agent(node, &[]).await);
    }
    eventually("the endpoint at node a", WAIT, || async {
        served_by(&env, &pv, a).await.then_some(())
    })
    .await;

    lost(&nodes, &[&pv], 0, Some(1));
    eventually("the endpoint at node b", WAIT, || async {
        served_by(&env, &pv, b).await.then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let peer = |node: &SimNode, state| (node.name.clone(), state);
    let state = |quorum, peers: [(String, &'static str); 2]| {
        let peers: Vec<(&str, &str, &str)> = peers
            .iter()
            .map(|(name, state)| {
                let role = if *state == "Connected" { "Secondary" } else { "Unknown" };
                (name.as_str(), *state, role)
            })
            .collect();
        resource(&pv, "Primary", quorum, &peers)
    };
    a.set(&[state(true, [peer(b, "Connecting"), peer(c, "Connected")])]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let published_back = served_by(&env, &pv, a).await;
    a.set(&[suspended(
        state(false, [peer(b, "Connecting"), peer(c, "Connecting")]),
        "quorum",
    )]);
    let last_change = Instant::now();
    eventually("the endpoint at node b, the primary with quorum", WAIT, || async {
        served_by(&env, &pv, b).await.then_some(())
    })
    .await;
    let settled = last_change.elapsed();
    let steady = Instant::now();
    let mut stayed = true;
    while steady.elapsed() < Duration::from_secs(3) {
        stayed &= served_by(&env, &pv, b).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let held_at_end = processes[2].metric("storageos_drbd_agent_publications_held").await;
    teardown(env, processes).await;
    Staggered {
        published_back,
        settled,
        stayed,
        held_at_end,
    }
}

/// Whether the PV and the EndpointSlice both name `node`.
async fn served_by(env: &TestEnv, pv: &str, node: &SimNode) -> bool {
    slice_addresses(env, pv).await == [node.ip.clone()]
        && env.pv_annotation(pv, SERVICE_ENDPOINT).await == Some(node.endpoint())
}
