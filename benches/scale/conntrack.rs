//! P11: what the conntrack repair costs on a node with a big table. Before (the `conntrack` tool,
//! as the repair ran it until ctnetlink: `conntrack -L` per sweep and one `conntrack -D` per
//! stranded flow, each a dump of the table of its own) and after (the repair's own table: one
//! ctnetlink dump filtered in the kernel, deletes by reply tuple on one socket), side by side in
//! one run, on a table of the benchmark's own: a network namespace filled with TCP entries to
//! other ports, plus the volume's flows.
//!
//! CPU is the process's user and system time over the operation (the tool's as a child process),
//! so the kernel's walk of the table is counted. A move's cost on a node with no client is one
//! sweep's times the sweeps the rule makes: before, the window over the sweep period (nothing ends
//! it early on such a node); after, two (at the move, and once kube-proxy's word can end it).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use shared_volume_controller::{ConntrackTable, Flow};

use super::Figure;

/// The repair's defaults: a moved volume is swept every 250 ms for at most 30 s.
const SWEEP_PERIOD: Duration = Duration::from_millis(250);
const SWEEPS_BEFORE: f64 = 120.0;
const SWEEPS_AFTER: f64 = 2.0;
/// Repetitions of each measured operation; the median is reported.
const REPEATS: usize = 5;
const NFS_PORT: u16 = 2049;
/// Where the stranded flows were bound, and where their volumes went.
const OLD_BACKEND: &str = "10.211.1.2:2049";

pub async fn repair_at_table_sizes(tables: &[usize], mass_volumes: usize, mass_table: usize) -> Vec<Figure> {
    let mut figures = Vec::new();
    for &entries in tables {
        let node = Node::new(entries + mass_volumes).await;
        node.fill(entries).await;
        figures.extend(one_client(&node, entries).await);
    }
    let node = Node::new(mass_table + mass_volumes).await;
    node.fill(mass_table).await;
    figures.extend(mass_move(&node, mass_table, mass_volumes).await);
    figures
}

/// Per table size: a sweep with one stranded flow, a move on a node without clients, and a
/// client's repair once the rules changed.
async fn one_client(node: &Node, entries: usize) -> Vec<Figure> {
    let stranded = vec![volume_flow(0)];
    let after = node.median(|| node.after(&stranded)).await;
    let before = node.median(|| node.before(&stranded)).await;
    let listing_after = node.median(|| node.after(&[])).await;
    let listing_before = node.median(|| node.before(&[])).await;
    println!(
        "P11 {entries} entries: sweep after {:.1} ms CPU / {:.1} ms wall, before {:.1} / {:.1}",
        after.cpu_ms, after.wall_ms, before.cpu_ms, before.wall_ms
    );
    let at_100k = entries == 100_000;
    let move_after = listing_after.cpu_ms * SWEEPS_AFTER;
    let repair = SWEEP_PERIOD.as_secs_f64() * 1000.0 + after.wall_ms;
    let mut figures = cpu_and_wall(
        "P11s",
        "one sweep, one stranded flow (dumps: 1 vs 2)",
        entries,
        after,
        before,
    );
    figures.extend([
        figure(
            "P11m",
            "a move on a node without clients, CPU ms (2 sweeps vs 120)".into(),
            entries,
            move_after,
            listing_before.cpu_ms * SWEEPS_BEFORE,
            if at_100k {
                "<= 50 ms at 100,000".into()
            } else {
                "-".into()
            },
            !at_100k || move_after <= 50.0,
        ),
        figure(
            "P11r",
            "a client's repair after its rules changed, ms (sweep period + sweep)".into(),
            entries,
            repair,
            SWEEP_PERIOD.as_secs_f64() * 1000.0 + before.wall_ms,
            if entries == 1_000_000 {
                "<= 1000 ms at 1,000,000".into()
            } else {
                "-".into()
            },
            entries != 1_000_000 || repair <= 1000.0,
        ),
    ]);
    figures
}

