//! A converged set of shared volumes costs nothing to re-sync: the apiserver's own request counter
//! sees no write while the controller reconciles every volume again and again. This lives in its
//! own test binary so that no other test writes while it counts (cargo runs binaries one by one).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::process::Process;
use common::{MOUNT_ENDPOINT, eventually, serving};
use kube::Client;

const VOLUMES: usize = 5;
// The controller never deletes; DELETEs seen meanwhile are the namespace controller and the
// garbage collector cleaning up after the tests that ran before this one.
const WRITE_VERBS: [&str; 4] = ["POST", "PUT", "PATCH", "APPLY"];
const WATCHED_RESOURCES: [&str; 5] = ["services", "endpoints", "endpointslices", "persistentvolumes", "events"];

/// Write requests the apiserver has served so far for the resources the controller touches, by
/// its `apiserver_request_total` counter, keyed by the sample's labels.
async fn writes(client: &Client) -> BTreeMap<String, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = client.request_text(request).await.expect("read apiserver /metrics");
    metrics
        .lines()
        .filter(|line| line.starts_with("apiserver_request_total{"))
        .filter(|line| {
            WRITE_VERBS
                .iter()
                .any(|verb| line.contains(&format!("verb=\"{verb}\"")))
        })
        .filter(|line| {
            WATCHED_RESOURCES
                .iter()
                .any(|resource| line.contains(&format!("resource=\"{resource}\"")))
        })
        .filter_map(|line| {
            let (labels, value) = line.rsplit_once(' ')?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The samples that grew between two readings, and by how much.
fn grown(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    after
        .iter()
        .map(|(labels, value)| (labels.clone(), value - before.get(labels).copied().unwrap_or(0.0)))
        .filter(|(_, delta)| *delta > 0.0)
        .collect()
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn resyncing_converged_volumes_writes_nothing() {
    let env = common::setup("resync").await;
    let controller = Process::start(
        &env.ns,
        &[
            "controller",
            "--watch-namespace",
            &env.ns,
            "--leader-elect",
            "false",
            "--resync-interval",
            "1s",
        ],
    );
    controller.wait_ready().await;
    for i in 0..VOLUMES {
        env.bound_rwx_claim(&format!("data-{i}"), serving(&format!("192.0.2.{}:2049", 100 + i)))
            .await;
    }
    for i in 0..VOLUMES {
        let pv = env.pv_name(&format!("data-{i}"));
        eventually("every volume published", Duration::from_secs(30), || async {
            env.pv_annotation(&pv, MOUNT_ENDPOINT).await
        })
        .await;
    }
    // Let the publishing settle (events, the PV watch echo), then count.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let reconciles = "storageos_shared_volume_reconciles_total{result=\"shared\"}";
    let before_reconciles = controller.metric(reconciles).await;
    let before_writes = writes(&env.client).await;
    let total: f64 = before_writes.values().sum();
    assert!(
        total >= (4 * VOLUMES) as f64,
        "the counter must have seen the writes that built the volumes: {total}"
    );

    eventually("three resyncs of every volume", Duration::from_secs(30), || async {
        let done = controller.metric(reconciles).await - before_reconciles;
        (done >= (3 * VOLUMES) as f64).then_some(())
    })
    .await;
    let after_writes = writes(&env.client).await;
    let resynced = controller.metric(reconciles).await - before_reconciles;
    let grown = grown(&before_writes, &after_writes);
    println!("{resynced} reconciles of converged volumes; writes meanwhile: {grown:?}");
    assert!(grown.is_empty(), "a converged resync must not write: {grown:#?}");
    controller.stop().await;
    env.cleanup().await;
}
