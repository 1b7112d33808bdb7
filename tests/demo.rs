//! The demo (`make demo`), also run by `make test`: the controller and three agents over three
//! simulated DRBD nodes on the local control plane, a few RWX claims, the failure of the
//! primary's node, and the endpoints following the new primary — told as a story with timings.
//! Then the data path: a real NFS client writing through a claim's ClusterIP (kube-proxy's rules,
//! nfs-ganesha in the primary's network namespace) through a fail-over, with its outage.
//! A real Prometheus scrapes every process meanwhile, and every panel of the Grafana dashboard
//! must return data from it. Every step waits for the real outcome, so the demo fails (and exits
//! non-zero) when any step did not happen.

use std::time::{Duration, Instant};

use common::datapath::ProxyMode;
use common::drbd::SimNode;
use common::drbd::{cluster_events, drbd_taints, healthy, lost, node_monitor_grace_period, slice_addresses};
use common::node_loss::{lose_the_primarys_node, side_by_side};
use common::outage::{Scenario, client_through_a_fail_over};
use common::process::Process;
use common::process::sample_value;
use common::prometheus::{AGENT_JOB, CONTROLLER_JOB, Panels, Prometheus};
use common::{MOUNT_ENDPOINT, TestEnv, eventually, serving};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;

/// Long enough for Kubernetes to mark a lost node NotReady (50 s by default) and the agents to act.
fn wait() -> Duration {
    node_monitor_grace_period() + Duration::from_secs(40)
}
const CLAIMS: [&str; 3] = ["shared-1", "shared-2", "shared-3"];

struct Story {
    started: Instant,
}

impl Story {
    fn chapter(&self, title: &str) {
        println!("\n== {title}");
    }

    fn say(&self, line: impl AsRef<str>) {
        println!("[{:>6.2}s] {}", self.started.elapsed().as_secs_f64(), line.as_ref());
    }
}

#[tokio::test]
#[ignore = "needs a control plane: run `make demo` or `make test`"]
async fn demo() {
    let story = Story {
        started: Instant::now(),
    };
    story.chapter("1. Three storage nodes with simulated DRBD");
    let env = common::setup("demo").await;
    let nodes = env.sim_nodes(&["node-a", "node-b", "node-c"]).await;
    for node in &nodes {
        story.say(format!(
            "Node {} (InternalIP {}) with a fake drbdsetup in {}",
            node.name,
            node.ip,
            node.dir.display()
        ));
    }
    story.chapter("2. The controller and one HA agent per node");
    let (controller, mut agents, prometheus) = processes(&story, &env, &nodes).await;
    story.chapter("3. ReadWriteMany claims served from node-a");
    let claims = claims_on_node_a(&story, &env, &nodes).await;
    story.chapter("4. node-a fails");
    agents.remove(0).stop().await;
    node_a_fails(&story, &env, &nodes, &agents, &claims).await;
    story.chapter("5. DRBD promotes node-b: the endpoints follow");
    endpoints_follow(&story, &env, &nodes, &claims).await;
    story.chapter("6. Reconcile duration, from the controller's /metrics");
    reconcile_duration(&story, &controller).await;
    story.chapter("7. The Grafana dashboard against the real Prometheus");
    let (panels, queries) = prometheus.check_dashboard(Panels::ControlPlane).await;
    story.say(format!(
        "all {panels} panels ({queries} queries) return data; those of the clients' data path in chapter 10"
    ));
    plain_rules_hold(&prometheus, &story).await;
    story.chapter("8. Clean up");
    agents.push(controller);
    for process in agents {
        process.stop().await;
    }
    env.cleanup().await;
    story.say("processes stopped, objects deleted");
    story.chapter("9. The same loss, with the agents and with Kubernetes alone");
    with_the_agents_and_without(&story).await;
    story.chapter("10. A real NFS client through the ClusterIP, across a fail-over");
    let nfs = common::setup("demo-nfs").await;
    let scenario = Scenario::repaired(ProxyMode::Iptables);
    let outage = client_through_a_fail_over(&nfs, scenario, &|line| story.say(line), Some(&prometheus)).await;
    story.say(outage.to_string());
    drop(prometheus);
    nfs.cleanup().await;
    story.say("namespaces, links, NAT rules and NFS servers removed");
    story.say("the demo ran every step");
}

