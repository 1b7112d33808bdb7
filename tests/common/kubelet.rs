//! A fake kubelet for a simulated node: it posts the node Ready and renews the node's Lease in
//! `kube-node-lease`, as a real kubelet does, so that Kubernetes's own node-lifecycle controller
//! (run by `hack/cluster.sh`) decides the node's readiness. Stopping it is how a test loses a node:
//! the controller marks the node NotReady once the Lease is older than its grace period.
//!
//! It beats every second (a real kubelet: every 10 s against a 40 s Lease) on a thread and a client
//! of its own, so that a test blocked in a subprocess, or a busy runtime, cannot starve it into a
//! node loss nobody asked for.
//!
//! Like a live kubelet, it finishes what the API asks of its pods: a pod on its node that is being
//! deleted (evicted, say) is deleted for good at its next beat, its containers taken as stopped.
//! What it leaves out: containers (none run), the pod's grace period (they stop at once), and
//! status updates other than the node's Ready condition.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const BEAT: Duration = Duration::from_secs(1);
/// One beat's requests give up after this: the API server may be restarting (the fault tests).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

pub struct Kubelet {
    node: String,
    config: kube::Config,
    beating: Mutex<Option<Beating>>,
    /// How often the Lease is renewed, in milliseconds: every beat unless set.
    lease_period_ms: Arc<AtomicU64>,
}

struct Beating {
    running: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Kubelet {
    /// Starts beating for `node` against the cluster `config` names.
    pub fn start(config: kube::Config, node: &str) -> Self {
        let kubelet = Self {
            node: node.to_owned(),
            config,
            beating: Mutex::new(None),
            lease_period_ms: Arc::new(AtomicU64::new(BEAT.as_millis() as u64)),
        };
        kubelet.resume();
        kubelet
    }

    /// Renews the Lease every `period` from now on, as a real kubelet does (10 s), and posts its
    /// Ready condition's heartbeat every beat instead, as a kubelet did before Leases, so that the
    /// tests' short NotReady grace still sees the node alive between renewals.
    pub fn renew_lease_every(&self, period: Duration) {
        self.lease_period_ms.store(period.as_millis() as u64, Ordering::SeqCst);
    }

    /// The node goes silent: no beat is sent after this returns.
    pub fn stop(&self) {
        if let Some(thread) = self.halt() {
            let _ = thread.join();
        }
    }

    /// Tells the beating thread to end, and hands it over.
    fn halt(&self) -> Option<JoinHandle<()>> {
        let beating = self.beating.lock().unwrap().take()?;
        beating.running.store(false, Ordering::SeqCst);
        Some(beating.thread)
    }

    /// The node is back: it posts itself Ready again and renews its Lease.
    pub fn resume(&self) {
        let mut beating = self.beating.lock().unwrap();
        if beating.is_some() {
            return;
        }
        let running = Arc::new(AtomicBool::new(true));
        let (node, config, flag) = (self.node.clone(), self.config.clone(), running.clone());
        let period = self.lease_period_ms.clone();
        let thread = std::thread::Builder::new()
            .name(format!("kubelet-{node}"))
            .spawn(move || beat_until_stopped(config, &node, &flag, &period))
            .expect("start the fake kubelet's thread");
        *beating = Some(Beating { running, thread });
    }
}

impl Drop for Kubelet {
    /// Ends the beating without waiting for the thread's last beat.
    fn drop(&mut self) {
        self.halt();
    }
}

fn beat_until_stopped(config: kube::Config, node: &str, running: &AtomicBool, lease_period_ms: &AtomicU64) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("the fake kubelet's runtime");
    runtime.block_on(async {
        let client = Client::try_from(config).expect("the fake kubelet's client");
        let mut renewed: Option<Instant> = None;
        while running.load(Ordering::SeqCst) {
            let period = Duration::from_millis(lease_period_ms.load(Ordering::SeqCst));
            let renew = renewed.is_none_or(|at| at.elapsed() + BEAT / 2 >= period);
            // A missed beat is what a real kubelet has too: the next one may land.
            let beat = beat(&client, node, renew, period > BEAT);
            if let Ok(Ok(())) = tokio::time::timeout(REQUEST_TIMEOUT, beat).await
                && renew
            {
                renewed = Some(Instant::now());
            }
            for _ in 0..10 {
                if !running.load(Ordering::SeqCst) {
                    return;
                }
                tokio::time::sleep(BEAT / 10).await;
            }
        }
    });
}

/// One heartbeat: the Lease renewed (owned by the Node, so it goes with it) when `renew`, and the
/// Ready condition posted when the node does not show it (at start, and after the node was lost)
/// or when `post_status`.
async fn beat(client: &Client, node: &str, renew: bool, post_status: bool) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes.get(node).await?;
    let now = Timestamp::now();
    if renew {
        renew_lease(client, node, &current, now).await?;
    }
    finish_deleted_pods(client, node).await?;
    if post_status || !shows_ready(&current) {
        post_ready(&nodes, node, &current, now).await?;
    }
    Ok(())
}

/// The node's Lease renewed at `now`.
async fn renew_lease(client: &Client, node: &str, current: &Node, now: Timestamp) -> Result<(), kube::Error> {
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(node.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.to_owned(),
                uid: current.uid().unwrap_or_default(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.to_owned()),
            lease_duration_seconds: Some(40),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    };
    let mut lease = serde_json::to_value(lease).unwrap();
    lease["apiVersion"] = "coordination.k8s.io/v1".into();
    lease["kind"] = "Lease".into();
    Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE)
        .patch(node, &PatchParams::apply("fake-kubelet").force(), &Patch::Apply(lease))
        .await?;
    Ok(())
}

/// The node's Ready condition posted with its heartbeat at `now` (its transition kept while it
/// shows Ready).
async fn post_ready(nodes: &Api<Node>, node: &str, current: &Node, now: Timestamp) -> Result<(), kube::Error> {
    let since = ready_since(current).unwrap_or(Time(now));
    let ready = NodeCondition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: Some("KubeletReady".into()),
        message: Some("kubelet is posting ready status".into()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(since),
    };
    let patch = json!({"status": {"conditions": [ready]}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    Ok(())
}

/// Deletes for good the pods on `node` that are being deleted: their containers have stopped.
async fn finish_deleted_pods(client: &Client, node: &str) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    for pod in pods.list(&on_node).await? {
        if pod.metadata.deletion_timestamp.is_none() {
            continue;
        }
        let (Some(namespace), Some(uid)) = (pod.namespace(), pod.uid()) else {
            continue;
        };
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        let _ = Api::<Pod>::namespaced(client.clone(), &namespace)
            .delete(&pod.name_any(), &params)
            .await;
    }
    Ok(())
}

pub fn shows_ready(node: &Node) -> bool {
    ready_condition(node).is_some_and(|c| c.status == "True")
}

/// When the node turned Ready, if it shows Ready.
fn ready_since(node: &Node) -> Option<Time> {
    ready_condition(node)
        .filter(|c| c.status == "True")?
        .last_transition_time
        .clone()
}

fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
}
