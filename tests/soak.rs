//! The seeded fault soak (`make soak`; a short run in `make test`). Two leader-elected controller
//! replicas and an agent per node, with the chart's permissions, over simulated DRBD nodes and
//! shared volumes on a control plane of the soak's own. The soak plays DRBD (roles, majority
//! quorum, drbd-reactor's promotion, force-secondary on reconnect, the outdating of a node the
//! primary goes on without), the scheduler, the kubelets and the attacher, over one of two layouts
//! drawn from the seed (three diskful nodes, or the README's with a diskless tie-breaker that runs
//! no agent), and injects faults in an order drawn from `SOAK_SEED`: controller and agent
//! `kill -9`, kube-apiserver and etcd restarts, broken links, isolated nodes, switch-overs, node
//! losses and returns, hand edits and deletions of the managed objects, a hanging `drbdsetup`, a
//! partition whose sides notice it at different times, refused Lease reads, a stalled agent, a
//! node's clock a minute off (libfaketime), resources created one after another, an agent
//! rollout, a node cut off from the API server alone.
//! Watchers check both kinds of promise all the time, what must never happen (a healthy primary
//! tainted, evicted, detached or demoted; a ClusterIP that changes) and what must happen by when
//! while a fault lasts (a slice at the healthy primary within 20 s of its agent running, a lost node's consumers gone
//! within 17 s, 24 s while Lease reads are refused); the last line says what happened:
//! `soak: <faults> faults (<by kind>), <violations> violations, converged in <s> s, seed <seed>`.
//! Without `SOAK_SECONDS` the test does nothing but say so.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::PrivateCluster;
use common::controller::ControllerArgs;
use common::drbd::{NODE_LABEL, SimNode, resource, slice_addresses, suspended, with_diskless_peer};
use common::process::Process;
use common::{MOUNT_ENDPOINT, SERVICE_ENDPOINT, TestEnv, serving};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Endpoints, Node, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

#[path = "soak/faults.rs"]
mod faults;
#[path = "soak/watchers.rs"]
mod watchers;
#[path = "soak/world.rs"]
mod world;

use faults::*;
use watchers::*;
use world::*;

const NODES: [&str; 3] = ["a", "b", "c"];
const VOLUMES: usize = 6;
/// A primary with quorum this long is healthy: nothing of it may be tainted, evicted or detached.
const HEALTHY_AFTER: Duration = Duration::from_secs(3);
/// How long a slice may point away from a healthy primary: the promise that every hold lets go.
const SLICE_BOUND: Duration = Duration::from_secs(20);
/// How long a consumer may stay on a node that is down. The NFS server's node: evicted after
/// DRBD's detection window (3.5 s here), a report interval (2 s) and the fail-over timeout (1 s),
/// force-deleted once its kubelet has stopped renewing too (13 s after its last renewal: a 10 s
/// renewal of its 40 s node Lease and 3 s of slack). Its NFS clients, whose node may only have
/// lost its storage links: Kubernetes's NotReady (8 s here) and the agents' wait for peers to
/// restate after an outage (3 s). With a margin.
const POD_MOVE_BOUND: Duration = Duration::from_secs(17);
/// The same while the agents' reads of their peers' Leases are refused: the peers are unknown, not
/// silent, and only Kubernetes's NotReady (8 s here), seen by an agent for its gate
/// (`--fail-over-timeout` 1 s + `--reconcile-interval` 2 s + 10 s), lets the fail-over go. With a
/// margin.
const POD_MOVE_BOUND_UNREAD: Duration = Duration::from_secs(24);
/// How long after the last fault everything must be in line.
const CONVERGE_BOUND: Duration = Duration::from_secs(90);
const LEASE: &str = "svc-leader";

/// xorshift64*: the fault sequence replays from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A moment between `from` and `to` milliseconds from now.
    fn later(&mut self, from: u64, to: u64) -> Instant {
        Instant::now() + self.millis(from, to)
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.next() % (to - from))
    }
}

