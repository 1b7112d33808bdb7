//! The NFS data path end to end: NFS clients reach the claim's ClusterIP, translated by the real
//! kube-proxy (iptables mode; nftables mode with the repair) to an NFS server (nfs-ganesha) in the
//! primary's network namespace, and keep working through a fail-over that loses the primary's node
//! silently (its namespace drops every packet), without changing the address they use. Three
//! client models: a new connection per write (libnfs), and a connection held from a fixed source
//! port, closed normally or abortively before reconnecting from that port (the Linux kernel's NFS
//! client keeps its port). The conntrack repair is what lets the held connections follow. A fourth,
//! stateful one (NFSv4.1, an open file and a lock) checks that what a client holds survives too.
//! Each node's NFS server runs the install guide's ganesha template under the node's own hostname.

use std::time::Duration;

use common::datapath::{NfsGrace, ProxyMode, leftovers, service_chain_reaches};
use common::linstor_nfs::a_held_client_through_a_linstor_move;
use common::outage::{
    ClientModel, ClientOutage, Move, Moves, Outage, Scenario, client_through_a_fail_over, clients_through_fail_overs,
};
use common::quiet_move::a_move_no_client_here_mounts;
use common::server_probe::a_server_that_starts_late_then_dies;
use common::stateful::Tally;

/// Grace on, as a production server should run it, with the rule grace ≥ lease; shorter than
/// ganesha's defaults (lease 60 s, grace 90 s) so that the test waits 15 s, not 90.
const GRACE_ON: NfsGrace = NfsGrace::On {
    lease_seconds: 10,
    grace_seconds: 15,
};

/// What every client model must do with the repair on and grace off: reach the new primary
/// within this long of the loss (its last success before it to its first after).
const FOLLOWS_WITHIN: Duration = Duration::from_secs(5);

/// Two lock holders (one writing, one idle), a client asking for conflicting locks, one opening
/// new files: what a move must keep, and what it makes wait.
const HOLDERS_AND_OPENERS: [ClientModel; 4] = [
    ClientModel::Stateful,
    ClientModel::IdleHolder,
    ClientModel::LockTester,
    ClientModel::NewOpen,
];

/// The kernel's NFS client: two lock holders writing, one process opening new files.
const KERNEL_CLIENTS: [ClientModel; 3] = [
    ClientModel::KernelPosixWriter,
    ClientModel::KernelFlockWriter,
    ClientModel::KernelNewOpen,
];

/// What every stateful run of moves must show: nothing taken (2 locks held, none lost, no stale
/// handle, acknowledged writes all read back), the headline client through each move, every
/// client through the last.
fn everything_held_survived(moves: &Moves, who: &str) {
    eprintln!("{who} {} moves: {}", moves.outages.len(), moves.tally);
    assert_eq!(
        moves.lost,
        Vec::<(ClientModel, Tally)>::new(),
        "what the clients held survives every move"
    );
    assert_eq!(
        (moves.tally.locks, moves.tally.lost_locks, moves.tally.stale_handles),
        (2, 0, 0)
    );
    assert!(moves.tally.acknowledged > 0, "{}", moves.tally);
    for (step, outages) in &moves.outages {
        assert!(outages[0].total.is_some(), "{step}: {} carried on", outages[0].model);
    }
    let (last, outages) = moves.outages.last().unwrap();
    for outage in outages {
        assert!(outage.total.is_some(), "{last}: {} carried on", outage.model);
    }
}

/// `moves` with `scenario`'s clients on a data path of its own (one at a time), narrated.
async fn through_moves(name: &str, scenario: Scenario, moves: &[Move]) -> Moves {
    let _alone = DATA_PATH.lock().await;
    let env = common::setup(name).await;
    let say = |line: String| eprintln!("{line}");
    let moves = clients_through_fail_overs(&env, scenario, moves, &say).await;
    env.cleanup().await;
    moves
}

