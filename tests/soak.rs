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

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillController,
    KillAgent,
    RestartApiserver,
    RestartEtcd,
    BreakLink,
    IsolateNode,
    SwitchOver,
    LoseNode,
    EditObject,
    DeleteObject,
    SlowDrbd,
    /// A link drops silently; one end's DRBD notices up to `ping-int` after the other.
    LateDetection,
    /// A volume's IO is suspended on every replica (a LINSTOR snapshot), quorum kept, for longer
    /// than the fail-over timeout.
    SuspendIo,
    /// A primary's node cut off from both others, which notice at once and promote another; its
    /// own DRBD notices one link, then the other, each up to `ping-int` later: until the second it
    /// is still Primary with quorum as far as it knows. Lasts 25-40 s.
    StaggeredPartition,
    /// Every agent's fresh reads of the agents' Leases refused (403) for 5-15 s.
    RefusedReads,
    /// An agent stopped (SIGSTOP) for 5-30 s: its rounds, reports and heartbeat stall.
    StallAgent,
    /// An agent restarted with its node's clock a minute ahead or behind (libfaketime, which
    /// shifts every clock by the same minute: intervals unchanged) for 20-40 s: its heartbeat's
    /// renewal times and its guard reservations are a minute off.
    SkewClock,
    /// Five DRBD resources created on a node one after another, 0.6 s apart, each without quorum
    /// for 0.7 s (less than the fail-over timeout) while it connects: together a few seconds in
    /// which some resource there lacks quorum, each one not long enough to mean anything.
    CreateResources,
    /// The agents restarted one after another, 2-4 s apart, as a DaemonSet's rollout does.
    RollAgents,
    /// A node cut off from the API server alone for 20-40 s: its agent and kubelet silent (the
    /// node goes NotReady), its DRBD links intact; a primary there goes on writing.
    CutFromApi,
}

const FAULTS: [Fault; 20] = [
    Fault::KillController,
    Fault::KillAgent,
    Fault::RestartApiserver,
    Fault::RestartEtcd,
    Fault::BreakLink,
    Fault::IsolateNode,
    Fault::SwitchOver,
    Fault::LoseNode,
    Fault::EditObject,
    Fault::DeleteObject,
    Fault::SlowDrbd,
    Fault::LateDetection,
    Fault::SuspendIo,
    Fault::StaggeredPartition,
    Fault::RefusedReads,
    Fault::StallAgent,
    Fault::SkewClock,
    Fault::CreateResources,
    Fault::RollAgents,
    Fault::CutFromApi,
];

/// The soak's DRBD net options: a silent drop is noticed within `ping-int` 3 s + `ping-timeout`
/// 0.5 s (`timeout` 2.5 s stays below `ping-int`, as DRBD wants).
const PING_INT: Duration = Duration::from_secs(3);

/// The layout the soak plays, drawn from the seed (`SOAK_TOPOLOGY=three-diskful|tie-breaker`
/// chooses): three diskful nodes with an agent each, or the README's, where c is a diskless
/// tie-breaker on a node that runs no agent (the chart's nodeSelector leaving it out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Topology {
    ThreeDiskful,
    TieBreaker,
}

impl Topology {
    fn of(seed: u64) -> Self {
        match std::env::var("SOAK_TOPOLOGY").as_deref() {
            Ok("three-diskful") => Self::ThreeDiskful,
            Ok("tie-breaker") => Self::TieBreaker,
            _ if (seed >> 1) & 1 == 0 => Self::TieBreaker,
            _ => Self::ThreeDiskful,
        }
    }

    fn diskless(self, i: usize) -> bool {
        self == Self::TieBreaker && i == 2
    }

    /// Whether node `i` runs an agent.
    fn agent_on(self, i: usize) -> bool {
        !self.diskless(i)
    }

    /// The node that serves volume `v` first.
    fn first_primary(self, v: usize) -> usize {
        v % if self == Self::TieBreaker { 2 } else { 3 }
    }
}

/// The DRBD world as the soak plays it: which nodes are up, which links carry traffic, the
/// primary of each volume, what each node's DRBD has not noticed yet, and the volumes whose IO is
/// suspended.
#[derive(Clone, Debug)]
struct World {
    topology: Topology,
    up: [bool; 3],
    link: [[bool; 3]; 3],
    primary: Vec<Option<usize>>,
    /// (i, j): until when node i's DRBD still sees its dropped link to j connected.
    unnoticed: HashMap<(usize, usize), Instant>,
    /// Volumes whose IO is suspended by request (`user`) on every replica.
    suspended: Vec<bool>,
    /// Per volume: a former primary cut off from the others that has not noticed all of it yet.
    /// It stays Primary in its own view (with quorum while it sees a peer, suspended without),
    /// until its links come back and it steps down (`on-suspended-primary-outdated
    /// force-secondary`), or its node goes.
    lingering: Vec<Option<usize>>,
    /// DRBD resources of no volume, being created on one node ([`Fault::CreateResources`]).
    scratch: Vec<Scratch>,
    /// Per volume: the nodes DRBD outdated (the primary went on with quorum without them); a node
    /// back in touch with the primary is in sync again at once.
    outdated: Vec<[bool; 3]>,
}

/// A resource created on `node` at `appears`, with quorum once it connects at `connects`.
#[derive(Clone, Debug)]
struct Scratch {
    node: usize,
    name: String,
    appears: Instant,
    connects: Instant,
}

