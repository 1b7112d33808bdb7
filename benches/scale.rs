//! The product end to end against its floor, on a real control plane: the controller and agents
//! run as processes, and every figure is compared with a bare client on the same crates doing only
//! the necessary writes, measured in the same run. Prints a table and writes every figure to
//! `target/bench/scale.json` (or `$SVC_BENCH_JSON`).
//!
//! `make bench` runs the full sizes; `cargo test` (the test command) runs a smoke size that checks
//! only that every step converges, never a time.

#[path = "scale/conntrack.rs"]
mod conntrack;
#[path = "scale/nfs41.rs"]
mod nfs41;
#[path = "scale/proxy.rs"]
mod proxy;
#[path = "scale/tenant.rs"]
mod tenant;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::controller::ControllerArgs;
use common::drbd::{SimNode, demote_others, healthy, lost, node_monitor_grace_period, promote, slice_addresses};
use common::node_loss::{OUTCOMES, Timeline, lose_the_primarys_node, side_by_side};
use common::partition::staggered_partition;
use common::process::Process;
use common::{MOUNT_ENDPOINT, SERVICE_ENDPOINT, TestEnv, grown, serving, writes};
use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Endpoints, PersistentVolume, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use shared_volume_controller::{SharedVolume, WriteEndpoints, bound_claim, claim_owner, desired};

const CONCURRENCY: usize = 8;
const FAIL_OVER_TIMEOUT: Duration = Duration::from_secs(1);

struct Sizes {
    sequential: usize,
    /// P1b's bursts, each timed against the floor's of the same size.
    bursts: &'static [usize],
    moves: usize,
    fail_overs: usize,
    /// Runs of P3s per kind of workload (worst of them).
    stateful_crashes: usize,
    nfs_fail_overs: usize,
    /// Moves in P8c's run (`SVC_BENCH_NFS41_MOVES` overrides).
    nfs41_moves: usize,
    cold: usize,
    pods: usize,
    /// PVs of DRBD resources on other nodes around the agent of P6 (`SVC_BENCH_FOREIGN_PVS`
    /// overrides).
    foreign_pvs: usize,
    /// Volumes served from the one node that is lost in P9 (`SVC_BENCH_MASS` overrides).
    mass: usize,
    /// P9's product and floor runs, alternating (`SVC_BENCH_MASS_PAIRS` overrides).
    mass_pairs: usize,
    /// Services around kube-proxy in P10 (`SVC_BENCH_PROXY_SERVICES` overrides), and the moves
    /// timed among them in each mode.
    proxy_services: usize,
    proxy_moves: usize,
    /// P11: the conntrack tables the repair is measured on, and a mass move's volumes and table.
    conntrack_tables: &'static [usize],
    conntrack_mass: usize,
    conntrack_mass_table: usize,
}

const SMOKE: Sizes = Sizes {
    sequential: 10,
    bursts: &[20],
    moves: 5,
    fail_overs: 1,
    stateful_crashes: 1,
    nfs_fail_overs: 1,
    nfs41_moves: 6,
    cold: 20,
    pods: 200,
    foreign_pvs: 100,
    mass: 20,
    mass_pairs: 1,
    proxy_services: 30,
    proxy_moves: 1,
    conntrack_tables: &[10_000],
    conntrack_mass: 20,
    conntrack_mass_table: 10_000,
};
const FULL: Sizes = Sizes {
    sequential: 200,
    bursts: &[200, 1000],
    moves: 100,
    fail_overs: 3,
    stateful_crashes: 5,
    nfs_fail_overs: 10,
    nfs41_moves: 12,
    cold: 2000,
    pods: 20000,
    foreign_pvs: 10000,
    mass: 1000,
    mass_pairs: 3,
    proxy_services: 10000,
    proxy_moves: 10,
    conntrack_tables: &[10_000, 100_000, 1_000_000],
    conntrack_mass: 500,
    conntrack_mass_table: 100_000,
};

/// One line of the table.
struct Figure {
    id: &'static str,
    what: String,
    n: usize,
    product: f64,
    floor: Option<f64>,
    unit: &'static str,
    target: String,
    met: bool,
}

