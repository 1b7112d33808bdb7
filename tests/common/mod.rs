//! Helpers shared by the end-to-end tests. They run against the control plane named by
//! `KUBECONFIG` (started by `make test`), each test in a namespace of its own.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// The reason every end-to-end test carries in its `#[ignore]`.
pub const NEEDS_CLUSTER: &str = "needs a control plane: run `make test`, or `hack/cluster.sh up`, export KUBECONFIG and run `cargo test -- --ignored`";

pub struct TestEnv {
    pub client: Client,
    pub ns: String,
}

/// Connects to the cluster in KUBECONFIG and creates a fresh namespace named after the test.
pub async fn setup(test: &str) -> TestEnv {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG is not set: {NEEDS_CLUSTER}"
    );
    let client = Client::try_default()
        .await
        .expect("cannot build a client from KUBECONFIG");
    let suffix: u32 = std::process::id()
        ^ (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos());
    let ns = format!("{}-{:x}", test.replace('_', "-"), suffix % 0xfffff);
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
    TestEnv { client, ns }
}

impl TestEnv {
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Deletes the namespace (cluster-scoped objects the test made are its own to delete).
    pub async fn cleanup(self) {
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.ns, &DeleteParams::default())
            .await;
    }

    /// Creates an RWX claim and its PV, bound to each other (status included, as the PV controller
    /// would leave them), with `pv_annotations` on the PV.
    pub async fn bound_rwx_claim(
        &self,
        claim: &str,
        pv_name: &str,
        pv_annotations: BTreeMap<String, String>,
    ) -> (PersistentVolumeClaim, PersistentVolume) {
        self.bound_claim(claim, pv_name, "ReadWriteMany", "replicated", pv_annotations)
            .await
    }

    pub async fn bound_claim(
        &self,
        claim: &str,
        pv_name: &str,
        access_mode: &str,
        storage_class: &str,
        pv_annotations: BTreeMap<String, String>,
    ) -> (PersistentVolumeClaim, PersistentVolume) {
        let claims: Api<PersistentVolumeClaim> = self.api();
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        let pvc = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(claim.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec![access_mode.into()]),
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
        let pvc = claims.create(&PostParams::default(), &pvc).await.expect("create claim");
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": pv_name, "annotations": pv_annotations},
            "spec": {
                "accessModes": [access_mode],
                "capacity": {"storage": "1Gi"},
                "storageClassName": storage_class,
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"namespace": self.ns, "name": claim, "uid": pvc.metadata.uid},
                "csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": pv_name},
            }
        }))
        .unwrap();
        pvs.create(&PostParams::default(), &pv).await.expect("create PV");
        let bound = Patch::Merge(json!({"status": {"phase": "Bound"}}));
        let pv = pvs
            .patch_status(pv_name, &PatchParams::default(), &bound)
            .await
            .expect("bind PV");
        let pvc = claims
            .patch_status(claim, &PatchParams::default(), &bound)
            .await
            .expect("bind claim");
        (pvc, pv)
    }
}

/// Retries `probe` every 100ms until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
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
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