struct Soak {
    cluster: PrivateCluster,
    env: TestEnv,
    nodes: Vec<SimNode>,
    pvs: Vec<String>,
    world: World,
    truth: Shared,
    controllers: Vec<Option<Process>>,
    agents: Vec<Option<Process>>,
    controller_kubeconfig: String,
    agent_kubeconfig: String,
    /// Per node: how far its agent's wall clock is off, in seconds ([`Fault::SkewClock`]).
    clock_offset: [i64; 3],
    started: Instant,
}

impl Soak {
    fn write_world(&mut self) {
        self.world.react();
        for i in (0..3).filter(|&i| self.world.up[i]) {
            self.nodes[i].set(&self.world.state_of(i, &self.nodes, &self.pvs));
        }
        self.truth.lock().unwrap().update(&self.world);
    }

    fn start_controller(&mut self, r: usize) {
        let identity = ["x", "y"][r];
        let args = ControllerArgs::replica(&self.env.ns, identity, LEASE, 4, 2);
        let name = format!("{}-controller-{identity}", self.env.ns);
        let kubeconfig = [("KUBECONFIG", self.controller_kubeconfig.as_str())];
        self.controllers[r] = Some(Process::start_with_env(&name, &args.as_strs(), &kubeconfig));
    }

    /// Starts node `i`'s agent, not waiting for it: the API server may be restarting, or its
    /// `drbdsetup` hanging, and the soak goes on meanwhile.
    fn start_agent(&mut self, i: usize) {
        if !self.world.topology.agent_on(i) {
            return;
        }
        let offset = format!("{:+}", self.clock_offset[i]);
        let mut env = vec![("KUBECONFIG", self.agent_kubeconfig.as_str())];
        if self.clock_offset[i] != 0 {
            // Every clock of the agent and its children shifted by the same minute: its wall
            // clock is a minute off, its intervals (Instant, sleeps) are as they were. libfaketime
            // 0.9.10 fails every sleep of a child with EINVAL when the monotonic clock is left
            // alone (DONT_FAKE_MONOTONIC), and the fake events2 then outlives a killed agent.
            env.extend([("LD_PRELOAD", libfaketime()), ("FAKETIME", offset.as_str())]);
        }
        let agent = self.env.spawn_agent_with_env(&self.nodes[i], &[], &env);
        self.agents[i] = Some(agent);
        self.agent_runs(i, true);
    }

    /// Kills node `i`'s agent, if it runs, and starts it again (with the clock it is to have).
    async fn restart_agent(&mut self, i: usize) {
        if let Some(agent) = self.agents[i].take() {
            agent.kill().await;
        }
        self.agent_runs(i, false);
        self.start_agent(i);
    }

    /// The rollout at node `i`: its agent starts again, and the next agent node's stops (the
    /// rollout's next step, when there is one).
    async fn roll_on(&mut self, i: usize) -> Option<(Instant, Undo)> {
        self.start_agent(i);
        let next = (i + 1..3).find(|&j| self.world.topology.agent_on(j))?;
        let stopped = self.stop_agent(next).await;
        stopped.then(|| (Instant::now() + Duration::from_secs(3), Undo::Roll(next)))
    }

    /// Node `i` reaches the API server again: its kubelet renews, its agent starts.
    fn reattach(&mut self, i: usize) {
        self.nodes[i].kubelet.resume();
        if self.agents[i].is_none() {
            self.start_agent(i);
        }
    }

    /// Kills node `i`'s agent, if it runs: whether it did.
    async fn stop_agent(&mut self, i: usize) -> bool {
        let Some(agent) = self.agents[i].take() else {
            return false;
        };
        agent.kill().await;
        self.agent_runs(i, false);
        true
    }

    /// Tells the watchers whether node `i`'s agent runs from now on.
    fn agent_runs(&self, i: usize, runs: bool) {
        self.truth.lock().unwrap().agent_since[i] = runs.then(Instant::now);
    }

