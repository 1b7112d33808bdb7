//! A converged set of shared volumes costs nothing to re-sync: the apiserver's own request counter
//! sees no write while the controller reconciles every volume again and again. This lives in its
//! own test binary so that no other test writes while it counts (cargo runs binaries one by one).

use std::time::Duration;

use common::{eventually, grown, serving, writes};

const VOLUMES: usize = 5;
#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn resyncing_converged_volumes_writes_nothing() {
    let env = common::setup("resync").await;
    let controller = env.start_controller(&["--resync-interval", "1s"]).await;
    for i in 0..VOLUMES {
        env.bound_rwx_claim(&format!("data-{i}"), serving(&format!("192.0.2.{}:2049", 100 + i)))
            .await;
    }
    for i in 0..VOLUMES {
        let pv = env.pv_name(&format!("data-{i}"));
        env.published_mount_endpoint(&pv).await;
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
