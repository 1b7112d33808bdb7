//! An NFS client through a fail-over, on the real data path ([`super::datapath`]): the client
//! writes through the claim's ClusterIP, the primary's node is lost, the agents fail it over, the
//! new primary starts its NFS server and publishes itself, and the client, which never changes the
//! address it uses, carries on. Measures what the client saw.

use std::future::ready;
use std::time::{Duration, Instant};

use serde_json::json;

use super::datapath::{DataPath, NfsGrace, ProxyMode, fenced_packets, nfs_read, nfs_write};
use super::drbd::{LOST_QUORUM, healthy, lost, no_labels, slice_addresses};
use super::prometheus::{Panels, Prometheus};
use super::stateful::{IDLE_FILE, Tally, WRITER_FILE};
use super::{MOUNT_ENDPOINT, TestEnv, serving};

mod clients;
mod crash;
mod kernel_clients;
mod moves;
mod planned;

use clients::{CLIENT_PERIOD, Client, Finished, Operation, Reach};
pub use clients::{ClientModel, ClientOutage};
pub use moves::{How, Move};

const WAIT: Duration = Duration::from_secs(60);
/// How the kernel client mounts the claim: as users do (`hard`, the default `timeo`).
pub const KERNEL_MOUNT_OPTIONS: &str = "vers=4.1,hard";
/// The world one fail-over runs in.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    pub grace: NfsGrace,
    pub mode: ProxyMode,
    /// `Some(window)`: the conntrack repair runs, sweeping a moved volume for `window`
    /// (`--sweep-for`); `None`: it does not run.
    pub repair: Option<&'static str>,
    /// kube-proxy is paused from the loss until this long after the slice moved: the repair's
    /// race with it.
    pub proxy_late: Option<Duration>,
    /// How long after kube-proxy's new rule the clients are given to get through.
    pub patience: Duration,
    /// How long the clients carry on once all got through (an idle client renews its lease
    /// every few seconds: a lease it cannot keep shows only over several renewals).
    pub linger: Duration,
    /// `Some(port)`: the volume is shared as `share` makes it, with this NFS port of its own on
    /// the PV, and each node's server is started only as its agent's drbd-reactor snippet says.
    pub own_port: Option<u16>,
    /// The clients, the first one the headline: [`ClientModel::ALL`] unless a scenario says.
    /// A [`ClientModel::Stateful`] one's acknowledged writes must read back, its lock must still
    /// be held, its file never lost.
    pub clients: &'static [ClientModel],
    /// The install guide's template without its `Server_Scope`: ganesha's default scope, the
    /// node's hostname, which changes with every move (what clients lose then).
    pub without_server_scope: bool,
}

impl Scenario {
    /// The files the scenario's clients hold locked.
    fn held_files(&self) -> Vec<&'static str> {
        let held = |model: &ClientModel| match model {
            ClientModel::Stateful => Some(WRITER_FILE),
            ClientModel::IdleHolder => Some(IDLE_FILE),
            _ => None,
        };
        self.clients.iter().filter_map(held).collect()
    }
}

impl Scenario {
    /// Grace off, kube-proxy in `mode`, the repair on with its default window.
    pub fn repaired(mode: ProxyMode) -> Self {
        Self {
            grace: NfsGrace::Off,
            mode,
            repair: Some("30s"),
            proxy_late: None,
            patience: Duration::from_secs(30),
            linger: Duration::from_secs(1),
            own_port: None,
            clients: &ClientModel::ALL,
            without_server_scope: false,
        }
    }

    /// A volume shared as `share` makes it on LINSTOR (an NFS port of its own, 20490; each
    /// node's server started as its agent's drbd-reactor snippet says), `grace`, these `clients`,
    /// kube-proxy in iptables mode, the repair on.
    pub fn shared_on_linstor(grace: NfsGrace, clients: &'static [ClientModel]) -> Self {
        Self {
            grace,
            own_port: Some(20490),
            clients,
            ..Self::repaired(ProxyMode::Iptables)
        }
    }

    /// Whether the Linux kernel's client serves some of the clients.
    fn has_kernel_clients(&self) -> bool {
        self.clients.iter().any(|c| c.is_kernel())
    }

    /// Whether libnfs (NFSv4.0) clients run: they are new clients at every call.
    fn has_nfs40_clients(&self) -> bool {
        self.clients.contains(&ClientModel::NewConnection)
    }
}