    /// The scheduler, the kubelets and the attacher: each volume has a Running consumer and an
    /// attachment; what the agents took away comes back on the volume's primary.
    async fn keep_consumers(&self) {
        let pods: Api<Pod> = self.env.api();
        let attachments: Api<VolumeAttachment> = Api::all(self.env.client.clone());
        for v in 0..VOLUMES {
            let Some(p) = self.world.primary[v].filter(|&p| self.world.up[p]) else {
                continue;
            };
            let node = &self.nodes[p].name;
            let pod = format!("app-{v}");
            if let Ok(None) = pods.get_opt(&pod).await {
                let volume = json!({"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{v}")}});
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    self.env.running_pod_with(&pod, node, volume, json!({}), json!({})),
                )
                .await;
            }
            let attachment = format!("{}-att-{v}", self.env.id);
            if let Ok(None) = attachments.get_opt(&attachment).await {
                let object: VolumeAttachment = serde_json::from_value(json!({
                    "metadata": {"name": attachment},
                    "spec": {"attacher": "linstor.csi.linbit.com", "nodeName": node,
                             "source": {"persistentVolumeName": self.pvs[v]}},
                }))
                .unwrap();
                let _ = attachments.create(&Default::default(), &object).await;
            }
        }
    }
}

#[tokio::test]
#[ignore = "needs the tools of `make test`; runs with SOAK_SECONDS set (make soak)"]
async fn soak() {
    let Some(seconds) = std::env::var("SOAK_SECONDS").ok().and_then(|s| s.parse::<u64>().ok()) else {
        println!("soak: SOAK_SECONDS not set, nothing run (make soak)");
        return;
    };
    let seed = seed();
    println!("soak: seed {seed}, {seconds} s (replay with SOAK_SEED={seed})");
    let mut rng = Rng(seed);
    let topology = Topology::of(seed);
    println!("soak: {topology:?}");
    let mut soak = Soak::set_up(topology).await;
    let watchers = watch(&soak);
    let (faults, converged) = play(&mut soak, &mut rng, Duration::from_secs(seconds)).await;
    // Taking the claims down is no fault: the watchers stop first.
    for watcher in watchers {
        watcher.abort();
    }
    collect(&soak).await;
    let violations = soak.truth.lock().unwrap().violations.clone();
    let total: usize = faults.values().sum();
    let by_kind: Vec<String> = FAULTS
        .iter()
        .map(|f| format!("{f:?} {}", faults.get(f).unwrap_or(&0)))
        .collect();
    let converged = converged.map_or("never".to_string(), |c| format!("{:.1}", c.as_secs_f64()));
    for process in soak.controllers.iter_mut().chain(soak.agents.iter_mut()) {
        if let Some(process) = process.take() {
            process.kill().await;
        }
    }
    soak.env.remove_chart_permissions(&soak.cluster.kubeconfig());
    let left = left_behind(&soak.env.id).await;
    println!(
        "soak: {total} faults ({}), {} violations, converged in {converged} s, seed {seed}, {topology:?}",
        by_kind.join(", "),
        violations.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert_ne!(
        converged, "never",
        "not converged within {CONVERGE_BOUND:?} of the last fault"
    );
    assert!(left.is_empty(), "processes of the soak's nodes outlived it: {left:?}");
}

/// `SOAK_SEED`, or one drawn from the clock; odd, as the generator needs.
fn seed() -> u64 {
    std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
        | 1
}

impl Soak {
    /// A control plane of its own, three simulated nodes, the volumes and their consumers, two
    /// controller replicas and three agents, all ready.
    async fn set_up(topology: Topology) -> Soak {
        // A lost node is given back after 5-20 s: Kubernetes must decide within that for the soak to
        // see NotReady nodes at all, so its grace period is 8 s here, as in `make test`, not 50 s.
        let cluster = PrivateCluster::up_with(
            "soak",
            &[
                ("SVC_NODE_MONITOR_GRACE_PERIOD", "8s"),
                ("SVC_NODE_MONITOR_PERIOD", "1s"),
            ],
        );
        let env = common::setup_on(cluster.config().await, "soak").await;
        let nodes = env.sim_nodes(&NODES).await;
        for node in &nodes {
            node.set_net_options(json!({"ping-int": PING_INT.as_secs().to_string(), "timeout": "25"}));
        }
        let mut pvs = Vec::new();
        for v in 0..VOLUMES {
            let (_, pv) = env
                .bound_rwx_claim(
                    &format!("data-{v}"),
                    serving(&nodes[topology.first_primary(v)].endpoint()),
                )
                .await;
            pvs.push(pv.metadata.name.unwrap());
        }
        let lease = format!("controller.flags.lease-name={LEASE}");
        let controller_kubeconfig = env.chart_kubeconfig(&cluster.kubeconfig(), "controller", &[&lease]);
        let agent_kubeconfig = env.chart_kubeconfig(&cluster.kubeconfig(), "agent", &[&lease]);
        let mut soak = Soak {
            cluster,
            env,
            nodes,
            pvs,
            world: World::new(topology),
            truth: Shared::default(),
            controllers: vec![None, None],
            agents: vec![None, None, None],
            controller_kubeconfig,
            agent_kubeconfig,
            clock_offset: [0; 3],
            started: Instant::now(),
        };
        soak.truth.lock().unwrap().control_plane_since = Some(Instant::now());
        soak.write_world();
        soak.keep_consumers().await;
        for r in 0..2 {
            soak.start_controller(r);
        }
        for i in 0..3 {
            soak.start_agent(i);
        }
        for process in soak.agents.iter().chain(&soak.controllers).flatten() {
            process.wait_ready().await;
        }
        soak
    }
}

/// The processes still running that belong to the nodes of test `id` (the agents' `drbdsetup
/// events2`, whose agent a crash fault killed), once they have had a moment to notice.
async fn left_behind(id: &str) -> Vec<String> {
    let node_dirs = format!("svc-e2e-drbd-{id}-");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut left = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&node_dirs) {
            left.push(cmdline.trim().to_owned());
        }
    }
    left
}