/// `volumes` volumes move at once, each with one client flow on this node.
async fn mass_move(node: &Node, entries: usize, volumes: usize) -> Vec<Figure> {
    let stranded: Vec<Flow> = (0..volumes).map(volume_flow).collect();
    let after = node.median(|| node.after(&stranded)).await;
    // Once: the tool's mass move takes minutes.
    let before = node.before(&stranded).await;
    println!(
        "P11 mass move of {volumes} volumes at {entries} entries: after {:.1} ms CPU / {:.1} ms wall, before {:.1} / {:.1}",
        after.cpu_ms, after.wall_ms, before.cpu_ms, before.wall_ms
    );
    let what = format!("a sweep of a mass move of {volumes} volumes");
    cpu_and_wall("P11x", &what, entries, after, before)
}

/// A repair's CPU and wall time beside the tool's, one line each; one table read per sweep is
/// what the repair's CPU line stands for.
fn cpu_and_wall(id: &'static str, what: &str, entries: usize, after: Cost, before: Cost) -> Vec<Figure> {
    vec![
        figure(
            id,
            format!("{what}, CPU ms"),
            entries,
            after.cpu_ms,
            before.cpu_ms,
            "one table read per sweep".into(),
            true,
        ),
        figure(
            id,
            format!("{what}, wall ms"),
            entries,
            after.wall_ms,
            before.wall_ms,
            "-".into(),
            true,
        ),
    ]
}

fn figure(id: &'static str, what: String, n: usize, product: f64, floor: f64, target: String, met: bool) -> Figure {
    Figure {
        id,
        what,
        n,
        product,
        floor: Some(floor),
        unit: "ms",
        target,
        met,
    }
}

/// The client flow of volume `i`: its ClusterIP, bound to the old backend.
fn volume_flow(i: usize) -> Flow {
    let client = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 211, 0, 1)), 10_000 + i as u16);
    let mount = Ipv4Addr::new(10, 97, (i / 250) as u8, (i % 250) as u8 + 1);
    Flow {
        orig_src: client,
        orig_dst: SocketAddr::new(IpAddr::V4(mount), NFS_PORT),
        reply_src: OLD_BACKEND.parse().unwrap(),
        reply_dst: client,
        state: "ESTABLISHED",
    }
}

/// Entry `i` of the rest of the table: a TCP flow to another port, from its own address.
fn other_flow(i: usize) -> Flow {
    let [_, a, b, c] = (i as u32).to_be_bytes();
    let client = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, a, b, c)), 40_000);
    Flow {
        orig_src: client,
        orig_dst: "10.96.0.1:443".parse().unwrap(),
        reply_src: "10.244.0.1:8443".parse().unwrap(),
        reply_dst: client,
        state: "ESTABLISHED",
    }
}

#[derive(Clone, Copy, Debug)]
struct Cost {
    cpu_ms: f64,
    wall_ms: f64,
}

/// A network namespace of the benchmark's own, and the machine's conntrack limit raised for it;
/// both put back on drop.
struct Node {
    netns: String,
    table: ConntrackTable,
    max_before: Option<u64>,
}

const CONNTRACK_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