/// The claims of chapter 3: each with its PV, the ClusterIP and mount endpoint before the loss,
/// and node-a's VolumeAttachment of it.
struct Claims {
    pvs: Vec<String>,
    before: Vec<(String, String)>,
    attachments: Vec<String>,
}

impl Claims {
    /// The DRBD resources: the PVs' names.
    fn resources(&self) -> Vec<&str> {
        self.pvs.iter().map(String::as_str).collect()
    }
}

/// The controller and an agent per node, and a Prometheus scraping them all.
async fn processes(story: &Story, env: &TestEnv, nodes: &[SimNode]) -> (Process, Vec<Process>, Prometheus) {
    let controller = env.start_namespace_controller().await;
    story.say(format!(
        "controller ready (admin {}, logs {})",
        controller.admin,
        controller.log.display()
    ));
    let mut agents = Vec::new();
    for node in nodes {
        let agent = env.start_agent(node, &[]).await;
        story.say(format!("agent on {} ready (admin {})", node.name, agent.admin));
        agents.push(agent);
    }
    let prometheus = Prometheus::start(
        &env.ns,
        &[
            (CONTROLLER_JOB, vec![controller.admin]),
            (AGENT_JOB, agents.iter().map(|a| a.admin).collect()),
        ],
    )
    .await;
    story.say(format!(
        "Prometheus scraping all four every second at http://{}",
        prometheus.addr
    ));
    (controller, agents, prometheus)
}

async fn claims_on_node_a(story: &Story, env: &TestEnv, nodes: &[SimNode]) -> Claims {
    let mut pvs = Vec::new();
    for claim in CLAIMS {
        let (_, pv) = env.bound_rwx_claim(claim, serving(&nodes[0].endpoint())).await;
        pvs.push(pv.metadata.name.unwrap());
    }
    let resources: Vec<&str> = pvs.iter().map(String::as_str).collect();
    healthy(nodes, &resources, 0);
    let mut attachments = Vec::new();
    for (claim, pv) in CLAIMS.iter().zip(&pvs) {
        env.running_pod(&format!("{claim}-app"), &nodes[0].name, claim, json!({}), json!({}))
            .await;
        attachments.push(env.attachment(claim, pv, &nodes[0].name).await);
    }
    story.say(format!(
        "{} claims bound, DRBD primary on {}, one app pod and one VolumeAttachment each there",
        CLAIMS.len(),
        nodes[0].name
    ));
    let mut before = Vec::new();
    for (claim, pv) in CLAIMS.iter().zip(&pvs) {
        let mount = env.published_mount_endpoint(pv).await;
        let slice = eventually("the EndpointSlice", wait(), || async {
            let addresses = slice_addresses(env, pv).await;
            (addresses == [nodes[0].ip.clone()]).then_some(addresses)
        })
        .await;
        let cluster_ip = eventually("the Service's ClusterIP", wait(), || env.cluster_ip(pv)).await;
        story.say(format!(
            "{claim}: Service {pv} ClusterIP {cluster_ip}, EndpointSlice → {}:2049, mount endpoint {mount}",
            slice.join(",")
        ));
        before.push((cluster_ip, mount));
    }
    env.bound_rwx_claim("broken", serving("nfs.example.com:2049")).await;
    let warning = env.wait_for_events("broken", "InvalidServiceEndpoint").await;
    story.say(format!(
        "broken: a volume reporting a hostname gets a Warning and nothing else: {}",
        warning[0].note.as_deref().unwrap_or_default()
    ));
    Claims {
        pvs,
        before,
        attachments,
    }
}

