//! Helpers shared by the end-to-end tests. They run against the control plane named by
//! `KUBECONFIG` (started by `make test`), each test in a namespace of its own.

pub mod accounts;
pub mod audit;
pub mod cluster;
pub mod controller;
pub mod datapath;
pub mod docs;
pub mod drbd;
pub mod drbd_mesh;
pub mod faulty_api;
pub mod held;
pub mod helm;
pub mod kernel_client;
pub mod kubelet;
pub mod libnfs;
pub mod linstor_nfs;
pub mod nfs41;
pub mod nfs_server;
pub mod node_loss;
pub mod outage;
pub mod partition;
pub mod process;
pub mod prometheus;
pub mod quiet_move;
pub mod release_pods;
pub mod server_probe;
pub mod stateful;
pub mod storageos;
pub mod workload;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The reason every end-to-end test carries in its `#[ignore]`.
pub const NEEDS_CLUSTER: &str = "needs a control plane: run `make test`, or `hack/cluster.sh up`, export KUBECONFIG and run `cargo test -- --ignored`";

/// A namespaced kind [`TestEnv`] can list.
pub trait Listable:
    kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType: Default>
    + Clone
    + serde::de::DeserializeOwned
    + std::fmt::Debug
{
}

impl<K> Listable for K where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType: Default>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
{
}

pub struct TestEnv {
    pub client: Client,
    /// What `client` was built from: for helpers that need a client of their own (the fake
    /// kubelets beat on threads of their own).
    pub config: kube::Config,
    pub ns: String,
    /// Random suffix of the namespace, also used to make cluster-scoped names unique.
    pub id: String,
    /// Whether dropping this env removes what the test made: so a test that fails before its
    /// [`TestEnv::cleanup`] leaves nothing behind either. False once cleaned, and for a view.
    removes_on_drop: bool,
}

/// Connects to the cluster in KUBECONFIG and creates a fresh namespace named after the test.
pub async fn setup(test: &str) -> TestEnv {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG is not set: {NEEDS_CLUSTER}"
    );
    let config = kube::Config::infer()
        .await
        .expect("cannot build a client from KUBECONFIG");
    setup_on(config, test).await
}

/// [`setup`] on the cluster `config` names.
pub async fn setup_on(config: kube::Config, test: &str) -> TestEnv {
    let client = Client::try_from(config.clone()).expect("a client from the kubeconfig");
    // Ids name cluster-scoped objects (PVs) that can outlive their test while they terminate, so
    // the test binaries sharing a cluster draw them from all 20 bits, from a start of their own;
    // tests of one binary run at once and count up from it.
    static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        std::process::id().wrapping_mul(0x9e37_79b1) ^ nanos
    });
    let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = format!("{:05x}", start.wrapping_add(serial) & 0xfffff);
    let ns = format!("{}-{id}", test.replace('_', "-"));
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.clone()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("cannot create the test namespace: is the control plane up?");
    TestEnv {
        client,
        config,
        ns,
        id,
        removes_on_drop: true,
    }
}

/// A tool from the test tool cache (`SVC_TOOLS_BIN`, set by `make test`), else from PATH.
pub fn tool(name: &str) -> std::process::Command {
    let path = std::env::var("SVC_TOOLS_BIN")
        .map(|bin| format!("{bin}/{name}"))
        .unwrap_or_else(|_| name.to_owned());
    std::process::Command::new(path)
}

/// `script` run by bash as a user pastes it (`-euo pipefail`), with the test tool cache first on
/// PATH.
pub fn pasted(script: &str) -> std::process::Command {
    let mut bash = std::process::Command::new("bash");
    bash.args(["-euo", "pipefail", "-c", script]);
    if let Ok(bin) = std::env::var("SVC_TOOLS_BIN") {
        bash.env("PATH", format!("{bin}:{}", std::env::var("PATH").unwrap_or_default()));
    }
    bash
}

/// Annotations that make a PV report its NFS server at `endpoint`.
pub fn serving(endpoint: &str) -> BTreeMap<String, String> {
    [(SERVICE_ENDPOINT.to_string(), endpoint.to_string())].into()
}

