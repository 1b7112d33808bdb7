//! Simulated DRBD nodes for the agent's end-to-end tests: a Node object each, a state directory
//! read by `tests/fixtures/fake-drbdsetup`, and agent processes pointed at them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::accounts::admin_kubeconfig;
use super::kubelet::{Kubelet, shows_ready};
use super::process::Process;
use super::{TestEnv, eventually, serving};

/// Label on every Node a test creates: `svc-test=<test id>`.
pub const NODE_LABEL: &str = "svc-test";
/// The simulated `drbdsetup` every agent of the tests runs.
pub const FAKE_DRBDSETUP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/fake-drbdsetup");
/// The agent's timings in the tests, unless a test sets its own: decisions within seconds.
pub const TEST_AGENT_TIMINGS: [(&str, &str); 5] = [
    ("--drbd-status-interval", "1s"),
    ("--fail-over-timeout", "1s"),
    ("--reconcile-interval", "2s"),
    ("--operations-timeout", "10s"),
    ("--grace-period-seconds", "5"),
];
/// The simulated nodes run no NFS server, so the agents probe none, unless a test gives its own
/// `--nfs-probe` (the data path's nodes run nfs-ganesha).
pub const NO_NFS_SERVER: [(&str, &str); 1] = [("--nfs-probe", "false")];

pub struct SimNode {
    /// Kubernetes node name, also the DRBD peer name.
    pub name: String,
    pub ip: String,
    pub dir: PathBuf,
    /// Renews the node's Lease: `kubelet.stop()` is the node lost, as Kubernetes sees it.
    pub kubelet: Kubelet,
}

impl SimNode {
    pub fn endpoint(&self) -> String {
        format!("{}:2049", self.ip)
    }

