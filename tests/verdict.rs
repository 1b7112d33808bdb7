//! End-to-end tests of the rule that destructive fail-over rests on DRBD's verdict, not on
//! silence: the README's layout (a Primary on a, b diskful, c a diskless tie-breaker on a node
//! that runs no agent), a simulated DRBD that outdates b when a goes on without it, real agent
//! processes and the real control plane. Each test holds for a while what must never happen,
//! then checks that a real loss is still handled in bounded time.
//!
//! `SVC_VERDICT_HOLD_SECONDS` (default 45: 45 fail-over timeouts of the tests' agents, past every
//! allowance of their silence rules and the tests' NotReady grace) sets how long; the issue that
//! asked for this test named 120 s.

use std::time::{Duration, Instant};

use common::accounts::admin_kubeconfig;
use common::drbd::{LOST_QUORUM, SimNode, app_on_node_a, drbd_taints, pod_then_attachment_gone, teardown, untouched};
use common::drbd_mesh::Mesh;
use common::faulty_api::{Fault, FaultyApi};
use common::process::Process;

/// How long nothing may happen to the healthy primary.
fn hold() -> Duration {
    let seconds = std::env::var("SVC_VERDICT_HOLD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok());
    Duration::from_secs(seconds.unwrap_or(45))
}

/// A layout of three nodes: a Primary with its pod `app` and attachment, b diskful, c diskless
/// without an agent (the README's, the chart's nodeSelector leaving c out) or diskful with one.
enum Layout {
    TieBreaker,
    ThreeDiskful,
}

type Scene = (common::TestEnv, Vec<SimNode>, String, Mesh, String, Vec<Process>);

async fn set_up(test: &str, layout: Layout) -> Scene {
    set_up_through(test, layout, None).await
}

/// [`set_up`], the agents reaching the API server through `api` when given.
async fn set_up_through(test: &str, layout: Layout, api: Option<&FaultyApi>) -> Scene {
    let (env, nodes, pv) = app_on_node_a(test).await;
    let (diskless, with_agents): (&[usize], usize) = match layout {
        Layout::TieBreaker => (&[2], 2),
        Layout::ThreeDiskful => (&[], 3),
    };
    let mut mesh = Mesh::over(&pv, &nodes, diskless);
    mesh.promote(0).unwrap();
    mesh.write(&nodes);
    let attachment = env.attachment("att", &pv, &nodes[0].name).await;
    let mut agents = Vec::new();
    let through = api.map(|api| api.kubeconfig_through(&env.chart_kubeconfig(&admin_kubeconfig(), "agent", &[])));
    let kubeconfig: Vec<(&str, &str)> = through.iter().map(|path| ("KUBECONFIG", path.as_str())).collect();
    for node in &nodes[..with_agents] {
        agents.push(env.start_agent_with_env(node, &[], &kubeconfig).await);
    }
    // Every agent has stated its view.
    tokio::time::sleep(Duration::from_secs(3)).await;
    (env, nodes, pv, mesh, attachment, agents)
}

/// Asserts for [`hold`] that node a keeps its pod, its attachment and no taint.
async fn nothing_happens_to_a(env: &common::TestEnv, a: &SimNode, attachment: &str, why: &str) {
    let since = Instant::now();
    while since.elapsed() < hold() {
        assert!(
            untouched(env, "app").await,
            "{why}: a's pod evicted or deleted after {:?}",
            since.elapsed()
        );
        assert!(
            env.attachment_exists(attachment).await,
            "{why}: a's attachment deleted after {:?}",
            since.elapsed()
        );
        assert_eq!(
            drbd_taints(env, &a.name).await,
            None,
            "{why}: a tainted after {:?}",
            since.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The a–b link comes back (b in sync again), then a loses every link: b may take the data over.
/// Waits for a's pod and attachment to be gone, and says how long that took.
async fn a_really_loses_quorum(
    env: &common::TestEnv,
    nodes: &[SimNode],
    mesh: &mut Mesh,
    attachment: &str,
) -> Duration {
    mesh.heal(0, 1);
    mesh.write(nodes);
    tokio::time::sleep(Duration::from_secs(2)).await;
    mesh.isolate(0);
    mesh.write(nodes);
    let lost = Instant::now();
    pod_then_attachment_gone(env, "app", attachment, Duration::from_secs(20)).await;
    lost.elapsed()
}

/// a's agent goes down (a rollout, an OOM kill) and meanwhile the a–b link drops: a keeps quorum
/// through c and goes on writing, its kubelet renews, DRBD outdates b. b's agent does nothing to
/// a: its own disk is Outdated. The old rule took a for crashed and force-deleted its pod. Once
/// the link is back (b in sync again) and a really loses quorum, a's pod is evicted (its kubelet
/// lives and finishes the eviction) and the attachment released.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn a_healthy_primary_whose_agent_restarts_keeps_its_pod_and_attachment() {
    let (env, nodes, pv, mut mesh, attachment, mut agents) = set_up("verdict-agent-down", Layout::TieBreaker).await;
    let a = &nodes[0];
    agents.remove(0).kill().await;
    mesh.cut(0, 1);
    mesh.write(&nodes);
    assert!(mesh.is_outdated(1));
    // Meanwhile a's kubelet misses renewals for 20 s (one that failed, retried at once, then
    // its period): b may see it quiet, even NotReady with the tests' short grace.
    a.kubelet.stop();
    tokio::time::sleep(Duration::from_secs(20)).await;
    a.kubelet.resume();
    nothing_happens_to_a(&env, a, &attachment, "a's agent down, b Outdated").await;
    let held = common::drbd::cluster_events(&env, &pv, "FailOverHeld").await;
    assert!(
        held.iter()
            .filter_map(|e| e.note.as_deref())
            .any(|n| n.contains("Outdated")),
        "the hold says b's disk is Outdated: {:?}",
        held.iter().map(|e| e.note.clone()).collect::<Vec<_>>()
    );

    let took = a_really_loses_quorum(&env, &nodes, &mut mesh, &attachment).await;
    eprintln!("a isolated with its kubelet alive: pod evicted and attachment released after {took:?}");
    assert!(env.taints(&a.name).await.iter().any(|t| t == LOST_QUORUM));
    teardown(env, agents).await;
}

/// a is cut off from the API server alone: its agent and kubelet quiet (its Node goes NotReady),
/// its DRBD links to c intact, the a–b link down, b Outdated. Nothing is done to a: b could not
/// take the data over. Once b is back in sync and a really loses quorum, a's pod is force-deleted
/// (its node cannot run anything) and the attachment released.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn a_primary_cut_off_from_the_api_server_alone_keeps_its_pod_and_attachment() {
    let scene = set_up("verdict-api-cut", Layout::TieBreaker).await;
    cut_off_from_the_api_then_lost(scene, "tie-breaker").await;
}

/// The same over three diskful nodes, c's agent stopped as well: a goes on with quorum through c,
/// DRBD outdates b, and b's agent, the only one left, does nothing to a until a really loses
/// quorum.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn three_diskful_nodes_with_one_agent_stopped_keep_a_primary_cut_off_from_the_api() {
    let mut scene = set_up("verdict-three", Layout::ThreeDiskful).await;
    scene.5.remove(2).kill().await;
    cut_off_from_the_api_then_lost(scene, "three diskful").await;
}

/// a's agent and kubelet go quiet and the a–b link drops (b Outdated): nothing happens to a for
/// [`hold`]; then a really loses quorum and its pod and attachment go within the bound.
async fn cut_off_from_the_api_then_lost(scene: Scene, layout: &str) {
    let (env, nodes, _pv, mut mesh, attachment, mut agents) = scene;
    let a = &nodes[0];
    agents.remove(0).kill().await;
    a.kubelet.stop();
    mesh.cut(0, 1);
    mesh.write(&nodes);
    assert!(mesh.is_outdated(1));
    let why = format!("{layout}: a cut off from the API server, b Outdated");
    nothing_happens_to_a(&env, a, &attachment, &why).await;
    let took = a_really_loses_quorum(&env, &nodes, &mut mesh, &attachment).await;
    eprintln!("{layout}: a NotReady and isolated: pod force-deleted and attachment released after {took:?}");
    teardown(env, agents).await;
}

/// a crashes (its agent and kubelet stop, every link drops) while the API server the other agents
/// reach fails one read in five. Their silence rules hold (the API server is not answering every
/// call), so Kubernetes's NotReady decides, and a failed read of a's Node or pods keeps the count
/// of how long it has been NotReady: a's pod is force-deleted within NotReady (the tests' 8 s
/// grace) and the documented hold for it (`--fail-over-timeout` + `--reconcile-interval` + 10 s:
/// 13 s), a few rounds of slack. The old rule started the count over at every failed read.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn a_crashed_node_behind_an_api_server_failing_one_read_in_five_loses_its_pod_in_bounded_time() {
    let api = FaultyApi::start(&admin_kubeconfig(), Fault::FailEveryRead(5));
    let (env, nodes, _pv, mut mesh, attachment, mut agents) =
        set_up_through("verdict-flaky-api", Layout::ThreeDiskful, Some(&api)).await;
    agents.remove(0).kill().await;
    nodes[0].kubelet.stop();
    mesh.isolate(0);
    mesh.write(&nodes);
    let crashed = Instant::now();
    // NotReady at 9 s (grace and monitor period), the hold 13 s later, four rounds of slack.
    let moved = pod_then_attachment_gone(&env, "app", &attachment, Duration::from_secs(30)).await - crashed;
    let (failed, reads) = api.failed_of_reads();
    eprintln!(
        "crashed behind a flaky API server: pod force-deleted after {moved:?} ({failed} of {reads} reads failed)"
    );
    assert!(
        failed * 5 >= reads - 4 && failed > 10,
        "the API server failed {failed} of {reads} reads"
    );
    teardown(env, agents).await;
}

