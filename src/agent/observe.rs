//! From cached Kubernetes objects to the agent's [`Observed`] view (pure): the indexes the
//! decisions need (PV by DRBD resource, pods by claim, attachments by PV, satellites by name,
//! the peers' reports from their heartbeat Leases).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod, Volume};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;

use super::drbd::DrbdState;
use super::report::Report;
use super::view::{AttachmentView, Liveness, NodeView, Observed, PeerReport, PodView, VolumeView};
use crate::names::{IGNORE_FAIL_OVER_ANNOTATION, SERVICE_ENDPOINT_ANNOTATION};
use crate::sharedvolume::claim::{bound_claim, nfs_port, pv_backs_shared_claim};
use crate::sharedvolume::filters::Filters;
use crate::sharedvolume::silence::SilentServer;
use crate::sharedvolume::stamp::MoveStamp;
use crate::volume::{ClaimKey, csi_resource_name};

/// The cached objects one decision round looks at.
#[derive(Default)]
pub struct Snapshot {
    pub pvs: Vec<Arc<PersistentVolume>>,
    pub pods: Vec<Arc<Pod>>,
    pub attachments: Vec<Arc<VolumeAttachment>>,
    pub nodes: Vec<Arc<Node>>,
    pub satellites: Vec<Arc<Pod>>,
    /// The agents' report Leases.
    pub leases: Vec<Arc<Lease>>,
}

/// Builds the view of `node`. Only PVs of local DRBD resources are looked at; `publishable` says
/// which of them it may publish over NFS.
pub fn observe(
    node: &str,
    node_ip: Option<IpAddr>,
    drbd: DrbdState,
    snapshot: &Snapshot,
    publishable: &Filters,
) -> Observed {
    let nodes: BTreeMap<String, NodeView> = snapshot.nodes.iter().map(|n| (n.name_any(), node_view(n))).collect();
    let node_ip = node_ip
        .or_else(|| own_internal_ip(node, snapshot))
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
            pods_by_claim.entry(key).or_default().push(pod_view(pod, claim));
        }
    }
    let mut attachments_by_pv = attachments_by_pv(snapshot);
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
            pv_version: pv.resource_version().unwrap_or_default(),
            pods,
            attachments,
            shared_claim: claim.clone().filter(|_| pv_backs_shared_claim(pv, publishable)),
            service_endpoint: pv.annotations().get(SERVICE_ENDPOINT_ANNOTATION).cloned(),
            nfs_port: nfs_port(pv),
            moved_by: MoveStamp::read(pv.metadata.annotations.as_ref()).and_then(|stamp| stamp.node),
            silent_server: SilentServer::read(pv.metadata.annotations.as_ref()),
        };
        volumes.insert(resource, view);
    }
    let satellite_nodes = satellite_nodes(snapshot);
    let (reports, agent_nodes) = peer_reports(&snapshot.leases);
    Observed {
        node: node.to_owned(),
        node_ip,
        drbd,
        volumes,
        nodes,
        satellite_nodes,
        reports,
        agent_nodes,
        // The shell's fresh reads say how the API server answered (`super::peers`).
        api_answering_since: None,
        piraeus_ha_controllers: piraeus_ha_controllers(node, &snapshot.pods),
        kubelet_silent_from: HashMap::new(),
        unread_nodes: BTreeSet::new(),
    }
}

/// The attachments not being deleted, by the PV they attach.
fn attachments_by_pv(snapshot: &Snapshot) -> HashMap<&str, Vec<AttachmentView>> {
    let mut by_pv: HashMap<&str, Vec<AttachmentView>> = HashMap::new();
    for attachment in snapshot
        .attachments
        .iter()
        .filter(|a| a.metadata.deletion_timestamp.is_none())
    {
        if let Some(pv) = attachment.spec.source.persistent_volume_name.as_deref() {
            by_pv.entry(pv).or_default().push(AttachmentView {
                name: attachment.name_any(),
                uid: attachment.uid().unwrap_or_default(),
                node: attachment.spec.node_name.clone(),
            });
        }
    }
    by_pv
}

/// The labels that tell a pod of Piraeus's HA Controller: piraeus-operator v2's DaemonSet, and
/// the chart of the standalone piraeus-ha-controller. `agent::cache`'s trimmer keeps these keys.
pub const PIRAEUS_HA_CONTROLLER_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/component", "ha-controller"),
    ("app.kubernetes.io/name", "piraeus-ha-controller"),
];