/// One data path at a time: they share the host's routes, rules and conntrack table.
static DATA_PATH: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn fail_over(name: &str, scenario: Scenario) -> Outage {
    let _alone = DATA_PATH.lock().await;
    let env = common::setup(name).await;
    let outage = client_through_a_fail_over(&env, scenario, &|line| eprintln!("{line}"), None).await;
    eprintln!("{outage}");
    assert!(
        outage.succeeded > 0 && outage.succeeded < outage.operations,
        "{outage:?}"
    );
    assert_eq!(
        outage.lost,
        Vec::<(ClientModel, Tally)>::new(),
        "what the clients held survives the move"
    );
    assert_eq!(leftovers(), Vec::<String>::new(), "the data path leaves nothing behind");
    env.cleanup().await;
    outage
}

fn every_client_followed_within(outage: &Outage, bound: Duration) {
    for client in &outage.clients {
        let total = client
            .total
            .unwrap_or_else(|| panic!("{} never reached the new primary:\n{outage}", client.model));
        assert!(total <= bound, "{} took {total:?}:\n{outage}", client.model);
    }
}

#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn every_client_follows_the_primary_in_seconds() {
    let outage = fail_over("datapath-repaired", Scenario::repaired(ProxyMode::Iptables)).await;
    every_client_followed_within(&outage, FOLLOWS_WITHIN);
}

/// The LINSTOR path as `share` and the agents set it up: the volume's NFS server listens on a port
/// of its own, and a node's server starts only once DRBD promotes the resource there and the
/// node's agent has written the drbd-reactor snippet naming that server's unit and port.
#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn a_volume_with_its_own_port_is_served_as_the_agents_snippets_say() {
    let scenario = Scenario {
        own_port: Some(20490),
        ..Scenario::repaired(ProxyMode::Iptables)
    };
    let outage = fail_over("datapath-own-port", scenario).await;
    every_client_followed_within(&outage, FOLLOWS_WITHIN);
}

#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn every_client_follows_the_primary_in_seconds_with_kube_proxy_in_nftables_mode() {
    let outage = fail_over("datapath-nft", Scenario::repaired(ProxyMode::Nftables)).await;
    every_client_followed_within(&outage, FOLLOWS_WITHIN);
}

#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn without_the_repair_a_client_reconnecting_from_its_port_stays_on_the_dead_node() {
    let scenario = Scenario {
        repair: None,
        patience: Duration::from_secs(15),
        ..Scenario::repaired(ProxyMode::Iptables)
    };
    let outage = fail_over("datapath-norepair", scenario).await;
    assert_eq!(
        outage.of(ClientModel::HeldNormalClose),
        None,
        "its conntrack entry still sends it to node a:\n{outage}"
    );
    assert!(
        outage
            .of(ClientModel::NewConnection)
            .is_some_and(|t| t <= FOLLOWS_WITHIN),
        "a new port each write takes the new rules:\n{outage}"
    );
    // The abortive client is not asserted: its RST ends the old entry, so whether it follows
    // depends on whether its next SYN went out before or after this node's rules changed (before,
    // it makes a new entry to the dead node that each retried SYN keeps). It is reported above.
}

/// The race: a stranded entry deleted before this node's kube-proxy rewrote the Service's rules is
/// made again through the old ones by the client's next packet. kube-proxy is held back 3 s after
/// the slice moved; the repair keeps sweeping until the rules are new.
#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn the_repair_outlasts_a_kube_proxy_that_rewrites_its_rules_late() {
    let late = Duration::from_secs(3);
    let scenario = Scenario {
        proxy_late: Some(late),
        ..Scenario::repaired(ProxyMode::Iptables)
    };
    let outage = fail_over("datapath-race", scenario).await;
    every_client_followed_within(&outage, FOLLOWS_WITHIN + late);
}

/// A node where no client mounts a moved volume has nothing to repair: the repair lists its table
/// at the move and once more when kube-proxy can have taken it, and kube-proxy's word ends the
/// sweep long before its 30 s window (until kube-proxy was asked, such a node listed its table
/// every 250 ms for the whole window).
#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn a_node_without_clients_of_a_moved_volume_lists_its_table_twice() {
    let _alone = DATA_PATH.lock().await;
    let env = common::setup("datapath-quiet").await;
    let within = Duration::from_secs(10);
    let quiet = a_move_no_client_here_mounts(&env, ProxyMode::Iptables, within).await;
    eprintln!("{quiet:?}");
    let quiet = quiet.unwrap_or_else(|| panic!("the move's sweep still runs {within:?} after the move"));
    // The repair follows every volume of the cluster: another test's move in the same seconds is
    // swept too, so what is asked holds for each sweep, not for a count of one.
    let sweeps = quiet.ended.get("kube-proxy").copied().unwrap_or(0.0);
    assert!(sweeps >= 1.0, "kube-proxy's word ended the move's sweep: {quiet:?}");
    assert_eq!(quiet.ended.len(), 1, "and nothing else ended one: {quiet:?}");
    assert!(
        quiet.listings <= 2.0 * sweeps + 1.0,
        "two listings a sweep, a third if a tick fell short: {quiet:?}"
    );
    assert_eq!(leftovers(), Vec::<String>::new(), "the data path leaves nothing behind");
    env.cleanup().await;
}