    /// Replaces the node's DRBD state; every resource has `quorum majority`, and each connection
    /// the node's net options ([`SimNode::set_net_options`]). `drbdsetup show --json` prints the
    /// options set away from their defaults, as here.
    pub fn set(&self, resources: &[Value]) {
        let net = std::fs::read_to_string(self.dir.join("net.json"))
            .ok()
            .and_then(|text| serde_json::from_str::<Value>(&text).ok())
            .unwrap_or_else(tuned_net_options);
        let shown: Vec<Value> = resources
            .iter()
            .map(|r| {
                let connections: Vec<Value> = r["connections"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .enumerate()
                    .map(|(i, c)| {
                        let mut options = net.clone();
                        options["_name"] = c["name"].clone();
                        json!({"_peer_node_id": i + 1, "net": options})
                    })
                    .collect();
                json!({"resource": r["name"], "options": {"quorum": "majority"}, "connections": connections})
            })
            .collect();
        write_atomically(&self.dir.join("show.json"), &Value::from(shown).to_string());
        // DRBD's word on promotion goes to events2 alone, as drbd-utils prints it; the events2
        // stand-in reads it when status.json is replaced, so it is written first.
        let mut status = resources.to_vec();
        let words: serde_json::Map<String, Value> = status
            .iter_mut()
            .map(|r| {
                let word = r.as_object_mut().and_then(|r| r.remove("_drbd"));
                let name = r["name"].as_str().unwrap_or_default().to_owned();
                (name, word.unwrap_or_else(|| drbds_word(r)))
            })
            .collect();
        write_atomically(&self.dir.join("promotion.json"), &Value::from(words).to_string());
        write_atomically(&self.dir.join("status.json"), &Value::from(status).to_string());
    }

    /// The net options of the node's connections from the next [`SimNode::set`] on, as
    /// `drbdsetup show --json` prints them (`{}`: DRBD's defaults, which notice a silent drop
    /// within 10.5 s).
    pub fn set_net_options(&self, options: Value) {
        write_atomically(&self.dir.join("net.json"), &options.to_string());
    }

    /// The environment variable that tells the fake drbdsetup which node it is.
    pub fn fake_drbd_env(&self) -> (&'static str, &str) {
        ("FAKE_DRBD_DIR", self.dir.to_str().unwrap())
    }

    /// Every command the agent ran against this node's drbdsetup.
    pub fn calls(&self) -> String {
        std::fs::read_to_string(self.dir.join("calls")).unwrap_or_default()
    }
}

/// How long after its last renewal the agents take a kubelet for silent: one 10 s renewal of a
/// 40 s node Lease and 3 s of slack, and a second for the round that reads it.
pub const KUBELET_QUIET: Duration = Duration::from_secs(14);

/// How long the control plane lets a silent node pass for Ready: `SVC_NODE_MONITOR_GRACE_PERIOD`
/// (in seconds, as `hack/cluster.sh` passes it on), else Kubernetes's default, 50 s.
pub fn node_monitor_grace_period() -> Duration {
    std::env::var("SVC_NODE_MONITOR_GRACE_PERIOD")
        .ok()
        .and_then(|v| v.strip_suffix('s')?.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(50))
}

/// DRBD's `may_promote` for a state a test wrote by hand, as DRBD decides it from what the node
/// sees itself: a Secondary, every disk UpToDate with quorum, no connected Primary, IO not
/// suspended (a Primary reachable only through another peer needs [`super::drbd_mesh::Mesh`]).
fn drbds_word(resource: &Value) -> Value {
    let devices = resource["devices"].as_array().cloned().unwrap_or_default();
    let up_to_date = !devices.is_empty() && devices.iter().all(|d| d["disk-state"] == "UpToDate");
    let quorum = !devices.is_empty() && devices.iter().all(|d| d["quorum"] == true);
    let primary_peer = resource["connections"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["peer-role"] == "Primary");
    let may_promote =
        resource["role"] == "Secondary" && up_to_date && quorum && !primary_peer && resource["suspended"] != true;
    let score = if up_to_date && quorum { 10102 } else { 1 };
    json!({"may_promote": may_promote, "promotion_score": score})
}

/// `ping-int 1` and `timeout 5` (DRBD wants `timeout` below `ping-int`): a tuned DRBD that
/// notices a silent drop within 1.5 s. The tests' default, so that the agents' hold for a peer's
/// late detection stays short.
fn tuned_net_options() -> Value {
    json!({"ping-int": "1", "timeout": "5"})
}

fn write_atomically(path: &std::path::Path, contents: &str) {
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, contents).unwrap();
    std::fs::rename(temp, path).unwrap();
}

/// One DRBD resource as `drbdsetup status --json` prints it; peers are (name, state, role). Two
/// volumes, as LINSTOR CSI's NFS volumes have: the data (0) and a small recovery volume (1).
pub fn resource(name: &str, role: &str, quorum: bool, peers: &[(&str, &str, &str)]) -> Value {
    let connections: Vec<Value> = peers
        .iter()
        .map(|(peer, state, role)| {
            // As DRBD has it: a connected peer's replica is in sync, a lost one's unknown.
            let disk = if *state == "Connected" { "UpToDate" } else { "DUnknown" };
            let peer_devices: Vec<Value> = VOLUMES
                .iter()
                .map(|v| json!({"volume": v, "peer-disk-state": disk}))
                .collect();
            json!({"name": peer, "connection-state": state, "peer-role": role, "peer_devices": peer_devices})
        })
        .collect();
    let devices: Vec<Value> = VOLUMES
        .iter()
        .map(|v| json!({"volume": v, "disk-state": "UpToDate", "quorum": quorum, "ap-in-flight": 18446744073709551608u64}))
        .collect();
    json!({
        "name": name, "role": role, "suspended": false, "suspended-user": false, "suspended-no-data": false,
        "suspended-fencing": false, "suspended-quorum": false, "force-io-failures": false,
        "devices": devices,
        "connections": connections,
    })
}

/// The volumes of every simulated resource.
const VOLUMES: [u32; 2] = [0, 1];