impl World {
    fn new(topology: Topology) -> Self {
        Self {
            topology,
            up: [true; 3],
            link: [[true; 3]; 3],
            primary: (0..VOLUMES).map(|v| Some(topology.first_primary(v))).collect(),
            unnoticed: HashMap::new(),
            suspended: vec![false; VOLUMES],
            lingering: vec![None; VOLUMES],
            scratch: Vec::new(),
            outdated: vec![[false; 3]; VOLUMES],
        }
    }

    /// Whether node i's DRBD sees its link to j connected: it is, or i has not noticed the drop.
    fn seen_connected(&self, i: usize, j: usize) -> bool {
        let late = self.unnoticed.get(&(i, j)).is_some_and(|until| Instant::now() < *until);
        self.connected(i, j) || (late && self.up[i] && self.up[j])
    }

    /// Quorum as node i's DRBD sees it.
    fn seen_quorum(&self, i: usize) -> bool {
        self.up[i] && (0..3).any(|j| j != i && self.seen_connected(i, j))
    }

    fn connected(&self, i: usize, j: usize) -> bool {
        i != j && self.up[i] && self.up[j] && self.link[i][j] && self.link[j][i]
    }

    /// Majority of three: itself and one connected peer.
    fn quorum(&self, i: usize) -> bool {
        self.up[i] && (0..3).any(|j| self.connected(i, j))
    }

    /// drbd-reactor: a primary that lost quorum steps down; a volume without a primary is promoted
    /// on a node with quorum.
    fn react(&mut self) {
        for v in 0..VOLUMES {
            if let Some(p) = self.primary[v].filter(|&p| !self.quorum(p)) {
                // The others no longer count it; it counts itself Primary until it notices.
                let unaware = self.up[p] && (0..3).any(|j| self.unnoticed.contains_key(&(p, j)));
                self.lingering[v] = unaware.then_some(p);
                self.primary[v] = None;
            }
            // Back in touch with a peer (or gone): a lingering primary steps down.
            if self.lingering[v].is_some_and(|p| !self.up[p] || self.quorum(p)) {
                self.lingering[v] = None;
            }
            if self.primary[v].is_none() {
                // DRBD refuses to promote a node it outdated.
                let outdated = self.outdated[v];
                let candidate = |i: usize| self.quorum(i) && !outdated[i] && !self.topology.diskless(i);
                self.primary[v] = (0..3).map(|k| (v + k) % 3).find(|&i| candidate(i));
            }
            self.outdate(v);
        }
    }

    /// DRBD outdates the nodes a primary with quorum goes on without (down ones too); a node
    /// connected to the primary again has its data back.
    fn outdate(&mut self, v: usize) {
        let Some(p) = self.primary[v].filter(|&p| self.quorum(p)) else {
            return;
        };
        for i in (0..3).filter(|&i| i != p && !self.topology.diskless(i)) {
            self.outdated[v][i] = !self.connected(i, p);
        }
    }

    /// One line for the soak's log: nodes up, links down, primaries.
    fn describe(&self) -> String {
        let down: Vec<String> = (0..3)
            .flat_map(|i| (i + 1..3).map(move |j| (i, j)))
            .filter(|&(i, j)| !self.link[i][j])
            .map(|(i, j)| format!("{}-{}", NODES[i], NODES[j]))
            .collect();
        let primaries: Vec<&str> = self.primary.iter().map(|p| p.map_or("-", |p| NODES[p])).collect();
        format!("up {:?}, links down {down:?}, primaries {primaries:?}", self.up)
    }

    fn healthy_primary(&self, v: usize) -> Option<usize> {
        self.primary[v].filter(|&p| self.quorum(p))
    }

    /// Node `i`'s DRBD state of every volume, as `drbdsetup status --json` prints it.
    fn state_of(&self, i: usize, nodes: &[SimNode], pvs: &[String]) -> Vec<serde_json::Value> {
        let now = Instant::now();
        let scratch = self
            .scratch
            .iter()
            .filter(|r| r.node == i && r.appears <= now)
            .map(|r| {
                let connected = now >= r.connects;
                let peers: Vec<(&str, &str, &str)> = (0..3)
                    .filter(|&j| j != i)
                    .map(|j| match connected && self.seen_connected(i, j) {
                        true => (nodes[j].name.as_str(), "Connected", "Secondary"),
                        false => (nodes[j].name.as_str(), "Connecting", "Unknown"),
                    })
                    .collect();
                resource(&r.name, "Secondary", connected && self.seen_quorum(i), &peers)
            });
        let volumes = (0..VOLUMES).map(|v| {
            let peers: Vec<(&str, &str, &str)> = (0..3)
                .filter(|&j| j != i)
                .map(|j| {
                    // A link i has not noticed is down: i sees the peer as it last was.
                    let primary_there = self.primary[v] == Some(j) && self.connected(i, j);
                    let (state, role) = match (self.seen_connected(i, j), primary_there) {
                        (true, true) => ("Connected", "Primary"),
                        (true, false) => ("Connected", "Secondary"),
                        (false, _) => ("Connecting", "Unknown"),
                    };
                    (nodes[j].name.as_str(), state, role)
                })
                .collect();
            let lingers = self.lingering[v] == Some(i);
            let role = if self.primary[v] == Some(i) || lingers {
                "Primary"
            } else {
                "Secondary"
            };
            let mut state = resource(&pvs[v], role, self.seen_quorum(i), &peers);
            let disk = match (self.topology.diskless(i), self.outdated[v][i]) {
                (true, _) => Some("Diskless"),
                (false, true) => Some("Outdated"),
                (false, false) => None,
            };
            for device in state["devices"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .filter(|_| disk.is_some())
            {
                device["disk-state"] = serde_json::json!(disk);
            }
            if self.topology == Topology::TieBreaker && i != 2 {
                state = with_diskless_peer(state, &nodes[2].name);
            }
            if self.suspended[v] {
                suspended(state, "user")
            } else if lingers && !self.seen_quorum(i) {
                suspended(state, "quorum")
            } else {
                state
            }
        });
        volumes.chain(scratch).collect()
    }
}

/// What the watchers judge against: since when each volume has had its healthy primary.
#[derive(Default)]
struct Truth {
    healthy: Vec<Option<(usize, Instant)>>,
    /// Per node: since when it has been down, without a break.
    down_since: [Option<Instant>; 3],
    /// Per node: since when its agent has run without a stop (killed and stalled agents do not).
    agent_since: [Option<Instant>; 3],
    /// Since when the control plane has run without a restart; `None` while one is under way
    /// (nothing can be written then).
    control_plane_since: Option<Instant>,
    /// The agents' reads of their peers' Leases are refused now.
    lease_reads_refused: bool,
    /// Since when they have been allowed again, after the last refusal.
    lease_reads_since: Option<Instant>,
    violations: Vec<String>,
}

impl Truth {
    fn update(&mut self, world: &World) {
        for (i, up) in world.up.iter().enumerate() {
            match (up, self.down_since[i]) {
                (true, _) => self.down_since[i] = None,
                (false, None) => self.down_since[i] = Some(Instant::now()),
                (false, Some(_)) => {}
            }
        }
        self.healthy.resize(VOLUMES, None);
        for v in 0..VOLUMES {
            let now = world.healthy_primary(v);
            if self.healthy[v].map(|(p, _)| p) != now {
                self.healthy[v] = now.map(|p| (p, Instant::now()));
            }
        }
    }