/// The run's sizes: the full or the smoke ones, with the environment's overrides.
fn sizes(full: bool) -> Sizes {
    let mut sizes = if full { FULL } else { SMOKE };
    let number = |name: &str| std::env::var(name).ok().and_then(|n| n.parse().ok());
    // `SVC_BENCH_COLD=N` sets the size of P4, P5 and the controller's P6.
    for (name, size) in [
        ("SVC_BENCH_COLD", &mut sizes.cold),
        ("SVC_BENCH_NFS41_MOVES", &mut sizes.nfs41_moves),
        ("SVC_BENCH_MASS", &mut sizes.mass),
        ("SVC_BENCH_PROXY_SERVICES", &mut sizes.proxy_services),
    ] {
        if let Some(n) = number(name) {
            *size = n;
        }
    }
    sizes
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench") || std::env::var_os("SVC_BENCH_FULL").is_some();
    if std::env::var_os("KUBECONFIG").is_none() {
        println!("scale benchmark skipped: no KUBECONFIG (run `make bench`, or `make test` for the smoke size)");
        return;
    }
    let sizes = sizes(full);
    // `SVC_BENCH_ONLY=agent,cold` runs only those parts (agent, publish, cold, follow, failover,
    // nfs, mass, tenant, proxy, conntrack; stateful: P3s alone, which failover includes; nfs41: P8s and P8c
    // alone, which a full run's or a chosen nfs part includes; p8c: P8c alone).
    let only = std::env::var("SVC_BENCH_ONLY").unwrap_or_default();
    let part = |name: &str| only.is_empty() || only.split(',').any(|p| p.trim() == name);
    let mut figures = Vec::new();
    // The agent's cost first: the volumes of the other parts would still be terminating around it.
    if part("agent") {
        figures.extend(agent_cost(&sizes).await);
    }
    if part("publish") {
        figures.extend(publish(&sizes).await);
    }
    if part("cold") {
        figures.extend(cold_start(&sizes).await);
    }
    if part("follow") {
        figures.extend(follow_the_primary(&sizes).await);
    }
    if part("failover") {
        figures.extend(fail_over(&sizes).await);
        // The smoke run leaves P3p to its end-to-end test (tests/failover.rs), the same scenario,
        // and P3s, which needs a control plane of its own, to the full run.
        if full || !only.is_empty() {
            figures.extend(staggered_partitions(&sizes).await);
            figures.extend(stateful_crashes(&sizes).await);
        }
    } else if !only.is_empty() && part("stateful") {
        figures.extend(stateful_crashes(&sizes).await);
    }
    if part("nfs") {
        figures.extend(nfs_outage(&sizes, full).await);
    }
    if (part("nfs") && (full || !only.is_empty())) || (!only.is_empty() && part("nfs41")) {
        figures.extend(nfs41::grace_by_operation_class().await);
        figures.extend(nfs41::what_a_run_of_moves_takes(sizes.nfs41_moves).await);
    } else if !only.is_empty() && part("p8c") {
        figures.extend(nfs41::what_a_run_of_moves_takes(sizes.nfs41_moves).await);
    }
    if part("mass") {
        let pairs = std::env::var("SVC_BENCH_MASS_PAIRS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(sizes.mass_pairs);
        figures.extend(mass_move(sizes.mass, pairs).await);
    }
    if part("tenant") {
        figures.extend(tenant::mass_move_beside_a_tenant(sizes.mass, full).await);
    }
    if part("proxy") {
        figures.extend(proxy::sync_at_scale(sizes.proxy_services, sizes.proxy_moves).await);
    }
    if part("conntrack") {
        let (tables, mass) = (sizes.conntrack_tables, sizes.conntrack_mass);
        figures.extend(conntrack::repair_at_table_sizes(tables, mass, sizes.conntrack_mass_table).await);
    }
    report(full, &figures).await;
}

fn quantile(samples: &[Duration], q: f64) -> f64 {
    let mut sorted: Vec<f64> = samples.iter().map(Duration::as_secs_f64).collect();
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index] * 1000.0
}

/// `n` bound RWX claims `<prefix>-<i>`, created `CONCURRENCY` at a time; with `endpoint`, each PV
/// already reports its NFS server.
async fn claims(env: &TestEnv, prefix: &str, n: usize, endpoint: Option<&str>) -> Vec<String> {
    stream::iter(0..n)
        .map(|i| async move {
            let annotations = endpoint.map(serving).unwrap_or_default();
            let (_, pv) = env.bound_rwx_claim(&format!("{prefix}-{i}"), annotations).await;
            pv.name_any()
        })
        .buffered(CONCURRENCY)
        .collect()
        .await
}

/// When each PV of this run got its mount endpoint, as a watch sees it.
#[derive(Clone, Default)]
struct Published(Arc<Mutex<HashMap<String, Instant>>>);

impl Published {
    fn watch(client: &Client, prefix: String) -> (Self, tokio::task::JoinHandle<()>) {
        let published = Self::default();
        let seen = published.clone();
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let task = tokio::spawn(async move {
            let mut changes = watcher(pvs, watcher::Config::default()).applied_objects().boxed();
            while let Some(Ok(pv)) = changes.next().await {
                let name = pv.name_any();
                if name.starts_with(&prefix) && pv.annotations().contains_key(MOUNT_ENDPOINT) {
                    seen.0.lock().unwrap().entry(name).or_insert_with(Instant::now);
                }
            }
        });
        (published, task)
    }