/// `resource` with `peer` a diskless tie-breaker: it votes for quorum but holds no data.
pub fn with_diskless_peer(mut resource: Value, peer: &str) -> Value {
    for connection in resource["connections"].as_array_mut().into_iter().flatten() {
        if connection["name"] == peer {
            for device in connection["peer_devices"].as_array_mut().into_iter().flatten() {
                if device["peer-disk-state"] == "UpToDate" {
                    device["peer-disk-state"] = json!("Diskless");
                }
            }
        }
    }
    resource
}

/// `resource` as a diskless tie-breaker states it: its own replica holds no data.
pub fn diskless(mut resource: Value) -> Value {
    for device in resource["devices"].as_array_mut().into_iter().flatten() {
        device["disk-state"] = json!("Diskless");
    }
    resource
}

/// `resource` with its IO suspended for `reason` (`user`, `no-data`, `fencing`, `quorum`), as
/// `drbdsetup status --json` prints it.
pub fn suspended(mut resource: Value, reason: &str) -> Value {
    resource["suspended"] = json!(true);
    resource[format!("suspended-{reason}")] = json!(true);
    resource
}

impl TestEnv {
    /// Creates Ready Nodes `<id>-<name>` with InternalIP `10.77.0.<n>`, a state directory and a
    /// fake kubelet each.
    pub async fn sim_nodes(&self, names: &[&str]) -> Vec<SimNode> {
        let at: Vec<(&str, String)> = names
            .iter()
            .enumerate()
            .map(|(i, short)| (*short, format!("10.77.0.{}", i + 1)))
            .collect();
        self.sim_nodes_at(&at).await
    }

