//! End-to-end: a node serving many shared volumes is lost and another node is promoted for all of
//! them at once, with the controller running. A watch records every version of every
//! EndpointSlice; none may point back at the lost node once it has moved.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::drbd::{WAIT, healthy, lost, slice_addresses};
use common::{MOUNT_ENDPOINT, SERVICE_ENDPOINT, eventually, serving};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const VOLUMES: usize = 50;

/// Every address list each EndpointSlice of the namespace had, in the order the watch saw them.
#[derive(Clone, Default)]
struct SliceHistory(Arc<Mutex<BTreeMap<String, Vec<Vec<String>>>>>);

impl SliceHistory {
    fn record(&self, slice: &EndpointSlice) {
        let addresses = slice.endpoints.iter().flat_map(|e| e.addresses.clone()).collect();
        let mut history = self.0.lock().unwrap();
        let versions = history.entry(slice.name_any()).or_default();
        if versions.last() != Some(&addresses) {
            versions.push(addresses);
        }
    }

    /// The slices that pointed at `from` again after they had pointed at `to`.
    fn bounced_back(&self, from: &str, to: &str) -> Vec<(String, Vec<Vec<String>>)> {
        let (from, to) = (vec![from.to_owned()], vec![to.to_owned()]);
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, versions)| {
                let moved = versions.iter().position(|v| *v == to);
                moved.is_some_and(|at| versions[at..].contains(&from))
            })
            .map(|(name, versions)| (name.clone(), versions.clone()))
            .collect()
    }
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_mass_move_never_points_a_slice_back_at_the_lost_node() {
    let env = common::setup("moves-mass").await;
    let nodes = env.sim_nodes(&["a", "b", "c"]).await;
    let pvs = claims_served_at(&env, &nodes[0].endpoint(), VOLUMES).await;
    let resources: Vec<&str> = pvs.iter().map(String::as_str).collect();
    healthy(&nodes, &resources, 0);
    let controller = env.start_namespace_controller().await;
    for pv in &pvs {
        eventually("every claim published at node a", WAIT, || async {
            let published = env.pv_annotation(pv, MOUNT_ENDPOINT).await.is_some();
            (published && slice_addresses(&env, pv).await == [nodes[0].ip.clone()]).then_some(())
        })
        .await;
    }

    let history = SliceHistory::default();
    let watch = record_slices(&env, &history);
    let agents = vec![
        env.start_agent(&nodes[1], &[]).await,
        env.start_agent(&nodes[2], &[]).await,
    ];
    // Node a is lost; b becomes the primary of every volume at once.
    lost(&nodes, &resources, 0, Some(1));
    eventually("every EndpointSlice at node b", Duration::from_secs(60), || async {
        let history = history.0.lock().unwrap();
        let at_b = pvs
            .iter()
            .filter(|pv| history.get(*pv).and_then(|v| v.last()) == Some(&vec![nodes[1].ip.clone()]))
            .count();
        (at_b == VOLUMES).then_some(())
    })
    .await;
    // What the controller would still write back would land within its hold and a resync.
    tokio::time::sleep(Duration::from_secs(3)).await;
    watch.abort();

    let bounced = history.bounced_back(&nodes[0].ip, &nodes[1].ip);
    assert!(bounced.is_empty(), "slices pointed back at the lost node: {bounced:#?}");
    for pv in &pvs {
        assert_eq!(slice_addresses(&env, pv).await, [nodes[1].ip.clone()], "{pv}");
    }
    for process in agents.into_iter().chain([controller]) {
        process.stop().await;
    }
    env.cleanup().await;
}