/// The pods of Piraeus's HA Controller that run on `node` (`namespace/name`).
fn piraeus_ha_controllers(node: &str, pods: &[Arc<Pod>]) -> Vec<String> {
    let mut found: Vec<String> = pods
        .iter()
        .filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && phase(pod) == Some("Running"))
        .filter(|pod| {
            let labels = pod.labels();
            PIRAEUS_HA_CONTROLLER_LABELS
                .iter()
                .any(|(key, value)| labels.get(*key).map(String::as_str) == Some(*value))
        })
        .map(|pod| format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()))
        .collect();
    found.sort();
    found
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref().and_then(|s| s.phase.as_deref())
}

/// This node's InternalIP, from its Node.
fn own_internal_ip(node: &str, snapshot: &Snapshot) -> Option<IpAddr> {
    internal_ip(snapshot.nodes.iter().find(|n| n.name_any() == node)?)
}

/// LINSTOR node name → Kubernetes node name, from the satellite pods.
fn satellite_nodes(snapshot: &Snapshot) -> HashMap<String, String> {
    snapshot
        .satellites
        .iter()
        .filter_map(|p| Some((p.name_any(), p.spec.as_ref()?.node_name.clone()?)))
        .collect()
}

/// The Kubernetes nodes of the DRBD peers `node` has lost the link to, for resources with a PV:
/// the only other nodes whose pods and Node the decisions may need, to be read fresh before
/// [`observe`]. Costs nothing while every link is up.
/// The Kubernetes nodes of this node's DRBD peers, of the resources that have a PV: those whose
/// liveness a fail-over may weigh.
pub fn drbd_peer_nodes(node: &str, drbd: &DrbdState, snapshot: &Snapshot) -> BTreeSet<String> {
    let with_pv: HashSet<String> = snapshot.pvs.iter().filter_map(|pv| csi_resource_name(pv)).collect();
    let satellites = satellite_nodes(snapshot);
    drbd.resources
        .iter()
        .filter(|r| with_pv.contains(&r.name))
        .flat_map(|r| &r.connections)
        .map(|c| satellites.get(&c.name).cloned().unwrap_or_else(|| c.name.clone()))
        .filter(|peer| peer != node)
        .collect()
}

pub fn suspected_peers(node: &str, drbd: &DrbdState, snapshot: &Snapshot) -> BTreeSet<String> {
    let disconnected: Vec<(&str, &str)> = drbd
        .resources
        .iter()
        .flat_map(|r| {
            r.connections
                .iter()
                .filter(|c| !c.is_connected())
                .map(move |c| (r.name.as_str(), c.name.as_str()))
        })
        .collect();
    if disconnected.is_empty() {
        return BTreeSet::new();
    }
    let with_pv: HashSet<String> = snapshot.pvs.iter().filter_map(|pv| csi_resource_name(pv)).collect();
    let satellites = satellite_nodes(snapshot);
    disconnected
        .into_iter()
        .filter(|(resource, _)| with_pv.contains(*resource))
        .map(|(_, peer)| satellites.get(peer).cloned().unwrap_or_else(|| peer.to_owned()))
        .filter(|peer| peer != node)
        .collect()
}