pub const SERVICE_ENDPOINT: &str = "storageos.com/nfs-service-endpoint";
/// The volume mode Kubernetes gives a claim that names none.
const FILESYSTEM: &str = "Filesystem";
pub const MOUNT_ENDPOINT: &str = "storageos.com/nfs-mount-endpoint";

/// What a test PV is made of besides its name and claim.
struct PvShape<'a> {
    /// (access mode, volume mode).
    modes: (&'a str, &'a str),
    storage_class: &'a str,
    annotations: BTreeMap<String, String>,
    csi_attributes: BTreeMap<String, String>,
}

impl TestEnv {
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// A PV name unique to this test: `pvc-<id>-<name>`, a valid Service name.
    pub fn pv_name(&self, name: &str) -> String {
        format!("pvc-{}-{name}", self.id)
    }

    /// The same namespace through another client, for a task of its own; dropping it removes
    /// nothing.
    pub fn view(&self, client: Client) -> TestEnv {
        TestEnv {
            client,
            config: self.config.clone(),
            ns: self.ns.clone(),
            id: self.id.clone(),
            removes_on_drop: false,
        }
    }

    /// Deletes the namespace and the PVs, Nodes and VolumeAttachments this test made.
    pub async fn cleanup(mut self) {
        self.remove_what_the_test_made().await;
        self.removes_on_drop = false;
    }

    async fn remove_what_the_test_made(&self) {
        self.remove_chart_permissions(&accounts::admin_kubeconfig());
        self.cleanup_nodes().await;
        let pvs = self.pvs();
        if let Ok(list) = pvs.list(&Default::default()).await {
            let prefix = self.pv_name("");
            for pv in list
                .items
                .iter()
                .filter(|pv| pv.metadata.name.as_deref().unwrap_or("").starts_with(&prefix))
            {
                let _ = pvs
                    .delete(pv.metadata.name.as_deref().unwrap(), &DeleteParams::default())
                    .await;
            }
        }
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
    }

    /// Creates an RWX claim `claim` and its PV `pv_name(claim)`, bound to each other (status
    /// included, as the PV controller would leave them), with `pv_annotations` on the PV.
    pub async fn bound_rwx_claim(
        &self,
        claim: &str,
        pv_annotations: BTreeMap<String, String>,
    ) -> (PersistentVolumeClaim, PersistentVolume) {
        self.bound_claim(claim, "ReadWriteMany", "replicated", pv_annotations)
            .await
    }

    pub async fn bound_claim(
        &self,
        claim: &str,
        access_mode: &str,
        storage_class: &str,
        pv_annotations: BTreeMap<String, String>,
    ) -> (PersistentVolumeClaim, PersistentVolume) {
        self.bound_claim_in_mode(claim, access_mode, storage_class, FILESYSTEM, pv_annotations)
            .await
    }

    /// An RWX claim of a raw block device (`volumeMode: Block`, a VM disk shared for live
    /// migration), bound to its PV.
    pub async fn bound_rwx_block_claim(
        &self,
        claim: &str,
        pv_annotations: BTreeMap<String, String>,
    ) -> (PersistentVolumeClaim, PersistentVolume) {
        self.bound_claim_in_mode(claim, "ReadWriteMany", "replicated", "Block", pv_annotations)
            .await
    }

    /// An RWX filesystem claim bound to a PV shaped as LINSTOR CSI's NFS export makes them (1.10+):
    /// its own NFS server, behind its own Service (`linstor-csi-nfs`, in this namespace), serves
    /// the volume.
    pub async fn bound_rwx_claim_served_by_linstor_nfs(
        &self,
        claim: &str,
    ) -> (PersistentVolumeClaim, PersistentVolume) {
        let export = format!(
            "nfs://linstor-csi-nfs.{}.svc:2050/srv/linstor-csi-nfs/{}",
            self.ns,
            self.pv_name(claim)
        );
        let attributes = [("linstor.csi.linbit.com/nfs-export".to_owned(), export)].into();
        self.bound_claim_with(
            claim,
            ("ReadWriteMany", FILESYSTEM),
            "replicated",
            Default::default(),
            attributes,
        )
        .await
    }