    /// Whether `node` has been the healthy primary of `v` for [`HEALTHY_AFTER`].
    fn long_healthy(&self, v: usize, node: usize) -> bool {
        self.healthy
            .get(v)
            .copied()
            .flatten()
            .is_some_and(|(p, since)| p == node && since.elapsed() >= HEALTHY_AFTER)
    }

    /// The healthy primary of `v`, and since when a slice at it has been owed: it has been the
    /// healthy primary, its agent has run (a stopped agent publishes nothing) and so has the
    /// control plane.
    fn slice_owed_since(&self, v: usize) -> Option<(usize, Instant)> {
        let (primary, healthy) = self.healthy.get(v).copied().flatten()?;
        let since = healthy.max(self.agent_since[primary]?).max(self.control_plane_since?);
        Some((primary, since))
    }

    /// Since when the promise that node `i`'s consumer of volume `v` is gone has been owed: `i`
    /// down, `v` with a healthy primary elsewhere, the agent on that primary's node running (the
    /// others defer to a Primary peer's agent), and the control plane running. `None` while it is
    /// not owed (no quorum anywhere, the agent that could act stopped, or the control plane
    /// restarting).
    fn consumer_move_owed_since(&self, i: usize, v: usize) -> Option<Instant> {
        let down = self.down_since[i]?;
        let (primary, healthy) = self.healthy.get(v).copied().flatten()?;
        let agent = self.agent_since[primary]?;
        let control_plane = self.control_plane_since?;
        (primary != i).then(|| down.max(healthy).max(agent).max(control_plane))
    }

    /// Since when a consumer of `v` on node `i` has been owed a move, once it is late: within
    /// [`POD_MOVE_BOUND`] of when the agents could read their peers' Leases (again), and in any
    /// case within [`POD_MOVE_BOUND_UNREAD`].
    fn consumer_move_late(&self, i: usize, v: usize) -> Option<Instant> {
        let owed = self.consumer_move_owed_since(i, v)?;
        let readable =
            (!self.lease_reads_refused).then(|| self.lease_reads_since.map_or(owed, |since| since.max(owed)));
        let late =
            owed.elapsed() >= POD_MOVE_BOUND_UNREAD || readable.is_some_and(|since| since.elapsed() >= POD_MOVE_BOUND);
        late.then_some(owed)
    }

    fn lease_reads(&mut self, allowed: bool) {
        self.lease_reads_refused = !allowed;
        if allowed {
            self.lease_reads_since = Some(Instant::now());
        }
    }

