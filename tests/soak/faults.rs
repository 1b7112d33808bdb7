//! The faults the soak injects, and how each is undone.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
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

pub const FAULTS: [Fault; 20] = [
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

/// Something to undo at a time: a process to start again, a link to mend, a node to bring back.
pub enum Undo {
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
    pub fn describe(&self) -> String {
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
pub async fn play(soak: &mut Soak, rng: &mut Rng, length: Duration) -> (BTreeMap<Fault, usize>, Option<Duration>) {
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
pub async fn harness<T>(what: &str, step: impl std::future::Future<Output = T>) -> Option<T> {
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

pub async fn undo_due(soak: &mut Soak, pending: &mut Vec<(Instant, Undo)>, all: bool) {
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
pub async fn inject(
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
pub async fn roll_agents(soak: &mut Soak, pending: &mut Vec<(Instant, Undo)>) -> bool {
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
pub async fn cut_from_api(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let i = rng.below(3);
    if !soak.world.up[i] || !soak.stop_agent(i).await {
        return false;
    }
    soak.nodes[i].kubelet.stop();
    pending.push((rng.later(20_000, 40_000), Undo::Reattach(i)));
    true
}

/// Refuses every agent's reads of the agents' Leases for 5-15 s, unless they are refused already.
pub async fn refuse_lease_reads(soak: &Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
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
pub async fn skew_clock(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
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
pub async fn create_resources(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
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
pub fn libfaketime() -> &'static str {
    pub const PLACES: [&str; 2] = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    ];
    PLACES
        .into_iter()
        .find(|place| std::path::Path::new(place).exists())
        .expect("libfaketime not found: hack/tools.sh installs Debian's faketime package")
}

/// Stops (SIGSTOP) one running agent for 5-30 s.
pub fn stall_agent(soak: &Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
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
pub fn staggered_partition(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
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
pub fn restart_control_plane(
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
pub fn isolate_node(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
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
pub async fn lose_node(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
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
pub async fn tamper(soak: &Soak, rng: &mut Rng, fault: Fault) -> String {
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
pub fn drop_link_noticed_late(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
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
pub fn suspend_io(soak: &mut Soak, rng: &mut Rng, pending: &mut Vec<(Instant, Undo)>) -> bool {
    let v = rng.below(VOLUMES);
    if soak.world.suspended[v] {
        return false;
    }
    soak.world.suspended[v] = true;
    soak.write_world();
    pending.push((Instant::now() + rng.millis(2_000, 6_000), Undo::Resume(v)));
    true
}
