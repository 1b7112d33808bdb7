//! The NFS data path of the simulated cluster, on this machine: each simulated node is a network
//! namespace holding its InternalIP behind a veth pair, with an NFS server (nfs-ganesha) in it
//! while it serves the volume; the real kube-proxy turns Services and EndpointSlices into the
//! host's NAT rules; a userspace NFS client (libnfs) reaches the volume through its ClusterIP.
//!
//! Network rule: traffic goes only to loopback or into namespaces made here. The service range is
//! routed into a sink namespace that owns no address in it (a ClusterIP without a NAT rule reaches
//! nothing), and the nodes' range is unreachable but through their own links (a node whose link
//! is down is unreachable, not routed elsewhere), and firewall rules drop and count any packet for
//! those ranges that would still leave through another interface. Dropping the [`DataPath`] removes every process,
//! namespace, link, route and rule it added, whatever happened.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::drbd::SimNode;
pub use super::libnfs::{nfs_read, nfs_write};
pub use super::nfs_server::NfsGrace;
use super::nfs_server::{
    NfsServer, ServerUnit, answers, ganesha_template, stop_within, target_stops_when_a_unit_fails, without_param,
};
use super::{TestEnv, tool};

/// `hack/cluster.sh`'s `--service-cluster-ip-range`.
const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The simulated nodes' addresses: node k (1-based) is 10.211.k.2, its host side 10.211.k.1;
/// the sink is 10.211.0.x.
const NODE_RANGE: &str = "10.211.0.0/16";
/// Every namespace and host link made here starts with this, so a run can remove what a killed
/// run left behind.
const PREFIX: &str = "svcdp";
/// Where the volume is exported on every node's NFS server.
pub const EXPORT: &str = "/export";
/// Comment on the rules that keep the traffic of the data path on this machine.
const FENCE: &str = "svcdp-fence";
/// The fence: packets to the service or node ranges, or forwarded from the nodes, that would
/// leave through any interface but the data path's own are dropped and counted.
const FENCE_RULES: [[&str; 2]; 3] = [["OUTPUT", "-d"], ["OUTPUT", "-d"], ["FORWARD", "-s"]];
const FENCED_RANGES: [&str; 3] = [NODE_RANGE, SERVICE_CIDR, NODE_RANGE];

struct NodeLink {
    netns: String,
    host_link: String,
    ip: String,
    server: Option<ServerUnit>,
    /// Where a promoter sends the NFS server it started.
    promoter: Option<std::sync::mpsc::Receiver<ServerUnit>>,
}

/// The role of `resource` in a fake drbdsetup's status file, if it is there.
fn role_of(status: &Path, resource: &str) -> Option<String> {
    let text = std::fs::read_to_string(status).ok()?;
    let resources: Vec<serde_json::Value> = serde_json::from_str(&text).ok()?;
    let found = resources.iter().find(|r| r["name"] == resource)?;
    Some(found["role"].as_str()?.to_owned())
}

pub struct DataPath {
    dir: PathBuf,
    /// The replicated volume's contents, which every node's NFS server exports in turn.
    pub export_dir: PathBuf,
    /// The NFS servers' recovery records, on the replicated volume beside the export.
    recovery_dir: PathBuf,
    /// How the NFS servers started from now on treat a restart.
    pub grace: NfsGrace,
    /// Servers started from now on run the template without its `Server_Scope`.
    pub without_server_scope: bool,
    pub nodes: Vec<SimNode>,
    links: Vec<NodeLink>,
    sink: NodeLink,
    proxy: Option<Child>,
    proxy_node: String,
    pub proxy_log: PathBuf,
    proxy_metrics: SocketAddr,
    pub mode: ProxyMode,
    /// The port the NFS servers started from now on listen on (a volume shared with a port of
    /// its own; 2049 otherwise).
    pub nfs_port: u16,
    /// Promoters start a server only as the agent's drbd-reactor snippet says.
    pub from_snippets: bool,
}