    /// Like [`TestEnv::sim_nodes`], each node `(name, InternalIP)`.
    pub async fn sim_nodes_at(&self, at: &[(&str, String)]) -> Vec<SimNode> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let mut created = Vec::new();
        for (short, ip) in at {
            let name = format!("{}-{short}", self.id);
            let ip = ip.clone();
            let node: Node = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {NODE_LABEL: self.id}},
            }))
            .unwrap();
            nodes.create(&PostParams::default(), &node).await.expect("create Node");
            let status = json!({"status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "addresses": [{"type": "InternalIP", "address": ip}],
            }});
            nodes
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
                .await
                .expect("set Node status");
            let dir = std::env::temp_dir().join(format!("svc-e2e-drbd-{name}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("proc"), "version: 9.2.0 (fake)\n").unwrap();
            let kubelet = Kubelet::start(self.config.clone(), &name);
            let node = SimNode { name, ip, dir, kubelet };
            node.set(&[]);
            created.push(node);
        }
        created
    }

    /// Starts an agent for `node`, managing only this test's nodes, its Lease in this namespace,
    /// with short test timings unless `extra` sets them.
    pub async fn start_agent(&self, node: &SimNode, extra: &[&str]) -> Process {
        self.start_agent_with_env(node, extra, &[]).await
    }

    /// Like [`TestEnv::start_agent`], with extra environment variables.
    pub async fn start_agent_with_env(&self, node: &SimNode, extra: &[&str], env: &[(&str, &str)]) -> Process {
        let process = self.spawn_agent_with_env(node, extra, env);
        process.wait_ready().await;
        process
    }

    /// Like [`TestEnv::start_agent_with_env`], without waiting for it to be ready (as a
    /// DaemonSet's pod comes up whatever the API server or DRBD is doing).
    pub fn spawn_agent_with_env(&self, node: &SimNode, extra: &[&str], env: &[(&str, &str)]) -> Process {
        let simulation = self.simulated_drbd_args(node);
        let mut args = vec!["agent", "--node-name", &node.name];
        args.extend(simulation.iter().map(String::as_str));
        let defaults = TEST_AGENT_TIMINGS.into_iter().chain(NO_NFS_SERVER);
        for (flag, value) in defaults.filter(|(flag, _)| !extra.contains(flag)) {
            args.extend([flag, value]);
        }
        args.extend_from_slice(extra);
        let log_name = format!("{}-agent-{}", self.ns, self.short_name(node));
        let mut env = env.to_vec();
        env.push(node.fake_drbd_env());
        // As the chart's agent, unless the test gives a kubeconfig of its own.
        let as_agent;
        if !env.iter().any(|(name, _)| *name == "KUBECONFIG") {
            as_agent = self.chart_kubeconfig(&admin_kubeconfig(), "agent", &[]);
            env.push(("KUBECONFIG", as_agent.as_str()));
        }
        Process::start_with_env(&log_name, &args, &env)
    }

    /// The agent flags that point it at `node`'s simulated DRBD, this test's nodes and this
    /// namespace's Leases.
    pub fn simulated_drbd_args(&self, node: &SimNode) -> Vec<String> {
        [
            "--drbdsetup-path",
            FAKE_DRBDSETUP,
            "--drbd-proc-path",
            node.dir.join("proc").to_str().unwrap(),
            "--node-selector",
            &format!("{NODE_LABEL}={}", self.id),
            "--lease-namespace",
            &self.ns,
        ]
        .map(String::from)
        .to_vec()
    }

    /// `node`'s name without this test's prefix: `a` for `<id>-a`.
    pub fn short_name<'a>(&self, node: &'a SimNode) -> &'a str {
        node.name.trim_start_matches(&format!("{}-", self.id))
    }

    /// Loses `node` as Kubernetes sees it: its kubelet stops, and this returns once Kubernetes's
    /// node-lifecycle controller has marked it NotReady.
    pub async fn lose_node_and_wait_not_ready(&self, node: &SimNode) {
        node.kubelet.stop();
        let stopped = std::time::Instant::now();
        self.wait_not_ready(&node.name).await;
        // With Kubernetes's 40 s grace, a NotReady node's kubelet has long missed its renewal (the
        // agents allow one 10 s renewal and 3 s); the tests' shorter grace comes before that.
        tokio::time::sleep(KUBELET_QUIET.saturating_sub(stopped.elapsed())).await;
    }

    /// Waits until the node-lifecycle controller has marked `node` NotReady: its grace period
    /// (`node_monitor_grace_period`) and a margin.
    pub async fn wait_not_ready(&self, node: &str) {
        let within = node_monitor_grace_period() + Duration::from_secs(30);
        eventually(&format!("node {node} NotReady"), within, || async {
            (!self.node_ready(node).await).then_some(())
        })
        .await;
    }

    /// Whether `node`'s Ready condition is True.
    pub async fn node_ready(&self, node: &str) -> bool {
        let node = Api::<Node>::all(self.client.clone()).get(node).await.expect("get Node");
        shows_ready(&node)
    }

    /// The keys of a Node's taints.
    pub async fn taints(&self, node: &str) -> Vec<String> {
        let node = Api::<Node>::all(self.client.clone()).get(node).await.expect("get Node");
        node.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect()
    }

    /// Adds a NoSchedule taint, as another writer (an operator, another controller) would.
    pub async fn add_taint(&self, node: &str, key: &str) {
        let mut taints: Vec<Value> = self
            .taints(node)
            .await
            .into_iter()
            .map(|k| json!({"key": k, "effect": "NoSchedule"}))
            .collect();
        taints.push(json!({"key": key, "effect": "NoSchedule"}));
        self.patch_node_spec(node, json!({"taints": taints})).await;
    }

    /// Cordons `node` (`kubectl cordon`, the first step of `kubectl drain`), or uncordons it.
    pub async fn cordon(&self, node: &str, cordoned: bool) {
        self.patch_node_spec(node, json!({"unschedulable": cordoned})).await;
    }

    /// Merges `spec` into `node`'s spec.
    async fn patch_node_spec(&self, node: &str, spec: Value) {
        Api::<Node>::all(self.client.clone())
            .patch(node, &PatchParams::default(), &Patch::Merge(json!({"spec": spec})))
            .await
            .unwrap_or_else(|error| panic!("patch Node {node}'s spec: {error}"));
    }

    /// A Running pod on `node` that mounts `claim`, owned by a ConfigMap (so it counts as managed
    /// and the garbage collector keeps it), with `annotations` and `labels`.
    pub async fn running_pod(&self, name: &str, node: &str, claim: &str, annotations: Value, labels: Value) -> Pod {
        let volume = json!({"name": "data", "persistentVolumeClaim": {"claimName": claim}});
        self.running_pod_with(name, node, volume, annotations, labels).await
    }

    /// Like [`TestEnv::running_pod`], with the pod's one volume given whole.
    pub async fn running_pod_with(
        &self,
        name: &str,
        node: &str,
        volume: Value,
        annotations: Value,
        labels: Value,
    ) -> Pod {
        let owners: Api<ConfigMap> = self.api();
        let owner = match owners.get_opt("owner").await.unwrap() {
            Some(owner) => owner,
            None => owners
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
                )
                .await
                .expect("create owner"),
        };
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {
                "name": name, "annotations": annotations, "labels": labels,
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.uid()}],
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "busybox"}],
                "volumes": [volume],
            }
        }))
        .unwrap();
        let pods: Api<Pod> = self.api();
        pods.create(&PostParams::default(), &pod).await.expect("create Pod");
        pods.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("mark Pod running")
    }

    /// A VolumeAttachment `<id>-<name>` of `pv` to `node`.
    pub async fn attachment(&self, name: &str, pv: &str, node: &str) -> String {
        let name = format!("{}-{name}", self.id);
        let attachment: VolumeAttachment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"attacher": "linstor.csi.linbit.com", "nodeName": node, "source": {"persistentVolumeName": pv}},
        }))
        .unwrap();
        Api::<VolumeAttachment>::all(self.client.clone())
            .create(&PostParams::default(), &attachment)
            .await
            .expect("create VolumeAttachment");
        name
    }

    pub async fn attachment_exists(&self, name: &str) -> bool {
        Api::<VolumeAttachment>::all(self.client.clone())
            .get_opt(name)
            .await
            .unwrap()
            .is_some()
    }

    /// Deletes the Nodes and VolumeAttachments this test made (part of [`TestEnv::cleanup`]).
    pub(super) async fn cleanup_nodes(&self) {
        let selector = format!("{NODE_LABEL}={}", self.id);
        let nodes: Api<Node> = Api::all(self.client.clone());
        let _ = nodes
            .delete_collection(&Default::default(), &kube::api::ListParams::default().labels(&selector))
            .await;
        let attachments: Api<VolumeAttachment> = Api::all(self.client.clone());
        if let Ok(list) = attachments.list(&Default::default()).await {
            for attachment in list.items.iter().filter(|a| a.name_any().starts_with(&self.id)) {
                let _ = attachments.delete(&attachment.name_any(), &Default::default()).await;
            }
        }
    }
}

