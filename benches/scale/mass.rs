//! P9: a node serving many shared volumes is lost and another takes them all over at once.

use super::*;

/// P9: a node serving `n` shared volumes is lost and another is promoted for all of them at once,
/// with the controller running: the time until every EndpointSlice is at the new node, the API
/// writes per moved volume, and the slices that pointed back at the lost node after they had
/// moved. The floor: a bare client moving the same number of volumes (the PV annotation, then the
/// slice, `CONCURRENCY` at a time) in the same run.
pub(super) async fn mass_move(n: usize, pairs: usize) -> Vec<Figure> {
    // Product and floor alternate, so that the machine's slow moments fall on both; the ratio
    // is the median of the pairs' ratios.
    let mut runs = Vec::new();
    for pair in 1..=pairs {
        let product = product_mass_move(n).await;
        let floor = floor_mass_move(n, &product.from, &product.to).await;
        let ratio = product.took.as_secs_f64() / floor.as_secs_f64();
        println!(
            "P9 pair {pair}/{pairs}: product {:.2} s, floor {:.2} s, ratio {ratio:.2}",
            product.took.as_secs_f64(),
            floor.as_secs_f64()
        );
        runs.push((product, floor, ratio));
    }
    runs.sort_by(|a, b| a.2.total_cmp(&b.2));
    let (product, floor, ratio) = runs.swap_remove(runs.len() / 2);
    println!(
        "P9: {} moves held by the controller while their PV write was in flight",
        product.held
    );
    mass_move_figures(n, pairs, &product, floor, ratio)
}

/// What one mass move of the product showed.
pub(super) struct MassMove {
    pub(super) took: Duration,
    writes_per_volume: f64,
    pv_reads: u64,
    bounced: usize,
    held: f64,
    /// The lost node's and the new primary's (IP, NFS endpoint).
    from: (String, String),
    to: (String, String),
}

/// `n` volumes served from node a, the controller and two agents as in a cluster; node a is
/// lost and DRBD promotes node b: how long until every slice is at b, and what it cost.
pub(super) async fn product_mass_move(n: usize) -> MassMove {
    let env = common::setup("bench-mass").await;
    let moved = product_mass_move_on(&env, &Identities::admin(), n).await;
    env.cleanup().await;
    moved
}

/// Whom the processes of a mass move sign in as: a kubeconfig each.
pub(super) struct Identities {
    pub(super) controller: String,
    pub(super) agent: String,
}

impl Identities {
    /// The admin (the tests act as the chart's accounts), as in the other moves.
    fn admin() -> Self {
        let admin = common::accounts::admin_kubeconfig();
        Self {
            controller: admin.clone(),
            agent: admin,
        }
    }
}

/// [`product_mass_move`] in `env`, its processes signed in as `identities` say.
pub(super) async fn product_mass_move_on(env: &TestEnv, identities: &Identities, n: usize) -> MassMove {
    let nodes = env.sim_nodes(&["a", "b", "c"]).await;
    let (watch_published, published_task) = Published::watch(&env.client, format!("pvc-{}-mass-", env.id));
    let pvs = claims(env, "mass", n, Some(&nodes[0].endpoint())).await;
    let resources: Vec<&str> = pvs.iter().map(String::as_str).collect();
    healthy(&nodes, &resources, 0);
    let controller = controller_with(env, &[CLUSTER_LOG_LEVEL, ("KUBECONFIG", &identities.controller)]);
    controller.wait_ready().await;
    watch_published.all(&pvs).await;
    published_task.abort();
    let history = SliceHistory::default();
    let slices_task = history.record(env);
    let at_a = vec![nodes[0].ip.clone()];
    history.wait_until(&pvs, &at_a).await;
    let agents = vec![
        agent_as(env, &nodes[1], &identities.agent).await,
        agent_as(env, &nodes[2], &identities.agent).await,
    ];
    settle().await;
    let before = writes(&env.client).await;
    let reads_before = common::requests(&env.client, &["GET", "LIST"]).await;
    let cpu_before = cpu_seconds_by_process();
    let started = Instant::now();
    lost(&nodes, &resources, 0, Some(1));
    let at_b = vec![nodes[1].ip.clone()];
    history.wait_until(&pvs, &at_b).await;
    let took = started.elapsed();
    for (process, seconds) in grown(&cpu_before, &cpu_seconds_by_process()) {
        println!("P9 CPU during the move: {seconds:>5.2} s {process}");
    }
    let reads = grown(&reads_before, &common::requests(&env.client, &["GET", "LIST"]).await);
    let pv_reads: u64 = reads
        .iter()
        .filter(|(labels, _)| labels.contains("resource=\"persistentvolumes\""))
        .map(|(_, count)| *count as u64)
        .sum();
    // The events land within a second; the claims' conditions once each move is 3 s old.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let grew = grown(&before, &writes(&env.client).await);
    for (labels, delta) in &grew {
        println!("P9 writes: {delta:>6} {labels}");
    }
    let wrote: f64 = grew.iter().map(|(_, d)| d).sum();
    let bounced = history.bounced_back(&at_a, &at_b).len();
    slices_task.abort();
    let held = controller.metric("storageos_shared_volume_moves_held_total").await;
    for process in agents.into_iter().chain([controller]) {
        process.stop().await;
    }
    MassMove {
        took,
        writes_per_volume: wrote / n as f64,
        pv_reads,
        bounced,
        held,
        from: (nodes[0].ip.clone(), nodes[0].endpoint()),
        to: (nodes[1].ip.clone(), nodes[1].endpoint()),
    }
}

