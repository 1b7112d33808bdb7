//! An NFS client through a fail-over, on the real data path ([`super::datapath`]): the client
//! writes through the claim's ClusterIP, the primary's node is lost, the agents fail it over, the
//! new primary starts its NFS server and publishes itself, and the client, which never changes the
//! address it uses, carries on. Measures what the client saw.

use std::future::ready;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::datapath::{DataPath, NfsGrace, fenced_packets, nfs_read, nfs_write};
use super::drbd::{LOST_QUORUM, healthy, lost, no_labels, slice_addresses};
use super::{MOUNT_ENDPOINT, TestEnv, serving};

const WAIT: Duration = Duration::from_secs(60);
/// The client's pace, and its bounds (the network rule: client loops are bounded).
const CLIENT_PERIOD: Duration = Duration::from_millis(100);
const CLIENT_MAX_OPERATIONS: usize = 1_000;
const CLIENT_MAX_TIME: Duration = Duration::from_secs(120);

/// One client operation: when it started and ended, and whether it worked.
#[derive(Clone, Copy)]
struct Operation {
    started: Instant,
    ended: Instant,
    ok: bool,
    tick: usize,
}

/// A client writing `tick-<n>` files through `server` every [`CLIENT_PERIOD`] until stopped.
struct Client {
    stop: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<Operation>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Client {
    fn start(server: String, scratch: std::path::PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, log) = (stop.clone(), log.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                for tick in 0..CLIENT_MAX_OPERATIONS {
                    if stop.load(Ordering::Relaxed) || started.elapsed() > CLIENT_MAX_TIME {
                        break;
                    }
                    let started = Instant::now();
                    let ok = nfs_write(&server, &format!("tick-{tick}"), &tick.to_string(), &scratch).is_ok();
                    log.lock().unwrap().push(Operation {
                        started,
                        ended: Instant::now(),
                        ok,
                        tick,
                    });
                    std::thread::sleep(CLIENT_PERIOD);
                }
            })
        };
        Self { stop, log, thread }
    }

    /// When the first operation started after `since` succeeded.
    fn first_success_after(&self, since: Instant) -> Option<Instant> {
        let log = self.log.lock().unwrap();
        log.iter().find(|op| op.ok && op.started > since).map(|op| op.ended)
    }

    fn finish(self) -> Vec<Operation> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("client thread");
        Arc::try_unwrap(self.log).ok().unwrap().into_inner().unwrap()
    }
}

/// What the client saw of one fail-over, split into its parts.
#[derive(Debug)]
pub struct Outage {
    /// Last successful operation before the failure to the first after it.
    pub total: Duration,
    /// Failure → the agents failed the node over (the fail-over timeout and the decision).
    pub fail_over: Duration,
    /// → DRBD Primary on the new node and its NFS server up, started by the promoter on the role
    /// change (the storage's part).
    pub promotion: Duration,
    /// → the EndpointSlice at the new primary (the agent's endpoint rewrite).
    pub rewrite: Duration,
    /// → kube-proxy's NAT rule at the new primary.
    pub programming: Duration,
    /// → the client's first successful operation (its retry pace, NFS reconnect and grace).
    pub reconnect: Duration,
    /// Client operations, and how many of them worked.
    pub operations: usize,
    pub succeeded: usize,
    /// The NFS servers' configuration it was measured with.
    pub grace: NfsGrace,
}

impl std::fmt::Display for Outage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_millis();
        write!(
            f,
            "client-visible outage {} ms = fail-over {} ms + promotion {} ms + endpoint rewrite {} ms + kube-proxy {} ms + client retry and NFS reconnect {} ms (its pace: one write every {} ms, each given 2 s; {})",
            ms(self.total),
            ms(self.fail_over),
            ms(self.promotion),
            ms(self.rewrite),
            ms(self.programming),
            ms(self.reconnect),
            ms(CLIENT_PERIOD),
            self.grace,
        )
    }
}