    fn violation(&mut self, what: String) {
        println!("soak {}: VIOLATION {what}", wall_clock());
        self.violations.push(what);
    }
}

type Shared = Arc<Mutex<Truth>>;

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

/// Something to undo at a time: a process to start again, a link to mend, a node to bring back.
enum Undo {
    StartController(usize),
    StartAgent(usize),
    Mend(usize, usize),
    Reconnect(usize),
    Return(usize),
    Unhang(usize),
    /// A late end's DRBD notices its dropped link.
    Notice(usize, usize),
    /// A volume's suspended IO resumes.
    Resume(usize),
    /// The agents may read Leases again.
    AllowReads,
    /// A stopped agent goes on (SIGCONT).
    Continue(usize),
    /// An agent whose clock was off is restarted on the right time.
    Unskew(usize),
    /// The resources created on a node go again.
    DropScratch(usize),
    /// The rollout starts agent i again, and stops the next one.
    Roll(usize),
    /// A node cut off from the API server reaches it again: its kubelet and agent resume.
    Reattach(usize),
}

impl Undo {
    fn describe(&self) -> String {
        match self {
            Self::StartController(r) => format!("start controller {r}"),
            Self::StartAgent(i) => format!("start agent {}", NODES[*i]),
            Self::Mend(i, j) => format!("mend link {}-{}", NODES[*i], NODES[*j]),
            Self::Reconnect(i) => format!("reconnect {}", NODES[*i]),
            Self::Return(i) => format!("return {}", NODES[*i]),
            Self::Unhang(i) => format!("unhang drbdsetup on {}", NODES[*i]),
            Self::Notice(i, j) => format!("{} notices its link to {} is down", NODES[*i], NODES[*j]),
            Self::Resume(v) => format!("resume IO of volume {v}"),
            Self::AllowReads => "let the agents read Leases again".into(),
            Self::Continue(i) => format!("continue agent {}", NODES[*i]),
            Self::Unskew(i) => format!("set the clock of node {} right", NODES[*i]),
            Self::DropScratch(i) => format!("remove the resources created on {}", NODES[*i]),
            Self::Roll(i) => format!("the rollout starts agent {} again", NODES[*i]),
            Self::Reattach(i) => format!("{} reaches the API server again", NODES[*i]),
        }
    }
}

/// Injects faults until `length` has passed, undoes them all, and waits for convergence: the
/// faults by kind and how long convergence took after the last undo.
async fn play(soak: &mut Soak, rng: &mut Rng, length: Duration) -> (BTreeMap<Fault, usize>, Option<Duration>) {
    let end = Instant::now() + length;
    let mut faults = BTreeMap::new();
    let mut pending: Vec<(Instant, Undo)> = Vec::new();
    let mut restart: Option<tokio::task::JoinHandle<()>> = None;
    let mut last_restart = Instant::now() - Duration::from_secs(60);
    while Instant::now() < end {
        undo_due(soak, &mut pending, false).await;
        harness("keeping the consumers", soak.keep_consumers()).await;
        let fault = FAULTS[rng.below(FAULTS.len())];
        if inject(soak, rng, fault, &mut pending, &mut restart, &mut last_restart).await {
            *faults.entry(fault).or_insert(0) += 1;
            println!("soak {}: {fault:?}; {}", wall_clock(), soak.world.describe());
        }
        tokio::time::sleep(rng.millis(1_000, 3_000)).await;
    }
    undo_due(soak, &mut pending, true).await;
    if let Some(restart) = restart.take() {
        let _ = restart.await;
    }
    let settled = Instant::now();
    while settled.elapsed() < CONVERGE_BOUND {
        harness("keeping the consumers", soak.keep_consumers()).await;
        if harness("checking convergence", converged(soak)).await == Some(true) {
            return (faults, Some(settled.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (faults, None)
}

/// Runs a step of the harness's own (the scheduler, kubelets and attacher it plays, or a check)
/// that may meet an API server in the middle of a restart: a panic there is the harness's, said
/// as such and tried again later, never taken for a violation of the product's promises.
async fn harness<T>(what: &str, step: impl std::future::Future<Output = T>) -> Option<T> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(step).catch_unwind().await {
        Ok(done) => Some(done),
        Err(_) => {
            println!(
                "soak {}: harness: {what} failed (the API server restarting?); trying again",
                wall_clock()
            );
            None
        }
    }
}

async fn undo_due(soak: &mut Soak, pending: &mut Vec<(Instant, Undo)>, all: bool) {
    let now = Instant::now();
    let (due, later): (Vec<_>, Vec<_>) = pending.drain(..).partition(|(at, _)| all || *at <= now);
    *pending = later;
    let mut retry = Vec::new();
    for (_, undo) in due {
        println!("soak {}: undo {}", wall_clock(), undo.describe());
        match undo {
            Undo::StartController(r) => soak.start_controller(r),
            Undo::StartAgent(i) => soak.start_agent(i),
            Undo::Mend(i, j) => {
                soak.world.link[i][j] = true;
                soak.world.link[j][i] = true;
                soak.write_world();
            }
            Undo::Reconnect(i) => {
                for j in 0..3 {
                    soak.world.link[i][j] = true;
                    soak.world.link[j][i] = true;
                }
                soak.write_world();
            }
            Undo::Return(i) => {
                soak.world.up[i] = true;
                soak.write_world();
                soak.nodes[i].kubelet.resume();
                soak.start_agent(i);
            }
            Undo::Unhang(i) => {
                let _ = std::fs::remove_file(soak.nodes[i].dir.join("hang"));
            }
            Undo::Notice(i, j) => {
                soak.world.unnoticed.remove(&(i, j));
                soak.write_world();
            }
            Undo::Resume(v) => {
                soak.world.suspended[v] = false;
                soak.write_world();
            }
            Undo::AllowReads => {
                let allowed = harness(
                    "giving the agents their reads back",
                    soak.env.agents_may_read_leases(true),
                );
                if allowed.await.is_none() {
                    retry.push((Instant::now() + Duration::from_secs(1), Undo::AllowReads));
                } else {
                    soak.truth.lock().unwrap().lease_reads(true);
                }
            }
            Undo::Unskew(i) => {
                soak.clock_offset[i] = 0;
                soak.restart_agent(i).await;
            }
            Undo::DropScratch(i) => {
                soak.world.scratch.retain(|r| r.node != i);
                soak.write_world();
            }
            Undo::Continue(i) => {
                if let Some(agent) = &soak.agents[i] {
                    agent.signal("CONT");
                    soak.agent_runs(i, true);
                }
            }
            Undo::Roll(i) => retry.extend(soak.roll_on(i).await),
            Undo::Reattach(i) => soak.reattach(i),
        }
    }
    pending.extend(retry);
}

/// Injects one fault if it applies now; whether it did.
async fn inject(
    soak: &mut Soak,
    rng: &mut Rng,
    fault: Fault,
    pending: &mut Vec<(Instant, Undo)>,
    restart: &mut Option<tokio::task::JoinHandle<()>>,
    last_restart: &mut Instant,
) -> bool {
    match fault {
        Fault::KillController => {
            let r = rng.below(2);
            let Some(process) = soak.controllers[r].take() else {
                return false;
            };
            process.kill().await;
            pending.push((rng.later(500, 3_000), Undo::StartController(r)));
        }
        Fault::KillAgent => {
            let i = rng.below(3);
            let Some(process) = soak.agents[i].take() else {
                return false;
            };
            process.kill().await;
            soak.agent_runs(i, false);
            pending.push((rng.later(500, 3_000), Undo::StartAgent(i)));
        }
        Fault::RestartApiserver | Fault::RestartEtcd => {
            return restart_control_plane(soak, fault, restart, last_restart);
        }
        Fault::BreakLink => {
            let (i, j) = (rng.below(3), rng.below(3));
            if i == j || !soak.world.link[i][j] {
                return false;
            }
            soak.world.link[i][j] = false;
            soak.world.link[j][i] = false;
            soak.write_world();
            pending.push((rng.later(2_000, 8_000), Undo::Mend(i, j)));
        }
        Fault::IsolateNode => return isolate_node(soak, rng, pending),
        Fault::SwitchOver => {
            let v = rng.below(VOLUMES);
            let to = rng.below(3);
            // DRBD refuses to promote a node it outdated.
            let refused = !soak.world.quorum(to) || soak.world.outdated[v][to] || soak.world.topology.diskless(to);
            if soak.world.primary[v] == Some(to) || refused {
                return false;
            }
            soak.world.primary[v] = Some(to);
            soak.write_world();
        }
        Fault::LoseNode => return lose_node(soak, rng, pending).await,
        Fault::EditObject | Fault::DeleteObject => {
            let what = tamper(soak, rng, fault).await;
            println!("soak {}: {what}", wall_clock());
        }
        Fault::SlowDrbd => {
            let i = rng.below(3);
            std::fs::write(soak.nodes[i].dir.join("hang"), "").unwrap();
            pending.push((rng.later(1_000, 3_000), Undo::Unhang(i)));
        }
        Fault::LateDetection => return drop_link_noticed_late(soak, rng, pending),
        Fault::SuspendIo => return suspend_io(soak, rng, pending),
        Fault::StaggeredPartition => return staggered_partition(soak, rng, pending),
        Fault::RefusedReads => return refuse_lease_reads(soak, rng, pending).await,
        Fault::SkewClock => return skew_clock(soak, rng, pending).await,
        Fault::CreateResources => return create_resources(soak, rng, pending).await,
        Fault::StallAgent => return stall_agent(soak, rng, pending),
        Fault::RollAgents => return roll_agents(soak, pending).await,
        Fault::CutFromApi => return cut_from_api(soak, rng, pending).await,
    }
    true
}

/// Restarts the agents one after another, the first now, unless one is not running.
async fn roll_agents(soak: &mut Soak, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let topology = soak.world.topology;
    let all_running = (0..3)
        .filter(|&i| topology.agent_on(i))
        .all(|i| soak.agents[i].is_some());
    if !all_running || !soak.stop_agent(0).await {
        return false;
    }
    pending.push((Instant::now() + Duration::from_secs(3), Undo::Roll(0)));
    true
}

/// Cuts one running node off from the API server alone, its DRBD left as it is.
async fn cut_from_api(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let i = rng.below(3);
    if !soak.world.up[i] || !soak.stop_agent(i).await {
        return false;
    }
    soak.nodes[i].kubelet.stop();
    pending.push((rng.later(20_000, 40_000), Undo::Reattach(i)));
    true
}

/// Refuses every agent's reads of the agents' Leases for 5-15 s, unless they are refused already.
async fn refuse_lease_reads(soak: &Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    if pending.iter().any(|(_, undo)| matches!(undo, Undo::AllowReads)) {
        return false;
    }
    // Counted as refused from before the change: an agent may see it before the call returns.
    soak.truth.lock().unwrap().lease_reads(false);
    let refused = harness("refusing the agents' reads", soak.env.agents_may_read_leases(false));
    if refused.await.is_none() {
        soak.truth.lock().unwrap().lease_reads(true);
        return false;
    }
    pending.push((rng.later(5_000, 15_000), Undo::AllowReads));
    true
}

/// Restarts one running agent with its wall clock a minute ahead or behind for 20-40 s. Behind
/// only once the control plane's certificates are older than a minute: the agent's TLS would
/// otherwise refuse them as not valid yet.
async fn skew_clock(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let i = rng.below(3);
    if soak.clock_offset[i] != 0 || soak.agents[i].is_none() {
        return false;
    }
    let behind = soak.started.elapsed() > Duration::from_secs(120) && rng.below(2) == 0;
    soak.clock_offset[i] = if behind { -60 } else { 60 };
    soak.restart_agent(i).await;
    pending.push((rng.later(20_000, 40_000), Undo::Unskew(i)));
    true
}

/// Creates five resources on an up node one after another ([`Fault::CreateResources`]), writing
/// the DRBD world as each appears and connects (the harness waits the 3.1 s meanwhile, so that no
/// resource lacks quorum longer than it should), and removes them 5 s after the last connected.
async fn create_resources(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let i = rng.below(3);
    if !soak.world.up[i] || soak.world.scratch.iter().any(|r| r.node == i) {
        return false;
    }
    let start = Instant::now();
    let mut changes = Vec::new();
    for k in 0..5u32 {
        let appears = start + Duration::from_millis(600) * k;
        let connects = appears + Duration::from_millis(700);
        soak.world.scratch.push(Scratch {
            node: i,
            name: format!("scratch-{}-{k}", NODES[i]),
            appears,
            connects,
        });
        changes.extend([appears, connects]);
    }
    changes.sort();
    for change in changes {
        tokio::time::sleep_until(change.into()).await;
        soak.write_world();
    }
    pending.push((Instant::now() + Duration::from_secs(5), Undo::DropScratch(i)));
    true
}

/// Where Debian's faketime package puts libfaketime (hack/tools.sh installs it).
fn libfaketime() -> &'static str {
    const PLACES: [&str; 2] = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    ];
    PLACES
        .into_iter()
        .find(|place| std::path::Path::new(place).exists())
        .expect("libfaketime not found: hack/tools.sh installs Debian's faketime package")
}

/// Stops (SIGSTOP) one running agent for 5-30 s.
fn stall_agent(soak: &Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let i = rng.below(3);
    let stalled = pending
        .iter()
        .any(|(_, undo)| matches!(undo, Undo::Continue(j) if *j == i));
    let Some(agent) = soak.agents[i].as_ref().filter(|_| !stalled) else {
        return false;
    };
    agent.signal("STOP");
    soak.agent_runs(i, false);
    pending.push((rng.later(5_000, 30_000), Undo::Continue(i)));
    true
}

/// Cuts a primary's node off from both others, which notice at once; the node itself notices
/// one link up to `ping-int` later and the other later still, Primary meanwhile in its own view.
fn staggered_partition(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let whole = soak.world.up.iter().all(|u| *u) && soak.world.link.iter().flatten().all(|l| *l);
    let Some(i) = soak.world.primary[rng.below(VOLUMES)].filter(|_| whole) else {
        return false;
    };
    let ping = PING_INT.as_millis() as u64;
    let first = Instant::now() + rng.millis(300, ping);
    let second = first + rng.millis(300, ping);
    let (j, k) = ((i + 1) % 3, (i + 2) % 3);
    let (j, k) = if rng.below(2) == 0 { (j, k) } else { (k, j) };
    for (peer, notices) in [(j, first), (k, second)] {
        soak.world.unnoticed.insert((i, peer), notices);
        pending.push((notices, Undo::Notice(i, peer)));
    }
    for j in 0..3 {
        soak.world.link[i][j] = false;
        soak.world.link[j][i] = false;
    }
    soak.write_world();
    // Longer than the slice watcher's bound: a hold that never lets go is caught while it lasts.
    pending.push((rng.later(25_000, 40_000), Undo::Reconnect(i)));
    true
}

/// Restarts the API server or etcd, at most one at a time and 30 s apart, in the background.
fn restart_control_plane(
    soak: &Soak,
    fault: Fault,
    restart: &mut Option<tokio::task::JoinHandle<()>>,
    last_restart: &mut Instant,
) -> bool {
    let busy = restart.as_ref().is_some_and(|r| !r.is_finished());
    if busy || last_restart.elapsed() < Duration::from_secs(30) {
        return false;
    }
    let component = if fault == Fault::RestartApiserver {
        "kube-apiserver"
    } else {
        "etcd"
    };
    let dir = soak.cluster.dir.clone();
    let truth = soak.truth.clone();
    truth.lock().unwrap().control_plane_since = None;
    *restart = Some(tokio::task::spawn_blocking(move || {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/hack/cluster.sh");
        let _ = std::process::Command::new(script)
            .args(["restart", component])
            .arg(dir)
            .status();
        truth.lock().unwrap().control_plane_since = Some(Instant::now());
    }));
    *last_restart = Instant::now();
    true
}

/// Cuts one node off from both others while everything else is whole.
fn isolate_node(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let i = rng.below(3);
    if !soak.world.up.iter().all(|u| *u) || soak.world.link.iter().flatten().any(|l| !l) {
        return false;
    }
    for j in 0..3 {
        soak.world.link[i][j] = false;
        soak.world.link[j][i] = false;
    }
    soak.write_world();
    pending.push((rng.later(3_000, 8_000), Undo::Reconnect(i)));
    true
}

/// A node gone: its agent killed, its kubelet silent, its links down, back some seconds later.
async fn lose_node(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let i = rng.below(3);
    if !soak.world.up.iter().all(|u| *u) {
        return false;
    }
    if let Some(process) = soak.agents[i].take() {
        process.kill().await;
    }
    soak.agent_runs(i, false);
    pending.retain(|(_, undo)| !matches!(undo, Undo::StartAgent(j) | Undo::Reattach(j) if *j == i));
    soak.world.up[i] = false;
    soak.nodes[i].kubelet.stop();
    soak.write_world();
    pending.push((rng.later(5_000, 20_000), Undo::Return(i)));
    true
}

/// A hand edit of one volume's EndpointSlice, or its Service or slice deleted; what was done.
async fn tamper(soak: &Soak, rng: &mut Rng, fault: Fault) -> String {
    let v = rng.below(VOLUMES);
    let name = &soak.pvs[v];
    if fault == Fault::EditObject {
        let elsewhere = json!({"endpoints": [{"addresses": ["192.0.2.250"], "conditions": {"ready": true}}]});
        let edited = soak
            .env
            .api::<EndpointSlice>()
            .patch(name, &PatchParams::default(), &Patch::Merge(elsewhere))
            .await;
        let version = edited.map(|slice| slice.resource_version().unwrap_or_default());
        return format!("volume {v}'s EndpointSlice pointed at 192.0.2.250: {version:?}");
    }
    let params = DeleteParams::default();
    let (kind, deleted) = match rng.below(2) {
        0 => (
            "Service",
            soak.env.api::<Service>().delete(name, &params).await.map(|_| ()),
        ),
        _ => (
            "EndpointSlice",
            soak.env.api::<EndpointSlice>().delete(name, &params).await.map(|_| ()),
        ),
    };
    format!(
        "volume {v}'s {kind} deleted: {:?}",
        deleted.map_err(|err| err.to_string())
    )
}

/// A link drops silently; one end's DRBD notices at once, the other up to `ping-int` later.
fn drop_link_noticed_late(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let (i, j) = (rng.below(3), rng.below(3));
    if i == j || !soak.world.connected(i, j) {
        return false;
    }
    let (late, early) = if rng.below(2) == 0 { (i, j) } else { (j, i) };
    let notices = Instant::now() + rng.millis(300, PING_INT.as_millis() as u64);
    soak.world.unnoticed.insert((late, early), notices);
    soak.world.link[i][j] = false;
    soak.world.link[j][i] = false;
    soak.write_world();
    pending.push((notices, Undo::Notice(late, early)));
    pending.push((Instant::now() + rng.millis(5_000, 10_000), Undo::Mend(i, j)));
    true
}

/// A volume's IO suspended on every replica, quorum kept, for longer than the fail-over timeout.
fn suspend_io(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let v = rng.below(VOLUMES);
    if soak.world.suspended[v] {
        return false;
    }
    soak.world.suspended[v] = true;
    soak.write_world();
    pending.push((Instant::now() + rng.millis(2_000, 6_000), Undo::Resume(v)));
    true
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

/// The watchers: taints, evictions and detachments of healthy primaries, slices away from them,
/// ClusterIPs that change.
fn watch(soak: &Soak) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        watch_taints(soak),
        watch_pod_removals(soak),
        watch_attachment_deletions(soak),
        watch_forced_demotions(soak),
        watch_cluster_ips(soak),
        watch_slices(soak),
        watch_consumers_of_lost_nodes(soak),
    ]
}

/// A consumer still on a node that has been down for longer than [`POD_MOVE_BOUND`]: a lost
/// node's pods must go (and come back elsewhere) while the loss lasts.
fn watch_consumers_of_lost_nodes(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let names: Vec<String> = soak.nodes.iter().map(|n| n.name.clone()).collect();
    let truth = soak.truth.clone();
    let pods: Api<Pod> = soak.env.api();
    tokio::spawn(async move {
        let mut reported: HashMap<String, Instant> = HashMap::new();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let down = truth.lock().unwrap().down_since;
            for i in (0..3).filter(|&i| down[i].is_some()) {
                let on_node = ListParams::default().fields(&format!("spec.nodeName={}", names[i]));
                let Ok(list) = pods.list(&on_node).await else { continue };
                for pod in list.items {
                    let name = pod.name_any();
                    let Some(v) = volume_of(&name, "app-") else { continue };
                    let Some(since) = truth.lock().unwrap().consumer_move_late(i, v) else {
                        continue;
                    };
                    if reported.get(&name) == Some(&since) {
                        continue;
                    }
                    reported.insert(name.clone(), since);
                    let what = format!(
                        "pod {name} still on node {}, {:?} after it was down, volume {v} had a healthy primary elsewhere and an agent there ran",
                        NODES[i],
                        since.elapsed()
                    );
                    truth.lock().unwrap().violation(what);
                }
            }
        }
    })
}