    async fn bound_claim_in_mode(
        &self,
        claim: &str,
        access_mode: &str,
        storage_class: &str,
        volume_mode: &str,
        pv_annotations: BTreeMap<String, String>,
    ) -> (PersistentVolumeClaim, PersistentVolume) {
        let modes = (access_mode, volume_mode);
        self.bound_claim_with(claim, modes, storage_class, pv_annotations, BTreeMap::new())
            .await
    }

    async fn bound_claim_with(
        &self,
        claim: &str,
        modes: (&str, &str),
        storage_class: &str,
        pv_annotations: BTreeMap<String, String>,
        csi_attributes: BTreeMap<String, String>,
    ) -> (PersistentVolumeClaim, PersistentVolume) {
        let pv_name = self.pv_name(claim);
        let pvc = self.create_claim_in_mode(claim, &pv_name, modes, storage_class).await;
        let shape = PvShape {
            modes,
            storage_class,
            annotations: pv_annotations,
            csi_attributes,
        };
        let pv = self
            .create_pv_in_mode(&pv_name, claim, pvc.metadata.uid.as_deref(), shape)
            .await;
        let pvc = self.mark_bound(claim).await;
        (pvc, pv)
    }

    /// A claim naming `pv_name` as its volume (not yet bound).
    pub async fn create_claim(
        &self,
        claim: &str,
        pv_name: &str,
        access_mode: &str,
        storage_class: &str,
    ) -> PersistentVolumeClaim {
        self.create_claim_in_mode(claim, pv_name, (access_mode, FILESYSTEM), storage_class)
            .await
    }