/// Node-a's agent is stopped already: its kubelet stops and its DRBD links drop; the agents on the
/// others fail it over, and Kubernetes marks it NotReady.
async fn node_a_fails(story: &Story, env: &TestEnv, nodes: &[SimNode], agents: &[Process], claims: &Claims) {
    let resources = claims.resources();
    nodes[0].kubelet.stop();
    lost(nodes, &resources, 0, None);
    let failed = Instant::now();
    story.say(format!(
        "node-a's kubelet and agent stop; node-b and node-c see its DRBD connections drop (fail-over timeout 1s); \
         Kubernetes will mark it NotReady after node-monitor-grace-period ({:?})",
        node_monitor_grace_period()
    ));
    eventually("the lost-quorum taint", wait(), || async {
        drbd_taints(env, &nodes[0].name).await
    })
    .await;
    story.say(format!(
        "+{:.2}s node-a tainted drbd.linbit.com/lost-quorum:NoSchedule",
        failed.elapsed().as_secs_f64()
    ));
    // Node-a's agent and kubelet are silent and DRBD on b and c could take the data over (UpToDate,
    // may_promote): its pods cannot write and nothing on node-a can stop them. They are
    // force-deleted and their attachments released, Kubernetes showing node-a Ready or not.
    let pods: Api<Pod> = env.api();
    eventually("the pods force-deleted", wait(), || async {
        let left = pods.list(&Default::default()).await.unwrap().items.len();
        (left == 0).then_some(())
    })
    .await;
    story.say(format!(
        "+{:.2}s the {} app pods on node-a force-deleted: node-a's agent and kubelet are silent, and DRBD on node-b and node-c says they may take the data over, so node-a cannot write",
        failed.elapsed().as_secs_f64(),
        CLAIMS.len()
    ));
    eventually("the attachments deleted", wait(), || async {
        for name in &claims.attachments {
            if env.attachment_exists(name).await {
                return None;
            }
        }
        Some(())
    })
    .await;
    let ready = env.node_ready(&nodes[0].name).await;
    story.say(format!(
        "+{:.2}s the {} VolumeAttachments to node-a deleted; Kubernetes shows node-a {}",
        failed.elapsed().as_secs_f64(),
        claims.attachments.len(),
        if ready { "Ready still" } else { "NotReady" }
    ));
    env.wait_not_ready(&nodes[0].name).await;
    story.say(format!(
        "+{:.2}s Kubernetes marks node-a NotReady (its Lease went unrenewed)",
        failed.elapsed().as_secs_f64()
    ));
    cluster_events(env, &nodes[0].name, "NodeStorageQuorumLost").await;
    let (count, sum) = common::drbd::fail_over_durations(agents, CLAIMS.len()).await;
    story.say(format!(
        "storageos_drbd_agent_fail_over_duration_seconds: {count} volumes failed over, {:.2} s each on average, from the first sign of loss to the last step done",
        sum / count
    ));
}

async fn endpoints_follow(story: &Story, env: &TestEnv, nodes: &[SimNode], claims: &Claims) {
    let resources = claims.resources();
    lost(nodes, &resources, 0, Some(1));
    let promoted = Instant::now();
    for ((claim, pv), (cluster_ip, mount)) in CLAIMS.iter().zip(&claims.pvs).zip(&claims.before) {
        eventually("the EndpointSlice at node-b", wait(), || async {
            (slice_addresses(env, pv).await == [nodes[1].ip.clone()]).then_some(())
        })
        .await;
        let elapsed = promoted.elapsed();
        let now_ip = env.cluster_ip(pv).await.unwrap_or_default();
        let now_mount = env.pv_annotation(pv, MOUNT_ENDPOINT).await.unwrap_or_default();
        assert_eq!(&now_ip, cluster_ip, "the ClusterIP must not change");
        assert_eq!(&now_mount, mount, "the mount endpoint must not change");
        story.say(format!(
            "+{:.2}s {claim}: EndpointSlice → {}:2049; ClusterIP {now_ip} and mount endpoint {now_mount} unchanged",
            elapsed.as_secs_f64(),
            nodes[1].ip
        ));
    }

    let on_b = format!("on node {}", nodes[1].name);
    let told = env
        .claim_condition_says(CLAIMS[0], "True", "ServedAfterMove", &on_b)
        .await;
    story.say(format!(
        "kubectl describe pvc {}: SharedVolumeReady True (ServedAfterMove): {told}",
        CLAIMS[0]
    ));
}