/// The volume a name of the soak's (`<prefix><v>`) is of.
fn volume_of(name: &str, prefix: &str) -> Option<usize> {
    name.strip_prefix(prefix).and_then(|v| v.parse::<usize>().ok())
}

/// A lost-quorum taint (a peer's fail-over or the node's own) put on a healthy primary's node.
fn watch_taints(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let names: Vec<String> = soak.nodes.iter().map(|n| n.name.clone()).collect();
    let client = soak.env.client.clone();
    let (truth, nodes) = (soak.truth.clone(), names);
    let selector = format!("{NODE_LABEL}={}", soak.env.id);
    let node_api: Api<Node> = Api::all(client.clone());
    tokio::spawn(async move {
        let mut tainted: HashMap<String, bool> = HashMap::new();
        let config = watcher::Config::default().labels(&selector);
        let mut events = watcher(node_api, config).default_backoff().applied_objects().boxed();
        while let Some(event) = events.next().await {
            let Ok(node) = event else { continue };
            let name = node.name_any();
            let now = node
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == "drbd.linbit.com/lost-quorum");
            let before = tainted.insert(name.clone(), now).unwrap_or(false);
            let Some(i) = nodes.iter().position(|n| *n == name) else {
                continue;
            };
            if now && !before {
                let mut truth = truth.lock().unwrap();
                if let Some(v) = (0..VOLUMES).find(|&v| truth.long_healthy(v, i)) {
                    truth.violation(format!("node {name} tainted while the healthy primary of volume {v}"));
                }
            }
        }
    })
}