impl std::fmt::Display for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "kube-proxy {}, {}, ", self.mode.flag(), self.grace)?;
        match self.repair {
            Some(window) => write!(f, "conntrack repair on (--sweep-for {window})")?,
            None => write!(f, "conntrack repair off")?,
        }
        if let Some(port) = self.own_port {
            write!(
                f,
                ", the volume's own NFS port {port}, servers started as the agents' snippets say"
            )?;
        }
        if self.clients != ClientModel::ALL {
            let clients: Vec<String> = self.clients.iter().map(ToString::to_string).collect();
            write!(f, ", clients: {}", clients.join("; "))?;
        }
        if self.without_server_scope {
            write!(f, ", the template without Server_Scope")?;
        }
        if let Some(late) = self.proxy_late {
            write!(
                f,
                ", kube-proxy paused until {} ms after the slice moved",
                late.as_millis()
            )?;
        }
        Ok(())
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
    /// Every client model's own outage.
    pub clients: Vec<ClientOutage>,
    /// What the clients found taken by the move (a stateful client's lock, file or writes).
    pub lost: Vec<(ClientModel, Tally)>,
    /// What it was measured in.
    pub scenario: Scenario,
}

impl Outage {
    /// The outage of `model`'s client, `None` if it never got through.
    pub fn of(&self, model: ClientModel) -> Option<Duration> {
        self.clients.iter().find(|c| c.model == model).and_then(|c| c.total)
    }

    /// One line per client model.
    pub fn per_client(&self) -> String {
        per_client(&self.clients, &still_failing(self.scenario.patience))
    }
}

/// One line per client model's outage; `none` says what a client not through was.
fn per_client(clients: &[ClientOutage], none: &str) -> String {
    clients
        .iter()
        .map(|c| match c.total {
            Some(total) => format!("  {}: {} ms", c.model, total.as_millis()),
            None => format!("  {}: {none}", c.model),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn still_failing(patience: Duration) -> String {
    format!("still failing {} s after kube-proxy's new rule", patience.as_secs())
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
            self.scenario,
        )?;
        write!(f, "\n{}", self.per_client())?;
        for (model, lost) in &self.lost {
            write!(f, "\n  taken by the move from the {model} client: {lost}")?;
        }
        Ok(())
    }
}

/// Three netns-backed nodes, the controller and an agent each, one claim served from node a;
/// a client of each [`ClientModel`] at the ClusterIP while node a is lost (its namespace drops
/// every packet) and node b takes over. Asserts that the address never changed and that every
/// write the new-connection client was told succeeded is there. `say` narrates. With
/// `prometheus`, it scrapes the repair and kube-proxy meanwhile, and the dashboard's data-path
/// panels must return data before they stop.
pub async fn client_through_a_fail_over(
    env: &TestEnv,
    scenario: Scenario,
    say: &dyn Fn(String),
    prometheus: Option<&Prometheus>,
) -> Outage {
    let mut stage = Stage::set(env, scenario, say, prometheus).await;
    stage.first_write(say).await;
    // Node b's server starts when DRBD promotes it there, as a drbd-reactor promoter's would.
    stage.path.start_promoter(1, &stage.pv);
    let clients = stage.start_clients().await;
    let timeline = stage.lose_node_a(say).await;
    let outage = stage.measure(clients, timeline, say).await;
    if let Some(prometheus) = prometheus {
        let (panels, queries) = prometheus.check_dashboard(Panels::DataPath).await;
        say(format!(
            "the dashboard's {panels} data-path panels ({queries} queries) return data: the repair's figures and kube-proxy's move-to-rules latency"
        ));
    }
    stage.tear_down().await;
    outage
}

/// What the clients saw of a run of moves: each move's outage per client model (`None` for a
/// client not through before the next move), and what the moves took from the stateful clients.
pub struct Moves {
    pub outages: Vec<(Move, Vec<ClientOutage>)>,
    pub lost: Vec<(ClientModel, Tally)>,
    /// All the stateful clients' tallies together.
    pub tally: Tally,
}

/// Like [`client_through_a_fail_over`], through a run of `moves`. After a loss the node comes
/// back, and its fail-over taint goes, before the next move. The next move follows once the
/// headline client got through: about 7 s after a loss, inside the new server's grace period.
/// The scenario's clients run through all of them; what they hold is tallied at the end, and by
/// the stateful clients themselves along the way (a writer reads back its records after each
/// recovery; a lock tester asks for conflicting locks throughout).
pub async fn clients_through_fail_overs(
    env: &TestEnv,
    scenario: Scenario,
    moves: &[Move],
    say: &dyn Fn(String),
) -> Moves {
    let mut stage = Stage::set(env, scenario, say, None).await;
    stage.first_write(say).await;
    let clients = stage.start_clients().await;
    let mut outages = Vec::new();
    for (i, &step) in moves.iter().enumerate() {
        if !stage.path.promoter_waiting(step.to) {
            stage.path.start_promoter(step.to, &stage.pv);
        }
        if i > 0 && step.how == How::Loss {
            // What the agents move: a consumer of the volume on the node to lose, as node a has.
            let node = &stage.path.nodes[step.from].name;
            env.running_pod(&format!("nfs-server-{i}"), node, "data", json!({}), no_labels())
                .await;
        }
        let at = match step.how {
            How::Drain => stage.drain(step.from, step.to, say).await,
            How::Planned => stage.hand_over(step.from, step.to, say).await,
            How::Loss => stage.lose(step.from, step.to, say).await,
            How::Crash => stage.crash(step.from, step.to, say).await,
        };
        let last = i + 1 == moves.len();
        let waited_for = if last { &clients[..] } else { &clients[..1] };
        stage.wait_for(waited_for, &at).await;
        outages.push((step, stage.outages(&clients, &at)));
        let none = if last {
            still_failing(scenario.patience)
        } else {
            "not through before the next move".to_owned()
        };
        say(format!(
            "move {} of {} ({step}):\n{}",
            i + 1,
            moves.len(),
            per_client(&outages[i].1, &none)
        ));
        if !last && step.how == How::Loss {
            stage.bring_back(step.from, step.to).await;
        }
    }
    let finished: Vec<Finished> = clients.into_iter().map(Client::finish).collect();
    let lost: Vec<(ClientModel, Tally)> = finished.iter().filter_map(Finished::taken).collect();
    let mut tally = Tally::default();
    for client in &finished {
        tally.add(&client.tally);
    }
    assert_eq!(
        env.cluster_ip(&stage.pv).await.as_deref(),
        Some(stage.cluster_ip.as_str()),
        "the ClusterIP never changes"
    );
    stage.tear_down().await;
    Moves { outages, lost, tally }
}

/// The data path of one fail-over and the processes on it.
struct Stage<'a> {
    env: &'a TestEnv,
    scenario: Scenario,
    path: DataPath,
    pv: String,
    controller: super::process::Process,
    /// Each node's agent, while it runs.
    agents: Vec<Option<super::process::Process>>,
    repair: Option<super::process::Process>,
    mount: String,
    cluster_ip: String,
    scratch: std::path::PathBuf,
    /// The kernel's NFS client, booted when the scenario has its models.
    kernel: Option<std::sync::Arc<super::kernel_client::KernelGuest>>,
}

