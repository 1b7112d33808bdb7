//! A stateful pod of a StatefulSet or a Deployment through a silent crash of its node, for the
//! benchmark's P3s. Kubernetes's own StatefulSet, Deployment and ReplicaSet controllers replace
//! the pod (on a control plane of its own that runs them); the rest of a cluster is played here as
//! it behaves:
//!
//! - the scheduler binds a pending pod to the first node, in order, that is Ready and carries no
//!   NoSchedule or NoExecute taint (its scoring is left out);
//! - the attacher attaches the volume to a pod's node once no other node holds an attachment of it
//!   (a DRBD volume is attached to one node at a time: Multi-Attach otherwise), at once (a real
//!   CSI attacher takes a second or so);
//! - the kubelets of the live nodes start a pod once its volume is attached there (image pulls and
//!   container start left out: a real kubelet adds seconds);
//! - DRBD on the survivors notices the silent crash within its default detection window
//!   (`ping-int` 10 s + `ping-timeout` 0.5 s, at a point of it each run chooses) and promotes
//!   node b, as drbd-reactor's promoter would.
//!
//! The crashed node's kubelet and agent stop at once and without a word (SIGKILL: its heartbeat
//! Lease runs out, it says nothing), and its DRBD is gone with it.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use super::TestEnv;
use super::drbd::{SimNode, healthy, lost};
use super::kubelet::shows_ready;
use super::process::Process;

/// DRBD's default detection window for a silent drop: `ping-int` 10 s + `ping-timeout` 0.5 s.
pub const DRBD_DEFAULT_DETECTION: Duration = Duration::from_millis(10_500);

#[derive(Clone, Copy, Debug)]
pub enum Workload {
    StatefulSet,
    Deployment,
}

impl Workload {
    fn manifest(self, claim: &str) -> (&'static str, serde_json::Value) {
        let template = json!({
            "metadata": {"labels": {"app": "p3s"}},
            "spec": {
                "containers": [{"name": "app", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            },
        });
        let spec = json!({"replicas": 1, "selector": {"matchLabels": {"app": "p3s"}}, "template": template});
        match self {
            Self::StatefulSet => {
                let mut spec = spec;
                spec["serviceName"] = json!("p3s");
                ("StatefulSet", spec)
            }
            Self::Deployment => ("Deployment", spec),
        }
    }
}

/// What one crash showed: when DRBD noticed it, and when the workload's pod was Running on another
/// node (`None`: not within [`WATCHED`]), both from the crash.
pub struct Crash {
    pub noticed: Duration,
    pub running_elsewhere: Option<Duration>,
}

/// How long a crash is watched for the pod to run elsewhere.
pub const WATCHED: Duration = Duration::from_secs(90);

/// Runs `workload` on node a of three with the agents at their defaults (`--fail-over-timeout`
/// 5 s), crashes node a, and times its pod running elsewhere. `phase` (0 to 1) is where in DRBD's
/// detection window the survivors notice.
pub async fn crash_under(env: &TestEnv, kubeconfig: &str, workload: Workload, phase: f64) -> Crash {
    let (nodes, pv) = three_nodes_at_drbd_defaults(env).await;
    let alive: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(nodes_by_name(&nodes).into_iter().collect()));
    let cluster = tokio::spawn(play_the_cluster(
        env.view(env.client.clone()),
        nodes_by_name(&nodes),
        pv.clone(),
        alive.clone(),
    ));
    run_on_node_a(env, &nodes, workload).await;
    let mut agents = agents_at_their_defaults(env, &nodes, kubeconfig).await;

    let crashed = Instant::now();
    agents.remove(0).kill().await;
    nodes[0].kubelet.stop();
    alive.lock().unwrap().remove(&nodes[0].name);
    let noticed = DRBD_DEFAULT_DETECTION.mul_f64(phase.clamp(0.0, 1.0));
    tokio::time::sleep(noticed.saturating_sub(crashed.elapsed())).await;
    lost(&nodes, &[&pv], 0, Some(1));
    let running_elsewhere = running_elsewhere_since(env, &nodes[0].name, crashed).await;

    cluster.abort();
    for agent in agents {
        agent.stop().await;
    }
    Crash {
        noticed,
        running_elsewhere,
    }
}

/// Three simulated nodes with DRBD's default net options, a ReadWriteOnce volume the pod mounts
/// itself (DRBD's block device on its node, not a share), node a its Primary.
async fn three_nodes_at_drbd_defaults(env: &TestEnv) -> (Vec<SimNode>, String) {
    let nodes = env.sim_nodes(&["a", "b", "c"]).await;
    for node in &nodes {
        node.set_net_options(json!({}));
    }
    let (_, pv) = env
        .bound_claim("data", "ReadWriteOnce", "replicated", Default::default())
        .await;
    let pv = pv.metadata.name.unwrap();
    healthy(&nodes, &[&pv], 0);
    (nodes, pv)
}

/// Creates the workload once every node is Ready and schedulable (a cluster that is up), and
/// waits for its pod to run on node a, the first in the scheduler's order.
async fn run_on_node_a(env: &TestEnv, nodes: &[SimNode], workload: Workload) {
    let names = nodes_by_name(nodes);
    super::eventually(
        "the three nodes Ready and schedulable",
        Duration::from_secs(60),
        || async {
            let mut schedulable_each = Vec::new();
            for name in &names {
                schedulable_each.push(schedulable(env, std::slice::from_ref(name)).await.is_some());
            }
            schedulable_each.iter().all(|&yes| yes).then_some(())
        },
    )
    .await;
    let (kind, spec) = workload.manifest("data");
    let object = json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "p3s"}, "spec": spec});
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &env.ns,
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("apps", "v1", kind)),
    );
    api.create(&PostParams::default(), &serde_json::from_value(object).unwrap())
        .await
        .expect("create the workload");
    super::eventually(
        "the workload's pod running on node a",
        Duration::from_secs(60),
        || async { running_on(env, &nodes[0].name).await.then_some(()) },
    )
    .await;
}