/// A consumer evicted or deleted on its volume's healthy primary.
fn watch_pod_removals(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let names: Vec<String> = soak.nodes.iter().map(|n| n.name.clone()).collect();
    let (truth, nodes) = (soak.truth.clone(), names);
    let pods: Api<Pod> = soak.env.api();
    tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = events.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(pod)) if pod.metadata.deletion_timestamp.is_some() => pod,
                Ok(watcher::Event::Delete(pod)) => pod,
                _ => continue,
            };
            let (Some(v), Some(node)) = (
                volume_of(&pod.name_any(), "app-"),
                pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            ) else {
                continue;
            };
            let Some(i) = nodes.iter().position(|n| *n == node) else {
                continue;
            };
            let mut truth = truth.lock().unwrap();
            if truth.long_healthy(v, i) {
                truth.violation(format!(
                    "pod {} removed from node {node}, the healthy primary of volume {v}",
                    pod.name_any()
                ));
            }
        }
    })
}

/// An attachment deleted on its volume's healthy primary.
fn watch_attachment_deletions(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let names: Vec<String> = soak.nodes.iter().map(|n| n.name.clone()).collect();
    let client = soak.env.client.clone();
    let (truth, nodes, id) = (soak.truth.clone(), names, soak.env.id.clone());
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    tokio::spawn(async move {
        let prefix = format!("{id}-att-");
        let mut events = watcher(attachments, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(watcher::Event::Delete(attachment)) = event else {
                continue;
            };
            let Some(v) = volume_of(&attachment.name_any(), &prefix) else {
                continue;
            };
            let Some(i) = nodes.iter().position(|n| *n == attachment.spec.node_name) else {
                continue;
            };
            let mut truth = truth.lock().unwrap();
            if truth.long_healthy(v, i) {
                truth.violation(format!(
                    "attachment {} deleted on the healthy primary of volume {v}",
                    attachment.name_any()
                ));
            }
        }
    })
}

