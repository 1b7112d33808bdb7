//! Proves the test control plane is real: ClusterIP allocation, EndpointSlice mirroring and
//! garbage collection through owner references all happen.

use std::time::Duration;

use common::{NEEDS_CLUSTER, eventually};
use k8s_openapi::api::core::v1::{Endpoints, PersistentVolumeClaim, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Resource;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn control_plane_allocates_mirrors_and_collects_garbage() {
    let _ = NEEDS_CLUSTER;
    let env = common::setup("harness").await;
    let (pvc, pv) = env.bound_rwx_claim("data", Default::default()).await;
    let name = pv.metadata.name.unwrap();
    let owner = pvc.controller_owner_ref(&()).unwrap();

    let services = env.api::<Service>();
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": [owner]},
        "spec": {"type": "ClusterIP", "ports": [{"name": "nfs", "port": 2049, "protocol": "TCP", "targetPort": 2050}]}
    }))
    .unwrap();
    let service = services.create(&PostParams::default(), &service).await.unwrap();
    let cluster_ip = service
        .spec
        .unwrap()
        .cluster_ip
        .expect("apiserver allocated no ClusterIP");
    assert!(cluster_ip.starts_with("10.96."), "{cluster_ip}");

    let endpoints = env.api::<Endpoints>();
    let eps: Endpoints = serde_json::from_value(json!({
        "metadata": {"name": name, "ownerReferences": [owner]},
        "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"name": "nfs", "port": 2050}]}]
    }))
    .unwrap();
    endpoints.create(&PostParams::default(), &eps).await.unwrap();

    let slices = env.api::<EndpointSlice>();
    let by_service = ListParams::default().labels(&format!("kubernetes.io/service-name={name}"));
    let slice = eventually("a mirrored EndpointSlice", Duration::from_secs(20), || async {
        slices.list(&by_service).await.unwrap().items.into_iter().next()
    })
    .await;
    assert_eq!(slice.endpoints[0].addresses, vec!["192.0.2.10".to_string()]);

    env.api::<PersistentVolumeClaim>()
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "garbage collection of the Service and Endpoints",
        Duration::from_secs(30),
        || async {
            let gone =
                services.get_opt(&name).await.unwrap().is_none() && endpoints.get_opt(&name).await.unwrap().is_none();
            gone.then_some(())
        },
    )
    .await;
    env.cleanup().await;
}