/// The agents' reports by node, and the nodes where an agent runs or ran (they hold a report
/// Lease). A report counts as alive only once its agent's heartbeat has been checked: the shell
/// does that for the peers it weighs (see `confirm_alive` in the loop).
fn peer_reports(leases: &[Arc<Lease>]) -> (HashMap<String, PeerReport>, BTreeSet<String>) {
    let mut reports = HashMap::new();
    let mut agent_nodes = BTreeSet::new();
    for lease in leases {
        let Some(spec) = &lease.spec else { continue };
        let Some(holder) = spec.holder_identity.clone() else {
            continue;
        };
        agent_nodes.insert(holder.clone());
        let Some(report) = Report::of_lease(lease) else {
            continue;
        };
        reports.insert(
            holder,
            PeerReport {
                report,
                liveness: Liveness::Unknown,
                quiet_from: None,
                agent_silent_from: None,
            },
        );
    }
    (reports, agent_nodes)
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
            .map(|t| {
                t.iter()
                    .map(|t| (t.key.clone(), t.value.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default(),
        addresses: node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .map(|a| a.iter().map(|a| a.address.clone()).collect())
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

/// The pod as a consumer of `claim`.
fn pod_view(pod: &Pod, claim: &str) -> PodView {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
    let phase = phase(pod);
    let mounts = volumes
        .iter()
        .filter_map(|v| v.persistent_volume_claim.as_ref())
        .filter(|c| c.claim_name == claim);
    PodView {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
        running: phase == Some("Running"),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
        terminating: pod.metadata.deletion_timestamp.is_some(),
        has_owner: !pod.owner_references().is_empty(),
        ignore_fail_over: pod.annotations().contains_key(IGNORE_FAIL_OVER_ANNOTATION),
        unsafe_volumes: volumes.iter().any(|v| !is_safe_to_fail_over(v)),
        read_only: mounts.clone().count() > 0 && mounts.clone().all(|c| c.read_only == Some(true)),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::cache::{trim_attachment, trim_node, trim_pod};
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
                    "metadata": {"name": "csi-1", "uid": "a1"},
                    "spec": {"attacher": "x", "nodeName": "node-a", "source": {"persistentVolumeName": "pv-1"}}
                })),
                parse(json!({
                    "metadata": {"name": "csi-going", "deletionTimestamp": "2026-01-01T00:00:00Z"},
                    "spec": {"attacher": "x", "nodeName": "node-c", "source": {"persistentVolumeName": "pv-1"}}
                })),
            ],
            nodes: vec![parse(json!({
                "metadata": {"name": "node-b"},
                "spec": {"unschedulable": true, "taints": [{"key": "drbd.linbit.com/lost-quorum", "value": "fail-over", "effect": "NoSchedule"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "addresses": [{"type": "Hostname", "address": "b"}, {"type": "InternalIP", "address": "10.0.0.2"}]}
            }))],
            satellites: vec![parse(json!({
                "metadata": {"name": "linstor-b"}, "spec": {"nodeName": "node-b", "containers": []}
            }))],
            leases: vec![
                parse(json!({
                    "metadata": {"name": "shared-volume-agent-report-node-a", "annotations": {"storageos.com/drbd-report":
                        "{\"at\":\"2026-11-23T07:59:59Z\",\"resources\":{\"pvc-1\":{\"primary\":true,\"quorum\":true,\"connected\":[\"node-c\"],\"disconnected\":[\"node-b\"]}}}"}},
                    "spec": {"holderIdentity": "node-a", "leaseDurationSeconds": 40, "renewTime": "2026-11-23T07:59:30.000000Z"}
                })),
                parse(json!({
                    "metadata": {"name": "shared-volume-agent-report-node-c"},
                    "spec": {"holderIdentity": "node-c", "leaseDurationSeconds": 40, "renewTime": "2026-11-23T07:59:30.000000Z"}
                })),
            ],
        }
    }

    fn drbd() -> DrbdState {
        DrbdState {
            resources: vec![Resource {
                name: "pvc-1".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn indexes_volumes_pods_attachments_nodes_and_satellites() {
        let observed = observe("node-b", None, drbd(), &snapshot(), &Filters::default());
        assert_eq!(observed.node_ip.as_deref(), Some("10.0.0.2"));
        assert_eq!(observed.volumes.len(), 1, "only local DRBD resources");
        let volume = &observed.volumes["pvc-1"];
        assert_eq!(volume.pv, "pv-1");
        assert_eq!(
            volume.shared_claim,
            Some(ClaimKey {
                namespace: "apps".into(),
                name: "data".into()
            })
        );
        assert_eq!(volume.service_endpoint.as_deref(), Some("10.0.0.1:2049"));
        let attachment = AttachmentView {
            name: "csi-1".into(),
            uid: "a1".into(),
            node: "node-a".into(),
        };
        assert_eq!(volume.attachments, [attachment]);
        let [pod] = volume.pods.as_slice() else {
            panic!("pods of another namespace's claim must not count: {:?}", volume.pods)
        };
        assert_eq!(
            (
                pod.name.as_str(),
                pod.running,
                pod.has_owner,
                pod.ignore_fail_over,
                pod.unsafe_volumes,
                pod.read_only
            ),
            ("web", true, true, true, true, false)
        );
        let node = &observed.nodes["node-b"];
        assert!(node.ready && node.unschedulable);
        assert_eq!(node.taint_value("drbd.linbit.com/lost-quorum"), Some("fail-over"));
        assert_eq!(node.addresses, ["b", "10.0.0.2"]);
        assert_eq!(observed.satellite_nodes["linstor-b"], "node-b");
    }

    #[test]
    fn reports_are_indexed_by_node_and_not_trusted_until_checked() {
        let observed = observe("node-b", None, drbd(), &snapshot(), &Filters::default());
        assert_eq!(observed.agent_nodes, ["node-a", "node-c"].map(String::from).into());
        let a = &observed.reports["node-a"];
        assert_eq!(a.liveness, Liveness::Unknown, "alive only once the heartbeat was read");
        assert!(a.report.resources["pvc-1"].primary);
        assert!(!observed.reports.contains_key("node-c"), "a Lease without a report");
    }

    #[test]
    fn finished_and_read_only_consumers() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"namespace": "apps", "name": "reader"},
            "spec": {"containers": [], "volumes": [
                {"name": "d", "persistentVolumeClaim": {"claimName": "data", "readOnly": true}},
                {"name": "o", "persistentVolumeClaim": {"claimName": "other"}}]},
            "status": {"phase": "Succeeded"}
        }))
        .unwrap();
        let view = pod_view(&pod, "data");
        assert!(view.read_only && view.finished && !view.running);
        assert!(!pod_view(&pod, "other").read_only);
    }

    #[test]
    fn suspects_are_the_nodes_of_lost_peers_of_resources_with_a_pv() {
        let mut drbd = drbd();
        assert!(
            suspected_peers("node-b", &drbd, &snapshot()).is_empty(),
            "every link up"
        );
        let lost = |name: &str| crate::agent::drbd::Connection {
            name: name.into(),
            connection_state: "Connecting".into(),
            peer_role: "Unknown".into(),
            ..Default::default()
        };
        drbd.resources[0].connections = vec![lost("node-a"), lost("linstor-b")];
        drbd.resources.push(Resource {
            name: "no-pv".into(),
            connections: vec![lost("node-c")],
            ..Default::default()
        });
        let suspects = suspected_peers("node-b", &drbd, &snapshot());
        assert_eq!(
            suspects,
            ["node-a".to_string()].into(),
            "itself and resources without a PV excluded"
        );
    }

    #[test]
    fn the_node_ip_flag_wins_over_the_node_address() {
        let ip = "fd00::7".parse().ok();
        assert_eq!(
            observe("node-b", ip, drbd(), &snapshot(), &Filters::default())
                .node_ip
                .as_deref(),
            Some("fd00::7")
        );
        assert_eq!(
            observe("node-x", None, drbd(), &snapshot(), &Filters::default()).node_ip,
            None
        );
    }

    fn trimmed<K: Clone>(list: &[Arc<K>], trim: fn(&mut K)) -> Vec<Arc<K>> {
        list.iter()
            .map(|object| {
                let mut object = (**object).clone();
                trim(&mut object);
                Arc::new(object)
            })
            .collect()
    }

    #[test]
    fn trimmed_volumes_nodes_and_attachments_keep_what_decisions_read() {
        let full = snapshot();
        let trimmed = Snapshot {
            pvs: trimmed(&full.pvs, crate::sharedvolume::claim::trim_pv),
            nodes: trimmed(&full.nodes, trim_node),
            attachments: trimmed(&full.attachments, trim_attachment),
            ..snapshot()
        };
        let before = observe("node-b", None, drbd(), &full, &Filters::default());
        let after = observe("node-b", None, drbd(), &trimmed, &Filters::default());
        assert_eq!(after.volumes, before.volumes);
        assert_eq!(after.nodes, before.nodes);
        assert_eq!(after.node_ip, before.node_ip);
    }

    #[test]
    fn trimmed_pods_keep_what_decisions_read() {
        let mut pod = (*snapshot().pods[0]).clone();
        let before = pod_view(&pod, "data");
        let claims_before: Vec<String> = claims(&pod).map(String::from).collect();
        trim_pod(&mut pod);
        assert_eq!(pod_view(&pod, "data"), before);
        assert_eq!(claims(&pod).collect::<Vec<_>>(), claims_before);
    }
}
