//! End-to-end tests of the `controller` subcommand with the `kubernetes` volume backend: the real
//! binary against the real control plane, one namespace (and one controller process) per test.

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::PrivateCluster;
use common::controller::ControllerArgs;
use common::linstor_nfs::advertise;
use common::process::Process;
use common::{MOUNT_ENDPOINT, SERVICE_ENDPOINT, TestEnv, eventually, serving, tool};
use k8s_openapi::api::core::v1::{Endpoints, PersistentVolumeClaim, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn cluster_ip(service: &Service) -> String {
    service.spec.as_ref().unwrap().cluster_ip.clone().unwrap()
}

/// The EndpointSlice once it points at `ip:port`.
async fn slice_at(env: &TestEnv, name: &str, ip: &str, port: i32) -> EndpointSlice {
    let what = format!("EndpointSlice {name} at {ip}:{port}");
    eventually(&what, WAIT, || async {
        let slice = env.api::<EndpointSlice>().get_opt(name).await.unwrap()?;
        let at = slice.endpoints.first()?.addresses == vec![ip.to_string()]
            && slice.ports.as_ref()?.first()?.port == Some(port);
        at.then_some(slice)
    })
    .await
}

/// The core/v1 Endpoints and the EndpointSlice once both point at `ip:port` (a controller
/// started with `--write-endpoints always`).
async fn both_at(env: &TestEnv, name: &str, ip: &str, port: i32) -> (Endpoints, EndpointSlice) {
    let slice = slice_at(env, name, ip, port).await;
    let what = format!("Endpoints {name} at {ip}:{port}");
    let endpoints = eventually(&what, WAIT, || async {
        let endpoints = env.api::<Endpoints>().get_opt(name).await.unwrap()?;
        let subset = endpoints.subsets.as_ref()?.first()?;
        let at = subset.addresses.as_ref()?.first()?.ip == ip && subset.ports.as_ref()?.first()?.port == port;
        at.then_some(endpoints)
    })
    .await;
    (endpoints, slice)
}

/// What `--write-endpoints always` asks of both loops.
const WITH_CORE_ENDPOINTS: [&str; 2] = ["--write-endpoints", "always"];

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn publishes_a_stable_address_and_follows_failover() {
    let env = common::setup("ctl-publish").await;
    let controller = env.start_controller(&WITH_CORE_ENDPOINTS).await;
    let (claim, pv) = env.bound_rwx_claim("data", serving("192.0.2.10:2050")).await;
    let name = pv.metadata.name.clone().unwrap();
    let claim_uid = claim.metadata.uid.clone().unwrap();

    let mount = env.published_mount_endpoint(&name).await;
    let service = env.api::<Service>().get(&name).await.unwrap();
    let ip = cluster_ip(&service);
    assert_eq!(mount, format!("{ip}:2049"));
    the_service_points_at_the_nfs_port_and_selects_nothing(&service, &name);
    let (endpoints, slice) = both_at(&env, &name, "192.0.2.10", 2050).await;
    the_endpoints_are_ours_and_not_mirrored(&endpoints, &slice, &name);
    for owners in [
        &service.metadata.owner_references,
        &endpoints.metadata.owner_references,
        &slice.metadata.owner_references,
    ] {
        let owners = owners.as_ref().expect("owner references");
        assert_eq!((owners.len(), owners[0].uid.as_str()), (1, claim_uid.as_str()));
    }
    let published_events = env.wait_for_events("data", "MountEndpointPublished").await;
    assert_eq!(published_events[0].type_.as_deref(), Some("Normal"));
    assert!(published_events[0].note.as_deref().unwrap().contains(&mount));

    // Failover: the NFS server moves; the endpoints follow, the address clients mount does not.
    env.annotate_pv(&name, SERVICE_ENDPOINT, Some("192.0.2.11:2051")).await;
    both_at(&env, &name, "192.0.2.11", 2051).await;
    let service = eventually("the Service's targetPort to follow", WAIT, || async {
        let service = env.api::<Service>().get(&name).await.unwrap();
        let target = service.spec.as_ref()?.ports.as_ref()?[0].target_port.clone();
        (target == Some(IntOrString::Int(2051))).then_some(service)
    })
    .await;
    assert_eq!(cluster_ip(&service), ip, "failover must keep the ClusterIP");
    assert_eq!(env.pv_annotation(&name, MOUNT_ENDPOINT).await, Some(mount));
    assert_eq!(env.events("data", "MountEndpointPublished").await.len(), 1);
    assert_eq!(
        controller
            .metric("storageos_shared_volume_mount_endpoint_publishes_total")
            .await,
        1.0
    );
    assert_eq!(controller.metric("storageos_shared_volumes").await, 1.0);
    assert!(
        controller
            .metric("storageos_shared_volume_reconcile_duration_seconds_count")
            .await
            >= 2.0
    );
    controller.stop().await;
    the_default_on_this_cluster_deletes_the_core_endpoints(&env, &name).await;
    env.cleanup().await;
}

/// Restarted with the default (`auto`, on a 1.33+ control plane), the controller deletes the
/// Endpoints it wrote and keeps the slice where it was.
async fn the_default_on_this_cluster_deletes_the_core_endpoints(env: &TestEnv, name: &str) {
    let controller = env.start_controller(&[]).await;
    eventually("the controller's old Endpoints deleted", WAIT, || async {
        env.api::<Endpoints>()
            .get_opt(name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    slice_at(env, name, "192.0.2.11", 2051).await;
    controller.stop().await;
}

/// A ClusterIP Service without a selector, port `nfs` 2049 to the server's 2050, labelled with
/// its volume and its manager.
fn the_service_points_at_the_nfs_port_and_selects_nothing(service: &Service, name: &str) {
    let spec = service.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(spec.selector, None, "the Service must not select pods");
    let port = &spec.ports.as_ref().unwrap()[0];
    assert_eq!(
        (
            port.name.as_deref(),
            port.port,
            port.protocol.as_deref(),
            port.target_port.clone()
        ),
        (Some("nfs"), 2049, Some("TCP"), Some(IntOrString::Int(2050)))
    );
    let labels = service.metadata.labels.clone().unwrap();
    assert_eq!(labels["storageos.com/volume-id"], name);
    assert_eq!(labels["app.kubernetes.io/managed-by"], "shared-volume-controller");
}

/// The Endpoints not mirrored by Kubernetes, the slice named for the Service, managed by us,
/// IPv4, ready.
fn the_endpoints_are_ours_and_not_mirrored(endpoints: &Endpoints, slice: &EndpointSlice, name: &str) {
    assert_eq!(
        endpoints.metadata.labels.as_ref().unwrap()["endpointslice.kubernetes.io/skip-mirror"],
        "true"
    );
    let slice_labels = slice.metadata.labels.as_ref().unwrap();
    assert_eq!(slice_labels["kubernetes.io/service-name"], name);
    assert_eq!(
        slice_labels["endpointslice.kubernetes.io/managed-by"],
        "shared-volume-controller.storageos.com"
    );
    assert_eq!(slice.address_type, "IPv4");
    assert_eq!(slice.endpoints[0].conditions.as_ref().unwrap().ready, Some(true));
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn keeps_everything_when_the_service_endpoint_goes_away() {
    let env = common::setup("ctl-gone").await;
    let controller = env.start_controller(&[]).await;
    let (name, mount) = env.shared_claim("data", "192.0.2.20:2049").await;
    let ip = cluster_ip(&env.api::<Service>().get(&name).await.unwrap());
    let skipped_before = controller
        .metric("storageos_shared_volume_reconciles_total{result=\"skipped\"}")
        .await;

    env.annotate_pv(&name, SERVICE_ENDPOINT, None).await;
    eventually("a reconcile of the volume without endpoint", WAIT, || async {
        let skipped = controller
            .metric("storageos_shared_volume_reconciles_total{result=\"skipped\"}")
            .await;
        (skipped > skipped_before).then_some(())
    })
    .await;
    let service = env.api::<Service>().get(&name).await.expect("the Service must stay");
    assert_eq!(cluster_ip(&service), ip);
    slice_at(&env, &name, "192.0.2.20", 2049).await;
    assert_eq!(env.pv_annotation(&name, MOUNT_ENDPOINT).await, Some(mount));
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_deleted_service_comes_back_at_the_address_clients_mount() {
    let env = common::setup("ctl-recreate").await;
    let controller = env.start_controller(&[]).await;
    let (name, first) = env.shared_claim("data", "192.0.2.30:2049").await;
    let services = env.api::<Service>();
    let old = services.get(&name).await.unwrap();

    services.delete(&name, &DeleteParams::default()).await.unwrap();
    let service = recreated(&env, &name, &old).await;
    assert_eq!(
        format!("{}:2049", cluster_ip(&service)),
        first,
        "the Service came back at the ClusterIP clients mount"
    );
    let restored = env.wait_for_events("data", "ServiceRestored").await;
    assert_eq!(restored[0].type_.as_deref(), Some("Normal"));
    assert!(
        env.events("data", "ServiceRecreated").await.is_empty(),
        "no Warning: clients are unaffected"
    );
    assert_eq!(
        env.pv_annotation(&name, MOUNT_ENDPOINT).await.as_deref(),
        Some(first.as_str())
    );
    slice_at(&env, &name, "192.0.2.30", 2049).await;
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_deleted_service_whose_address_was_taken_gets_a_new_one_and_a_warning() {
    let env = common::setup("ctl-taken").await;
    let (name, first, old) = address_taken_while_away(&env, "192.0.2.31:2049", "squatter").await;
    let controller = env.start_controller(&[]).await;
    let service = recreated(&env, &name, &old).await;
    let expected = format!("{}:2049", cluster_ip(&service));
    assert_ne!(expected, first);
    assert_eq!(env.published_mount_endpoint_other_than(&name, &first).await, expected);
    let warnings = env.wait_for_events("data", "ServiceRecreated").await;
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));
    let note = warnings[0].note.clone().unwrap();
    assert!(
        note.contains(&first) && note.contains(&expected) && note.contains("remount"),
        "{note}"
    );
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_deleted_services_address_still_held_for_a_moment_is_taken_back() {
    let env = common::setup("ctl-release").await;
    // The API server frees a deleted Service's address just after the delete reaches watchers;
    // here something holds it for longer, until the controller has been refused it once.
    let (name, first, old) = address_taken_while_away(&env, "192.0.2.32:2049", "holder").await;
    let services = env.api::<Service>();
    let since = std::time::SystemTime::now();
    let controller = env.start_controller(&[]).await;
    eventually("the controller to be refused the held address", WAIT, || async {
        common::audit::writes(&env.ns, since)
            .iter()
            .any(|w| w.verb == "create" && w.resource == "services" && w.name == name && w.code == 422)
            .then_some(())
    })
    .await;
    services.delete("holder", &DeleteParams::default()).await.unwrap();

    let service = recreated(&env, &name, &old).await;
    assert_eq!(
        format!("{}:2049", cluster_ip(&service)),
        first,
        "an address freed within the grace is taken back"
    );
    assert_eq!(env.published_mount_endpoint(&name).await, first);
    assert!(
        env.events("data", "ServiceRecreated").await.is_empty(),
        "no Warning: clients are unaffected"
    );
    controller.stop().await;
    env.cleanup().await;
}

/// A claim served at `endpoint` whose Service was deleted while no controller ran, and whose
/// address the Service `taker` then took: (PV name, the mount endpoint published before, the
/// deleted Service).
async fn address_taken_while_away(env: &TestEnv, endpoint: &str, taker: &str) -> (String, String, Service) {
    let controller = env.start_controller(&[]).await;
    let (name, first) = env.shared_claim("data", endpoint).await;
    let services = env.api::<Service>();
    let old = services.get(&name).await.unwrap();
    controller.stop().await;
    services.delete(&name, &DeleteParams::default()).await.unwrap();
    let taker: Service = serde_json::from_value(json!({
        "metadata": {"name": taker},
        "spec": {"clusterIP": cluster_ip(&old), "ports": [{"port": 80}]},
    }))
    .unwrap();
    eventually("the old address to be taken", WAIT, || async {
        services.create(&Default::default(), &taker).await.ok()
    })
    .await;
    (name, first, old)
}

/// The Service `name` once it exists again as a new object (not `old`).
async fn recreated(env: &TestEnv, name: &str, old: &Service) -> Service {
    eventually("the Service to be recreated", WAIT, || async {
        env.api::<Service>()
            .get_opt(name)
            .await
            .unwrap()
            .filter(|s| s.metadata.uid != old.metadata.uid)
    })
    .await
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn repairs_hand_edited_objects() {
    let env = common::setup("ctl-drift").await;
    let controller = env.start_controller(&WITH_CORE_ENDPOINTS).await;
    let (name, _) = env.shared_claim("data", "192.0.2.40:2050").await;
    both_at(&env, &name, "192.0.2.40", 2050).await;

    let edit = PatchParams::default();
    env.api::<Service>()
        .patch(
            &name,
            &edit,
            &Patch::Merge(json!({
                "metadata": {"labels": {"storageos.com/volume-id": null}},
                "spec": {"ports": [{"name": "wrong", "port": 2049, "protocol": "TCP", "targetPort": 9999}]},
            })),
        )
        .await
        .unwrap();
    env.api::<Endpoints>()
        .patch(
            &name,
            &edit,
            &Patch::Merge(
                json!({"subsets": [{"addresses": [{"ip": "192.0.2.99"}], "ports": [{"name": "other", "port": 1}]}]}),
            ),
        )
        .await
        .unwrap();
    env.api::<EndpointSlice>()
        .patch(
            &name,
            &edit,
            &Patch::Merge(json!({"metadata": {"labels": {"storageos.com/volume-id": "someone-else"}}})),
        )
        .await
        .unwrap();

    eventually("the Service to be repaired", WAIT, || async {
        let service = env.api::<Service>().get(&name).await.unwrap();
        let port = service.spec.as_ref()?.ports.as_ref()?.first()?.clone();
        let label = service
            .metadata
            .labels
            .as_ref()?
            .get("storageos.com/volume-id")
            .cloned();
        (port.name.as_deref() == Some("nfs")
            && port.target_port == Some(IntOrString::Int(2050))
            && label.as_deref() == Some(name.as_str()))
        .then_some(())
    })
    .await;
    let (endpoints, _) = both_at(&env, &name, "192.0.2.40", 2050).await;
    let subset = &endpoints.subsets.unwrap()[0];
    assert_eq!(subset.ports.as_ref().unwrap()[0].name.as_deref(), Some("nfs"));
    assert_eq!(subset.addresses.as_ref().unwrap().len(), 1);
    eventually("the EndpointSlice's label to be repaired", WAIT, || async {
        let slice = env.api::<EndpointSlice>().get(&name).await.unwrap();
        (slice.metadata.labels?.get("storageos.com/volume-id") == Some(&name)).then_some(())
    })
    .await;
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn deleting_the_claim_collects_everything() {
    let env = common::setup("ctl-gc").await;
    let controller = env.start_controller(&[]).await;
    let (name, _) = env.shared_claim("data", "192.0.2.50:2049").await;
    slice_at(&env, &name, "192.0.2.50", 2049).await;

    env.api::<PersistentVolumeClaim>()
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    eventually("garbage collection of all three objects", WAIT, || async {
        let gone = env.api::<Service>().get_opt(&name).await.unwrap().is_none()
            && env.api::<Endpoints>().get_opt(&name).await.unwrap().is_none()
            && env.api::<EndpointSlice>().get_opt(&name).await.unwrap().is_none();
        gone.then_some(())
    })
    .await;
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn ignores_single_writer_claims_and_filtered_classes() {
    let env = common::setup("ctl-ignore").await;
    let controller = env.start_controller(&["--storage-class", "replicated"]).await;
    let (_, rwo) = env
        .bound_claim("rwo", "ReadWriteOnce", "replicated", serving("192.0.2.60:2049"))
        .await;
    let (_, other) = env
        .bound_claim("other", "ReadWriteMany", "other-class", serving("192.0.2.61:2049"))
        .await;
    // A raw block device shared for live migration: whatever its PV says, no NFS share.
    let (_, block) = env.bound_rwx_block_claim("vm-disk", serving("192.0.2.63:2049")).await;
    let (_, ours) = env.bound_rwx_claim("ours", serving("192.0.2.62:2049")).await;
    env.published_mount_endpoint(ours.metadata.name.as_deref().unwrap())
        .await;
    eventually("the three ignored claims to be looked at", WAIT, || async {
        let skipped = controller
            .metric("storageos_shared_volume_reconciles_total{result=\"skipped\"}")
            .await;
        (skipped >= 3.0).then_some(())
    })
    .await;

    for pv in [rwo, other, block] {
        let name = pv.metadata.name.unwrap();
        assert!(env.api::<Service>().get_opt(&name).await.unwrap().is_none(), "{name}");
        assert!(env.api::<Endpoints>().get_opt(&name).await.unwrap().is_none(), "{name}");
        assert_eq!(env.pv_annotation(&name, MOUNT_ENDPOINT).await, None, "{name}");
    }
    let vm_disk = env.api::<PersistentVolumeClaim>().get("vm-disk").await.unwrap();
    // Kubernetes' own conditions are not ours (from 1.37 it marks a claim no pod uses `Unused`).
    let ours: Vec<String> = vm_disk
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .map(|c| c.type_)
        .filter(|t| t == "SharedVolumeReady")
        .collect();
    assert_eq!(ours, Vec::<String>::new(), "no condition of ours on a VM disk's claim");
    assert_eq!(controller.metric("storageos_shared_volumes").await, 1.0);
    controller.stop().await;
    env.cleanup().await;
}

/// The histogram users watch describes the work on shared volumes: claims the controller skips
/// (RWO, unbound, filtered) are counted by result, never observed in it.
#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn skipped_claims_leave_the_reconcile_histogram_alone() {
    const SINGLE_WRITER_CLAIMS: usize = 30;
    let env = common::setup("ctl-histogram").await;
    let controller = env.start_controller(&[]).await;
    let skipped = "storageos_shared_volume_reconciles_total{result=\"skipped\"}";
    for i in 0..SINGLE_WRITER_CLAIMS {
        let endpoint = format!("192.0.2.{}:2049", 100 + i);
        env.bound_claim(&format!("rwo-{i}"), "ReadWriteOnce", "replicated", serving(&endpoint))
            .await;
    }
    eventually("every single-writer claim to be looked at", WAIT, || async {
        (controller.metric(skipped).await >= SINGLE_WRITER_CLAIMS as f64).then_some(())
    })
    .await;
    assert_eq!(
        reconciles(&controller).await,
        0.0,
        "skipped claims must not be observed in the reconcile histogram"
    );

    env.shared_claim("shared", "192.0.2.99:2049").await;
    let observed = reconciles(&controller).await;
    assert!(observed >= 1.0, "a shared claim is observed ({observed})");
    let shared = controller
        .metric("storageos_shared_volume_reconciles_total{result=\"shared\"}")
        .await;
    assert!(
        observed
            <= shared
                + controller
                    .metric("storageos_shared_volume_reconciles_total{result=\"error\"}")
                    .await,
        "one observation per served reconcile ({observed} observations, {shared} shared)"
    );
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn reports_bad_input_and_writes_nothing() {
    let env = common::setup("ctl-bad").await;
    // No retry within the test: what is told, is told by the first reconciles.
    let controller = env.start_controller(&["--api-retry-interval", "1h"]).await;
    let bad_endpoints = [
        ("hostname", "nfs.example.com:2049"),
        ("noport", "192.0.2.70"),
        ("ipv6", "fd00::70:2049"),
        ("badport", "192.0.2.71:70000"),
    ];
    for (claim, endpoint) in bad_endpoints {
        env.bound_rwx_claim(claim, serving(endpoint)).await;
    }
    // A claim bound to a PV that does not exist.
    env.create_claim("missing", &env.pv_name("missing"), "ReadWriteMany", "replicated")
        .await;
    env.mark_bound("missing").await;
    // A claim naming a PV that is bound to another claim.
    env.create_claim("elsewhere", &env.pv_name("elsewhere"), "ReadWriteMany", "replicated")
        .await;
    env.create_pv(
        &env.pv_name("elsewhere"),
        "someone-else",
        None,
        "ReadWriteMany",
        "replicated",
        serving("192.0.2.72:2049"),
    )
    .await;
    env.mark_bound("elsewhere").await;
    // A well-formed IPv6 server on this IPv4-only cluster: the API server refuses its Service.
    env.bound_rwx_claim("sixonfour", serving("[fd00::74]:2049")).await;

    let expectations = bad_endpoints
        .iter()
        .map(|(claim, endpoint)| (*claim, "InvalidServiceEndpoint", endpoint.to_string()))
        .chain([
            ("missing", "VolumeMissing", env.pv_name("missing")),
            ("elsewhere", "VolumeBoundElsewhere", "someone-else".to_string()),
            ("sixonfour", "WriteRefused", "IPv6".to_string()),
        ]);
    for (claim, reason, mentioned) in expectations {
        let events = env.wait_for_events(claim, reason).await;
        assert_eq!(events[0].type_.as_deref(), Some("Warning"));
        let note = events[0].note.clone().unwrap();
        assert!(note.contains(&mentioned), "{claim}: {note:?} should name {mentioned:?}");
    }
    assert_eq!(
        controller
            .metric("storageos_shared_volume_reconcile_errors_total{reason=\"InvalidServiceEndpoint\"}")
            .await,
        4.0
    );
    assert!(env.names::<Service>().await.is_empty());
    assert!(env.names::<Endpoints>().await.is_empty());
    assert!(env.names::<EndpointSlice>().await.is_empty());
    for claim in bad_endpoints.iter().map(|(claim, _)| *claim).chain(["sixonfour"]) {
        assert_eq!(env.pv_annotation(&env.pv_name(claim), MOUNT_ENDPOINT).await, None);
    }
    assert_eq!(controller.metric("storageos_shared_volumes").await, 0.0);

    // Fixing the input is picked up without a restart.
    env.annotate_pv(&env.pv_name("hostname"), SERVICE_ENDPOINT, Some("192.0.2.73:2049"))
        .await;
    env.published_mount_endpoint(&env.pv_name("hostname")).await;
    controller.stop().await;
    env.cleanup().await;
}

async fn reconciles(process: &Process) -> f64 {
    process
        .metric("storageos_shared_volume_reconcile_duration_seconds_count")
        .await
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn only_the_leader_writes_and_a_standby_takes_over() {
    let env = common::setup("ctl-leader").await;
    let start = |identity: &'static str| {
        let args = ControllerArgs::replica(&env.ns, identity, "svc-leader", 4, 2);
        env.start_as("controller", &format!("{}-{identity}", env.ns), &args.as_strs(), &[])
    };
    let (a, b) = (start("a"), start("b"));
    a.wait_ready().await;
    b.wait_ready().await;
    let leader_metric = "storageos_shared_volume_controller_leader";
    let (leader, standby) = eventually("one leader", WAIT, || async {
        match (a.metric(leader_metric).await, b.metric(leader_metric).await) {
            (1.0, 0.0) => Some(("a", "b")),
            (0.0, 1.0) => Some(("b", "a")),
            _ => None,
        }
    })
    .await;
    let (leader_process, standby_process) = if leader == "a" { (a, b) } else { (b, a) };

    let (_, pv) = env.bound_rwx_claim("first", serving("192.0.2.80:2049")).await;
    env.published_mount_endpoint(pv.metadata.name.as_deref().unwrap()).await;
    let events = env.events("first", "MountEndpointPublished").await;
    assert_eq!(
        events[0].reporting_instance.as_deref(),
        Some(leader),
        "the leader posts the events"
    );
    assert!(reconciles(&leader_process).await >= 1.0);
    assert_eq!(reconciles(&standby_process).await, 0.0, "the standby must stay idle");
    assert_eq!(standby_process.metric(leader_metric).await, 0.0);

    leader_process.stop().await;
    eventually(&format!("{standby} to take over"), WAIT, || async {
        (standby_process.metric(leader_metric).await == 1.0).then_some(())
    })
    .await;
    let (_, pv) = env.bound_rwx_claim("second", serving("192.0.2.81:2049")).await;
    env.published_mount_endpoint(pv.metadata.name.as_deref().unwrap()).await;
    let events = env.events("second", "MountEndpointPublished").await;
    assert_eq!(events[0].reporting_instance.as_deref(), Some(standby));
    standby_process.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn each_service_takes_its_servers_family_and_a_family_change_replaces_the_slice() {
    // A dual-stack cluster whose primary family is IPv4, of the test's own.
    let cluster = PrivateCluster::up_with("dualstack", &[("SVC_SERVICE_CIDR", "10.96.0.0/16,fd00:10:96::/108")]);
    let env = common::setup_on(cluster.config().await, "ctl-dualstack").await;
    // As the chart's controller: replacing a slice needs a permission the chart must grant.
    let controller = env.start_controller_on(&cluster, &[]).await;

    // An IPv6 NFS server gets an IPv6 ClusterIP, although the cluster's first family is IPv4.
    let (six, six_mount) = env.shared_claim("six", "[fd00:20::5]:2049").await;
    let service = env.api::<Service>().get(&six).await.unwrap();
    let spec = service.spec.unwrap();
    assert_eq!(spec.ip_families, Some(vec!["IPv6".to_string()]));
    let ip: std::net::IpAddr = spec.cluster_ip.unwrap().parse().unwrap();
    assert!(ip.is_ipv6(), "{ip}");
    assert_eq!(six_mount, format!("[{ip}]:2049"));
    let slice = slice_at(&env, &six, "fd00:20::5", 2049).await;
    assert_eq!(slice.address_type, "IPv6");

    // An IPv4 server whose primary moves to an IPv6 address: the EndpointSlice cannot change its
    // addressType, so it is replaced; the Service keeps its address (clients keep their mount)
    // and a Warning says it cannot reach the new family.
    let (four, four_mount) = env.shared_claim("four", "192.0.2.40:2049").await;
    let old_slice = slice_at(&env, &four, "192.0.2.40", 2049).await;
    env.annotate_pv(&four, SERVICE_ENDPOINT, Some("[fd00:20::6]:2049"))
        .await;
    let new_slice = slice_at(&env, &four, "fd00:20::6", 2049).await;
    assert_eq!(new_slice.address_type, "IPv6");
    assert_ne!(new_slice.metadata.uid, old_slice.metadata.uid, "replaced, not patched");
    let mismatch = env.wait_for_events("four", "ServiceFamilyMismatch").await;
    assert_eq!(mismatch[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        env.pv_annotation(&four, MOUNT_ENDPOINT).await.as_deref(),
        Some(four_mount.as_str())
    );
    controller.stop().await;
    env.remove_chart_permissions(&cluster.kubeconfig());
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn the_claim_states_its_shared_endpoint_through_each_state() {
    let env = common::setup("ctl-condition").await;
    // Limited to the CSI driver the test's volumes use: a claim still waiting is known to be ours.
    let controller = env.start_controller(&["--csi-driver", "linstor.csi.linbit.com"]).await;
    let (_, pv) = env.bound_rwx_claim("data", BTreeMap::new()).await;
    let pv = pv.metadata.name.unwrap();
    // Someone else's condition on the claim (the resizer's) is theirs to keep.
    let resizing = json!({"status": {"conditions": [{"type": "Resizing", "status": "True"}]}});
    env.api::<PersistentVolumeClaim>()
        .patch_status("data", &PatchParams::default(), &Patch::Merge(resizing))
        .await
        .unwrap();

    let pending = env
        .claim_condition_becomes("data", "False", "WaitingForNfsServer")
        .await;
    assert!(pending.contains(SERVICE_ENDPOINT), "{pending}");

    env.annotate_pv(&pv, SERVICE_ENDPOINT, Some("192.0.2.90:2049")).await;
    let mount = env.published_mount_endpoint(&pv).await;
    let ready = env.claim_condition_becomes("data", "True", "Served").await;
    assert!(ready.contains(&mount) && ready.contains("192.0.2.90:2049"), "{ready}");
    let describe = common::helm::run(tool("kubectl").args(["describe", "pvc", "data", "-n", &env.ns]));
    let describe = String::from_utf8_lossy(&describe.stdout);
    assert!(
        describe.contains("SharedVolumeReady") && describe.contains(&mount),
        "{describe}"
    );

    // An agent's move, as the agent stamps it: the node and the time are told.
    let stamp = r#"{"endpoint":"192.0.2.91:2049","overPvVersion":"1","node":"node-b","at":"2026-11-25T19:00:00Z"}"#;
    let moved = json!({"metadata": {"annotations": {SERVICE_ENDPOINT: "192.0.2.91:2049", "storageos.com/nfs-endpoint-move": stamp}}});
    env.pvs()
        .patch(&pv, &PatchParams::default(), &Patch::Merge(moved))
        .await
        .unwrap();
    let after_move = env.claim_condition_becomes("data", "True", "ServedAfterMove").await;
    assert!(
        after_move.contains("node-b") && after_move.contains("2026-11-25T19:00:00Z") && after_move.contains(&mount),
        "{after_move}"
    );

    env.annotate_pv(&pv, SERVICE_ENDPOINT, Some("nfs.example.com:2049"))
        .await;
    let broken = env
        .claim_condition_becomes("data", "False", "InvalidServiceEndpoint")
        .await;
    assert!(broken.contains("nfs.example.com"), "{broken}");

    let pvc = env.api::<PersistentVolumeClaim>().get("data").await.unwrap();
    let status = pvc.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Bound"), "the phase is the binder's");
    let types: Vec<String> = status.conditions.unwrap().into_iter().map(|c| c.type_).collect();
    assert!(types.contains(&"Resizing".to_owned()), "{types:?}");
    let managers: Vec<String> = pvc
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.subresource.as_deref() == Some("status"))
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.contains(&"shared-volume-controller".to_owned()),
        "{managers:?}"
    );
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_standing_warning_outlives_the_event_ttl() {
    // Events live 15 s on this control plane (1 h by default); the claim stays broken longer.
    let cluster = PrivateCluster::up_with("eventttl", &[("SVC_EVENT_TTL", "15s")]);
    let env = common::setup_on(cluster.config().await, "ctl-event-ttl").await;
    let repeat = ["--warning-repeat-interval", "5s", "--resync-interval", "2s"];
    let controller = env.start_controller_on(&cluster, &repeat).await;
    env.bound_rwx_claim("broken", serving("nfs.example.com:2049")).await;
    let first = env.wait_for_events("broken", "InvalidServiceEndpoint").await;
    let posted = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(40)).await;
    let standing = env.events("broken", "InvalidServiceEndpoint").await;
    assert!(
        !standing.is_empty(),
        "the Warning first posted {:?} ago ({:?}) expired and was not posted again",
        posted.elapsed(),
        first[0].metadata.name
    );
    let repeats = standing
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum::<i32>();
    assert!(repeats >= 2, "posted again while it stands: {repeats}");
    controller.stop().await;
    env.remove_chart_permissions(&cluster.kubeconfig());
    env.cleanup().await;
}

/// A claim LINSTOR CSI serves itself gets nothing of the shared-volume loop but its condition,
/// which follows what LINSTOR's nfs-helper advertises: no server yet, then who serves it, where
/// and since when, and through a move (the slice deleted, then made again naming the new node)
/// the new server.
#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_claim_linstor_csi_serves_is_told_who_serves_it_where_and_since_when() {
    let env = common::setup("ctl-linstor").await;
    let nodes = env.sim_nodes(&["a", "b"]).await;
    let controller = env.start_controller(&[]).await;
    let (_, pv) = env.bound_rwx_claim_served_by_linstor_nfs("theirs").await;
    let pv = pv.metadata.name.unwrap();

    let waiting = env
        .claim_condition_becomes("theirs", "False", "LinstorNfsNotAdvertised")
        .await;
    assert!(waiting.contains(&format!("{}/{pv}", env.ns)), "{waiting}");

    let first = advertise(&env, &pv, &nodes[0].name, "10.244.1.7", 2050).await;
    let since = first.metadata.creation_timestamp.unwrap().0.to_string();
    let served = env
        .claim_condition_says("theirs", "True", "ServedByLinstorCsi", "10.244.1.7:2050")
        .await;
    let pod = format!("{}/linstor-csi-nfs-server-{}", env.ns, nodes[0].name);
    assert!(served.contains(&since) && served.contains(&pod), "{served}");

    let moved = advertise(&env, &pv, &nodes[1].name, "10.244.2.9", 2050).await;
    let since = moved.metadata.creation_timestamp.unwrap().0.to_string();
    let after_move = env
        .claim_condition_says("theirs", "True", "ServedByLinstorCsi", "10.244.2.9:2050")
        .await;
    assert!(after_move.contains(&since), "{after_move}");

    // Nothing written for it: no Service, no mount endpoint.
    assert_eq!(env.cluster_ip(&pv).await, None);
    assert_eq!(env.pv_annotation(&pv, MOUNT_ENDPOINT).await, None);
    controller.stop().await;
    env.cleanup().await;
}