/// What the agent writes for a move, by hand, with its PV write `delay` behind its endpoint
/// writes (`None`: it never comes, the agent died).
async fn stamped_move(env: &common::TestEnv, pv: &str, to_ip: &str, delay: Option<Duration>) {
    let version = env.pvs().get(pv).await.unwrap().resource_version().unwrap();
    let endpoint = format!("{to_ip}:2049");
    let stamp = json!({"endpoint": endpoint, "overPvVersion": version}).to_string();
    let annotations = json!({STAMP: stamp});
    let params = PatchParams::default();
    // The slice alone: no core/v1 Endpoints on a 1.33+ control plane (`--write-endpoints auto`).
    let slice = json!({"metadata": {"annotations": annotations},
        "endpoints": [{"addresses": [to_ip], "conditions": {"ready": true}}]});
    env.api::<EndpointSlice>()
        .patch(pv, &params, &Patch::Merge(&slice))
        .await
        .unwrap();
    let Some(delay) = delay else { return };
    tokio::time::sleep(delay).await;
    let published = json!({"metadata": {"annotations": {SERVICE_ENDPOINT: endpoint, STAMP: stamp}}});
    env.pvs().patch(pv, &params, &Patch::Merge(&published)).await.unwrap();
}

const STAMP: &str = "storageos.com/nfs-endpoint-move";

/// The controller's two watches race: here the endpoints of a move always land half a second
/// before its PV write. The controller holds the move instead of putting the endpoints back, and
/// repairs only what no PV write follows (an agent that died) or what nobody stamped.
#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn endpoints_that_land_before_their_pv_are_held_not_put_back() {
    let env = common::setup("moves-held").await;
    let (a, b) = ("192.0.2.31", "192.0.2.32");
    let pvs = claims_served_at(&env, &format!("{a}:2049"), 10).await;
    let controller = env.start_namespace_controller().await;
    for pv in &pvs {
        eventually("every slice at a", WAIT, || async {
            (slice_addresses(&env, pv).await == [a.to_owned()]).then_some(())
        })
        .await;
    }
    let history = SliceHistory::default();
    let watch = record_slices(&env, &history);
    let (moved, rest) = pvs.split_at(8);
    stream::iter(moved)
        .for_each_concurrent(8, |pv| stamped_move(&env, pv, b, Some(Duration::from_millis(500))))
        .await;
    // An agent that died after its endpoint writes, and a hand edit.
    stamped_move(&env, &rest[0], b, None).await;
    let hand_edit = json!({"endpoints": [{"addresses": [b], "conditions": {"ready": true}}]});
    env.api::<EndpointSlice>()
        .patch(&rest[1], &PatchParams::default(), &Patch::Merge(&hand_edit))
        .await
        .unwrap();
    for (pv, at) in moved.iter().map(|pv| (pv, b)).chain(rest.iter().map(|pv| (pv, a))) {
        eventually("each slice where its PV says", WAIT, || async {
            (slice_addresses(&env, pv).await == [at.to_owned()]).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    watch.abort();
    let bounced = history.bounced_back(a, b);
    let bounced: Vec<_> = bounced.into_iter().filter(|(name, _)| moved.contains(name)).collect();
    assert!(
        bounced.is_empty(),
        "moves put back while their PV write was in flight: {bounced:#?}"
    );
    assert!(controller.metric("storageos_shared_volume_moves_held_total").await >= 8.0);
    for pv in rest {
        assert_eq!(
            slice_addresses(&env, pv).await,
            [a.to_owned()],
            "{pv}: the PV still says a"
        );
    }
    controller.stop().await;
    env.cleanup().await;
}

/// `n` bound RWX claims `data-<i>` whose volumes are served at `endpoint`: their PVs' names.
async fn claims_served_at(env: &common::TestEnv, endpoint: &str, n: usize) -> Vec<String> {
    stream::iter(0..n)
        .map(|i| async move {
            let (_, pv) = env.bound_rwx_claim(&format!("data-{i}"), serving(endpoint)).await;
            pv.name_any()
        })
        .buffered(8)
        .collect()
        .await
}

fn record_slices(env: &common::TestEnv, history: &SliceHistory) -> tokio::task::JoinHandle<()> {
    let (history, slices) = (history.clone(), env.api::<EndpointSlice>());
    tokio::spawn(async move {
        let events = watcher(slices, watcher::Config::default()).applied_objects();
        let _ = events
            .try_for_each(|slice| {
                history.record(&slice);
                futures::future::ready(Ok(()))
            })
            .await;
    })
}