    fn at(&self, pv: &str) -> Option<Instant> {
        self.0.lock().unwrap().get(pv).copied()
    }

    /// Waits until every PV in `pvs` is published; returns when the last one was.
    async fn all(&self, pvs: &[String]) -> Instant {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let times: Option<Vec<Instant>> = pvs.iter().map(|pv| self.at(pv)).collect();
            if let Some(times) = times {
                return times.into_iter().max().unwrap_or_else(Instant::now);
            }
            assert!(
                Instant::now() < deadline,
                "not every volume was published within 10 minutes"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

/// The bare floor for one volume: the writes the product makes for a newly served claim at this
/// API server's version, and nothing else: the Service, the EndpointSlice (and the core/v1
/// Endpoints where the product writes them, before Kubernetes 1.33), the mount endpoint on the
/// PV, the claim's condition and the Event that says it was published.
async fn bare_publish(env: &TestEnv, pv_name: &str, endpoint: &str) {
    let pv = env.pvs().get(pv_name).await.unwrap();
    let claim = bound_claim(&pv).unwrap();
    let claim = env
        .api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .get(&claim.name)
        .await
        .unwrap();
    let shared = SharedVolume {
        namespace: env.ns.clone(),
        service_name: desired::service_name(pv_name),
        volume_id: pv_name.to_owned(),
        owner: claim_owner(&claim),
        server: endpoint.parse().unwrap(),
        mount_endpoint: None,
    };
    let post = PostParams::default();
    let service = env
        .api::<Service>()
        .create(&post, &desired::service(&shared))
        .await
        .unwrap();
    if writes_core_endpoints(&env.client).await {
        env.api::<Endpoints>()
            .create(&post, &desired::endpoints(&shared))
            .await
            .unwrap();
    }
    env.api::<EndpointSlice>()
        .create(&post, &desired::endpoint_slice(&shared))
        .await
        .unwrap();
    let ip = service.spec.unwrap().cluster_ip.unwrap();
    let mount = desired::mount_endpoint(&ip).unwrap();
    env.annotate_pv(pv_name, MOUNT_ENDPOINT, Some(&mount)).await;
    bare_state_and_tell(env, &claim, &mount, endpoint).await;
}

/// Whether the product writes core/v1 Endpoints on this API server (`--write-endpoints auto`),
/// asked once.
async fn writes_core_endpoints(client: &Client) -> bool {
    static WRITES: tokio::sync::OnceCell<bool> = tokio::sync::OnceCell::const_new();
    *WRITES
        .get_or_init(|| async {
            let info = client.apiserver_version().await.unwrap();
            let number = |s: &str| s.trim_end_matches('+').parse().ok();
            let version = number(&info.major).zip(number(&info.minor));
            WriteEndpoints::Auto.resolve(version)
        })
        .await
}

/// The claim's condition and the Event of a publication, as the product writes them: the
/// condition applied to the claim's status, the Event created.
async fn bare_state_and_tell(env: &TestEnv, claim: &PersistentVolumeClaim, mount: &str, server: &str) {
    let name = claim.name_any();
    let now = k8s_openapi::jiff::Timestamp::now();
    let condition = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "status": {"conditions": [{"type": "SharedVolumeReady", "status": "True", "reason": "Served",
            "message": format!("clients mount {mount}; the NFS server is {server}"), "lastTransitionTime": now}]}});
    env.api::<PersistentVolumeClaim>()
        .patch_status(
            &name,
            &PatchParams::apply("bench-floor").force(),
            &Patch::Apply(&condition),
        )
        .await
        .unwrap();
    let event: k8s_openapi::api::events::v1::Event = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}.{:x}", now.as_nanosecond()), "namespace": env.ns},
        "eventTime": now.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        "reportingController": "bench-floor", "reportingInstance": "bench-floor",
        "action": "PublishMountEndpoint", "reason": "MountEndpointPublished", "type": "Normal",
        "note": format!("mount endpoint {mount} published (NFS server {server})"),
        "regarding": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": env.ns, "name": name, "uid": claim.uid()},
    }))
    .unwrap();
    env.api::<k8s_openapi::api::events::v1::Event>()
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
}

fn controller(env: &TestEnv) -> Process {
    controller_with(env, &[])
}

fn controller_with(env: &TestEnv, vars: &[(&str, &str)]) -> Process {
    Process::start_with_env(
        &format!("{}-controller", env.ns),
        &ControllerArgs::alone(&env.ns).as_strs(),
        vars,
    )
}

// The moves (P2, P9) are measured with the processes set as in a cluster: logging at info (the
// tests log at debug) and, for agents, the default DRBD status interval (the tests' 1 s would put
// a full `drbdsetup` read beside a move every second).
const CLUSTER_LOG_LEVEL: (&str, &str) = ("LOG_LEVEL", "info");