    /// [`TestEnv::create_claim`] with (access mode, volume mode).
    async fn create_claim_in_mode(
        &self,
        claim: &str,
        pv_name: &str,
        (access_mode, volume_mode): (&str, &str),
        storage_class: &str,
    ) -> PersistentVolumeClaim {
        let pvc = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(claim.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec![access_mode.into()]),
                volume_mode: Some(volume_mode.into()),
                storage_class_name: Some(storage_class.into()),
                volume_name: Some(pv_name.into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some([("storage".to_string(), Quantity("1Gi".into()))].into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.api::<PersistentVolumeClaim>()
            .create(&PostParams::default(), &pvc)
            .await
            .expect("create claim")
    }

    /// A bound CSI PV whose claimRef names `claim` in this namespace.
    pub async fn create_pv(
        &self,
        pv_name: &str,
        claim: &str,
        claim_uid: Option<&str>,
        access_mode: &str,
        storage_class: &str,
        annotations: BTreeMap<String, String>,
    ) -> PersistentVolume {
        let shape = PvShape {
            modes: (access_mode, FILESYSTEM),
            storage_class,
            annotations,
            csi_attributes: BTreeMap::new(),
        };
        self.create_pv_in_mode(pv_name, claim, claim_uid, shape).await
    }

    /// [`TestEnv::create_pv`] with (access mode, volume mode).
    async fn create_pv_in_mode(
        &self,
        pv_name: &str,
        claim: &str,
        claim_uid: Option<&str>,
        shape: PvShape<'_>,
    ) -> PersistentVolume {
        let (access_mode, volume_mode) = shape.modes;
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": pv_name, "annotations": shape.annotations},
            "spec": {
                "accessModes": [access_mode],
                "volumeMode": volume_mode,
                "capacity": {"storage": "1Gi"},
                "storageClassName": shape.storage_class,
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"namespace": self.ns, "name": claim, "uid": claim_uid},
                "csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": pv_name,
                        "volumeAttributes": shape.csi_attributes},
            }
        }))
        .unwrap();
        self.pvs().create(&PostParams::default(), &pv).await.expect("create PV");
        self.pvs()
            .patch_status(
                pv_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Bound"}})),
            )
            .await
            .expect("bind PV")
    }

    /// Sets the claim's phase to Bound, as the PV controller would.
    pub async fn mark_bound(&self, claim: &str) -> PersistentVolumeClaim {
        self.api::<PersistentVolumeClaim>()
            .patch_status(
                claim,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Bound"}})),
            )
            .await
            .expect("bind claim")
    }

    /// Waits until the claim's SharedVolumeReady condition has `status` and `reason`, and returns
    /// its message.
    pub async fn claim_condition_becomes(&self, claim: &str, status: &str, reason: &str) -> String {
        self.claim_condition_says(claim, status, reason, "").await
    }

    /// [`TestEnv::claim_condition_becomes`], once its message also contains `text`.
    pub async fn claim_condition_says(&self, claim: &str, status: &str, reason: &str, text: &str) -> String {
        let what = format!("claim {claim} condition SharedVolumeReady={status} ({reason}) saying {text:?}");
        eventually(&what, Duration::from_secs(30), || async {
            let pvc = self.api::<PersistentVolumeClaim>().get(claim).await.unwrap();
            let conditions = pvc.status?.conditions?;
            let condition = conditions.into_iter().find(|c| c.type_ == "SharedVolumeReady")?;
            let message = condition.message?;
            (condition.status == status && condition.reason.as_deref() == Some(reason) && message.contains(text))
                .then_some(message)
        })
        .await
    }

    /// Sets (or, with `None`, removes) one annotation of a PV.
    pub async fn annotate_pv(&self, pv_name: &str, key: &str, value: Option<&str>) {
        self.pvs()
            .patch(
                pv_name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .expect("annotate PV");
    }

    /// The ClusterIP of a Service in this namespace, once it has one.
    pub async fn cluster_ip(&self, service: &str) -> Option<String> {
        let service = self
            .api::<k8s_openapi::api::core::v1::Service>()
            .get_opt(service)
            .await
            .unwrap()?;
        service.spec?.cluster_ip.filter(|ip| !ip.is_empty())
    }

    /// Waits until the controller has published `pv_name`'s mount endpoint, and returns it.
    pub async fn published_mount_endpoint(&self, pv_name: &str) -> String {
        self.mount_endpoint_besides(pv_name, None).await
    }

    /// Waits until `pv_name`'s published mount endpoint is another than `old`, and returns it.
    pub async fn published_mount_endpoint_other_than(&self, pv_name: &str, old: &str) -> String {
        self.mount_endpoint_besides(pv_name, Some(old)).await
    }

    async fn mount_endpoint_besides(&self, pv_name: &str, old: Option<&str>) -> String {
        let what = format!("PV {pv_name}'s mount endpoint published");
        eventually(&what, Duration::from_secs(30), || async {
            self.pv_annotation(pv_name, MOUNT_ENDPOINT)
                .await
                .filter(|value| Some(value.as_str()) != old)
        })
        .await
    }

    /// Creates an RWX claim whose volume is served at `endpoint` and waits until its mount
    /// endpoint is published: (PV name, mount endpoint).
    pub async fn shared_claim(&self, claim: &str, endpoint: &str) -> (String, String) {
        let (_, pv) = self.bound_rwx_claim(claim, serving(endpoint)).await;
        let name = pv.metadata.name.expect("a named PV");
        let mount = self.published_mount_endpoint(&name).await;
        (name, mount)
    }

    /// An annotation of a PV as stored now.
    pub async fn pv_annotation(&self, pv_name: &str, key: &str) -> Option<String> {
        let pv = self.pvs().get(pv_name).await.expect("get PV");
        pv.metadata.annotations.and_then(|a| a.get(key).cloned())
    }

    /// Waits for at least one event about `name` with `reason`, and returns them all.
    pub async fn wait_for_events(&self, name: &str, reason: &str) -> Vec<Event> {
        let what = format!("a {reason} event about {name}");
        eventually(&what, Duration::from_secs(30), || async {
            let events = self.events(name, reason).await;
            (!events.is_empty()).then_some(events)
        })
        .await
    }

    /// Names of the objects of kind `K` in this namespace.
    pub async fn names<K: Listable>(&self) -> Vec<String> {
        self.all::<K>()
            .await
            .iter()
            .map(|o| o.meta().name.clone().unwrap_or_default())
            .collect()
    }

    /// Every object of kind `K` in this namespace.
    pub async fn all<K: Listable>(&self) -> Vec<K> {
        self.api::<K>()
            .list(&Default::default())
            .await
            .expect("list objects")
            .items
    }

    /// The events.k8s.io/v1 events about `name` in this namespace with `reason`.
    pub async fn events(&self, name: &str, reason: &str) -> Vec<Event> {
        self.api::<Event>()
            .list(&Default::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }
}

/// Retries `probe` every 100ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_every(what, timeout, Duration::from_millis(100), probe).await
}