/// A volume LINSTOR CSI serves itself: its nfs-helper's slice moves (deleted, then made again by
/// the new primary) and a client holding its connection to the `linstor-csi-nfs` Service's port
/// follows through the real kube-proxy, because the repair follows nfs-helper's slices too.
/// Without them (`--linstor-nfs-service ""`, the repair as it was), the client stays on the dead
/// node.
#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn a_client_of_linstor_csis_own_rwx_follows_its_move() {
    let _alone = DATA_PATH.lock().await;
    let env = common::setup("datapath-linstor").await;
    let followed = a_held_client_through_a_linstor_move(&env, &[], Duration::from_secs(20)).await;
    eprintln!("with the repair following nfs-helper's slices: {followed:?}");
    let followed = followed.expect("the held client reached node b");
    assert!(followed <= FOLLOWS_WITHIN, "followed after {followed:?}");
    env.cleanup().await;

    let env = common::setup("datapath-linstor-off").await;
    let without =
        a_held_client_through_a_linstor_move(&env, &["--linstor-nfs-service", ""], Duration::from_secs(12)).await;
    eprintln!("with the repair following only this product's slices: {without:?}");
    assert_eq!(
        without, None,
        "without the repair the held client stays on the dead node"
    );
    assert_eq!(leftovers(), Vec::<String>::new(), "the data path leaves nothing behind");
    env.cleanup().await;
}

/// A primary is published only once its NFS server answers an RPC NULL call: until its server
/// starts, the endpoint stays unpublished and the agent says why; then it is published within
/// seconds. A server that dies while published is reported (an Event, the agent's gauge, the PV,
/// the claim's condition) and the endpoint stays: there is nowhere else to send the clients. Once
/// it answers again, the PV's word is taken back and the condition is ready again.
#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn a_primary_is_published_once_its_server_answers_and_a_dead_server_is_reported() {
    let _alone = DATA_PATH.lock().await;
    let env = common::setup("datapath-probe").await;
    let probed = a_server_that_starts_late_then_dies(&env).await;
    eprintln!("{probed:#?}");
    assert_eq!(
        probed.published_before, None,
        "not published before its server answered"
    );
    assert_eq!(probed.held_gauge, 1.0, "{probed:?}");
    assert!(
        probed.published_after <= Duration::from_secs(5),
        "published {:?} after its server started",
        probed.published_after
    );
    assert_eq!(probed.died_gauge, 1.0, "{probed:?}");
    assert!(probed.endpoint_after_death.is_some(), "the endpoint stays where it is");
    let endpoint = probed.endpoint_after_death.as_deref().unwrap();
    let said = probed.said_on_pv.as_deref().unwrap_or_default();
    assert!(
        said.contains(endpoint),
        "the PV says which server is silent: {probed:?}"
    );
    assert!(
        probed.condition_while_dead.contains(endpoint) && probed.condition_while_dead.contains("does not answer"),
        "{probed:?}"
    );
    assert!(
        probed.taken_back_after <= Duration::from_secs(10),
        "the word taken back {:?} after the server answered again",
        probed.taken_back_after
    );
    assert_eq!(leftovers(), Vec::<String>::new(), "the data path leaves nothing behind");
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn a_server_in_its_grace_period_holds_new_clients_until_it_ends() {
    let scenario = Scenario {
        grace: GRACE_ON,
        ..Scenario::repaired(ProxyMode::Iptables)
    };
    let on = fail_over("datapath-grace", scenario).await;
    // A new client opens nothing on a server in its grace period: the outage lasts at least
    // until the new primary's grace ends. A NULL call needs no state: held clients do not wait.
    assert!(
        on.reconnect.as_secs_f64() >= 0.8 * 15.0,
        "grace on: the client waited out the grace period: {on}"
    );
    for model in [ClientModel::HeldNormalClose, ClientModel::HeldAbortiveClose] {
        assert!(on.of(model).is_some_and(|t| t <= FOLLOWS_WITHIN), "{model}:\n{on}");
    }
}

