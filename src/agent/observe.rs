//! From cached Kubernetes objects to the agent's [`Observed`] view (pure): the indexes the
//! decisions need (PV by DRBD resource, pods by claim, attachments by PV, satellites by name).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod, Volume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;

use super::drbd::DrbdState;
use super::view::{NodeView, Observed, PodView, VolumeView};
use crate::names::{IGNORE_FAIL_OVER_ANNOTATION, SERVICE_ENDPOINT_ANNOTATION};
use crate::sharedvolume::claim::{bound_claim, pv_backs_shared_claim};
use crate::volume::{ClaimKey, csi_resource_name};

/// The cached objects one decision round looks at.
#[derive(Default)]
pub struct Snapshot {
    pub pvs: Vec<Arc<PersistentVolume>>,
    pub pods: Vec<Arc<Pod>>,
    pub attachments: Vec<Arc<VolumeAttachment>>,
    pub nodes: Vec<Arc<Node>>,
    pub satellites: Vec<Arc<Pod>>,
}

/// Builds the view of `node`. Only PVs of local DRBD resources are looked at.
pub fn observe(node: &str, node_ip: Option<IpAddr>, drbd: DrbdState, snapshot: &Snapshot) -> Observed {
    let nodes: BTreeMap<String, NodeView> = snapshot.nodes.iter().map(|n| (n.name_any(), node_view(n))).collect();
    let node_ip = node_ip
        .or_else(|| {
            let own = snapshot.nodes.iter().find(|n| n.name_any() == node)?;
            internal_ip(own)
        })
        .map(|ip| ip.to_string());
    // The local resources' PVs first, so that only the pods of their claims are looked at closely.
    let local: HashSet<&str> = drbd.resources.iter().map(|r| r.name.as_str()).collect();
    let local_pvs: Vec<(String, &PersistentVolume, Option<ClaimKey>)> = snapshot
        .pvs
        .iter()
        .filter_map(|pv| {
            let resource = csi_resource_name(pv).filter(|r| local.contains(r.as_str()))?;
            Some((resource, pv.as_ref(), bound_claim(pv)))
        })
        .collect();
    let wanted: HashSet<(&str, &str)> = local_pvs
        .iter()
        .filter_map(|(_, _, claim)| claim.as_ref().map(|c| (c.namespace.as_str(), c.name.as_str())))
        .collect();
    let mut pods_by_claim: HashMap<ClaimKey, Vec<PodView>> = HashMap::new();
    for pod in &snapshot.pods {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        for claim in claims(pod).filter(|claim| wanted.contains(&(namespace, *claim))) {
            let key = ClaimKey {
                namespace: namespace.to_owned(),
                name: claim.to_owned(),
            };
            pods_by_claim.entry(key).or_default().push(pod_view(pod));
        }
    }
    let mut attachments_by_pv: HashMap<&str, Vec<(String, String)>> = HashMap::new();
    for attachment in snapshot
        .attachments
        .iter()
        .filter(|a| a.metadata.deletion_timestamp.is_none())
    {
        if let Some(pv) = attachment.spec.source.persistent_volume_name.as_deref() {
            let entry = (attachment.name_any(), attachment.spec.node_name.clone());
            attachments_by_pv.entry(pv).or_default().push(entry);
        }
    }
    let mut volumes = HashMap::new();
    for (resource, pv, claim) in local_pvs {
        let pods = claim
            .as_ref()
            .and_then(|c| pods_by_claim.get(c))
            .cloned()
            .unwrap_or_default();
        let attachments = attachments_by_pv.remove(pv.name_any().as_str()).unwrap_or_default();
        let view = VolumeView {
            pv: pv.name_any(),
            pods,
            attachments,
            shared: pv_backs_shared_claim(pv),
            service_endpoint: pv.annotations().get(SERVICE_ENDPOINT_ANNOTATION).cloned(),
        };
        volumes.insert(resource, view);
    }
    let satellite_nodes = snapshot
        .satellites
        .iter()
        .filter_map(|p| Some((p.name_any(), p.spec.as_ref()?.node_name.clone()?)))
        .collect();
    Observed {
        node: node.to_owned(),
        node_ip,
        drbd,
        volumes,
        nodes,
        satellite_nodes,
    }
}

pub fn node_view(node: &Node) -> NodeView {
    let spec = node.spec.as_ref();
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    NodeView {
        name: node.name_any(),
        ready,
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        taints: spec
            .and_then(|s| s.taints.as_ref())
            .map(|t| t.iter().map(|t| t.key.clone()).collect())
            .unwrap_or_default(),
    }
}

pub fn internal_ip(node: &Node) -> Option<IpAddr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    addresses
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .and_then(|a| a.address.parse().ok())
}

fn pod_view(pod: &Pod) -> PodView {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
    PodView {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
        running: pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        has_owner: !pod.owner_references().is_empty(),
        ignore_fail_over: pod.annotations().contains_key(IGNORE_FAIL_OVER_ANNOTATION),
        unsafe_volumes: volumes.iter().any(|v| !is_safe_to_fail_over(v)),
    }
}

fn claims(pod: &Pod) -> impl Iterator<Item = &str> + '_ {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.as_str()))
}

