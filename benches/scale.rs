//! The product end to end against its floor, on a real control plane: the controller and agents
//! run as processes, and every figure is compared with a bare client on the same crates doing only
//! the necessary writes, measured in the same run. Prints a table and writes every figure to
//! `target/bench/scale.json` (or `$SVC_BENCH_JSON`).
//!
//! `make bench` runs the full sizes; `cargo test` (the test command) runs a smoke size that checks
//! only that every step converges, never a time.

#[path = "scale/agent.rs"]
mod agent;
#[path = "scale/cold.rs"]
mod cold;
#[path = "scale/conntrack.rs"]
mod conntrack;
#[path = "scale/failover.rs"]
mod failover;
#[path = "scale/follow.rs"]
mod follow;
#[path = "scale/kernel.rs"]
mod kernel;
#[path = "scale/mass.rs"]
mod mass;
#[path = "scale/nfs.rs"]
mod nfs;
#[path = "scale/nfs41.rs"]
mod nfs41;
#[path = "scale/planned.rs"]
mod planned;
#[path = "scale/proxy.rs"]
mod proxy;
#[path = "scale/publish.rs"]
mod publish;
#[path = "scale/tenant.rs"]
mod tenant;

use agent::agent_cost;
use cold::cold_start;
use failover::{fail_over, staggered_partitions, stateful_crashes};
use follow::follow_the_primary;
use mass::{Identities, mass_move, product_mass_move_on};
use nfs::nfs_outage;
use publish::publish;

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
    /// Node losses per kernel-client setting (P8 and P8s with the kernel's client).
    kernel_runs: usize,
    /// Runs of P8m per kind of move (worst of them).
    planned_moves: usize,
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
    kernel_runs: 1,
    planned_moves: 1,
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
    kernel_runs: 3,
    planned_moves: 3,
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
        ("SVC_BENCH_KERNEL_RUNS", &mut sizes.kernel_runs),
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
    // alone, which a full run's or a chosen nfs part includes; p8c: P8c alone; p8m: P8m alone, which
    // a full run's or a chosen nfs part includes too; kernel: P8 and P8s with the kernel's client).
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
    if (part("nfs") && (full || !only.is_empty())) || (!only.is_empty() && part("p8m")) {
        figures.extend(planned::planned_moves(sizes.planned_moves).await);
    }
    // The kernel's NFS client: only when chosen (`SVC_BENCH_ONLY=kernel`) or in a full run.
    if (only.is_empty() && full) || (!only.is_empty() && part("kernel")) {
        figures.extend(kernel::kernel_client_outages(sizes.kernel_runs).await);
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
            WriteEndpoints::Auto.resolve_reported(&info)
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

/// Between samples: what a move sets off after the endpoints moved (the controller's follow-up
/// writes, events, the agents' reports) must not land in the next measurement, the product's or
/// the floor's. Moves in a cluster are seconds apart, not milliseconds.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(150)).await;
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