/// What a client holds survives the move between two nodes of different hostnames, with grace
/// on: an NFSv4.1 client holding a file open and write-locked reclaims both on the new server
/// (same server scope), every write it was told reached stable storage reads back, and another
/// client finds the file locked before, during and after the move.
#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn a_stateful_clients_lock_and_acknowledged_writes_survive_the_move() {
    let scenario = Scenario {
        grace: GRACE_ON,
        clients: &[
            ClientModel::NewConnection,
            ClientModel::HeldNormalClose,
            ClientModel::HeldAbortiveClose,
            ClientModel::Stateful,
            ClientModel::LockTester,
        ],
        ..Scenario::repaired(ProxyMode::Iptables)
    };
    let outage = fail_over("datapath-stateful", scenario).await;
    assert!(
        outage.of(ClientModel::Stateful).is_some(),
        "the stateful client carried on after the move:\n{outage}"
    );
}

/// What clients hold survives a run of moves of each kind: a planned move from a to b (a drain:
/// the server stopped in order, DRBD demoted and promoted), b lost right after, inside b's grace
/// period (c serves), b back, c lost inside c's grace period (a serves again). Two clients hold a
/// file open and locked, one writing, one idle (it renews its lease at the kernel's pace); a third
/// asks for conflicting locks throughout; a fourth opens new files. Nothing is lost: every lock
/// held and never granted to another, every acknowledged write read back after each recovery and
/// at the end, no stale handle; and the writer gets through each move, every client the last.
#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn what_stateful_clients_hold_survives_a_run_of_moves_of_each_kind() {
    let scenario = Scenario {
        grace: GRACE_ON,
        clients: &HOLDERS_AND_OPENERS,
        ..Scenario::repaired(ProxyMode::Iptables)
    };
    let moves = [Move::planned(0, 1), Move::loss(1, 2), Move::loss(2, 0)];
    let moves = through_moves("datapath-moves", scenario, &moves).await;
    everything_held_survived(&moves, "over");
    assert_eq!(leftovers(), Vec::<String>::new(), "the data path leaves nothing behind");
}

/// The Linux kernel's own NFS client (Debian's cloud kernel under qemu, a pod behind the
/// kube-proxy node, `vers=4.1,hard`) through a planned move and a node loss inside the new
/// server's grace period: a process holding a POSIX lock and one holding a flock, each writing
/// fsync'd records, keep their locks (another process is still refused them), every
/// acknowledged record reads back, no call fails (no EIO, no ESTALE), the kernel never says it
/// lost state, and each writer gets through each move; a third process creating files gets
/// through the last.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a control plane and root: run `make test`"]
async fn the_kernels_nfs_client_keeps_its_locks_and_writes_across_moves() {
    let scenario = Scenario {
        grace: GRACE_ON,
        clients: &KERNEL_CLIENTS,
        ..Scenario::repaired(ProxyMode::Iptables)
    };
    let moves = [Move::planned(0, 1), Move::loss(1, 2)];
    let moves = through_moves("datapath-kernel", scenario, &moves).await;
    everything_held_survived(&moves, "kernel client over");
    assert_eq!(leftovers(), Vec::<String>::new(), "the data path leaves nothing behind");
}