/// Volumes that stay correct when the pod restarts on another node: claims and what the
/// kubelet fills in from the API or leaves empty. Anything else (hostPath, in-tree network
/// storage…) might not, so such pods are moved only with `--fail-over-unsafe-pods`.
fn is_safe_to_fail_over(volume: &Volume) -> bool {
    volume.persistent_volume_claim.is_some()
        || volume.config_map.is_some()
        || volume.secret.is_some()
        || volume.downward_api.is_some()
        || volume.empty_dir.is_some()
        || volume.projected.is_some()
}

/// Drops what the decisions never read from a cached Pod, to keep the cache small.
pub fn trim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    pod.labels_mut().clear();
    pod.annotations_mut().retain(|k, _| k == IGNORE_FAIL_OVER_ANNOTATION);
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.clear();
        spec.init_containers = None;
        spec.ephemeral_containers = None;
        spec.affinity = None;
        spec.tolerations = None;
    }
    if let Some(status) = pod.status.as_mut() {
        *status = k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase.take(),
            ..Default::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::drbd::Resource;
    use serde_json::json;

    fn parse<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Arc<T> {
        Arc::new(serde_json::from_value(value).unwrap())
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            pvs: vec![
                parse(json!({
                    "metadata": {"name": "pv-1", "annotations": {"storageos.com/nfs-service-endpoint": "10.0.0.1:2049"}},
                    "spec": {"accessModes": ["ReadWriteMany"], "claimRef": {"namespace": "apps", "name": "data"},
                             "csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": "pvc-1/0"}}
                })),
                parse(json!({
                    "metadata": {"name": "pv-elsewhere"},
                    "spec": {"csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": "pvc-9"}}
                })),
            ],
            pods: vec![
                parse(json!({
                    "metadata": {"namespace": "apps", "name": "web", "uid": "u1",
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "r"}],
                                 "annotations": {"drbd.linbit.com/ignore-fail-over": ""}},
                    "spec": {"nodeName": "node-a", "containers": [],
                             "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                                         {"name": "h", "hostPath": {"path": "/srv"}}]},
                    "status": {"phase": "Running"}
                })),
                parse(json!({
                    "metadata": {"namespace": "other", "name": "same-claim-name", "uid": "u2"},
                    "spec": {"nodeName": "node-a", "containers": [],
                             "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}
                })),
            ],
            attachments: vec![
                parse(json!({
                    "metadata": {"name": "csi-1"},
                    "spec": {"attacher": "x", "nodeName": "node-a", "source": {"persistentVolumeName": "pv-1"}}
                })),
                parse(json!({
                    "metadata": {"name": "csi-going", "deletionTimestamp": "2026-01-01T00:00:00Z"},
                    "spec": {"attacher": "x", "nodeName": "node-c", "source": {"persistentVolumeName": "pv-1"}}
                })),
            ],
            nodes: vec![parse(json!({
                "metadata": {"name": "node-b"},
                "spec": {"unschedulable": true, "taints": [{"key": "drbd.linbit.com/lost-quorum", "effect": "NoSchedule"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "addresses": [{"type": "Hostname", "address": "b"}, {"type": "InternalIP", "address": "10.0.0.2"}]}
            }))],
            satellites: vec![parse(json!({
                "metadata": {"name": "linstor-b"}, "spec": {"nodeName": "node-b", "containers": []}
            }))],
        }
    }

    fn drbd() -> DrbdState {
        DrbdState {
            resources: vec![Resource {
                name: "pvc-1".into(),
                ..Default::default()
            }],
            quorum_enabled: Default::default(),
        }
    }

    #[test]
    fn indexes_volumes_pods_attachments_nodes_and_satellites() {
        let observed = observe("node-b", None, drbd(), &snapshot());
        assert_eq!(observed.node_ip.as_deref(), Some("10.0.0.2"));
        assert_eq!(observed.volumes.len(), 1, "only local DRBD resources");
        let volume = &observed.volumes["pvc-1"];
        assert_eq!(volume.pv, "pv-1");
        assert!(volume.shared);
        assert_eq!(volume.service_endpoint.as_deref(), Some("10.0.0.1:2049"));
        assert_eq!(volume.attachments, [("csi-1".to_string(), "node-a".to_string())]);
        let [pod] = volume.pods.as_slice() else {
            panic!("pods of another namespace's claim must not count: {:?}", volume.pods)
        };
        assert_eq!(
            (
                pod.name.as_str(),
                pod.running,
                pod.has_owner,
                pod.ignore_fail_over,
                pod.unsafe_volumes
            ),
            ("web", true, true, true, true)
        );
        let node = &observed.nodes["node-b"];
        assert!(node.ready && node.unschedulable);
        assert_eq!(node.taints, ["drbd.linbit.com/lost-quorum"]);
        assert_eq!(observed.satellite_nodes["linstor-b"], "node-b");
    }

    #[test]
    fn the_node_ip_flag_wins_over_the_node_address() {
        let ip = "fd00::7".parse().ok();
        assert_eq!(
            observe("node-b", ip, drbd(), &snapshot()).node_ip.as_deref(),
            Some("fd00::7")
        );
        assert_eq!(observe("node-x", None, drbd(), &snapshot()).node_ip, None);
    }

    #[test]
    fn trimmed_pods_keep_what_decisions_read() {
        let mut pod = (*snapshot().pods[0]).clone();
        let before = pod_view(&pod);
        let claims_before: Vec<String> = claims(&pod).map(String::from).collect();
        trim_pod(&mut pod);
        assert_eq!(pod_view(&pod), before);
        assert_eq!(claims(&pod).collect::<Vec<_>>(), claims_before);
    }
}