/// Runs a command that must succeed.
pub(super) fn must(program: &str, args: &[&str]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {program}: {err}"));
    assert!(
        output.status.success(),
        "{program} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs a cleanup command; failures (already gone) are fine.
fn quietly(program: &str, args: &[&str]) {
    let _ = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Sends SIGTERM, and SIGKILL after two seconds.
fn stop(child: &mut Child) {
    stop_within(child, Duration::from_secs(2));
}

/// Where `ip netns exec` finds a namespace's own `/etc` files.
fn resolver_dir(netns: &str) -> PathBuf {
    Path::new("/etc/netns").join(netns)
}

/// The data path's namespaces' `/etc` folders there are.
fn resolver_dirs() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/etc/netns") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
        .map(|e| e.path())
        .collect()
}

impl NodeLink {
    /// A namespace `netns` with `10.211.<k>.2/24` on its end of a veth pair, the host's end
    /// `host_link` with `.1`, and its default route back through the host.
    fn create(netns: String, host_link: String, k: usize) -> Self {
        let (host_ip, ip) = (format!("10.211.{k}.1"), format!("10.211.{k}.2"));
        must("ip", &["netns", "add", &netns]);
        must(
            "ip",
            &[
                "link", "add", &host_link, "type", "veth", "peer", "name", "eth0", "netns", &netns,
            ],
        );
        must("ip", &["addr", "add", &format!("{host_ip}/24"), "dev", &host_link]);
        must("ip", &["link", "set", &host_link, "up"]);
        must("ip", &["-n", &netns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        must("ip", &["-n", &netns, "link", "set", "eth0", "up"]);
        must("ip", &["-n", &netns, "link", "set", "lo", "up"]);
        must("ip", &["-n", &netns, "route", "add", "default", "via", &host_ip]);
        // A node resolves nothing outside: what it looks up (ganesha, a client's address) asks
        // its own loopback, never the host's nameserver through the default route.
        let etc = resolver_dir(&netns);
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(etc.join("resolv.conf"), "nameserver 127.0.0.1\n").unwrap();
        Self {
            netns,
            host_link,
            ip,
            server: None,
            promoter: None,
        }
    }

    fn remove(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop_within(Duration::from_secs(2));
        }
        quietly("ip", &["link", "del", &self.host_link]);
        quietly("ip", &["netns", "del", &self.netns]);
        let _ = std::fs::remove_dir_all(resolver_dir(&self.netns));
    }
}

/// Removes the namespaces and links of an earlier run that was killed before it could.
fn remove_leftovers() {
    let listed = Command::new("ip").args(["netns", "list"]).output().unwrap();
    for line in String::from_utf8_lossy(&listed.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.starts_with(PREFIX) {
            quietly("ip", &["netns", "del", name]);
        }
    }
    for dir in resolver_dirs() {
        let _ = std::fs::remove_dir_all(dir);
    }
    let links = Command::new("ip").args(["-o", "link", "show"]).output().unwrap();
    for line in String::from_utf8_lossy(&links.stdout).lines() {
        let name = line.split(": ").nth(1).unwrap_or("").split('@').next().unwrap_or("");
        if name.starts_with(PREFIX) {
            quietly("ip", &["link", "del", name]);
        }
    }
    quietly("ip", &["route", "del", "unreachable", NODE_RANGE]);
    quietly("ip", &["route", "del", SERVICE_CIDR]);
    remove_proxy_rules();
    super::held::remove_rst_rules();
    fence("-D");
}

/// Adds (`-I`) or removes (`-D`) the fence rules.
fn fence(action: &str) {
    let out_of_bounds = format!("{PREFIX}+");
    for ([chain, direction], range) in FENCE_RULES.iter().zip(FENCED_RANGES) {
        let rule = [
            action,
            chain,
            direction,
            range,
            "!",
            "-o",
            &out_of_bounds,
            "-m",
            "comment",
            "--comment",
            FENCE,
            "-j",
            "DROP",
        ];
        if action == "-I" {
            must("iptables", &rule);
        } else {
            quietly("iptables", &rule);
        }
    }
}

/// Packets the fence stopped so far.
pub fn fenced_packets() -> u64 {
    let rules = Command::new("iptables-save").arg("-c").output().unwrap();
    String::from_utf8_lossy(&rules.stdout)
        .lines()
        .filter(|line| line.contains(FENCE))
        .filter_map(|line| line.strip_prefix('[')?.split(':').next()?.parse::<u64>().ok())
        .sum()
}

/// `kube-proxy --cleanup`, then every `KUBE-` chain it leaves: the filter tables' KUBE-FIREWALL
/// (every version), its canary chains and KUBE-MARK-MASQ (1.33).
fn remove_proxy_rules() {
    let _ = tool("kube-proxy")
        .arg("--cleanup")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    for iptables in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle"] {
            remove_kube_chains(iptables, table);
        }
    }
}

/// Deletes the jumps into `KUBE-` chains of `table`, then the chains.
fn remove_kube_chains(iptables: &str, table: &str) {
    let saved = Command::new(format!("{iptables}-save"))
        .args(["-t", table])
        .output()
        .unwrap();
    let saved = String::from_utf8_lossy(&saved.stdout).into_owned();
    for rule in saved.lines().filter_map(|l| l.strip_prefix("-A ")) {
        let jumps_to_ours = rule
            .split_whitespace()
            .skip_while(|w| *w != "-j")
            .nth(1)
            .is_some_and(|c| c.starts_with("KUBE-"));
        if jumps_to_ours && !rule.starts_with("KUBE-") {
            let mut args = vec!["-t", table, "-D"];
            args.extend(rule.split_whitespace());
            quietly(iptables, &args);
        }
    }
    let chains: Vec<&str> = saved
        .lines()
        .filter_map(|l| l.strip_prefix(':')?.split_whitespace().next())
        .filter(|c| c.starts_with("KUBE-"))
        .collect();
    for chain in &chains {
        quietly(iptables, &["-t", table, "-F", chain]);
    }
    for chain in &chains {
        quietly(iptables, &["-t", table, "-X", chain]);
    }
}

impl DataPath {
    /// Builds the data path for simulated nodes `names` (Node objects included) and starts
    /// kube-proxy, in `mode`, with a Node of its own.
    pub async fn up(env: &TestEnv, names: &[&str], mode: ProxyMode) -> Self {
        assert!(
            Command::new("id")
                .arg("-u")
                .output()
                .unwrap()
                .stdout
                .starts_with(b"0\n"),
            "the NFS data path needs root (network namespaces, iptables): run `make test` as root"
        );
        remove_leftovers();
        let dir = std::env::temp_dir().join(format!("svc-e2e-datapath-{}", env.id));
        let _ = std::fs::remove_dir_all(&dir);
        let export_dir = dir.join("export");
        std::fs::create_dir_all(&export_dir).unwrap();
        let recovery_dir = dir.join("nfs-recovery");
        std::fs::create_dir_all(&recovery_dir).unwrap();

        let sink = NodeLink::create(format!("{PREFIX}-{}-sink", env.id), format!("{PREFIX}{}s", env.id), 0);
        route_service_range_to(&sink);
        let links: Vec<NodeLink> = names
            .iter()
            .enumerate()
            .map(|(i, short)| {
                NodeLink::create(
                    format!("{PREFIX}-{}-{short}", env.id),
                    format!("{PREFIX}{}{}", env.id, i + 1),
                    i + 1,
                )
            })
            .collect();
        let at: Vec<(&str, String)> = names.iter().copied().zip(links.iter().map(|l| l.ip.clone())).collect();
        let nodes = env.sim_nodes_at(&at).await;

        let proxy_node = ready_proxy_node(env).await;
        let proxy_log = dir.join("kube-proxy.log");
        let proxy_metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut path = Self {
            dir,
            export_dir,
            recovery_dir,
            grace: NfsGrace::Off,
            without_server_scope: false,
            nodes,
            links,
            sink,
            proxy: None,
            proxy_node,
            proxy_log,
            proxy_metrics,
            mode,
            nfs_port: 2049,
            from_snippets: false,
        };
        path.proxy = Some(path.start_proxy());
        path
    }

    /// Boots the Linux kernel's NFS client as a pod behind the kube-proxy node (the host): a
    /// tap of the data path's own, forwarding on it and on every node's host link.
    pub fn boot_kernel_client(&self) -> super::kernel_client::KernelGuest {
        let tap = format!("{}k", self.sink.host_link.trim_end_matches('s'));
        let mut forwarding: Vec<&str> = self.links.iter().map(|l| l.host_link.as_str()).collect();
        forwarding.push(&self.sink.host_link);
        tokio::task::block_in_place(|| super::kernel_client::KernelGuest::boot(&tap, &forwarding, &self.dir))
    }

    fn start_proxy(&self) -> Child {
        let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG");
        let log = std::fs::File::create(&self.proxy_log).unwrap();
        tool("kube-proxy")
            .args(["--kubeconfig", &kubeconfig, "--hostname-override", &self.proxy_node])
            .args(["--proxy-mode", self.mode.flag()])
            .args(["--iptables-min-sync-period", "0"])
            .args(["--bind-address", "127.0.0.1", "--nodeport-addresses", "127.0.0.1/32"])
            .args(["--metrics-bind-address", &self.proxy_metrics.to_string()])
            .args(["--healthz-bind-address", ""])
            // Leave the machine's conntrack limits as they are.
            .args(["--conntrack-max-per-core", "0"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kube-proxy (built by hack/tools.sh)")
    }

    /// What starting node `index`'s NFS server of `resource` takes: its configuration (the
    /// install guide's template on this node's paths and address) written, its command.
    fn nfs_server(&self, index: usize, resource: &str) -> NfsServer {
        let link = &self.links[index];
        let state = self.dir.join(&link.netns);
        std::fs::create_dir_all(&state).unwrap();
        let config = state.join("ganesha.conf");
        // `make kernel-client` checks an adopter's own template the same way.
        let mut template = match std::env::var("SVC_GANESHA_TEMPLATE") {
            Ok(file) => std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("SVC_GANESHA_TEMPLATE={file}: {e}")),
            Err(_) => ganesha_template().to_owned(),
        };
        if self.without_server_scope {
            template = without_param(&template, "Server_Scope");
        }
        let text = self
            .grace
            .applied_to(&template)
            .replace("/srv/@RESOURCE@/export", &self.export_dir.display().to_string())
            .replace(
                "/srv/@RESOURCE@/.nfs/recovery",
                &self.recovery_dir.display().to_string(),
            )
            .replace("@RESOURCE@", resource)
            .replace("@PORT@", &self.nfs_port.to_string())
            .replace(
                "NFS_CORE_PARAM {",
                &format!("NFS_CORE_PARAM {{ Bind_addr = {};", link.ip),
            );
        std::fs::write(&config, text + "\n").unwrap();
        NfsServer {
            netns: link.netns.clone(),
            hostname: self.nodes[index].name.clone(),
            config,
            state,
            address: format!("{}:{}", link.ip, self.nfs_port).parse().unwrap(),
            under_serve: self.from_snippets,
        }
    }

    /// A stand-in for drbd-reactor's promoter on node `index`: it watches the node's DRBD state
    /// (what the fake drbdsetup reports) and starts the node's NFS server once `resource` is
    /// Primary there, as a promoter starts nfs-ganesha on promotion. With
    /// [`DataPath::from_snippets`], only as drbd-reactor would: once the agent's snippet for the
    /// resource is in the node's [`DataPath::snippets_dir`] and names the server's unit and port.
    /// [`DataPath::promoted`] takes the server it started.
    pub fn start_promoter(&mut self, index: usize, resource: &str) {
        let server = self.nfs_server(index, resource);
        let status = self.nodes[index].dir.join("status.json");
        let snippet = self.from_snippets.then(|| {
            let file = self.snippet_file(index, resource);
            (
                file,
                format!("\"shared-volume-nfs@{resource}:{}.service\"", self.nfs_port),
            )
        });
        let configured = move || {
            snippet
                .as_ref()
                .is_none_or(|(file, unit)| std::fs::read_to_string(file).is_ok_and(|text| text.contains(unit.as_str())))
        };
        let resource = resource.to_owned();
        let (started, promoted) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(120);
            while Instant::now() < deadline {
                if role_of(&status, &resource).as_deref() == Some("Primary") && configured() {
                    let _ = started.send(server.start());
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        self.links[index].promoter = Some(promoted);
    }

    /// Whether node `index` has a promoter waiting to start its NFS server.
    pub fn promoter_waiting(&self, index: usize) -> bool {
        self.links[index].promoter.is_some()
    }

    /// Where node `index`'s agent writes drbd-reactor's snippets (`--promoter-snippets-dir`).
    pub fn snippets_dir(&self, index: usize) -> PathBuf {
        let dir = self.nodes[index].dir.join("drbd-reactor.d");
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The snippet node `index`'s agent writes for `resource`.
    fn snippet_file(&self, index: usize, resource: &str) -> PathBuf {
        self.snippets_dir(index).join(format!("shared-volume-{resource}.toml"))
    }

    /// Waits until node `index`'s promoter started its NFS server, and keeps it.
    pub fn promoted(&mut self, index: usize) {
        let link = &mut self.links[index];
        let promoter = link.promoter.take().expect("a promoter on that node");
        let server = promoter
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the promoter of {} started no NFS server (was the node's resource promoted, and, from snippets, did its agent write one naming the server's unit and port?)", link.netns));
        link.server = Some(server);
    }

    /// Node `index` is lost as a powered-off node is: its namespace drops every packet, in and
    /// out (no RST, no ICMP; its link stays up and the packets stay inside it), then its NFS
    /// server stops (what it would still say is dropped).
    pub fn fail(&mut self, index: usize) {
        let link = &mut self.links[index];
        for chain in ["INPUT", "OUTPUT"] {
            must(
                "ip",
                &["netns", "exec", &link.netns, "iptables", "-I", chain, "-j", "DROP"],
            );
        }
        // Killed, not stopped: a powered-off node's server runs no shutdown, which would remove
        // its clients' recovery records from the replicated volume.
        if let Some(server) = link.server.take() {
            server.kill();
        }
    }

    /// Starts node `index`'s NFS server of `resource` now, as a promoter would on promotion.
    pub fn start_server(&mut self, index: usize, resource: &str) {
        let server = self.nfs_server(index, resource).start();
        self.links[index].server = Some(server);
    }

    /// Node `index`'s NFS server dies (SIGKILL) while the node stays up, as a crashed server,
    /// and nothing starts it again.
    pub fn kill_server(&mut self, index: usize) {
        let link = &mut self.links[index];
        link.server.take().expect("an NFS server on that node").kill();
    }

    /// Node `index`'s nfs-ganesha crashes (SIGKILL); its unit's process is left to do what it
    /// does (under `shared-volume-serve`: start it again, or give up past its restarts).
    pub fn crash_server(&mut self, index: usize) {
        let link = &self.links[index];
        let server = link.server.as_ref().expect("an NFS server unit on that node");
        assert!(server.crash(), "no nfs-ganesha ran on {} to crash", link.netns);
    }

    /// Whether node `index`'s NFS server accepts connections.
    pub fn answers(&self, index: usize) -> bool {
        answers(format!("{}:{}", self.links[index].ip, self.nfs_port).parse().unwrap())
    }

    /// How node `index`'s NFS server unit ended, once it has (it is then no longer kept).
    pub fn server_unit_ended(&mut self, index: usize) -> Option<std::process::ExitStatus> {
        let link = &mut self.links[index];
        let ended = link.server.as_mut()?.ended();
        if ended.is_some() {
            link.server = None;
        }
        ended
    }

    /// Whether drbd-reactor on node `index` stops the target of `resource`, and so demotes it
    /// there, when a unit of it fails: as the agent's snippet there says
    /// ([`target_stops_when_a_unit_fails`]).
    pub fn gives_up_on_a_failed_unit(&self, index: usize, resource: &str) -> bool {
        std::fs::read_to_string(self.snippet_file(index, resource))
            .is_ok_and(|text| target_stops_when_a_unit_fails(&text))
    }

    /// Node `index`'s NFS server stops as systemd stops its unit when drbd-reactor demotes the
    /// resource there (SIGTERM: ganesha shuts down in order, keeping its clients' records).
    pub fn stop_server(&mut self, index: usize) {
        let link = &mut self.links[index];
        let server = link.server.take().expect("an NFS server on that node");
        assert!(
            server.stop_within(Duration::from_secs(20)),
            "the NFS server of {} did not shut down within 20 s of SIGTERM",
            link.netns
        );
    }

    /// Node `index` is reachable again after [`Self::fail`]: its namespace lets packets through.
    /// Its NFS server stays stopped until its promoter starts one.
    pub fn restore(&mut self, index: usize) {
        let netns = &self.links[index].netns;
        for chain in ["INPUT", "OUTPUT"] {
            must("ip", &["netns", "exec", netns, "iptables", "-D", chain, "-j", "DROP"]);
        }
    }

    /// Stops kube-proxy where it is (SIGSTOP): the rules stay as they are until [`Self::resume_proxy`].
    pub fn pause_proxy(&self) {
        let proxy = self.proxy.as_ref().expect("kube-proxy running");
        quietly("kill", &["-STOP", &proxy.id().to_string()]);
    }

    pub fn resume_proxy(&self) {
        let proxy = self.proxy.as_ref().expect("kube-proxy running");
        quietly("kill", &["-CONT", &proxy.id().to_string()]);
    }

    /// Whether kube-proxy's rules send `namespace/service`'s NFS port to `ip` (and only there).
    pub fn programmed(&self, namespace: &str, service: &str, ip: &str) -> bool {
        self.programmed_port(namespace, service, "nfs", ip)
    }

    /// Like [`DataPath::programmed`], for the Service port named `port` (iptables mode names
    /// the port in its rule's comment; nftables mode in the chain it reaches).
    pub fn programmed_port(&self, namespace: &str, service: &str, port: &str, ip: &str) -> bool {
        match self.mode {
            ProxyMode::Iptables => {
                let rules = Command::new("iptables-save").args(["-t", "nat"]).output().unwrap();
                let wanted = format!("\"{namespace}/{service}:{port} -> {ip}:{}\"", self.nfs_port);
                String::from_utf8_lossy(&rules.stdout).contains(&wanted)
            }
            ProxyMode::Nftables => {
                let table = Command::new("nft")
                    .args(["list", "table", "ip", "kube-proxy"])
                    .output()
                    .unwrap();
                let table = String::from_utf8_lossy(&table.stdout);
                service_chain_reaches(&table, namespace, service, &format!("{ip}:{}", self.nfs_port))
            }
        }
    }
}

/// Whether, in `nft list table` output, the chain of `namespace/service`'s NFS port sends its
/// traffic to `endpoint` (`<ip>:<port>`): kube-proxy 1.37 DNATs a Service of one endpoint there
/// directly (`dnat to <ip>:<port>`); 1.36 through a `numgen` map (`0 : <ip> . <port>`); older
/// ones jumped to an endpoint chain named after the endpoint (`…nfs__<ip>/<port>`).
pub fn service_chain_reaches(table: &str, namespace: &str, service: &str, endpoint: &str) -> bool {
    let (ip, port) = endpoint.rsplit_once(':').expect("<ip>:<port>");
    let name = format!("-{namespace}/{service}/tcp/nfs {{");
    let mut lines = table
        .lines()
        .skip_while(|l| !(l.trim_start().starts_with("chain service-") && l.ends_with(&name)));
    let (mapped, chained) = (format!(" {ip} . {port}"), format!("nfs__{ip}/{port}"));
    let direct = format!("dnat to {ip}:{port}");
    lines.next().is_some()
        && lines
            .take_while(|l| l.trim() != "}")
            .any(|l| l.contains(&mapped) || l.contains(&chained) || l.trim_end().ends_with(&direct))
}

/// How kube-proxy programs Services on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    Iptables,
    /// GA since Kubernetes 1.33.
    Nftables,
}

impl ProxyMode {
    pub fn flag(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
        }
    }
}

impl Drop for DataPath {
    fn drop(&mut self) {
        for link in &mut self.links {
            link.remove();
        }
        if let Some(mut proxy) = self.proxy.take() {
            stop(&mut proxy);
        }
        remove_proxy_rules();
        quietly("ip", &["route", "del", SERVICE_CIDR]);
        quietly("ip", &["route", "del", "unreachable", NODE_RANGE]);
        self.sink.remove();
        fence("-D");
        let _ = tool("kubectl")
            .args(["delete", "node", &self.proxy_node, "--wait=false"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// What a data path would have left behind on this machine: namespaces, links, routes, NAT and
/// filter rules, NFS servers or kube-proxy. Empty once every [`DataPath`] is dropped.
pub fn leftovers() -> Vec<String> {
    let text = |program: &str, args: &[&str]| {
        let output = Command::new(program).args(args).output().unwrap();
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let mut left: Vec<String> = Vec::new();
    left.extend(
        text("ip", &["netns", "list"])
            .lines()
            .filter(|l| l.starts_with(PREFIX))
            .map(|l| format!("namespace {l}")),
    );
    left.extend(
        resolver_dirs()
            .into_iter()
            .map(|dir| format!("resolver {}", dir.display())),
    );
    left.extend(
        text("ip", &["-o", "link", "show"])
            .lines()
            .filter(|l| l.contains(PREFIX))
            .map(|l| format!("link {l}")),
    );
    left.extend(
        text("ip", &["route", "show"])
            .lines()
            .filter(|l| l.contains("10.96.") || l.contains("10.211."))
            .map(|l| format!("route {l}")),
    );
    for iptables in ["iptables-save", "ip6tables-save"] {
        left.extend(
            text(iptables, &[])
                .lines()
                .filter(|l| l.contains("KUBE-") || l.contains(FENCE) || l.contains(super::held::RST_RULE_COMMENT))
                .map(|l| format!("{iptables}: {l}")),
        );
    }
    left.extend(
        text("nft", &["list", "tables"])
            .lines()
            .filter(|l| l.contains("kube-proxy"))
            .map(|l| format!("nftables {l}")),
    );
    for process in [
        "ganesha.nfsd",
        "kube-proxy --kubeconfig",
        "shared-volume-controller conntrack",
    ] {
        left.extend(text("pgrep", &["-af", process]).lines().map(|l| format!("process {l}")));
    }
    left
}

impl DataPath {
    /// How kube-proxy programs Services here.
    pub fn mode(&self) -> ProxyMode {
        self.mode
    }

    /// Where kube-proxy serves its `/metrics`.
    pub fn proxy_metrics(&self) -> SocketAddr {
        self.proxy_metrics
    }

    /// The Node kube-proxy runs as: the node of the clients.
    pub fn proxy_node(&self) -> &str {
        &self.proxy_node
    }

    /// A scratch folder for the client's local files.
    pub fn scratch(&self) -> PathBuf {
        let scratch = self.dir.join("client");
        std::fs::create_dir_all(&scratch).unwrap();
        scratch
    }
}

/// Fences the node range and routes the Service range into `sink`: a ClusterIP no rule
/// translates goes nowhere, as in a cluster.
fn route_service_range_to(sink: &NodeLink) {
    fence("-I");
    must("ip", &["route", "add", "unreachable", NODE_RANGE]);
    must(
        "ip",
        &[
            "route",
            "add",
            SERVICE_CIDR,
            "dev",
            &sink.host_link,
            "src",
            "10.211.0.1",
        ],
    );
}

/// The Node kube-proxy runs as, Ready at loopback.
async fn ready_proxy_node(env: &TestEnv) -> String {
    let proxy_node = format!("{}-kube-proxy", env.id);
    let node: Node = serde_json::from_value(json!({"metadata": {"name": proxy_node}})).unwrap();
    let api: Api<Node> = Api::all(env.client.clone());
    api.create(&PostParams::default(), &node).await.unwrap();
    let status = json!({"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
    }});
    api.patch_status(&proxy_node, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    proxy_node
}