impl Node {
    async fn new(entries: usize) -> Self {
        let netns = format!("svcbench-ct-{}", std::process::id());
        // One left by an interrupted run.
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &netns])
            .stderr(std::process::Stdio::null())
            .status();
        assert!(
            command("ip", &["netns", "add", &netns]),
            "ip netns add {netns} (needs root)"
        );
        let current: Option<u64> = std::fs::read_to_string(CONNTRACK_MAX)
            .ok()
            .and_then(|text| text.trim().parse().ok());
        let count: u64 = std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0);
        let needed = entries as u64 + count + 50_000;
        let max_before = current.filter(|max| *max < needed);
        if max_before.is_some() {
            std::fs::write(CONNTRACK_MAX, needed.to_string()).expect("raise nf_conntrack_max");
        }
        let table = ConntrackTable {
            netns: Some(PathBuf::from("/run/netns").join(&netns)),
            timeout: Duration::from_secs(120),
        };
        Self {
            netns,
            table,
            max_before,
        }
    }

    async fn fill(&self, entries: usize) {
        let started = Instant::now();
        for chunk in (0..entries).collect::<Vec<_>>().chunks(50_000) {
            let flows = chunk.iter().map(|&i| other_flow(i)).collect();
            self.table.insert(flows, 3600).await.expect("fill the table");
        }
        println!("P11 {entries} entries made in {:.1} s", started.elapsed().as_secs_f64());
    }

    /// One sweep of the repair as it is: a dump, then the deletes of `stranded` (made first).
    async fn after(&self, stranded: &[Flow]) -> Cost {
        self.strand(stranded).await;
        let (cpu, started) = (cpu_now(), Instant::now());
        let listed = self.table.list(false, NFS_PORT).await.expect("dump");
        let found: Vec<Flow> = listed.into_iter().filter(|f| stranded.contains(f)).collect();
        assert_eq!(found.len(), stranded.len(), "the dump holds every stranded flow");
        if !found.is_empty() {
            let answers = self.table.delete(found).await.expect("delete");
            assert!(
                answers.iter().all(|a| matches!(a, Ok(1))),
                "every stranded flow deleted"
            );
        }
        cost(cpu, started)
    }

    /// One sweep as the repair ran it with the tool: `conntrack -L`, then one `conntrack -D` per
    /// stranded flow.
    async fn before(&self, stranded: &[Flow]) -> Cost {
        self.strand(stranded).await;
        let (cpu, started) = (cpu_now(), Instant::now());
        let port = NFS_PORT.to_string();
        let listing = ["-L", "-f", "ipv4", "-p", "tcp", "--orig-port-dst", &port];
        assert!(self.tool(&listing), "conntrack -L");
        for flow in stranded {
            let [src, dst, reply] = [flow.orig_src, flow.orig_dst, flow.reply_src].map(|a| a.ip().to_string());
            let [sport, dport, rport] = [flow.orig_src, flow.orig_dst, flow.reply_src].map(|a| a.port().to_string());
            let delete = [
                "-D",
                "-f",
                "ipv4",
                "-p",
                "tcp",
                "--orig-src",
                &src,
                "--orig-dst",
                &dst,
                "--orig-port-src",
                &sport,
                "--orig-port-dst",
                &dport,
                "--reply-src",
                &reply,
                "--reply-port-src",
                &rport,
            ];
            assert!(self.tool(&delete), "conntrack -D");
        }
        cost(cpu, started)
    }

    /// Makes `stranded`'s entries (again).
    async fn strand(&self, stranded: &[Flow]) {
        if !stranded.is_empty() {
            self.table.insert(stranded.to_vec(), 3600).await.expect("strand");
        }
    }

    fn tool(&self, args: &[&str]) -> bool {
        let mut all = vec!["netns", "exec", &self.netns, "conntrack"];
        all.extend_from_slice(args);
        std::process::Command::new("ip")
            .args(&all)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    async fn median<F: std::future::Future<Output = Cost>>(&self, run: impl Fn() -> F) -> Cost {
        let mut costs = Vec::with_capacity(REPEATS);
        for _ in 0..REPEATS {
            costs.push(run().await);
        }
        let middle = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        Cost {
            cpu_ms: middle(costs.iter().map(|c| c.cpu_ms).collect()),
            wall_ms: middle(costs.iter().map(|c| c.wall_ms).collect()),
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = command("ip", &["netns", "del", &self.netns]);
        if let Some(max) = self.max_before {
            let _ = std::fs::write(CONNTRACK_MAX, max.to_string());
        }
    }
}

fn command(program: &str, args: &[&str]) -> bool {
    std::process::Command::new(program)
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

/// This process's and its finished children's CPU time so far.
#[allow(unsafe_code)]
fn cpu_now() -> Duration {
    let of = |who| {
        // SAFETY: getrusage fills the struct it is given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut usage) };
        let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        time(usage.ru_utime) + time(usage.ru_stime)
    };
    of(libc::RUSAGE_SELF) + of(libc::RUSAGE_CHILDREN)
}

fn cost(cpu: Duration, started: Instant) -> Cost {
    Cost {
        cpu_ms: cpu_now().saturating_sub(cpu).as_secs_f64() * 1000.0,
        wall_ms: started.elapsed().as_secs_f64() * 1000.0,
    }
}
