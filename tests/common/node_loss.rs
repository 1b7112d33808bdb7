//! One node loss watched as a user would watch it, for the demo and the benchmark's P3: the
//! primary's node goes silent (kubelet, agent and DRBD links at once; DRBD promotes node b, as
//! its promoter would), with the agents running or with Kubernetes alone (no agents; the
//! controller still serves the claim). Nothing writes the node's readiness: Kubernetes's
//! node-lifecycle controller decides it from the missing Lease renewals.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::drbd::{SimNode, app_on_node_a, lost, node_monitor_grace_period, pod_state, slice_addresses};
use super::kubelet::shows_ready;
use super::process::Process;
use super::{TestEnv, eventually};

/// When each outcome was first seen, from the moment of the loss; `None`: not within `watched`.
#[derive(Default)]
pub struct Timeline {
    pub not_ready: Option<Duration>,
    pub tainted: Option<Duration>,
    /// Kubernetes's own `node.kubernetes.io/unreachable:NoExecute`: the pods' tolerations start.
    pub unreachable: Option<Duration>,
    pub pod_deleting: Option<Duration>,
    pub pod_deleted: Option<Duration>,
    pub attachment_released: Option<Duration>,
    pub endpoints_moved: Option<Duration>,
    pub watched: Duration,
}

/// One row of the side-by-side table: what, and what Kubernetes documents when it is not seen.
pub struct Outcome {
    pub what: &'static str,
    pub documented: &'static str,
    pub at: fn(&Timeline) -> Option<Duration>,
}

pub const OUTCOMES: [Outcome; 7] = [
    Outcome {
        what: "node NotReady",
        documented: "node-monitor-grace-period, 50 s by default",
        at: |t| t.not_ready,
    },
    Outcome {
        what: "node tainted unreachable:NoExecute",
        documented: "node-lifecycle, at NotReady (0.1 node/s per zone)",
        at: |t| t.unreachable,
    },
    Outcome {
        what: "node tainted drbd.linbit.com/lost-quorum",
        documented: "only the agents put it",
        at: |t| t.tainted,
    },
    Outcome {
        what: "pod evicted or deleted",
        documented: "taint-eviction: NotReady + the pod's 300 s toleration of node.kubernetes.io/unreachable",
        at: |t| t.pod_deleting,
    },
    Outcome {
        what: "pod gone",
        documented: "never without a kubelet: an evicted pod stays Terminating",
        at: |t| t.pod_deleted,
    },
    Outcome {
        what: "VolumeAttachment released",
        documented: "attach-detach: 6 min after the pod's eviction, about 11.5 min after the loss",
        at: |t| t.attachment_released,
    },
    Outcome {
        what: "endpoints at the new primary",
        documented: "never: nothing else moves a volume's NFS endpoints",
        at: |t| t.endpoints_moved,
    },
];

/// [`app_on_node_a`] for `test`, with an attachment on node a and its nodes in a zone of their
/// own; node a lost, and every outcome watched until all are seen or, with Kubernetes alone, until
/// NotReady is `after_not_ready` old. The caller cleans the test up.
pub async fn lose_the_primarys_node(test: &str, with_agents: bool, after_not_ready: Duration) -> (TestEnv, Timeline) {
    let (env, nodes, pv) = app_on_node_a(test).await;
    in_a_zone_of_their_own(&env, &nodes).await;
    let attachment = env.attachment("att", &pv, &nodes[0].name).await;
    let controller = env.start_namespace_controller().await;
    let wait = Duration::from_secs(60);
    eventually("the EndpointSlice at node a", wait, || async {
        (slice_addresses(&env, &pv).await == [nodes[0].ip.clone()]).then_some(())
    })
    .await;
    let mut agents: Vec<Process> = Vec::new();
    if with_agents {
        for node in &nodes {
            agents.push(env.start_agent(node, &[]).await);
        }
        // As in a cluster, where the agents ran long before the loss: a peer's silence counts
        // only once the API server has answered an agent for its fail-over timeout and
        // reconcile interval (1 s + 2 s here).
        tokio::time::sleep(Duration::from_secs(4)).await;
        agents.remove(0).stop().await;
    }

    nodes[0].kubelet.stop();
    let lost_at = Instant::now();
    lost(&nodes, &[&pv], 0, Some(1));
    let cap = node_monitor_grace_period() + after_not_ready + Duration::from_secs(30);
    let node_api = Api::<Node>::all(env.client.clone());
    let mut timeline = Timeline::default();
    loop {
        // Each outcome is timed when its answer came back.
        let seen = |at: &mut Option<Duration>, yes: bool| {
            if yes && at.is_none() {
                *at = Some(lost_at.elapsed());
            }
        };
        let pod = pod_state(&env, "app").await;
        let node = node_api.get(&nodes[0].name).await.expect("get Node");
        let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
        seen(&mut timeline.not_ready, !shows_ready(&node));
        seen(
            &mut timeline.tainted,
            taints.iter().any(|t| t.key.starts_with("drbd.linbit.com/")),
        );
        seen(
            &mut timeline.unreachable,
            taints
                .iter()
                .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute"),
        );
        seen(
            &mut timeline.pod_deleting,
            pod.as_ref().is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        );
        seen(&mut timeline.pod_deleted, pod.is_none());
        seen(
            &mut timeline.attachment_released,
            !env.attachment_exists(&attachment).await,
        );
        seen(
            &mut timeline.endpoints_moved,
            slice_addresses(&env, &pv).await == [nodes[1].ip.clone()],
        );
        let now = lost_at.elapsed();
        timeline.watched = now;
        let all_seen = OUTCOMES.iter().all(|o| (o.at)(&timeline).is_some());
        let long_enough = timeline.not_ready.is_some_and(|at| now >= at + after_not_ready);
        if (with_agents && all_seen) || (!with_agents && long_enough) || now >= cap {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for process in agents.into_iter().chain([controller]) {
        process.stop().await;
    }
    (env, timeline)
}

/// Labels `nodes` with a zone named after the test: the node-lifecycle controller rate-limits its
/// NoExecute taints per zone, and two runs' losses at once must not wait on each other's.
async fn in_a_zone_of_their_own(env: &TestEnv, nodes: &[SimNode]) {
    let zone = json!({"metadata": {"labels": {"topology.kubernetes.io/zone": env.ns}}});
    for node in nodes {
        Api::<Node>::all(env.client.clone())
            .patch(&node.name, &PatchParams::default(), &Patch::Merge(&zone))
            .await
            .expect("label the node's zone");
    }
}

/// The table of both runs, one outcome a line.
pub fn side_by_side(with_agents: &Timeline, alone: &Timeline) -> String {
    let cell = |timeline: &Timeline, outcome: &Outcome| match (outcome.at)(timeline) {
        Some(at) => format!("{:.2} s", at.as_secs_f64()),
        None => format!("not in {:.0} s", timeline.watched.as_secs_f64()),
    };
    let mut table = format!(
        "{:<42} {:>14} {:>16}  {}\n",
        "after the node's loss", "with the agents", "Kubernetes alone", "Kubernetes documents"
    );
    for outcome in &OUTCOMES {
        let _ = writeln!(
            table,
            "{:<42} {:>14} {:>16}  {}",
            outcome.what,
            cell(with_agents, outcome),
            cell(alone, outcome),
            outcome.documented
        );
    }
    let _ = write!(
        table,
        "(node-monitor-grace-period {:?}; the agents' fail-over timeout 1 s)",
        node_monitor_grace_period()
    );
    table
}