/// The check above can fail: with the install guide's template less its `Server_Scope`, each
/// node's server has a scope of its own (ganesha's default, from the hostname), the kernel's
/// client takes the moved server for another one, reclaims nothing, and its lock is lost (the
/// kernel says so on its console, the holder's I/O fails, or another process gets the lock).
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs a control plane and root: run `make test`"]
async fn without_a_server_scope_of_its_own_the_kernels_client_loses_its_lock() {
    let scenario = Scenario {
        grace: GRACE_ON,
        clients: &[ClientModel::KernelPosixWriter],
        without_server_scope: true,
        patience: Duration::from_secs(20),
        ..Scenario::repaired(ProxyMode::Iptables)
    };
    let moves = through_moves("datapath-kernel-scope", scenario, &[Move::planned(0, 1)]).await;
    eprintln!(
        "kernel client without Server_Scope: {}: {:?}",
        moves.tally, moves.tally.wrong
    );
    let said = |w: &String| w.starts_with("the kernel said") && w.contains("lost");
    assert!(
        moves.tally.lost_locks >= 1 && moves.tally.wrong.iter().any(said),
        "the kernel's client lost its lock and said so: {}: {:?}",
        moves.tally,
        moves.tally.wrong
    );
}

/// A drain on the drbd-reactor path (the volume on its own port, servers started as the agents'
/// snippets say): node a is cordoned, its agent asks drbd-reactor to hand the volume over, and the
/// endpoint, the primary and the server end on node b. What the clients hold survives it; their
/// pauses are printed (a new open waits for the new server's grace period, unless every client
/// reclaimed early).
#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn a_drain_hands_the_volume_over_through_drbd_reactor() {
    holders_through_a_move_on_the_drbd_reactor_path("datapath-drain", Move::drain(0, 1)).await;
}

/// How long the writing lock holder may pause when the primary's server dies for good: from its
/// last write before the last crash to its first after, through the unit's failure, the
/// demotion, the peer's promotion and server start, the agent's publication and kube-proxy's
/// rule (drbd-reactor's and systemd's own steps take no time here: the simulation leaves them out).
const CRASH_MOVED_WITHIN: Duration = Duration::from_secs(10);

/// A crashed NFS server with the install guide's units: `shared-volume-serve` starts it again in
/// place while its restarts last, and the primary and the endpoint stay (asserted at each
/// restart, within 8 s of the crash); one crash more fails the unit, drbd-reactor (its rule for a
/// unit's failure, see `common::nfs_server`) stops the target with `target-as = BindsTo` and
/// demotes the resource, and a peer serves the volume. The clients keep what they held through it.
#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn a_crashed_server_restarts_in_place_and_one_that_stays_dead_moves_to_a_peer() {
    let outages = holders_through_a_move_on_the_drbd_reactor_path("datapath-crash", Move::crash(0, 1)).await;
    let writer = outages
        .iter()
        .find(|o| o.model == ClientModel::Stateful)
        .and_then(|o| o.total)
        .expect("the writing lock holder carried on");
    assert!(
        writer <= CRASH_MOVED_WITHIN,
        "the writing lock holder paused {writer:?} after the server died for good"
    );
}

/// Two lock holders, a lock tester and a new-file opener through one `step` on the drbd-reactor
/// path (the volume shared with a port of its own, each node's server started as its agent's
/// snippet says): nothing they held is lost, each carries on; what each saw, as printed.
async fn holders_through_a_move_on_the_drbd_reactor_path(name: &str, step: Move) -> Vec<ClientOutage> {
    let _alone = DATA_PATH.lock().await;
    let env = common::setup(name).await;
    let scenario = Scenario::shared_on_linstor(GRACE_ON, &HOLDERS_AND_OPENERS);
    let say = |line: String| eprintln!("{line}");
    let moves = clients_through_fail_overs(&env, scenario, &[step], &say).await;
    eprintln!("the {step}: {}", moves.tally);
    assert_eq!(
        moves.lost,
        Vec::<(ClientModel, Tally)>::new(),
        "what the clients held survives the {step}"
    );
    assert_eq!(
        (moves.tally.locks, moves.tally.lost_locks, moves.tally.stale_handles),
        (2, 0, 0)
    );
    let outages = moves.outages[0].1.clone();
    for outage in &outages {
        assert!(outage.total.is_some(), "{} carried on after the {step}", outage.model);
    }
    assert_eq!(leftovers(), Vec::<String>::new(), "the data path leaves nothing behind");
    env.cleanup().await;
    outages
}