fn controller_as_in_a_cluster(env: &TestEnv) -> Process {
    controller_with(env, &[CLUSTER_LOG_LEVEL])
}

/// The agents act as the admin (the tests act as the chart's accounts): the figures compare their
/// writes with a bare client's, which passes no admission policy either.
async fn agent_as_in_a_cluster(env: &TestEnv, node: &SimNode) -> Process {
    agent_as(env, node, &common::accounts::admin_kubeconfig()).await
}

/// An agent set as in a cluster, signed in with `kubeconfig`.
async fn agent_as(env: &TestEnv, node: &SimNode, kubeconfig: &str) -> Process {
    let vars = [CLUSTER_LOG_LEVEL, ("KUBECONFIG", kubeconfig)];
    env.start_agent_with_env(node, &["--drbd-status-interval", "5s"], &vars)
        .await
}

/// P1 and P1b: a volume gets its service endpoint → its mount endpoint is published.
async fn publish(sizes: &Sizes) -> Vec<Figure> {
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
async fn bare_serve_and_publish(bare: &TestEnv, pv: &str, endpoint: &str) -> Duration {
    let started = Instant::now();
    bare.annotate_pv(pv, SERVICE_ENDPOINT, Some(endpoint)).await;
    bare_publish(bare, pv, endpoint).await;
    started.elapsed()
}

/// P1's and P1b's lines.
fn publish_figures(sizes: &Sizes, product: &[Duration], floor: &[Duration]) -> Vec<Figure> {
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
fn burst_figure(n: usize, product: Duration, floor: Duration) -> Figure {
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

/// Peak RSS of a process, from /proc.
fn peak_rss_mib(process: &Process) -> f64 {
    status_mib(process, "VmHWM:")
}

/// A memory figure of `/proc/<pid>/status` (`VmHWM:`, `VmRSS:`), in MiB.
fn status_mib(process: &Process, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", process.pid())).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .unwrap_or(0.0)
}

/// P4, P5 and the controller's part of P6: claims that exist before the controller starts, a
/// restart over converged volumes, and the controller's memory.
async fn cold_start(sizes: &Sizes) -> Vec<Figure> {
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

/// P2: the fake DRBD on the other node becomes Primary → the EndpointSlice shows its address.
async fn follow_the_primary(sizes: &Sizes) -> Vec<Figure> {
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
fn print_spread(what: &str, samples: &[Duration]) {
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

/// A bare client's move of one volume to the node at `ip`, serving at `endpoint`: its PV's
/// annotation and its slice, timed.
async fn bare_move(bare: &TestEnv, pv: &str, ip: &str, endpoint: &str) -> Duration {
    let started = Instant::now();
    bare.annotate_pv(pv, SERVICE_ENDPOINT, Some(endpoint)).await;
    let slice = json!({"endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]});
    bare.api::<EndpointSlice>()
        .patch(pv, &PatchParams::default(), &Patch::Merge(slice))
        .await
        .unwrap();
    started.elapsed()
}

/// The mean of one histogram over every process, in ms, and how many it observed.
async fn histogram_mean_ms(processes: &[Process], histogram: &str) -> (f64, f64) {
    let (mut sum, mut count) = (0.0, 0.0);
    for process in processes {
        sum += process.metric(&format!("{histogram}_sum")).await;
        count += process.metric(&format!("{histogram}_count")).await;
    }
    let mean = if count > 0.0 { sum / count * 1000.0 } else { 0.0 };
    (mean, count)
}

/// Between samples: what a move sets off after the endpoints moved (the controller's follow-up
/// writes, events, the agents' reports) must not land in the next measurement, the product's or
/// the floor's. Moves in a cluster are seconds apart, not milliseconds.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

/// The addresses of one EndpointSlice as a watch delivers them: a move is seen when it happens,
/// not at the next poll.
struct SliceWatch(stream::BoxStream<'static, EndpointSlice>);

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

async fn wait_for_slice(env: &TestEnv, pv: &str, ip: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while slice_addresses(env, pv).await != [ip.to_owned()] {
        assert!(Instant::now() < deadline, "the EndpointSlice never pointed at {ip}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// P3: the primary's node is lost (kubelet, agent and DRBD links at once) with the agents and,
/// at the same time on nodes of its own, with Kubernetes alone: when each outcome was seen, the
/// worst of the runs. The "floor" column is Kubernetes alone here; an outcome it never reached
/// shows `-` and its documented timer.
async fn fail_over(sizes: &Sizes) -> Vec<Figure> {
    // How long Kubernetes alone is watched once NotReady: `SVC_BENCH_ALONE_WATCH` seconds (330
    // sees taint-eviction's default 300 s toleration run out), else 10.
    let settle = Duration::from_secs(
        std::env::var("SVC_BENCH_ALONE_WATCH")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    );
    let mut runs = Vec::new();
    for run in 0..sizes.fail_overs {
        let (with_test, alone_test) = (format!("bench-failover-{run}"), format!("bench-alone-{run}"));
        let ((with, with_agents), (alone, kubernetes_alone)) = tokio::join!(
            lose_the_primarys_node(&with_test, true, settle),
            lose_the_primarys_node(&alone_test, false, settle)
        );
        println!("P3 run {run}:\n{}", side_by_side(&with_agents, &kubernetes_alone));
        runs.push((with_agents, kubernetes_alone));
        with.cleanup().await;
        alone.cleanup().await;
    }
    let quick = FAIL_OVER_TIMEOUT + Duration::from_secs(1);
    let grace = node_monitor_grace_period();
    OUTCOMES
        .iter()
        .map(|outcome| {
            let worst = |pick: fn(&(Timeline, Timeline)) -> &Timeline| {
                let seen: Option<Vec<Duration>> = runs.iter().map(|r| (outcome.at)(pick(r))).collect();
                seen.and_then(|all| all.into_iter().max())
            };
            let (agents, kubernetes) = (worst(|r| &r.0), worst(|r| &r.1));
            // The endpoints follow DRBD's promotion at once. The rest waits for Kubernetes: once
            // the new primary serves, node a holds only NFS clients, which the agents leave alone
            // on a node Kubernetes still has Ready (it may only have lost its storage links).
            let (target, met) = match outcome.what {
                "node NotReady" => {
                    let bound = grace + Duration::from_secs(10);
                    (format!("≤ {}s", bound.as_secs()), agents.is_some_and(|at| at <= bound))
                }
                // Kubernetes's own step, shown for the comparison: no target of ours.
                "node tainted unreachable:NoExecute" => ("-".to_owned(), true),
                "endpoints at the new primary" => {
                    (format!("≤ {}s", quick.as_secs()), agents.is_some_and(|at| at <= quick))
                }
                _ => (
                    "≤ NotReady + 5 s".to_owned(),
                    runs.iter().all(|(t, _)| match ((outcome.at)(t), t.not_ready) {
                        (Some(at), Some(not_ready)) => at <= not_ready + Duration::from_secs(5),
                        _ => false,
                    }),
                ),
            };
            let kubernetes_says = match kubernetes {
                Some(_) => String::new(),
                None => format!("; Kubernetes alone: {}", outcome.documented),
            };
            Figure {
                id: "P3",
                what: format!(
                    "{} after a node loss, worst run (floor: Kubernetes alone{kubernetes_says})",
                    outcome.what
                ),
                n: sizes.fail_overs,
                product: agents.map_or(f64::NAN, |at| at.as_secs_f64() * 1000.0),
                floor: kubernetes.map(|at| at.as_secs_f64() * 1000.0),
                unit: "ms",
                target,
                met,
            }
        })
        .collect()
}

/// P3p: a partition whose sides notice it at different times (`common::partition`): from the
/// last DRBD view change (the old primary's quorum lost) to the PV and EndpointSlice naming the
/// primary with quorum, worst and median of the runs. No floor: nothing else moves the endpoint.
async fn staggered_partitions(sizes: &Sizes) -> Vec<Figure> {
    let mut settled = Vec::new();
    for run in 0..sizes.fail_overs {
        let seen = staggered_partition(&format!("bench-staggered-{run}")).await;
        println!(
            "P3p run {run}: published back {}, settled {:?}, stayed {}, held at the end {}",
            seen.published_back, seen.settled, seen.stayed, seen.held_at_end
        );
        assert!(seen.stayed, "the endpoint left the primary with quorum again");
        settled.push(seen.settled);
    }
    let worst = settled.iter().max().copied().unwrap_or_default();
    let target = Duration::from_secs(5);
    vec![Figure {
        id: "P3p",
        what: format!(
            "staggered partition: endpoint at the primary with quorum after the last DRBD change, worst of {} (median {:.0} ms)",
            settled.len(),
            quantile(&settled, 0.5)
        ),
        n: settled.len(),
        product: worst.as_secs_f64() * 1000.0,
        floor: None,
        unit: "ms",
        target: format!("≤ {}s", target.as_secs()),
        met: worst <= target,
    }]
}

/// P3s: a StatefulSet's pod and a Deployment's pod on a node that crashes silently, running on
/// another node (`common::workload`), with Kubernetes's default timers, DRBD's default net options
/// and the agents' defaults, worst and median of the runs per kind. Kubernetes alone is not run:
/// it never moves the StatefulSet's pod by itself (the pod stays Terminating on the unreachable
/// node until someone force-deletes it or sets the out-of-service taint), and the Deployment's
/// replacement waits on Multi-Attach until the attach-detach controller gives up on the lost
/// node, 6 minutes after the pod's eviction at NotReady + 300 s: its figures are documented ones.
async fn stateful_crashes(sizes: &Sizes) -> Vec<Figure> {
    use common::cluster::PrivateCluster;
    use common::workload::{DRBD_DEFAULT_DETECTION, WATCHED, Workload, crash_under};
    let cluster = PrivateCluster::up_with(
        "p3s",
        &[(
            "SVC_EXTRA_CONTROLLERS",
            "statefulset-controller,deployment-controller,replicaset-controller",
        )],
    );
    let target = DRBD_DEFAULT_DETECTION + Duration::from_secs(5) + Duration::from_secs(1);
    let kinds = [
        (
            Workload::StatefulSet,
            "never by itself (force-delete or the out-of-service taint by hand)",
        ),
        (
            Workload::Deployment,
            "6 to 11.5 minutes (NotReady + 300 s eviction + 6 min force-detach)",
        ),
    ];
    let mut figures = Vec::new();
    for (workload, alone) in kinds {
        let mut seen = Vec::new();
        let mut missed = 0;
        for run in 0..sizes.stateful_crashes {
            let env = common::setup_on(cluster.config().await, &format!("bench-p3s-{run}")).await;
            let kubeconfig = env.chart_kubeconfig(&cluster.kubeconfig(), "agent", &[]);
            // DRBD notices at a point of its window that moves across the runs, the last at its end.
            let phase = (run + 1) as f64 / sizes.stateful_crashes as f64;
            let crash = crash_under(&env, &kubeconfig, workload, phase).await;
            println!(
                "P3s {workload:?} run {run}: DRBD noticed at {:?}, running elsewhere at {:?}",
                crash.noticed, crash.running_elsewhere
            );
            match crash.running_elsewhere {
                Some(at) => seen.push(at),
                None => missed += 1,
            }
            env.cleanup().await;
        }
        let worst = seen.iter().max().copied().unwrap_or_default();
        let median = if seen.is_empty() {
            f64::NAN
        } else {
            quantile(&seen, 0.5)
        };
        figures.push(Figure {
            id: "P3s",
            what: format!(
                "{workload:?}'s pod on a silently crashed node running on another, worst of {} (median {median:.0} ms{}; Kubernetes alone: {alone})",
                sizes.stateful_crashes,
                if missed > 0 { format!(", {missed} not within {WATCHED:?}") } else { String::new() }
            ),
            n: sizes.stateful_crashes,
            product: if missed > 0 { f64::NAN } else { worst.as_secs_f64() * 1000.0 },
            floor: None,
            unit: "ms",
            target: format!("≤ {:.1}s", target.as_secs_f64()),
            met: missed == 0 && worst <= target,
        });
    }
    figures
}

/// P9: a node serving `n` shared volumes is lost and another is promoted for all of them at once,
/// with the controller running: the time until every EndpointSlice is at the new node, the API
/// writes per moved volume, and the slices that pointed back at the lost node after they had
/// moved. The floor: a bare client moving the same number of volumes (the PV annotation, then the
/// slice, `CONCURRENCY` at a time) in the same run.
async fn mass_move(n: usize, pairs: usize) -> Vec<Figure> {
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
struct MassMove {
    took: Duration,
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
async fn product_mass_move(n: usize) -> MassMove {
    let env = common::setup("bench-mass").await;
    let moved = product_mass_move_on(&env, &Identities::admin(), n).await;
    env.cleanup().await;
    moved
}

/// Whom the processes of a mass move sign in as: a kubeconfig each.
struct Identities {
    controller: String,
    agent: String,
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
async fn product_mass_move_on(env: &TestEnv, identities: &Identities, n: usize) -> MassMove {
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
async fn floor_mass_move(n: usize, from: &(String, String), to: &(String, String)) -> Duration {
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
fn mass_move_figures(n: usize, pairs: usize, product: &MassMove, floor: Duration, ratio: f64) -> Vec<Figure> {
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
struct SliceHistory(Arc<Mutex<HashMap<String, Vec<Vec<String>>>>>);

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

/// P8: what each NFS client model sees of a fail-over on the real data path (kube-proxy,
/// nfs-ganesha, libnfs and held connections): from its last successful operation before the node
/// is lost to its first after, through the same ClusterIP; per kube-proxy mode, with the conntrack
/// repair on and off, grace off (`nfs_fail_overs` runs) and on (one run). The smoke run measures
/// iptables with the repair, grace off, once. Piraeus documents about 10 s for its fail-over,
/// Longhorn about 20 s.
async fn nfs_outage(sizes: &Sizes, full: bool) -> Vec<Figure> {
    use common::datapath::{NfsGrace, ProxyMode};
    use common::outage::{ClientModel, Scenario};
    let mut scenarios = Vec::new();
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables] {
        for repair in [Some("30s"), None] {
            let grace_off = Scenario {
                repair,
                patience: Duration::from_secs(20),
                ..Scenario::repaired(mode)
            };
            let grace_on = Scenario {
                grace: NfsGrace::On {
                    lease_seconds: 10,
                    grace_seconds: 15,
                },
                ..grace_off
            };
            scenarios.push((grace_off, sizes.nfs_fail_overs));
            scenarios.push((grace_on, 1));
        }
    }
    if !full {
        scenarios.truncate(1);
    }
    let mut figures = Vec::new();
    for (at, (scenario, runs)) in scenarios.into_iter().enumerate() {
        let mut per_model: Vec<Vec<Option<Duration>>> = vec![Vec::new(); ClientModel::ALL.len()];
        for run in 0..runs {
            let env = common::setup(&format!("bench-nfs-{at}-{run}")).await;
            let outage = common::outage::client_through_a_fail_over(&env, scenario, &|_| {}, None).await;
            println!("P8 {scenario}, run {run}: {outage}");
            for (i, model) in ClientModel::ALL.into_iter().enumerate() {
                per_model[i].push(outage.of(model));
            }
            env.cleanup().await;
        }
        for (model, outages) in ClientModel::ALL.into_iter().zip(per_model) {
            figures.push(client_figure(&scenario, model, &outages));
        }
    }
    figures
}

/// One P8 row: a client model's p50 and worst outage in one scenario; a client that never got
/// through counts as the scenario's patience, and misses the target.
fn client_figure(
    scenario: &common::outage::Scenario,
    model: common::outage::ClientModel,
    outages: &[Option<Duration>],
) -> Figure {
    let stuck = outages.iter().filter(|o| o.is_none()).count();
    let measured: Vec<Duration> = outages.iter().map(|o| o.unwrap_or(scenario.patience)).collect();
    let worst = measured.iter().max().copied().unwrap_or_default();
    let stuck_note = if stuck > 0 {
        format!(
            "; {stuck} of {} runs still on the dead node after {} s",
            outages.len(),
            scenario.patience.as_secs()
        )
    } else {
        String::new()
    };
    Figure {
        id: "P8",
        what: format!(
            "NFS outage, {model}; {scenario}; p50 {:.0} ms{stuck_note}",
            quantile(&measured, 0.5)
        ),
        n: outages.len(),
        product: worst.as_secs_f64() * 1000.0,
        floor: None,
        unit: "ms (worst)",
        target: "< 10 s (Piraeus)".into(),
        met: stuck == 0 && worst < Duration::from_secs(10),
    }
}

/// `n` pods of a realistic size, `own` of them on `node` and the rest spread over 50 other nodes.
async fn pods_around(env: &TestEnv, node: &str, n: usize, own: usize) {
    let pod = |i: usize, node: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("load-{i}"), "labels": {"app": format!("app-{}", i % 100)},
                         "annotations": {"example.com/config": "x".repeat(500)}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.example.com/app:1",
                     "env": (0..15).map(|k| json!({"name": format!("VAR_{k}"), "value": "value-value-value"})).collect::<Vec<Value>>()}]}
        }))
        .unwrap()
    };
    let pods: Api<Pod> = env.api();
    let elsewhere = |i: usize| format!("{}-other-{}", env.id, i % 50);
    stream::iter(0..n)
        .map(|i| {
            let node = if i < own { node.to_owned() } else { elsewhere(i) };
            let pods = pods.clone();
            let pod = pod(i, &node);
            async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|_| async {})
        .await;
}

/// `n` PVs of DRBD resources that live on other nodes (ReadWriteMany, bound, each with a service
/// endpoint), as an agent sees them in a cluster of many storage nodes.
async fn foreign_pvs(env: &TestEnv, n: usize) {
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    stream::iter(0..n)
        .map(|i| {
            let pvs = pvs.clone();
            let name = env.pv_name(&format!("foreign-{i}"));
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": {SERVICE_ENDPOINT: "10.99.0.1:2049"}},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "capacity": {"storage": "1Gi"},
                    "storageClassName": "replicated",
                    "persistentVolumeReclaimPolicy": "Delete",
                    "claimRef": {"namespace": env.ns, "name": format!("foreign-{i}")},
                    "csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": name},
                }
            }))
            .unwrap();
            async move { pvs.create(&PostParams::default(), &pv).await.unwrap() }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|_| async {})
        .await;
}

/// P6 (agent) and P7: an agent's memory among many pods, and what their churn on other nodes
/// costs it.
async fn agent_cost(sizes: &Sizes) -> Vec<Figure> {
    let env = common::setup("bench-agent").await;
    let nodes = env.sim_nodes(&["a"]).await;
    let own = sizes.pods / 200;
    let pods: Api<Pod> = env.api();
    pods_around(&env, &nodes[0].name, sizes.pods, own).await;
    let foreign = std::env::var("SVC_BENCH_FOREIGN_PVS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(sizes.foreign_pvs);
    foreign_pvs(&env, foreign).await;
    // A few resources of its own, among them: their PVs are the ones it keeps.
    let local: Vec<String> = (0..5).map(|i| env.pv_name(&format!("local-{i}"))).collect();
    for (i, pv) in local.iter().enumerate() {
        let claim = format!("local-{i}");
        env.create_pv(pv, &claim, None, "ReadWriteMany", "replicated", Default::default())
            .await;
    }
    healthy(&nodes, &local.iter().map(String::as_str).collect::<Vec<_>>(), 0);
    let agent = env.start_agent(&nodes[0], &[]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss = peak_rss_mib(&agent);
    let received = "storageos_drbd_agent_watch_events_total{watch=\"pods\"}";
    let before = agent.metric(received).await;
    // Churn on other nodes: every such pod relabelled, then deleted.
    let others: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(nodes[0].name.as_str()))
        .map(|p| p.name_any())
        .collect();
    stream::iter(&others)
        .for_each_concurrent(CONCURRENCY, |name| {
            let pods = pods.clone();
            async move {
                let relabel = json!({"metadata": {"labels": {"churn": "1"}}});
                pods.patch(name, &PatchParams::default(), &Patch::Merge(relabel))
                    .await
                    .unwrap();
                pods.delete(name, &Default::default()).await.unwrap();
            }
        })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let churn_events = agent.metric(received).await - before;
    agent.stop().await;
    env.cleanup().await;
    vec![
        Figure {
            id: "P6",
            what: format!("agent peak RSS, {own} pods on its node, {foreign} PVs of resources on other nodes"),
            n: sizes.pods + foreign,
            product: rss,
            floor: None,
            unit: "MiB",
            target: "≤ 32 MiB".into(),
            met: rss <= 32.0,
        },
        Figure {
            id: "P7",
            what: format!(
                "pod events the agent received while {} pods elsewhere churned",
                others.len()
            ),
            n: 2 * others.len(),
            product: churn_events,
            floor: Some(0.0),
            unit: "events",
            target: "does not grow with the churn".into(),
            met: churn_events == 0.0,
        },
    ]
}

async fn report(full: bool, figures: &[Figure]) {
    println!(
        "\nshared-volume-controller end to end ({} size, concurrency {CONCURRENCY})",
        if full { "full" } else { "smoke" }
    );
    println!(
        "{:<4} {:>6}  {:>10} {:>10} {:>6}  {:<14} {:<4} what",
        "", "N", "product", "floor", "ratio", "target", "met"
    );
    for f in figures {
        let floor = f.floor.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
        let ratio = match f.floor {
            Some(floor) if floor > 0.0 => format!("{:.2}", f.product / floor),
            _ => "-".into(),
        };
        println!(
            "{:<4} {:>6}  {:>10} {:>10} {:>6}  {:<14} {:<4} {}",
            f.id,
            f.n,
            format!("{:.1} {}", f.product, f.unit),
            floor,
            ratio,
            f.target,
            if f.met { "yes" } else { "NO" },
            f.what
        );
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    let revision = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let client = Client::try_default().await.unwrap();
    let kubernetes = client
        .apiserver_version()
        .await
        .map(|v| v.git_version)
        .unwrap_or_default();
    let json = json!({
        "size": if full { "full" } else { "smoke" },
        "concurrency": CONCURRENCY,
        "revision": revision,
        "machine": {"cores": cores, "memory": memory},
        "versions": {"shared-volume-controller": env!("CARGO_PKG_VERSION"), "kubernetes": kubernetes},
        "figures": figures.iter().map(|f| json!({
            "id": f.id, "what": f.what, "n": f.n, "product": f.product, "floor": f.floor,
            "unit": f.unit, "target": f.target, "met": f.met,
        })).collect::<Vec<_>>(),
    });
    let path = std::env::var("SVC_BENCH_JSON")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target/bench/scale.json").to_owned());
    let path = std::path::PathBuf::from(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).unwrap();
    println!("figures written to {}", path.display());
}

/// CPU seconds (user and system) each process on the machine has used so far, by process name
/// (kube-apiserver, etcd, shared-volume-c…), from /proc.
fn cpu_seconds_by_process() -> BTreeMap<String, f64> {
    let mut seconds = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let stat = entry.path().join("stat");
        let Ok(stat) = std::fs::read_to_string(stat) else {
            continue;
        };
        let (Some((head, rest)), true) = (
            stat.rsplit_once(')'),
            entry.file_name().to_string_lossy().parse::<u32>().is_ok(),
        ) else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, name)| name);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap_or(0.0) + fields[12].parse::<f64>().unwrap_or(0.0);
        *seconds.entry(name.to_owned()).or_insert(0.0) += ticks / 100.0;
    }
    seconds.retain(|_, used| *used > 0.0);
    seconds
}