/// When each part of a fail-over was seen done.
struct Timeline {
    failed: Instant,
    failed_over: Instant,
    promoted: Instant,
    rewritten: Instant,
    programmed: Instant,
}

const FIRST: &str = "written before the failure\n";

impl<'a> Stage<'a> {
    /// Nodes, the claim served from node a, the controller, the agents, the repair (if the
    /// scenario has it), kube-proxy's rule to node a.
    async fn set(env: &'a TestEnv, scenario: Scenario, say: &dyn Fn(String), prometheus: Option<&Prometheus>) -> Self {
        let mut path = DataPath::up(env, &["a", "b", "c"], scenario.mode).await;
        path.grace = scenario.grace;
        path.without_server_scope = scenario.without_server_scope;
        let (a, b) = (path.nodes[0].ip.clone(), path.nodes[1].ip.clone());
        let mut annotations = serving(&format!("{a}:{}", scenario.own_port.unwrap_or(2049)));
        if let Some(port) = scenario.own_port {
            annotations.insert("storageos.com/nfs-port".into(), port.to_string());
            (path.nfs_port, path.from_snippets) = (port, true);
        }
        let (_, pv) = env.bound_rwx_claim("data", annotations).await;
        let pv = pv.metadata.name.unwrap();
        healthy(&path.nodes, &[&pv], 0);
        env.running_pod("nfs-server", &path.nodes[0].name, "data", json!({}), no_labels())
            .await;
        // Node a's server: at once, or once its agent has written the snippet.
        path.start_promoter(0, &pv);
        say(format!(
            "nodes a, b, c are network namespaces at {a}, {b}, {}; NFS server on a; {scenario}",
            path.nodes[2].ip
        ));
        let controller = env.start_namespace_controller().await;
        let mut agents = Vec::new();
        // Decisions every second: the fail-over holds for DRBD's detection window (1.5 s with the
        // simulated links' ping-int 1 s) plus one reconcile interval while node a's heartbeat lasts.
        for i in 0..path.nodes.len() {
            agents.push(Some(agent_on(env, &path, i).await));
        }
        path.promoted(0);
        let repair = match scenario.repair {
            Some(window) => Some(start_repair(env, &path, window).await),
            None => None,
        };
        if let Some(prometheus) = prometheus {
            prometheus.scrape("kube-proxy", &[path.proxy_metrics()]);
            if let Some(repair) = &repair {
                prometheus.scrape("shared-volume-conntrack", &[repair.admin]);
            }
        }
        let mount = env.published_mount_endpoint(&pv).await;
        let cluster_ip = env.cluster_ip(&pv).await.expect("a ClusterIP");
        until("kube-proxy's rule to node a", || {
            ready(path.programmed(&env.ns, &pv, &a))
        })
        .await;
        let scratch = path.scratch();
        Self {
            env,
            scenario,
            path,
            pv,
            controller,
            agents,
            repair,
            mount,
            cluster_ip,
            scratch,
            kernel: None,
        }
    }