/// How the harness tells that kube-proxy's nftables rules moved: kube-proxy 1.36's service chain
/// (a `numgen` map) and 1.37's (a Service of one endpoint DNATed to it directly).
#[test]
fn an_nftables_service_chain_names_its_endpoint() {
    const MAPPED: &str = "table ip kube-proxy {
\tchain service-GDWIIWMN-ns/pvc-1/tcp/nfs {
\t\tmeta l4proto tcp dnat ip to numgen random mod 1 map { 0 : 10.211.0.5 . 2049 }
\t}
\tchain service-AAAAAAAA-ns/pvc-2/tcp/nfs {
\t\tmeta l4proto tcp dnat ip to numgen random mod 1 map { 0 : 10.211.0.51 . 2049 }
\t}
}";
    const DIRECT: &str = "table ip kube-proxy {
\tchain service-GDWIIWMN-ns/pvc-1/tcp/nfs {
\t\tmeta l4proto tcp dnat to 10.211.0.5:2049
\t}
\tchain service-AAAAAAAA-ns/pvc-2/tcp/nfs {
\t\tmeta l4proto tcp dnat to 10.211.0.51:2049
\t}
}";
    for table in [MAPPED, DIRECT] {
        assert!(service_chain_reaches(table, "ns", "pvc-1", "10.211.0.5:2049"));
        assert!(!service_chain_reaches(table, "ns", "pvc-1", "10.211.0.5:20490"));
        assert!(!service_chain_reaches(table, "ns", "pvc-1", "10.211.0.51:2049"));
        assert!(!service_chain_reaches(table, "ns", "pvc-2", "10.211.0.5:2049"));
        assert!(!service_chain_reaches(table, "ns", "pvc-3", "10.211.0.5:2049"));
    }
}

/// The install guide's `shared-volume-serve` around a stand-in server (a `sleep` that writes
/// its pid): it starts the server again after each death while the deaths within the window are
/// at most its restarts, exits 1 on the one after, and forgets deaths older than the window. A
/// stop (SIGTERM) ends it and its server, with status 0.
#[test]
fn the_guides_serve_script_restarts_a_server_as_it_says_then_gives_up() {
    let pids = std::env::temp_dir().join(format!("svc-serve-{}", std::process::id()));
    let mut unit = serve_a_sleep(&pids, 2, 60);
    until_within_5s("the server started", || started(&pids).len() == 1);
    for count in 2..=3 {
        signal("-KILL", started(&pids).last().unwrap());
        until_within_5s("the server started again", || started(&pids).len() == count);
        assert!(unit.try_wait().unwrap().is_none(), "the unit runs on");
    }
    signal("-KILL", started(&pids).last().unwrap());
    until_within_5s("the unit given up", || unit.try_wait().unwrap().is_some());
    assert_eq!(unit.wait().unwrap().code(), Some(1));

    let mut unit = serve_a_sleep(&pids, 1, 1);
    until_within_5s("the server started", || started(&pids).len() == 1);
    for count in 2..=3 {
        std::thread::sleep(Duration::from_millis(1500));
        signal("-KILL", started(&pids).last().unwrap());
        until_within_5s("a death past the window restarted", || started(&pids).len() == count);
    }
    signal("-TERM", &unit.id().to_string());
    until_within_5s("the unit stopped", || unit.try_wait().unwrap().is_some());
    assert_eq!(unit.wait().unwrap().code(), Some(0));
    let last = started(&pids).pop().unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{last}")).exists(),
        "its server stopped with it"
    );
    let _ = std::fs::remove_file(pids);
}

/// `shared-volume-serve RESTARTS WINDOW` running a `sleep` that appends its pid to `pids`.
fn serve_a_sleep(pids: &std::path::Path, restarts: u32, window: u32) -> std::process::Child {
    std::fs::write(pids, "").unwrap();
    std::process::Command::new("sh")
        .args(["-c", common::nfs_server::serve_script(), "shared-volume-serve"])
        .args([restarts.to_string(), window.to_string()])
        .args(["sh", "-c", "echo $$ >>\"$0\"; exec sleep 600"])
        .arg(pids)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// The pids of the servers started so far, in order.
fn started(pids: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(pids).unwrap();
    text.lines().map(str::to_owned).collect()
}

fn signal(which: &str, pid: &str) {
    let pid = pid.parse().expect("a pid");
    assert!(common::nfs_server::signal(which, pid), "kill {which} {pid}");
}

fn until_within_5s(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what} within 5 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}
