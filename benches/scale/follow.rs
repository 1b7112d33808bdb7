//! P2: the other node's fake DRBD becomes Primary, then the EndpointSlice shows its address.

use super::*;

/// P2: the fake DRBD on the other node becomes Primary → the EndpointSlice shows its address.
pub(super) async fn follow_the_primary(sizes: &Sizes) -> Vec<Figure> {
    let env = common::setup("bench-follow").await;
    let nodes = env.sim_nodes(&["a", "b", "c"]).await;
    let (_, pv) = env.bound_rwx_claim("data", serving(&nodes[0].endpoint())).await;
    let pv = pv.name_any();
    healthy(&nodes, &[&pv], 0);
    let controller = controller_as_in_a_cluster(&env);
    controller.wait_ready().await;
    let agents = vec![
        agent_as_in_a_cluster(&env, &nodes[0]).await,
        agent_as_in_a_cluster(&env, &nodes[1]).await,
    ];
    wait_for_slice(&env, &pv, &nodes[0].ip).await;
    let mut slice = SliceWatch::start(&env, &pv).await;
    let bare = common::setup("bench-follow-bare").await;
    let bare_pv = claims(&bare, "data", 1, Some(&nodes[0].endpoint())).await.remove(0);
    bare_publish(&bare, &bare_pv, &nodes[0].endpoint()).await;
    let mut product = Vec::new();
    let mut floor = Vec::new();
    for i in 0..sizes.moves {
        let to = (i + 1) % 2;
        // The clock starts when the new primary is promoted, after the old one demoted.
        demote_others(&nodes, &[&pv], to);
        let started = Instant::now();
        promote(&nodes, &[&pv], to);
        slice.until_at(&nodes[to].ip).await;
        product.push(started.elapsed());
        settle().await;
        // The floor: a bare client making the two writes a move needs.
        floor.push(bare_move(&bare, &bare_pv, &nodes[to].ip, &nodes[to].endpoint()).await);
        settle().await;
    }
    // The agents' own share: from reading the Primary role to the rewritten endpoints (before it,
    // events2 reports the change and the agent reads the DRBD state).
    let (agent_share, count) =
        histogram_mean_ms(&agents, "storageos_drbd_agent_endpoint_rewrite_duration_seconds").await;
    // What the detection costs before that: one read of the DRBD state.
    let (drbd_read, reads) = histogram_mean_ms(&agents, "storageos_drbd_agent_drbd_read_duration_seconds").await;
    for process in agents.into_iter().chain([controller]) {
        process.stop().await;
    }
    env.cleanup().await;
    bare.cleanup().await;
    let floor_mean = floor.iter().map(Duration::as_secs_f64).sum::<f64>() / floor.len().max(1) as f64 * 1000.0;
    let (p99, floor_p99) = (quantile(&product, 0.99), quantile(&floor, 0.99));
    for (what, samples) in [("product", &product), ("floor", &floor)] {
        print_spread(what, samples);
    }
    let share = Figure {
        id: "P2",
        what: "the agent's share, mean: Primary read → endpoints rewritten".into(),
        n: count as usize,
        product: agent_share,
        floor: Some(floor_mean),
        unit: "ms",
        target: "≤ 2× floor".into(),
        met: agent_share <= 2.0 * floor_mean,
    };
    let total = Figure {
        id: "P2",
        what: format!("follow the primary p99 (p50 {:.1} ms)", quantile(&product, 0.5)),
        n: sizes.moves,
        product: p99,
        floor: Some(floor_p99),
        unit: "ms",
        target: "≤ 2× floor and < 250 ms".into(),
        met: p99 <= 2.0 * floor_p99 && p99 < 250.0,
    };
    let detection = Figure {
        id: "P2",
        what: "the agents' DRBD read, mean (drbdsetup status + show; in the product, not the floor)".into(),
        n: reads as usize,
        product: drbd_read,
        floor: None,
        unit: "ms",
        target: "-".into(),
        met: true,
    };
    vec![total, share, detection]
}

/// P2's spread of one side's moves, with the three slowest.
pub(super) fn print_spread(what: &str, samples: &[Duration]) {
    let q = |q| quantile(samples, q);
    let mut slowest: Vec<(usize, &Duration)> = samples.iter().enumerate().collect();
    slowest.sort_by(|a, b| b.1.cmp(a.1));
    let slowest: Vec<String> = slowest[..3.min(slowest.len())]
        .iter()
        .map(|(i, d)| format!("#{i} {:.1}", d.as_secs_f64() * 1000.0))
        .collect();
    println!(
        "P2 {what}: p50 {:.1}, p90 {:.1}, p95 {:.1}, p99 {:.1}, max {:.1} ms; slowest moves {}",
        q(0.5),
        q(0.9),
        q(0.95),
        q(0.99),
        q(1.0),
        slowest.join(", ")
    );
}

/// The mean of one histogram over every process, in ms, and how many it observed.
pub(super) async fn histogram_mean_ms(processes: &[Process], histogram: &str) -> (f64, f64) {
    let (mut sum, mut count) = (0.0, 0.0);
    for process in processes {
        sum += process.metric(&format!("{histogram}_sum")).await;
        count += process.metric(&format!("{histogram}_count")).await;
    }
    let mean = if count > 0.0 { sum / count * 1000.0 } else { 0.0 };
    (mean, count)
}

/// The addresses of one EndpointSlice as a watch delivers them: a move is seen when it happens,
/// not at the next poll.
pub(super) struct SliceWatch(stream::BoxStream<'static, EndpointSlice>);

impl SliceWatch {
    async fn start(env: &TestEnv, name: &str) -> Self {
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let events = watcher(env.api::<EndpointSlice>(), config)
            .applied_objects()
            .map(|slice| slice.expect("the EndpointSlice watch"));
        let mut events = events.boxed();
        // The initial list: from here on, only changes arrive.
        events.next().await.expect("the EndpointSlice exists");
        Self(events)
    }

    async fn until_at(&mut self, ip: &str) {
        let wait = async {
            while let Some(slice) = self.0.next().await {
                if slice.endpoints.iter().flat_map(|e| &e.addresses).eq([ip]) {
                    return;
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .unwrap_or_else(|_| panic!("the EndpointSlice never pointed at {ip}"));
    }
}

pub(super) async fn wait_for_slice(env: &TestEnv, pv: &str, ip: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while slice_addresses(env, pv).await != [ip.to_owned()] {
        assert!(Instant::now() < deadline, "the EndpointSlice never pointed at {ip}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