/// Every node connected, `primary` (an index) Primary of every resource, all with quorum. As
/// DRBD moves a primary: the other nodes first (the old primary demotes), then `primary`.
pub fn healthy(nodes: &[SimNode], resources: &[&str], primary: usize) {
    demote_others(nodes, resources, primary);
    promote(nodes, resources, primary);
}

/// The first half of [`healthy`]: every node but `primary` states its part of it.
pub fn demote_others(nodes: &[SimNode], resources: &[&str], primary: usize) {
    healthy_on(nodes, resources, primary, |i| i != primary);
}

/// The second half of [`healthy`]: `primary` becomes Primary.
pub fn promote(nodes: &[SimNode], resources: &[&str], primary: usize) {
    healthy_on(nodes, resources, primary, |i| i == primary);
}

fn healthy_on(nodes: &[SimNode], resources: &[&str], primary: usize, writes: impl Fn(usize) -> bool) {
    for (i, node) in nodes.iter().enumerate().filter(|(i, _)| writes(*i)) {
        let role = |j: usize| if j == primary { "Primary" } else { "Secondary" };
        let peers: Vec<_> = others(nodes, i).map(|(j, peer)| (peer, "Connected", role(j))).collect();
        let states: Vec<Value> = resources.iter().map(|r| resource(r, role(i), true, &peers)).collect();
        node.set(&states);
    }
}

