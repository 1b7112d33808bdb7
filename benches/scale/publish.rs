//! P1 and P1b: a volume gets its service endpoint, then its mount endpoint is published; one at a
//! time, and in bursts, against a bare client making the same writes.

use super::*;

/// P1 and P1b: a volume gets its service endpoint → its mount endpoint is published.
pub(super) async fn publish(sizes: &Sizes) -> Vec<Figure> {
    let env = common::setup("bench-publish").await;
    // The bare client's volumes live in a namespace the controller does not watch.
    let bare = common::setup("bench-publish-bare").await;
    let endpoint = "10.0.0.9:2049";
    let (published, watch) = Published::watch(&env.client, env.pv_name(""));
    let sequential = claims(&env, "seq", sizes.sequential, None).await;
    let bare_sequential = claims(&bare, "seq", sizes.sequential, None).await;
    let mut bursts = Vec::new();
    for &size in sizes.bursts {
        let name = format!("burst{size}");
        bursts.push((
            claims(&env, &name, size, None).await,
            claims(&bare, &name, size, None).await,
        ));
    }
    let controller = controller(&env);
    controller.wait_ready().await;

    let mut product = Vec::new();
    for pv in &sequential {
        let started = Instant::now();
        env.annotate_pv(pv, SERVICE_ENDPOINT, Some(endpoint)).await;
        product.push(published.all(std::slice::from_ref(pv)).await - started);
    }
    let mut floor = Vec::new();
    for pv in &bare_sequential {
        floor.push(bare_serve_and_publish(&bare, pv, endpoint).await);
    }

    // Each size's burst, then the floor's of the same size, one after the other.
    let mut burst_times = Vec::new();
    for (burst, bare_burst) in &bursts {
        let started = Instant::now();
        stream::iter(burst)
            .for_each_concurrent(CONCURRENCY, |pv| env.annotate_pv(pv, SERVICE_ENDPOINT, Some(endpoint)))
            .await;
        let burst_time = published.all(burst).await - started;
        let started = Instant::now();
        stream::iter(bare_burst)
            .for_each_concurrent(CONCURRENCY, |pv| async {
                bare_serve_and_publish(&bare, pv, endpoint).await;
            })
            .await;
        burst_times.push((burst.len(), burst_time, started.elapsed()));
    }

    controller.stop().await;
    watch.abort();
    env.cleanup().await;
    bare.cleanup().await;
    let mut figures = publish_figures(sizes, &product, &floor);
    figures.extend(
        burst_times
            .into_iter()
            .map(|(n, product, floor)| burst_figure(n, product, floor)),
    );
    figures
}

/// A bare client's publication of one volume served at `endpoint`: the server's annotation,
/// then what the product writes for it, timed.
pub(super) async fn bare_serve_and_publish(bare: &TestEnv, pv: &str, endpoint: &str) -> Duration {
    let started = Instant::now();
    bare.annotate_pv(pv, SERVICE_ENDPOINT, Some(endpoint)).await;
    bare_publish(bare, pv, endpoint).await;
    started.elapsed()
}

/// P1's and P1b's lines.
pub(super) fn publish_figures(sizes: &Sizes, product: &[Duration], floor: &[Duration]) -> Vec<Figure> {
    let (p50, p99, floor_p99) = (quantile(product, 0.5), quantile(product, 0.99), quantile(floor, 0.99));
    vec![
        Figure {
            id: "P1",
            what: "publish latency p50, one volume at a time".into(),
            n: sizes.sequential,
            product: p50,
            floor: Some(quantile(floor, 0.5)),
            unit: "ms",
            target: "-".into(),
            met: true,
        },
        Figure {
            id: "P1",
            what: "publish latency p99, one volume at a time".into(),
            n: sizes.sequential,
            product: p99,
            floor: Some(floor_p99),
            unit: "ms",
            target: "≤ 1.5× floor".into(),
            met: p99 <= 1.5 * floor_p99,
        },
    ]
}

/// P1b at one size: every volume of a burst published, against the floor's same burst.
pub(super) fn burst_figure(n: usize, product: Duration, floor: Duration) -> Figure {
    Figure {
        id: "P1b",
        what: format!("burst: all published, {CONCURRENCY} at a time"),
        n,
        product: product.as_secs_f64() * 1000.0,
        floor: Some(floor.as_secs_f64() * 1000.0),
        unit: "ms",
        target: "≤ 1.5× floor".into(),
        met: product.as_secs_f64() <= 1.5 * floor.as_secs_f64(),
    }
}