/// A ClusterIP that changes.
fn watch_cluster_ips(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let truth = soak.truth.clone();
    let services: Api<Service> = soak.env.api();
    tokio::spawn(async move {
        let mut first: HashMap<String, String> = HashMap::new();
        let mut events = watcher(services, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(service) = event else { continue };
            let Some(ip) = service.spec.and_then(|s| s.cluster_ip) else {
                continue;
            };
            let known = first
                .entry(service.metadata.name.clone().unwrap_or_default())
                .or_insert(ip.clone());
            if *known != ip {
                let what = format!(
                    "Service {:?} moved from ClusterIP {known} to {ip}",
                    service.metadata.name
                );
                truth.lock().unwrap().violation(what);
                *known = ip;
            }
        }
    })
}

/// A slice away from a primary that has been healthy for longer than the bound.
fn watch_slices(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let ips: Vec<String> = soak.nodes.iter().map(|n| n.ip.clone()).collect();
    let client = soak.env.client.clone();
    let (truth, pvs) = (soak.truth.clone(), soak.pvs.clone());
    let env = soak.env.view(client.clone());
    tokio::spawn(async move {
        let mut reported: HashMap<usize, Instant> = HashMap::new();
        // Per volume: since when its slice has been seen away from the healthy primary, without
        // a look that found it right. The bound runs from then too: a hand edit just made is
        // owed its repair from the edit, not from when the primary became healthy.
        let mut wrong_since: HashMap<usize, Instant> = HashMap::new();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            for (v, pv) in pvs.iter().enumerate() {
                let owed = truth.lock().unwrap().slice_owed_since(v);
                let Some((p, owed)) = owed else {
                    wrong_since.remove(&v);
                    continue;
                };
                let Ok(Some(slice)) = env.api::<EndpointSlice>().get_opt(pv).await else {
                    continue;
                };
                let at: Vec<String> = slice.endpoints.iter().flat_map(|e| e.addresses.clone()).collect();
                if at == [ips[p].clone()] {
                    wrong_since.remove(&v);
                    continue;
                }
                let since = owed.max(*wrong_since.entry(v).or_insert_with(Instant::now));
                if since.elapsed() >= SLICE_BOUND && reported.get(&v) != Some(&since) {
                    reported.insert(v, since);
                    let what = format!(
                        "volume {v}'s slice at {at:?}, not at its healthy primary {} for over {SLICE_BOUND:?} while its agent ran",
                        ips[p]
                    );
                    truth.lock().unwrap().violation(what);
                }
            }
        }
    })
}