    /// A file written and read back through the ClusterIP, before anything fails, by libnfs
    /// when the scenario has its clients: an NFSv4.0 client leaves a recovery record that is
    /// never completed, which would hold a later grace period to its end.
    async fn first_write(&self, say: &dyn Fn(String)) {
        let (cluster_ip, scratch) = (&self.cluster_ip, &self.scratch);
        if self.scenario.has_nfs40_clients() {
            until("a write through the ClusterIP", || {
                ready(nfs_write(cluster_ip, "first", FIRST, scratch).is_ok())
            })
            .await;
            assert_eq!(nfs_read(cluster_ip, "first").as_deref(), Ok(FIRST));
        }
        say(format!(
            "clients mount {} (nfs://{cluster_ip}{}), one of each model: {}",
            self.mount,
            super::datapath::EXPORT,
            self.scenario
                .clients
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }

    /// Node a lost silently, the agents fail it over, DRBD promotes node b (whose promoter, started
    /// before, starts its NFS server), the slice moves, kube-proxy rewrites its rule (late, if the scenario says).
    async fn lose_node_a(&mut self, say: &dyn Fn(String)) -> Timeline {
        self.lose(0, 1, say).await
    }

    /// Node `from` lost silently, the agents fail it over, DRBD promotes node `to` (whose
    /// promoter, started before, starts its NFS server), the slice moves, kube-proxy rewrites its
    /// rule (late, if the scenario says).
    async fn lose(&mut self, from: usize, to: usize, say: &dyn Fn(String)) -> Timeline {
        let (env, pv) = (self.env, self.pv.as_str());
        let (lost_node, new_ip) = (self.path.nodes[from].name.clone(), self.path.nodes[to].ip.clone());
        if self.scenario.proxy_late.is_some() {
            self.path.pause_proxy();
        }
        self.agents[from]
            .take()
            .expect("the lost node's agent runs")
            .stop()
            .await;
        self.path.nodes[from].kubelet.stop();
        self.path.fail(from);
        // From here no operation can succeed until another server answers at the ClusterIP.
        let failed = Instant::now();
        lost(&self.path.nodes, &[pv], from, None);
        say(format!(
            "node {lost_node} lost: its namespace drops every packet; its kubelet, agent and NFS server stopped; DRBD peers disconnected"
        ));
        until("the fail-over taint on the lost node", || async {
            env.taints(&lost_node).await.iter().any(|t| t == LOST_QUORUM)
        })
        .await;
        let failed_over = Instant::now();
        lost(&self.path.nodes, &[pv], from, Some(to));
        self.path.promoted(to);
        let promoted = Instant::now();
        say(format!(
            "agents failed node {lost_node} over; DRBD promoted node {} and its promoter started the NFS server there",
            self.path.nodes[to].name
        ));
        until("the EndpointSlice at the new primary", || async {
            slice_addresses(env, pv).await == [new_ip.clone()]
        })
        .await;
        let rewritten = Instant::now();
        if let Some(late) = self.scenario.proxy_late {
            tokio::time::sleep(late).await;
            self.path.resume_proxy();
            say(format!(
                "kube-proxy resumed {} ms after the slice moved",
                late.as_millis()
            ));
        }
        until("kube-proxy's rule to the new primary", || {
            ready(self.path.programmed(&env.ns, pv, &new_ip))
        })
        .await;
        Timeline {
            failed,
            failed_over,
            promoted,
            rewritten,
            programmed: Instant::now(),
        }
    }

    /// Node `index` comes back after its loss: its packets flow, its kubelet and agent run, its
    /// DRBD reconnects as a Secondary of node `primary`; once its agents took the fail-over taint
    /// off it. (A move to it starts its promoter, as for any node.)
    async fn bring_back(&mut self, index: usize, primary: usize) {
        let (env, pv) = (self.env, self.pv.clone());
        self.path.restore(index);
        self.path.nodes[index].kubelet.resume();
        healthy(&self.path.nodes, &[&pv], primary);
        self.agents[index] = Some(agent_on(env, &self.path, index).await);
        let node = self.path.nodes[index].name.clone();
        until("the fail-over taint off the returned node", || async {
            !env.taints(&node).await.iter().any(|t| t == LOST_QUORUM)
        })
        .await;
    }

    /// A client of each of the scenario's models at the ClusterIP, in the scenario's order; started
    /// one at a time, the lock holders first, each once the one before has worked (a lock tester
    /// once the holders have their locks); once they have run a while.
    async fn start_clients(&mut self) -> Vec<Client> {
        if self.scenario.has_kernel_clients() {
            let guest = self.path.boot_kernel_client();
            let port = self.scenario.own_port.unwrap_or(2049);
            let mounted = tokio::task::block_in_place(|| guest.mount(&self.cluster_ip, port, KERNEL_MOUNT_OPTIONS));
            mounted.unwrap_or_else(|e| {
                panic!(
                    "the kernel client mounts the ClusterIP: {e}; see {}",
                    guest.console().display()
                )
            });
            self.kernel = Some(std::sync::Arc::new(guest));
        }
        let reach = Reach {
            cluster_ip: self.cluster_ip.clone(),
            scratch: self.scratch.clone(),
            kernel: self.kernel.clone(),
        };
        let models = self.scenario.clients;
        let mut order: Vec<usize> = (0..models.len()).collect();
        order.sort_by_key(|&i| !matches!(models[i], ClientModel::Stateful | ClientModel::IdleHolder));
        let mut started: Vec<Option<Client>> = models.iter().map(|_| None).collect();
        for i in order {
            let client = Client::start(models[i], self.scenario, reach.clone());
            let what = format!("the {} client's first success", models[i]);
            super::eventually_every(&what, WAIT, Duration::from_millis(20), || {
                ready(client.log.lock().unwrap().iter().any(|op| op.ok).then_some(()))
            })
            .await;
            started[i] = Some(client);
        }
        let clients: Vec<Client> = started.into_iter().flatten().collect();
        tokio::time::sleep(Duration::from_secs(2)).await;
        clients
    }

    /// Waits for `clients` to get through after the loss `at` (or the scenario's patience to end).
    async fn wait_for(&self, clients: &[Client], at: &Timeline) {
        let through = |client: &Client| client.first_success_after(at.failed);
        while clients.iter().any(|c| through(c).is_none()) && at.programmed.elapsed() < self.scenario.patience {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What each client saw of the loss `at` so far.
    fn outages(&self, clients: &[Client], at: &Timeline) -> Vec<ClientOutage> {
        clients
            .iter()
            .map(|client| ClientOutage::of(client.model, &client.log.lock().unwrap(), at.failed))
            .collect()
    }

    /// Waits for every client to get through (or the scenario's patience to end), checks that the
    /// address held and every acknowledged write is there, and puts the figures together.
    async fn measure(&self, clients: Vec<Client>, at: Timeline, say: &dyn Fn(String)) -> Outage {
        self.wait_for(&clients, &at).await;
        let reconnected = clients[0]
            .first_success_after(at.failed)
            .unwrap_or_else(|| panic!("the {} client never worked again after the fail-over", clients[0].model));
        tokio::time::sleep(self.scenario.linger).await;
        let finished: Vec<Finished> = clients.into_iter().map(Client::finish).collect();
        let (env, pv, cluster_ip) = (self.env, self.pv.as_str(), self.cluster_ip.as_str());
        assert_eq!(
            env.cluster_ip(pv).await.as_deref(),
            Some(cluster_ip),
            "the ClusterIP never changes"
        );
        assert_eq!(
            env.pv_annotation(pv, MOUNT_ENDPOINT).await.as_deref(),
            Some(self.mount.as_str())
        );
        if self.scenario.has_nfs40_clients() {
            assert_eq!(
                nfs_read(cluster_ip, "first").as_deref(),
                Ok(FIRST),
                "the file written before, read after"
            );
        }
        let clients: Vec<ClientOutage> = finished
            .iter()
            .map(|client| ClientOutage::of(client.model, &client.operations, at.failed))
            .collect();
        if let Some(client) = finished
            .iter()
            .find(|client| client.model == ClientModel::NewConnection)
        {
            written_and_read_back(cluster_ip, &client.operations, reconnected);
        }
        let operations = &finished[0].operations;
        let succeeded = operations.iter().filter(|op| op.ok).count();
        let outage = Outage {
            total: clients[0].total.expect("the headline client's outage"),
            fail_over: at.failed_over - at.failed,
            promotion: at.promoted - at.failed_over,
            rewrite: at.rewritten - at.promoted,
            programming: at.programmed - at.rewritten,
            reconnect: reconnected.saturating_duration_since(at.programmed),
            operations: operations.len(),
            succeeded,
            clients,
            lost: finished.iter().filter_map(Finished::taken).collect(),
            scenario: self.scenario,
        };
        say(format!(
            "the clients carried on through the same ClusterIP {cluster_ip}: {} of {} operations of the {} client worked, every acknowledged write read back",
            outage.succeeded, outage.operations, self.scenario.clients[0]
        ));
        outage
    }

    /// The processes stopped, the data path removed; no packet of it tried to leave the machine.
    async fn tear_down(self) {
        let fenced = fenced_packets();
        drop(self.kernel);
        for process in self
            .agents
            .into_iter()
            .flatten()
            .chain([self.controller])
            .chain(self.repair)
        {
            process.stop().await;
        }
        drop(self.path);
        assert_eq!(fenced, 0, "no packet of the data path tried to leave the machine");
    }
}

/// The agent of node `index`, deciding every second, writing drbd-reactor's snippets where the
/// node's promoter reads them, and probing the node's NFS server before it publishes it; once it
/// is ready.
async fn agent_on(env: &TestEnv, path: &DataPath, index: usize) -> super::process::Process {
    let snippets = path.snippets_dir(index).display().to_string();
    let args = [
        "--reconcile-interval",
        "1s",
        "--promoter-snippets-dir",
        &snippets,
        "--nfs-probe",
        "true",
        "--nfs-probe-interval",
        "1s",
        "--node-drain-policy",
        "evacuate",
    ];
    env.start_agent(&path.nodes[index], &args).await
}

/// The conntrack repair on the client's node (the host, where kube-proxy runs), as the chart's
/// account, sweeping a moved volume for `window`; once it is ready.
pub async fn start_repair(env: &TestEnv, path: &DataPath, window: &str) -> super::process::Process {
    start_conntrack_repair(env, path, window, &[]).await
}

/// [`start_repair`] with `extra` flags.
pub async fn start_conntrack_repair(
    env: &TestEnv,
    path: &DataPath,
    window: &str,
    extra: &[&str],
) -> super::process::Process {
    let name = format!("{}-conntrack", env.ns);
    let metrics = format!("http://{}/metrics", path.proxy_metrics());
    let args = [
        "conntrack",
        "--node-name",
        path.proxy_node(),
        "--sweep-for",
        window,
        "--kube-proxy-metrics",
        &metrics,
    ];
    let args = [&args[..], extra].concat();
    let repair = env.start_as("conntrack", &name, &args, &[]);
    repair.wait_ready().await;
    repair
}

/// Asserts that every write the client was told succeeded is there, and that it kept writing
/// after `reconnected`.
fn written_and_read_back(cluster_ip: &str, operations: &[Operation], reconnected: Instant) {
    let succeeded: Vec<&Operation> = operations.iter().filter(|op| op.ok).collect();
    for op in &succeeded {
        // libnfs binds a reserved port of its own choosing: one whose conntrack entry is still
        // pinned to the dead node (no repair) gets no answer, and the next read takes another.
        let read = (0..5)
            .map(|_| nfs_read(cluster_ip, &format!("tick-{}", op.tick)))
            .find(Result::is_ok)
            .unwrap_or_else(|| Err("no read answered".into()));
        assert_eq!(
            read.as_deref(),
            Ok(op.tick.to_string().as_str()),
            "every write the client was told succeeded is there"
        );
    }
    assert!(
        operations.iter().any(|op| op.ok && op.started > reconnected),
        "the client keeps writing after the fail-over"
    );
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
