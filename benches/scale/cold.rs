//! P4, P5 and the controller's part of P6: claims that exist before the controller starts.

use super::*;

/// P4, P5 and the controller's part of P6: claims that exist before the controller starts, a
/// restart over converged volumes, and the controller's memory.
pub(super) async fn cold_start(sizes: &Sizes) -> Vec<Figure> {
    let env = common::setup("bench-cold").await;
    let bare_env = common::setup("bench-cold-bare").await;
    let endpoint = "10.0.0.9:2049";
    let (published, watch) = Published::watch(&env.client, env.pv_name(""));
    let volumes = claims(&env, "cold", sizes.cold, Some(endpoint)).await;
    let started = Instant::now();
    let first = controller(&env);
    let converged = published.all(&volumes).await - started;
    let rss = peak_rss_mib(&first);
    // What it keeps, once the cold start's transient buffers are given back.
    settle().await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    println!(
        "P6 controller after the cold start: peak {rss:.1} MiB, resident now {:.1} MiB",
        status_mib(&first, "VmRSS:")
    );
    first.stop().await;
    // The bare client's volumes only now: the controller caches every PV in the cluster, and its
    // memory is measured at `sizes.cold` volumes, not twice as many.
    let bare = claims(&bare_env, "cold", sizes.cold, Some(endpoint)).await;
    let started = Instant::now();
    stream::iter(&bare)
        .for_each_concurrent(CONCURRENCY, |pv| bare_publish(&bare_env, pv, endpoint))
        .await;
    let bare_time = started.elapsed();

    // A restart reconciles every converged volume again: it must cost no write.
    let before = writes(&env.client).await;
    let second = controller(&env);
    second.wait_ready().await;
    let reconciled = "storageos_shared_volume_reconciles_total{result=\"shared\"}";
    let deadline = Instant::now() + Duration::from_secs(600);
    while second.metric(reconciled).await < sizes.cold as f64 {
        assert!(
            Instant::now() < deadline,
            "the restarted controller did not reconcile every claim"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resync_writes: f64 = grown(&before, &writes(&env.client).await).iter().map(|(_, d)| d).sum();
    second.stop().await;
    watch.abort();
    env.cleanup().await;
    bare_env.cleanup().await;
    vec![
        Figure {
            id: "P4",
            what: "cold start: claims existing before the controller, all published".into(),
            n: sizes.cold,
            product: converged.as_secs_f64() * 1000.0,
            floor: Some(bare_time.as_secs_f64() * 1000.0),
            unit: "ms",
            target: "≤ 1.5× floor".into(),
            met: converged.as_secs_f64() <= 1.5 * bare_time.as_secs_f64(),
        },
        Figure {
            id: "P5",
            what: "restart over converged volumes: write requests".into(),
            n: sizes.cold,
            product: resync_writes.abs(),
            floor: Some(0.0),
            unit: "writes",
            target: "0".into(),
            met: resync_writes == 0.0,
        },
        Figure {
            id: "P6",
            what: "controller peak RSS after the cold start".into(),
            n: sizes.cold,
            product: rss,
            floor: None,
            unit: "MiB",
            target: "≤ 96 MiB (at 10,000)".into(),
            met: rss <= 96.0,
        },
    ]
}