/// [`eventually`], probing every `interval`.
pub async fn eventually_every<T, F, Fut>(what: &str, timeout: Duration, interval: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(interval).await;
    }
}

// The controller never deletes; DELETEs seen meanwhile are the namespace controller and the
// garbage collector cleaning up after the tests that ran before this one.
pub const WRITE_VERBS: [&str; 4] = ["POST", "PUT", "PATCH", "APPLY"];
/// What the loops write, as `resource` or `resource/subresource`: their objects, the PVs'
/// annotations, events and the claims' condition (a claim's status only: the PVC protection
/// controller updates the claims of the namespaces earlier tests left behind).
pub const WATCHED_RESOURCES: [&str; 6] = [
    "services",
    "endpoints",
    "endpointslices",
    "persistentvolumes",
    "events",
    "persistentvolumeclaims/status",
];

/// Whether an `apiserver_request_total` sample is about `watched` (`resource` or
/// `resource/subresource`).
fn about(line: &str, watched: &str) -> bool {
    match watched.split_once('/') {
        Some((resource, sub)) => {
            line.contains(&format!("resource=\"{resource}\"")) && line.contains(&format!("subresource=\"{sub}\""))
        }
        None => line.contains(&format!("resource=\"{watched}\"")),
    }
}

/// Write requests the apiserver has served so far for the resources the controller touches, by
/// its `apiserver_request_total` counter, keyed by the sample's labels.
pub async fn writes(client: &Client) -> BTreeMap<String, f64> {
    requests(client, &WRITE_VERBS).await
}

/// Requests with one of `verbs` the apiserver has served so far for the resources the
/// controller touches, keyed by the sample's labels.
pub async fn requests(client: &Client, verbs: &[&str]) -> BTreeMap<String, f64> {
    apiserver_samples(client, "apiserver_request_total")
        .await
        .into_iter()
        .filter(|(labels, _)| verbs.iter().any(|verb| labels.contains(&format!("verb=\"{verb}\""))))
        .filter(|(labels, _)| WATCHED_RESOURCES.iter().any(|watched| about(labels, watched)))
        // The product posts events.k8s.io/v1 Events; core/v1 ones are the control plane's own
        // (node-lifecycle's RegisteredNode, NodeNotReady, RemovingNode for the tests' nodes).
        .filter(|(labels, _)| !labels.contains("group=\"\",resource=\"events\""))
        .collect()
}

/// The samples of the apiserver's `metric` (a counter or gauge with labels), keyed by the
/// sample's labels.
pub async fn apiserver_samples(client: &Client, metric: &str) -> BTreeMap<String, f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let metrics = client.request_text(request).await.expect("read apiserver /metrics");
    let prefix = format!("{metric}{{");
    metrics
        .lines()
        .filter(|line| line.starts_with(&prefix))
        .filter_map(|line| {
            let (labels, value) = line.rsplit_once(' ')?;
            Some((labels.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The samples that grew between two readings, and by how much.
pub fn grown(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> Vec<(String, f64)> {
    after
        .iter()
        .map(|(labels, value)| (labels.clone(), value - before.get(labels).copied().unwrap_or(0.0)))
        .filter(|(_, delta)| *delta > 0.0)
        .collect()
}

/// A test that panics (a failed assertion) never reaches its clean-up: the same clean-up then
/// runs here, on a thread with a runtime and a client of its own (the test's runtime is
/// unwinding), and gives up after [`DROP_CLEANUP_LIMIT`] when the API server is gone.
impl Drop for TestEnv {
    fn drop(&mut self) {
        if !self.removes_on_drop {
            return;
        }
        let config = self.config.clone();
        let (ns, id) = (self.ns.clone(), self.id.clone());
        let cleaner = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the clean-up");
            runtime.block_on(async move {
                let Ok(client) = Client::try_from(config.clone()) else {
                    return;
                };
                let env = TestEnv {
                    client,
                    config,
                    ns,
                    id,
                    removes_on_drop: false,
                };
                let _ = tokio::time::timeout(DROP_CLEANUP_LIMIT, env.remove_what_the_test_made()).await;
            });
        });
        let _ = cleaner.join();
    }
}

const DROP_CLEANUP_LIMIT: Duration = Duration::from_secs(20);