/// Three netns-backed nodes, the controller and an agent each, one claim served from node a;
/// a client writing through the ClusterIP while node a is lost and node b takes over. Asserts
/// that the address never changed and that every write the client was told succeeded is there.
/// `say` narrates. The NFS servers run with `grace`; each write is a new client (libnfs's
/// `nfs-cp`), which during a grace period cannot open a file until it ends.
pub async fn client_through_a_fail_over(env: &TestEnv, grace: NfsGrace, say: &dyn Fn(String)) -> Outage {
    let mut path = DataPath::up(env, &["a", "b", "c"]).await;
    path.grace = grace;
    let (a, b) = (path.nodes[0].ip.clone(), path.nodes[1].ip.clone());
    let (_, pv) = env.bound_rwx_claim("data", serving(&path.nodes[0].endpoint())).await;
    let pv = pv.metadata.name.unwrap();
    healthy(&path.nodes, &[&pv], 0);
    env.running_pod("nfs-server", &path.nodes[0].name, "data", json!({}), no_labels())
        .await;
    path.start_nfs(0);
    say(format!(
        "nodes a, b, c are network namespaces at {a}, {b}, {}; NFS server ({grace}) on a; kube-proxy (iptables) running",
        path.nodes[2].ip
    ));

    let controller = env.start_namespace_controller().await;
    let mut agents = Vec::new();
    for node in &path.nodes {
        agents.push(env.start_agent(node, &[]).await);
    }
    let mount = super::eventually("the mount endpoint", WAIT, || env.pv_annotation(&pv, MOUNT_ENDPOINT)).await;
    let cluster_ip = env.cluster_ip(&pv).await.expect("a ClusterIP");
    until("kube-proxy's rule to node a", || {
        ready(path.programmed(&env.ns, &pv, &a))
    })
    .await;
    let scratch = path.scratch();
    let first = "written before the failure\n";
    until("a write through the ClusterIP", || {
        ready(nfs_write(&cluster_ip, "first", first, &scratch).is_ok())
    })
    .await;
    assert_eq!(nfs_read(&cluster_ip, "first").as_deref(), Ok(first));
    say(format!(
        "client mounts {mount} (nfs://{cluster_ip}{}), wrote and read a file; now writes one every {} ms",
        super::datapath::EXPORT,
        CLIENT_PERIOD.as_millis()
    ));

    // Node b's server starts when DRBD promotes it there, as a drbd-reactor promoter's would.
    path.start_promoter(1, &pv);
    let client = Client::start(cluster_ip.clone(), scratch.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    agents.remove(0).stop().await;
    path.nodes[0].kubelet.stop();
    path.fail(0);
    // From here no operation can succeed until another server answers at the ClusterIP.
    let failed = Instant::now();
    lost(&path.nodes, &[&pv], 0, None);
    say("node a lost: its kubelet, agent and NFS server stopped, its link down, DRBD peers disconnected".into());
    until("the fail-over taint on node a", || async {
        env.taints(&path.nodes[0].name).await.iter().any(|t| t == LOST_QUORUM)
    })
    .await;
    let failed_over = Instant::now();
    lost(&path.nodes, &[&pv], 0, Some(1));
    path.promoted(1);
    let promoted = Instant::now();
    say("agents failed node a over; DRBD promoted node b and its promoter started the NFS server there".into());
    until("the EndpointSlice at node b", || async {
        slice_addresses(env, &pv).await == [b.clone()]
    })
    .await;
    let rewritten = Instant::now();
    until("kube-proxy's rule to node b", || {
        ready(path.programmed(&env.ns, &pv, &b))
    })
    .await;
    let programmed = Instant::now();
    let reconnected = loop {
        if let Some(at) = client.first_success_after(failed) {
            break at;
        }
        assert!(
            failed.elapsed() < WAIT,
            "the client never worked again after the fail-over"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let operations = client.finish();

    assert_eq!(
        env.cluster_ip(&pv).await.as_deref(),
        Some(cluster_ip.as_str()),
        "the ClusterIP never changes"
    );
    assert_eq!(
        env.pv_annotation(&pv, MOUNT_ENDPOINT).await.as_deref(),
        Some(mount.as_str())
    );
    assert_eq!(
        nfs_read(&cluster_ip, "first").as_deref(),
        Ok(first),
        "the file written before, read after"
    );
    let succeeded: Vec<&Operation> = operations.iter().filter(|op| op.ok).collect();
    for op in &succeeded {
        assert_eq!(
            nfs_read(&cluster_ip, &format!("tick-{}", op.tick)).as_deref(),
            Ok(op.tick.to_string().as_str()),
            "every write the client was told succeeded is there"
        );
    }
    assert!(
        operations.iter().any(|op| op.ok && op.started > reconnected),
        "the client keeps writing after the fail-over"
    );
    let last_before = operations
        .iter()
        .filter(|op| op.ok && op.started < failed)
        .map(|op| op.ended)
        .next_back()
        .expect("the client worked before the failure");
    let outage = Outage {
        total: reconnected - last_before,
        fail_over: failed_over - failed,
        promotion: promoted - failed_over,
        rewrite: rewritten - promoted,
        programming: programmed - rewritten,
        reconnect: reconnected.saturating_duration_since(programmed),
        operations: operations.len(),
        succeeded: succeeded.len(),
        grace,
    };
    let fenced = fenced_packets();
    say(format!(
        "the client carried on through the same ClusterIP {cluster_ip}: {} of {} writes worked, all read back",
        outage.succeeded, outage.operations
    ));
    for process in agents.into_iter().chain([controller]) {
        process.stop().await;
    }
    drop(path);
    assert_eq!(fenced, 0, "no packet of the data path tried to leave the machine");
    outage
}

/// Waits up to [`WAIT`] for `probe` to hold, probing every 20 ms: these waits time the outage's
/// parts.
async fn until<Fut: std::future::Future<Output = bool>>(what: &str, mut probe: impl FnMut() -> Fut) {
    super::eventually_every(what, WAIT, Duration::from_millis(20), || {
        let holds = probe();
        async move { holds.await.then_some(()) }
    })
    .await
}