/// An agent per node with the product's defaults, which have heard the API server for their
/// fail-over timeout and reconcile interval, as in a cluster where they ran long before.
async fn agents_at_their_defaults(env: &TestEnv, nodes: &[SimNode], kubeconfig: &str) -> Vec<Process> {
    let defaults = [
        "--fail-over-timeout",
        "5s",
        "--reconcile-interval",
        "5s",
        "--drbd-status-interval",
        "5s",
    ];
    let mut agents = Vec::new();
    for node in nodes {
        agents.push(
            env.start_agent_with_env(node, &defaults, &[("KUBECONFIG", kubeconfig)])
                .await,
        );
    }
    tokio::time::sleep(Duration::from_secs(11)).await;
    agents
}

/// When, after `crashed`, a pod of the workload first runs on a node other than `lost`.
async fn running_elsewhere_since(env: &TestEnv, lost: &str, crashed: Instant) -> Option<Duration> {
    while crashed.elapsed() < WATCHED {
        if running_on_another(env, lost).await {
            return Some(crashed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

fn nodes_by_name(nodes: &[SimNode]) -> Vec<String> {
    nodes.iter().map(|n| n.name.clone()).collect()
}

async fn workload_pods(env: &TestEnv) -> Vec<Pod> {
    let pods: Api<Pod> = env.api();
    pods.list(&ListParams::default().labels("app=p3s"))
        .await
        .map(|list| list.items)
        .unwrap_or_default()
}

fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

async fn running_on(env: &TestEnv, node: &str) -> bool {
    workload_pods(env)
        .await
        .iter()
        .any(|p| running(p) && node_of(p) == Some(node))
}

async fn running_on_another(env: &TestEnv, node: &str) -> bool {
    workload_pods(env)
        .await
        .iter()
        .any(|p| running(p) && node_of(p).is_some_and(|n| n != node))
}

/// The scheduler, the attacher and the live nodes' kubelets, every 100 ms, until aborted.
async fn play_the_cluster(env: TestEnv, nodes: Vec<String>, pv: String, alive: Arc<Mutex<HashSet<String>>>) {
    loop {
        let _ = tokio::time::timeout(Duration::from_secs(5), one_turn(&env, &nodes, &pv, &alive)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn one_turn(env: &TestEnv, nodes: &[String], pv: &str, alive: &Mutex<HashSet<String>>) {
    let pods: Api<Pod> = env.api();
    let attachments: Api<VolumeAttachment> = Api::all(env.client.clone());
    for pod in workload_pods(env).await {
        if pod.metadata.deletion_timestamp.is_some() || running(&pod) {
            continue;
        }
        let name = pod.name_any();
        let Some(node) = node_of(&pod).map(str::to_owned) else {
            if let Some(node) = schedulable(env, nodes).await {
                let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                                     "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
                let _ = pods
                    .create_subresource::<_, serde_json::Value>("binding", &name, &PostParams::default(), &binding)
                    .await;
            }
            continue;
        };
        if !alive.lock().unwrap().contains(&node) {
            continue;
        }
        let Ok(held) = attachments.list(&ListParams::default()).await else {
            continue;
        };
        let of_volume: Vec<&VolumeAttachment> = held
            .items
            .iter()
            .filter(|a| a.spec.source.persistent_volume_name.as_deref() == Some(pv))
            .collect();
        if of_volume.iter().any(|a| a.spec.node_name != node) {
            continue; // Multi-Attach: another node still holds the volume.
        }
        if of_volume.is_empty() {
            let attachment: VolumeAttachment = serde_json::from_value(json!({
                "metadata": {"name": format!("{}-att-{node}", env.id)},
                "spec": {"attacher": "linstor.csi.linbit.com", "nodeName": node,
                         "source": {"persistentVolumeName": pv}},
            }))
            .unwrap();
            if attachments.create(&PostParams::default(), &attachment).await.is_err() {
                continue;
            }
        }
        let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        let _ = pods
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
            .await;
    }
}

/// The first node, in order, that is Ready and carries no NoSchedule or NoExecute taint.
async fn schedulable(env: &TestEnv, nodes: &[String]) -> Option<String> {
    let api: Api<Node> = Api::all(env.client.clone());
    for name in nodes {
        let Ok(node) = api.get(name).await else { continue };
        let repels = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|taints| {
                taints
                    .iter()
                    .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            });
        if shows_ready(&node) && !repels {
            return Some(name.clone());
        }
    }
    None
}
