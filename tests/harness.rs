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

/// The simulated DRBD outdates and refuses as DRBD does: a Secondary the Primary goes on without
/// (quorum through a diskless tie-breaker) is Outdated and may not promote; a crashed Primary's
/// UpToDate peer may; a Primary reachable through the mesh forbids it.
#[test]
fn the_simulated_drbd_outdates_and_refuses_promotion_as_drbd_does() {
    use common::drbd_mesh::Mesh;
    let word = |mesh: &Mesh, i: usize| mesh.state_of(i)["_drbd"]["may_promote"].clone();
    let disk = |mesh: &Mesh, i: usize| mesh.state_of(i)["devices"][0]["disk-state"].clone();
    let mut mesh = Mesh::new("pvc-1", &["a", "b", "c"], &[2]);
    mesh.promote(0).unwrap();
    assert_eq!(disk(&mesh, 2), "Diskless");
    assert_eq!(word(&mesh, 1), false, "a Primary is connected");
    mesh.cut(0, 1);
    assert!(mesh.is_outdated(1));
    assert_eq!(
        mesh.state_of(1)["devices"][0]["quorum"],
        true,
        "b keeps quorum through c"
    );
    assert_eq!((disk(&mesh, 1), word(&mesh, 1)), ("Outdated".into(), false.into()));
    assert!(mesh.promote(1).is_err(), "DRBD refuses an Outdated disk");
    mesh.crash(0);
    assert_eq!(
        word(&mesh, 1),
        false,
        "still Outdated: only a resync brings the data back"
    );

    let mut crashed = Mesh::new("pvc-1", &["a", "b", "c"], &[2]);
    crashed.promote(0).unwrap();
    crashed.crash(0);
    assert_eq!((disk(&crashed, 1), word(&crashed, 1)), ("UpToDate".into(), true.into()));
    crashed.promote(1).unwrap();
    assert_eq!(crashed.state_of(1)["role"], "Primary");

    let mut reachable = Mesh::new("pvc-1", &["a", "b", "c"], &[]);
    reachable.promote(0).unwrap();
    reachable.cut(0, 1);
    assert_eq!(word(&reachable, 1), false, "a is reachable through c");
    let mut isolated = Mesh::new("pvc-1", &["a", "b", "c"], &[]);
    isolated.promote(0).unwrap();
    isolated.isolate(0);
    assert_eq!(word(&isolated, 1), true, "a is reachable by nobody, and has no quorum");
    assert_eq!(isolated.state_of(0)["suspended-quorum"], true);
}