/// Every slice at its volume's primary, and every volume published at its Service's ClusterIP.
async fn converged(soak: &Soak) -> bool {
    for v in 0..VOLUMES {
        let Some(p) = soak.world.primary[v] else { return false };
        if slice_addresses(&soak.env, &soak.pvs[v]).await != [soak.nodes[p].ip.clone()] {
            return false;
        }
        let Ok(Some(service)) = soak.env.api::<Service>().get_opt(&soak.pvs[v]).await else {
            return false;
        };
        let ip = service.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
        let published = soak.env.pv_annotation(&soak.pvs[v], MOUNT_ENDPOINT).await;
        let served = soak.env.pv_annotation(&soak.pvs[v], SERVICE_ENDPOINT).await;
        if published != Some(format!("{ip}:2049")) || served != Some(soak.nodes[p].endpoint()) {
            return false;
        }
    }
    true
}

/// The claims deleted, their managed objects must go with them.
async fn collect(soak: &Soak) {
    // No kubelet finishes a pod: they go at once, so that the claims' protection lets go.
    let pods: Api<Pod> = soak.env.api();
    let _ = pods
        .delete_collection(&DeleteParams::default().grace_period(0), &ListParams::default())
        .await;
    let claims: Api<PersistentVolumeClaim> = soak.env.api();
    let _ = claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = soak.env.names::<Service>().await.len()
            + soak.env.names::<Endpoints>().await.len()
            + soak.env.names::<EndpointSlice>().await.len();
        if left == 0 {
            return;
        }
        if Instant::now() >= deadline {
            let what = format!("{left} Services, Endpoints or EndpointSlices outlived their claims by 60 s");
            soak.truth.lock().unwrap().violation(what);
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Wall-clock time as the processes' logs print it.
fn wall_clock() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}