/// The floor of the same move: a client that already knows where every volume goes writes each
/// PV's annotation and slice, `CONCURRENCY` at a time.
pub(super) async fn floor_mass_move(n: usize, from: &(String, String), to: &(String, String)) -> Duration {
    let bare = common::setup("bench-mass-bare").await;
    let bare_pvs = claims(&bare, "mass", n, Some(&from.1)).await;
    stream::iter(&bare_pvs)
        .for_each_concurrent(CONCURRENCY, |pv| bare_publish(&bare, pv, &from.1))
        .await;
    settle().await;
    let cpu_before = cpu_seconds_by_process();
    let started = Instant::now();
    stream::iter(&bare_pvs)
        .for_each_concurrent(CONCURRENCY, |pv| async {
            bare_move(&bare, pv, &to.0, &to.1).await;
        })
        .await;
    let floor = started.elapsed();
    for (process, seconds) in grown(&cpu_before, &cpu_seconds_by_process()) {
        println!("P9 CPU during the floor's move: {seconds:>5.2} s {process}");
    }
    bare.cleanup().await;
    floor
}

/// P9's lines: the median pair's time and ratio, and that run's writes, reads and bounces.
pub(super) fn mass_move_figures(
    n: usize,
    pairs: usize,
    product: &MassMove,
    floor: Duration,
    ratio: f64,
) -> Vec<Figure> {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let line = |what: String, product: f64, unit, target: &str, met| Figure {
        id: "P9",
        what,
        n,
        product,
        floor: None,
        unit,
        target: target.into(),
        met,
    };
    vec![
        Figure {
            floor: Some(ms(floor)),
            ..line(
                format!(
                    "mass move: every EndpointSlice at the new node ({n} volumes, one node lost; median of {pairs} interleaved pairs, ratio {ratio:.2})"
                ),
                ms(product.took),
                "ms",
                "≤ 2× floor",
                ratio <= 2.0,
            )
        },
        line(
            "API writes per moved volume (PV, EndpointSlice, the claim's condition, and Events: one per PV up to 10 a round, then one on the node; no core/v1 Endpoints from Kubernetes 1.33; apiserver counter)".into(),
            product.writes_per_volume,
            "writes",
            "≤ 4",
            product.writes_per_volume <= 4.0,
        ),
        line(
            "PV reads per moved volume while the slices move (apiserver counter)".into(),
            product.pv_reads as f64 / n as f64,
            "reads",
            "0",
            product.pv_reads == 0,
        ),
        line(
            "bounce-backs: slices back at the lost node after they moved (watched)".into(),
            product.bounced as f64,
            "slices",
            "0",
            product.bounced == 0,
        ),
    ]
}

/// Every address list each EndpointSlice of a namespace had, as its watch delivered them.
#[derive(Clone, Default)]
pub(super) struct SliceHistory(Arc<Mutex<HashMap<String, Vec<Vec<String>>>>>);

impl SliceHistory {
    fn record(&self, env: &TestEnv) -> tokio::task::JoinHandle<()> {
        let (history, slices) = (self.clone(), env.api::<EndpointSlice>());
        tokio::spawn(async move {
            let mut events = watcher(slices, watcher::Config::default()).applied_objects().boxed();
            while let Some(Ok(slice)) = events.next().await {
                let addresses: Vec<String> = slice.endpoints.iter().flat_map(|e| e.addresses.clone()).collect();
                let mut history = history.0.lock().unwrap();
                let versions = history.entry(slice.name_any()).or_default();
                if versions.last() != Some(&addresses) {
                    versions.push(addresses);
                }
            }
        })
    }

    async fn wait_until(&self, pvs: &[String], at: &[String]) {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let done = {
                let history = self.0.lock().unwrap();
                pvs.iter()
                    .all(|pv| history.get(pv).and_then(|v| v.last()).is_some_and(|last| last == at))
            };
            if done {
                return;
            }
            assert!(Instant::now() < deadline, "not every EndpointSlice reached {at:?}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The slices that pointed at `from` again after they had pointed at `to`.
    fn bounced_back(&self, from: &[String], to: &[String]) -> Vec<String> {
        let history = self.0.lock().unwrap();
        history
            .iter()
            .filter(|(_, versions)| {
                let moved = versions.iter().position(|v| v == to);
                moved.is_some_and(|at| versions[at..].iter().any(|v| v == from))
            })
            .map(|(name, _)| name.clone())
            .collect()
    }
}
