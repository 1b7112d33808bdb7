//! A volume LINSTOR CSI serves itself, as its nfs-helper publishes it: one `linstor-csi-nfs`
//! Service with a port per volume (named after the resource), and an EndpointSlice per volume,
//! named after the resource, owned by the NFS server's pod, whose one port carries that name. A
//! move is nfs-helper's: the new primary deletes the slice, then makes it again naming itself. A
//! client that holds its connection through the real kube-proxy (closing it normally when a reply
//! is late, then connecting again from its port, as the kernel's client does) follows the move
//! only if the conntrack repair deletes its stranded entry.
//!
//! What it leaves out: LINSTOR CSI and drbd-reactor; the server pods are Pod objects on their nodes
//! (the slices' owners, as the garbage collector requires) with nfs-ganesha run in the node's
//! namespace beside them. Both nodes' servers run before the move, so that the measure is the
//! client's, not the server's start.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use super::datapath::{DataPath, ProxyMode};
use super::held::{Close, HeldClient};
use super::{TestEnv, eventually};

const SERVICE: &str = "linstor-csi-nfs";
const RESOURCE: &str = "pvc-linstor-1";
/// The Service port of the volume; the server listens on 2049 on its node.
const SERVICE_PORT: u16 = 2052;
const CLIENT_PORT: u16 = 710;
const WAIT: Duration = Duration::from_secs(60);

/// From the move of the slice to the held client's first answer after it, `None` when it had none
/// within `patience`; the repair runs with `repair_args`.
pub async fn a_held_client_through_a_linstor_move(
    env: &TestEnv,
    repair_args: &[&str],
    patience: Duration,
) -> Option<Duration> {
    let mut path = DataPath::up(env, &["a", "b"], ProxyMode::Iptables).await;
    let (a, b) = (path.nodes[0].ip.clone(), path.nodes[1].ip.clone());
    path.start_server(0, RESOURCE);
    path.start_server(1, RESOURCE);
    let cluster_ip = linstor_service(env).await;
    advertise(env, RESOURCE, &path.nodes[0].name, &a, 2049).await;
    eventually("kube-proxy's rule to node a", WAIT, || {
        std::future::ready(path.programmed_port(&env.ns, SERVICE, RESOURCE, &a).then_some(()))
    })
    .await;
    let repair = super::outage::start_conntrack_repair(env, &path, "30s", repair_args).await;
    let server = format!("{cluster_ip}:{SERVICE_PORT}").parse().unwrap();
    let mut client = HeldClient::new(server, CLIENT_PORT, Close::Normal);
    eventually("the held client's first answer, from node a", WAIT, || {
        std::future::ready(client.call().then_some(()))
    })
    .await;

    // Node a is lost; nfs-helper on node b takes the volume over.
    path.fail(0);
    advertise(env, RESOURCE, &path.nodes[1].name, &b, 2049).await;
    let moved = Instant::now();
    let mut followed = None;
    while moved.elapsed() < patience {
        if client.call() {
            followed = Some(moved.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        path.programmed_port(&env.ns, SERVICE, RESOURCE, &b),
        "kube-proxy's rules send the volume's port to node b"
    );
    repair.stop().await;
    drop(client);
    drop(path);
    followed
}

/// LINSTOR CSI's Service: selector-less, one port per volume named after it; its ClusterIP.
async fn linstor_service(env: &TestEnv) -> String {
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": SERVICE, "namespace": env.ns},
        "spec": {"ports": [
            {"name": "pvc-linstor-0", "port": 2051, "targetPort": 2049, "protocol": "TCP"},
            {"name": RESOURCE, "port": SERVICE_PORT, "targetPort": 2049, "protocol": "TCP"},
        ]},
    }))
    .unwrap();
    env.api::<Service>()
        .create(&Default::default(), &service)
        .await
        .unwrap();
    env.cluster_ip(SERVICE).await.expect("a ClusterIP")
}

/// What nfs-helper's move does on the node now primary for `resource` (its first `advertise
/// start` too): `advertise clean`, deleting the slice, then a new one naming the server of
/// `node` at `ip`:`port`, owned by its pod. The slice made.
pub async fn advertise(env: &TestEnv, resource: &str, node: &str, ip: &str, port: u16) -> EndpointSlice {
    let owner = server_pod(env, node).await;
    let slices = env.api::<EndpointSlice>();
    if slices.get_opt(resource).await.unwrap().is_some() {
        slices.delete(resource, &Default::default()).await.unwrap();
    }
    let slice = nfs_helper_slice(resource, ip, port, &owner);
    slices.create(&Default::default(), &slice).await.unwrap()
}

/// The NFS server's pod on `node`, as LINSTOR CSI runs one where the volume is primary: its
/// reference for the slice's owner.
async fn server_pod(env: &TestEnv, node: &str) -> Value {
    let name = format!("linstor-csi-nfs-server-{node}");
    let existing = env
        .api::<k8s_openapi::api::core::v1::Pod>()
        .get_opt(&name)
        .await
        .unwrap();
    let pod = match existing {
        Some(pod) => pod,
        None => {
            let scratch = json!({"name": "scratch", "emptyDir": {}});
            env.running_pod_with(&name, node, scratch, json!({}), json!({})).await
        }
    };
    json!({"apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod.metadata.uid,
        "controller": true, "blockOwnerDeletion": true})
}

/// The slice nfs-helper's `advertise start` makes on the node at `ip`, owned by its server pod.
fn nfs_helper_slice(resource: &str, ip: &str, port: u16, owner: &Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {
            "name": resource,
            "labels": {
                "kubernetes.io/service-name": SERVICE,
                "endpointslice.kubernetes.io/managed-by": "nfs-helper.linstor.csi.linbit.com",
            },
            "ownerReferences": [owner],
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip]}],
        "ports": [{"name": resource, "port": port}],
    }))
    .unwrap()
}