/// Two API servers behind one address, their clocks 10 s apart: about half of the Lease writes
/// carry stamps 10 s early, the agents' own and their peers' alike, and a's kubelet renews its
/// Lease every 10 s as a real one does. In the README's layout the a–b link drops (a goes on
/// with quorum through the tie-breaker c, DRBD outdates b): nothing happens to a for [`hold`], its agent and
/// kubelet renewing on. Then a really loses quorum, its agent and kubelet alive: its pod is
/// evicted (its kubelet finishes the eviction), never force-deleted, and the attachment released
/// within the bound. The old rule aged each renewal by its stamp: a kubelet Lease written through
/// the second server looked 13 s old 3 s after the write, an agent's heartbeat 3 s after it, and
/// a node both of whose last writes went that way looked crashed, with no third agent to speak
/// for it.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn lease_renewals_stamped_by_two_api_servers_10s_apart_leave_a_live_primary_alone() {
    let api = FaultyApi::start(&admin_kubeconfig(), Fault::TwoClocksApart(Duration::from_secs(10)));
    let (env, nodes, _pv, mut mesh, attachment, agents) =
        set_up_through("verdict-two-clocks", Layout::TieBreaker, Some(&api)).await;
    nodes[0].kubelet.renew_lease_every(Duration::from_secs(10));
    mesh.cut(0, 1);
    mesh.write(&nodes);
    assert!(mesh.is_outdated(1));
    nothing_happens_to_a(&env, &nodes[0], &attachment, "two API servers 10 s apart, b Outdated").await;
    let took = a_really_loses_quorum(&env, &nodes, &mut mesh, &attachment).await;
    eprintln!("two API servers 10 s apart: a isolated, pod evicted and attachment released after {took:?}");
    for agent in &agents {
        let forced = agent
            .metric("storageos_drbd_agent_actions_total{action=\"force_delete\",result=\"ok\"}")
            .await;
        assert_eq!(forced, 0.0, "a's pod force-deleted though its kubelet renews");
    }
    assert!(api.restamped() > 10, "only {} Leases seen restamped", api.restamped());
    teardown(env, agents).await;
}