async fn reconcile_duration(story: &Story, controller: &Process) {
    let (_, metrics) = controller.get("/metrics").await.expect("controller metrics");
    for q in [0.5, 0.9, 0.99] {
        let seconds = histogram_quantile(&metrics, "storageos_shared_volume_reconcile_duration_seconds", q);
        story.say(format!("p{:<2} {:>8.2} ms", (q * 100.0) as u32, seconds * 1000.0));
    }
    let count = sample_value(&metrics, "storageos_shared_volume_reconcile_duration_seconds_count").unwrap_or(0.0);
    let skipped = sample_value(&metrics, "storageos_shared_volume_reconciles_total{result=\"skipped\"}").unwrap_or(0.0);
    story.say(format!(
        "over {count} observations: reconciles of served claims ({skipped} skipped claims not observed)"
    ));
}

async fn with_the_agents_and_without(story: &Story) {
    story.say("two sets of three nodes, one claim each served from node a; node a lost in both at once");
    let settle = Duration::from_secs(10);
    let ((with, with_agents), (alone, kubernetes_alone)) = tokio::join!(
        lose_the_primarys_node("demo-agents", true, settle),
        lose_the_primarys_node("demo-alone", false, settle)
    );
    assert!(
        with_agents.endpoints_moved.is_some() && with_agents.attachment_released.is_some(),
        "with the agents, every step happened"
    );
    assert!(
        kubernetes_alone.not_ready.is_some() && kubernetes_alone.endpoints_moved.is_none(),
        "Kubernetes alone marked the node NotReady and moved no endpoint"
    );
    for line in side_by_side(&with_agents, &kubernetes_alone).lines() {
        story.say(line);
    }
    with.cleanup().await;
    alone.cleanup().await;
}

/// The plain rules file, loaded by a plain Prometheus scraping the jobs it documents: every rule
/// evaluates, the controller's leader is seen (no NoLeader while one leads), and the agent the
/// demo stopped on node-a is what SharedVolumeAgentDown's expression finds (its 5 minutes are
/// not waited for).
async fn plain_rules_hold(prometheus: &Prometheus, story: &Story) {
    let rules = prometheus.alerting_rules().await;
    assert!(rules.len() > 10, "the plain rules file is loaded: {rules:?}");
    for rule in &rules {
        assert_eq!(rule.health, "ok", "{rule:?} evaluates");
    }
    let rule = |name: &str| {
        rules
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    let no_leader = rule("SharedVolumeControllerNoLeader");
    assert_eq!(
        no_leader.state, "inactive",
        "a replica leads, and the plain rules see it"
    );
    let down = prometheus.query(&rule("SharedVolumeAgentDown").query).await;
    assert_eq!(
        down.len(),
        1,
        "SharedVolumeAgentDown's expression finds node-a's agent: {down:?}"
    );
    story.say(format!(
        "the plain rules file (docs/reference/prometheus-rules.yaml): {} alerts evaluate, NoLeader quiet, AgentDown's expression finds node-a's stopped agent",
        rules.len()
    ));
}

/// Prometheus's `histogram_quantile` over one histogram's cumulative buckets, as exposed.
fn histogram_quantile(exposition: &str, name: &str, q: f64) -> f64 {
    let prefix = format!("{name}_bucket{{le=\"");
    let buckets: Vec<(f64, f64)> = exposition
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (le, value) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, value.trim().parse().ok()?))
        })
        .collect();
    let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
    if total == 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in &buckets {
        if *count >= rank {
            if le.is_infinite() {
                return lower;
            }
            return lower + (le - lower) * (rank - below) / (count - below);
        }
        (lower, below) = (*le, *count);
    }
    lower
}