/// `lost` (an index) is gone: the others see it Connecting, keep quorum, and `new_primary` (if
/// any) is promoted. The lost node's own state is left as it was.
pub fn lost(nodes: &[SimNode], resources: &[&str], lost: usize, new_primary: Option<usize>) {
    for (i, node) in nodes.iter().enumerate().filter(|(i, _)| *i != lost) {
        let role = |j: usize| if Some(j) == new_primary { "Primary" } else { "Secondary" };
        let peers: Vec<_> = others(nodes, i)
            .map(|(j, peer)| {
                if j == lost {
                    (peer, "Connecting", "Unknown")
                } else {
                    (peer, "Connected", role(j))
                }
            })
            .collect();
        let states: Vec<Value> = resources.iter().map(|r| resource(r, role(i), true, &peers)).collect();
        node.set(&states);
    }
}

fn others(nodes: &[SimNode], i: usize) -> impl Iterator<Item = (usize, &str)> {
    nodes
        .iter()
        .enumerate()
        .filter(move |(j, _)| *j != i)
        .map(|(j, n)| (j, n.name.as_str()))
}

/// Waits for events about a cluster-scoped object (posted in `default`) with `reason`.
pub async fn cluster_events(env: &TestEnv, name: &str, reason: &str) -> Vec<Event> {
    let what = format!("a {reason} event about {name}");
    eventually(&what, Duration::from_secs(30), || async {
        let events = cluster_events_now(env, name, reason).await;
        (!events.is_empty()).then_some(events)
    })
    .await
}