/// A healthy primary forced to Secondary (its IO suspended for a snapshot is no reason), from the
/// `drbdsetup` calls each simulated node records.
fn watch_forced_demotions(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let (truth, pvs) = (soak.truth.clone(), soak.pvs.clone());
    let dirs: Vec<std::path::PathBuf> = soak.nodes.iter().map(|n| n.dir.clone()).collect();
    tokio::spawn(async move {
        let mut seen = vec![0; dirs.len()];
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            for (i, dir) in dirs.iter().enumerate() {
                let calls = std::fs::read_to_string(dir.join("calls")).unwrap_or_default();
                let forced: Vec<&str> = calls.lines().filter(|l| l.starts_with("secondary --force")).collect();
                for call in &forced[seen[i].min(forced.len())..] {
                    let Some(v) = pvs.iter().position(|pv| call.ends_with(pv.as_str())) else {
                        continue;
                    };
                    let mut truth = truth.lock().unwrap();
                    if truth.long_healthy(v, i) {
                        truth.violation(format!(
                            "node {}, the healthy primary of volume {v}, forced to Secondary",
                            NODES[i]
                        ));
                    }
                }
                seen[i] = forced.len();
            }
        }
    })
}

/// Wall-clock time as the processes' logs print it.
fn wall_clock() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}