/// The events about a cluster-scoped object (posted in `default`) with `reason`, now.
pub async fn cluster_events_now(env: &TestEnv, name: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(env.client.clone(), "default")
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

/// The node's `drbd.linbit.com/*` taints, if any (not Kubernetes's own `node.kubernetes.io/*`).
pub async fn drbd_taints(env: &TestEnv, node: &str) -> Option<Vec<String>> {
    let ours: Vec<String> = env
        .taints(node)
        .await
        .into_iter()
        .filter(|t| t.starts_with("drbd.linbit.com/"))
        .collect();
    (!ours.is_empty()).then_some(ours)
}

/// The addresses of the EndpointSlice `name` in the test namespace (none when it is missing).
/// Rides out an API server that restarts (the soak restarts it): a read that fails is tried
/// again for up to a minute before the harness gives up, and says it is the harness.
pub async fn slice_addresses(env: &TestEnv, name: &str) -> Vec<String> {
    let slices = env.api::<EndpointSlice>();
    let mut last_error = None;
    for _ in 0..300 {
        match slices.get_opt(name).await {
            Ok(Some(slice)) => return slice.endpoints.into_iter().flat_map(|e| e.addresses).collect(),
            Ok(None) => return vec![],
            Err(err) => last_error = Some(err),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("harness: cannot read EndpointSlice {name} for a minute: {last_error:?}");
}

// Scenario helpers shared by the agent's end-to-end tests.

pub const WAIT: Duration = Duration::from_secs(30);
pub const LOST_QUORUM: &str = "drbd.linbit.com/lost-quorum";
pub const FORCE_IO_ERROR: &str = "drbd.linbit.com/force-io-error";

/// A test namespace, three Ready nodes a, b, c, and an RWX claim `data` whose PV (also the DRBD
/// resource name) is served from node a.
pub async fn three_nodes(test: &str) -> (TestEnv, Vec<SimNode>, String) {
    let env = super::setup(test).await;
    let nodes = env.sim_nodes(&["a", "b", "c"]).await;
    let (_, pv) = env.bound_rwx_claim("data", serving(&nodes[0].endpoint())).await;
    (env, nodes, pv.metadata.name.unwrap())
}

/// [`three_nodes`], all connected with node a Primary, and a pod `app` on node a using the claim.
pub async fn app_on_node_a(test: &str) -> (TestEnv, Vec<SimNode>, String) {
    let (env, nodes, pv) = three_nodes(test).await;
    healthy(&nodes, &[&pv], 0);
    env.running_pod("app", &nodes[0].name, "data", json!({}), no_labels())
        .await;
    (env, nodes, pv)
}

/// Waits until the `agents` together have observed at least `volumes` fail-over durations, and
/// returns (how many, their sum in seconds).
pub async fn fail_over_durations(agents: &[Process], volumes: usize) -> (f64, f64) {
    eventually("the fail-overs' durations", Duration::from_secs(30), || async {
        let (mut count, mut sum) = (0.0, 0.0);
        for agent in agents {
            count += agent
                .metric("storageos_drbd_agent_fail_over_duration_seconds_count")
                .await;
            sum += agent
                .metric("storageos_drbd_agent_fail_over_duration_seconds_sum")
                .await;
        }
        (count >= volumes as f64).then_some((count, sum))
    })
    .await
}

pub async fn teardown(env: TestEnv, processes: Vec<Process>) {
    for process in processes {
        process.stop().await;
    }
    env.cleanup().await;
}

/// Waits up to `bound` each for pod `pod` to be gone and then for VolumeAttachment `attachment`
/// to be deleted (a fail-over's last two steps); returns when the pod was seen gone.
pub async fn pod_then_attachment_gone(env: &TestEnv, pod: &str, attachment: &str, bound: Duration) -> Instant {
    super::eventually(&format!("pod {pod} gone"), bound, || async {
        pod_state(env, pod).await.is_none().then_some(())
    })
    .await;
    let gone = Instant::now();
    super::eventually(&format!("VolumeAttachment {attachment} deleted"), bound, || async {
        (!env.attachment_exists(attachment).await).then_some(())
    })
    .await;
    gone
}

pub async fn pod_state(env: &TestEnv, name: &str) -> Option<Pod> {
    env.api::<Pod>().get_opt(name).await.unwrap()
}

/// Whether the pod exists and nobody started deleting it.
pub async fn untouched(env: &TestEnv, pod: &str) -> bool {
    pod_state(env, pod)
        .await
        .is_some_and(|p| p.metadata.deletion_timestamp.is_none())
}

/// Waits until the pod is being deleted (evicted: it has a deletionTimestamp) or is gone
/// (force-deleted, as a silent node's pods are).
pub async fn wait_for_eviction(env: &TestEnv, name: &str) {
    let what = format!("pod {name} evicted or deleted");
    eventually(&what, WAIT, || async {
        match pod_state(env, name).await {
            None => Some(()),
            Some(pod) => pod.metadata.deletion_timestamp.map(|_| ()),
        }
    })
    .await;
}

/// Waits until `pv`'s EndpointSlice names `node` alone.
pub async fn wait_for_slice_at(env: &TestEnv, pv: &str, node: &SimNode) {
    let what = format!("{pv}'s EndpointSlice at {}", node.name);
    eventually(&what, WAIT, || async {
        (slice_addresses(env, pv).await == [node.ip.clone()]).then_some(())
    })
    .await;
}

pub async fn wait_for_taint(env: &TestEnv, node: &str, key: &str, present: bool) {
    let what = format!("taint {key} {} node {node}", if present { "on" } else { "off" });
    eventually(&what, WAIT, || async {
        (env.taints(node).await.iter().any(|t| t == key) == present).then_some(())
    })
    .await;
}

pub fn no_labels() -> Value {
    json!({})
}
