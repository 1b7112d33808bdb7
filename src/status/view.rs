//! What `status` shows, built from the objects it read (pure): the leader, each agent, the
//! fail-over guard's reservations and each claim the controller states a condition on; as a table
//! for people ([`table`]) or as JSON for scripts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde::Serialize;

use crate::agent::guard::live_reservations;
use crate::agent::observe::node_view;
use crate::agent::report::Report;
use crate::names::{
    DEFAULT_OPERATIONS_TIMEOUT, LOST_QUORUM_TAINT, OPERATIONS_TIMEOUT_ENV, lease_name, report_lease_name,
};
use crate::names::{FAIL_OVER_GUARD_LEASE, MOUNT_ENDPOINT_ANNOTATION, SERVICE_ENDPOINT_ANNOTATION};
use crate::sharedvolume::claim::{ready_condition, served_elsewhere};
use crate::sharedvolume::linstor;
use crate::sharedvolume::silence::SilentServer;
use crate::sharedvolume::stamp::MoveStamp;
use crate::volume::csi_resource_name;

mod table;
pub use table::table;

/// Everything `status` reads, as the API returned it.
#[derive(Debug, Default)]
pub struct Observed {
    pub namespace: String,
    pub lease_name: String,
    /// The leader Lease, if it exists.
    pub leader: Option<Lease>,
    pub agent_pods: Vec<Pod>,
    /// The conntrack repair's pods.
    pub repair_pods: Vec<Pod>,
    /// The Leases of the release namespace (heartbeats, reports, the guard).
    pub leases: Vec<Lease>,
    pub nodes: Vec<Node>,
    pub claims: Vec<PersistentVolumeClaim>,
    pub pvs: Vec<PersistentVolume>,
    /// The slices LINSTOR CSI's nfs-helper advertises its servers with.
    pub linstor_slices: Vec<EndpointSlice>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusView {
    pub namespace: String,
    pub leader: Leader,
    pub agents: Vec<Agent>,
    pub repairs: Vec<Repair>,
    pub reservations: Vec<Reservation>,
    pub claims: Vec<Claim>,
    /// Claims LINSTOR CSI serves itself: the HA agent and the repair act for them, the controller
    /// does not.
    pub served_by_linstor: Vec<LinstorClaim>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LinstorClaim {
    pub namespace: String,
    pub name: String,
    pub volume: String,
    /// LINSTOR CSI's `nfs://<its Service>:<port>/…`.
    pub export: String,
    /// The server its nfs-helper advertises (`IP:port`), none while it advertises none.
    pub server: Option<String>,
    /// When it advertised that server (RFC 3339): the end of the last move.
    pub since: Option<String>,
    /// The node whose agent reports the volume's DRBD resource as Primary: where LINSTOR's NFS
    /// server runs.
    pub primary_node: Option<String>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Leader {
    pub lease: String,
    pub holder: Option<String>,
    pub renewed_seconds_ago: Option<i64>,
    /// Held, and renewed within its duration.
    pub fresh: bool,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Agent {
    pub node: String,
    pub pod: String,
    pub ready: bool,
    pub heartbeat_seconds_ago: Option<i64>,
    /// When it last reported a change of its DRBD view (the report Lease).
    pub drbd_reported_seconds_ago: Option<i64>,
    /// The DRBD resources it reports as Primary.
    pub primaries: usize,
    /// The node's `drbd.linbit.com/` taints, `key=value:effect`.
    pub taints: Vec<String>,
}

/// A pod of the conntrack repair: whether it is ready, and what keeps it from running (a
/// container's waiting or terminated reason, `ImagePullBackOff` for one).
#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Repair {
    pub node: String,
    pub pod: String,
    pub ready: bool,
    pub not_running: Option<String>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    pub node: String,
    pub expires_in_seconds: i64,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    pub namespace: String,
    pub name: String,
    pub volume: String,
    /// The SharedVolumeReady condition's status: `True`, `False` or `Unknown`.
    pub ready: String,
    pub reason: String,
    pub message: String,
    pub mount_endpoint: Option<String>,
    /// The node whose agent reports the volume's DRBD resource as Primary.
    pub primary_node: Option<String>,
    pub last_move: Option<Move>,
    /// The agent on its primary says its published NFS server does not answer: since when, why.
    pub server_not_answering: Option<SilentServer>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    pub node: Option<String>,
    pub at: Option<String>,
}

pub fn build(observed: &Observed, now: Timestamp) -> StatusView {
    let leases: BTreeMap<String, &Lease> = observed.leases.iter().map(|l| (l.name_any(), l)).collect();
    let reports: BTreeMap<&str, Report> = observed
        .agent_pods
        .iter()
        .filter_map(|pod| {
            let node = pod.spec.as_ref()?.node_name.as_deref()?;
            let lease = leases.get(&report_lease_name(node))?;
            Some((node, Report::of_lease(lease)?))
        })
        .collect();
    StatusView {
        namespace: observed.namespace.clone(),
        leader: leader(&observed.lease_name, observed.leader.as_ref(), now),
        agents: observed
            .agent_pods
            .iter()
            .map(|pod| agent(pod, &leases, &reports, &observed.nodes, now))
            .collect(),
        repairs: observed.repair_pods.iter().map(repair).collect(),
        reservations: leases
            .get(FAIL_OVER_GUARD_LEASE)
            .map(|guard| reservations(guard, observed, now))
            .unwrap_or_default(),
        claims: observed
            .claims
            .iter()
            .filter_map(|claim| self::claim(claim, &observed.pvs, &reports))
            .collect(),
        served_by_linstor: observed
            .claims
            .iter()
            .filter_map(|claim| linstor_claim(claim, observed, &reports))
            .collect(),
    }
}

fn seconds_since(then: Timestamp, now: Timestamp) -> i64 {
    now.duration_since(then).as_secs()
}

fn renewed(lease: &Lease) -> Option<Timestamp> {
    Some(lease.spec.as_ref()?.renew_time.as_ref()?.0)
}

fn leader(name: &str, lease: Option<&Lease>, now: Timestamp) -> Leader {
    let holder = lease
        .and_then(|l| l.spec.as_ref()?.holder_identity.clone())
        .filter(|h| !h.is_empty());
    Leader {
        lease: name.to_owned(),
        holder,
        renewed_seconds_ago: lease.and_then(renewed).map(|at| seconds_since(at, now)),
        // Held and renewed within its duration: the rule `helm test` checks.
        fresh: crate::selftest::leader_verdict(lease, now).is_ok(),
    }
}

fn agent(
    pod: &Pod,
    leases: &BTreeMap<String, &Lease>,
    reports: &BTreeMap<&str, Report>,
    nodes: &[Node],
    now: Timestamp,
) -> Agent {
    let node = node_of(pod);
    let ready = is_ready(pod);
    let age_of = |lease: Option<&&Lease>| lease.and_then(|l| renewed(l)).map(|at| seconds_since(at, now));
    let report = reports.get(node.as_str());
    let reported = report
        .and_then(|r| r.at.parse::<Timestamp>().ok())
        .map(|at| seconds_since(at, now));
    let taints = nodes
        .iter()
        .find(|n| n.name_any() == node)
        .and_then(|n| n.spec.as_ref()?.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key.starts_with("drbd.linbit.com/"))
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect();
    Agent {
        pod: pod.name_any(),
        ready,
        heartbeat_seconds_ago: age_of(leases.get(&lease_name(&node))),
        drbd_reported_seconds_ago: reported,
        primaries: report.map_or(0, |r| r.resources.values().filter(|r| r.primary).count()),
        taints,
        node,
    }
}

fn node_of(pod: &Pod) -> String {
    pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default()
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn repair(pod: &Pod) -> Repair {
    let not_running = pod
        .status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref())
        .find_map(|state| {
            let waiting = state.waiting.as_ref().and_then(|w| w.reason.clone());
            waiting.or_else(|| state.terminated.as_ref().and_then(|t| t.reason.clone()))
        });
    Repair {
        node: node_of(pod),
        pod: pod.name_any(),
        ready: is_ready(pod),
        not_running,
    }
}

/// The reservations the guard still counts, by its own rule ([`live_reservations`]): unexpired,
/// and of a node carrying the fail-over taint or made recently enough for its taint to be on its
/// way (within twice the agents' write bound).
fn reservations(guard: &Lease, observed: &Observed, now: Timestamp) -> Vec<Reservation> {
    let tainted: BTreeSet<String> = observed
        .nodes
        .iter()
        .map(node_view)
        .filter(|node| node.has_taint(LOST_QUORUM_TAINT))
        .map(|node| node.name)
        .collect();
    let held = crate::agent::guard::reservations(guard);
    live_reservations(held, &tainted, now, agents_write_within(&observed.agent_pods))
        .into_iter()
        .map(|(node, expiry)| Reservation {
            node,
            expires_in_seconds: expiry.duration_since(now).as_secs(),
        })
        .collect()
}

/// The bound of the agents' writes the guard applies: their `--operations-timeout`, read from
/// the `OPERATIONS_TIMEOUT` the chart sets in their pods (the longest, should they differ), its
/// default where none says.
fn agents_write_within(agent_pods: &[Pod]) -> Duration {
    agent_pods
        .iter()
        .filter_map(|pod| pod.spec.as_ref())
        .flat_map(|spec| &spec.containers)
        .flat_map(|container| container.env.iter().flatten())
        .filter(|var| var.name == OPERATIONS_TIMEOUT_ENV)
        .filter_map(|var| humantime::parse_duration(var.value.as_deref()?).ok())
        .max()
        .unwrap_or(DEFAULT_OPERATIONS_TIMEOUT)
}

/// A claim the controller states a condition on, but for LINSTOR CSI's own (listed apart).
fn claim(claim: &PersistentVolumeClaim, pvs: &[PersistentVolume], reports: &BTreeMap<&str, Report>) -> Option<Claim> {
    let condition = ready_condition(claim)?;
    let volume = claim
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.clone())
        .unwrap_or_default();
    let pv = pvs.iter().find(|pv| pv.name_any() == volume);
    if pv.is_some_and(served_elsewhere) {
        return None;
    }
    let primary_node = primary_node(pv, &volume, reports);
    let annotations = pv.map(|pv| pv.annotations());
    Some(Claim {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        ready: condition.status.clone(),
        reason: condition.reason.clone().unwrap_or_default(),
        message: condition.message.clone().unwrap_or_default(),
        mount_endpoint: annotations.and_then(|a| a.get(MOUNT_ENDPOINT_ANNOTATION).cloned()),
        primary_node,
        last_move: MoveStamp::read(annotations).map(|stamp| Move {
            node: stamp.node,
            at: stamp.at,
        }),
        server_not_answering: annotations
            .and_then(|a| a.get(SERVICE_ENDPOINT_ANNOTATION))
            .and_then(|endpoint| SilentServer::of_endpoint(annotations, endpoint)),
        volume,
    })
}

/// The node whose agent reports the resource of `pv` (or of the name `volume`) as Primary.
fn primary_node(pv: Option<&PersistentVolume>, volume: &str, reports: &BTreeMap<&str, Report>) -> Option<String> {
    let resource = pv.and_then(csi_resource_name).unwrap_or_else(|| volume.to_owned());
    reports
        .iter()
        .find(|(_, report)| report.resources.get(&resource).is_some_and(|r| r.primary))
        .map(|(node, _)| (*node).to_owned())
}

/// A claim whose PV carries LINSTOR CSI's NFS export: its export, the server advertised for it,
/// and where it is primary.
fn linstor_claim(
    claim: &PersistentVolumeClaim,
    observed: &Observed,
    reports: &BTreeMap<&str, Report>,
) -> Option<LinstorClaim> {
    let volume = claim.spec.as_ref()?.volume_name.clone()?;
    let pv = observed.pvs.iter().find(|pv| pv.name_any() == volume)?;
    let export = linstor::export_of(pv)?;
    let server = observed
        .linstor_slices
        .iter()
        .filter(|slice| slice.namespace() == export.namespace && slice.name_any() == export.resource)
        .find_map(linstor::advertised);
    Some(LinstorClaim {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        export: export.url,
        server: server.as_ref().map(|s| s.address.clone()),
        since: server.and_then(|s| s.since),
        primary_node: primary_node(Some(pv), &volume, reports),
        volume,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    const NOW: &str = "2026-11-26T12:00:30Z";

    fn observed() -> Observed {
        let report = r#"{"at":"2026-11-26T12:00:20Z","resources":{"pvc-1":{"primary":true,"quorum":true}}}"#;
        Observed {
            namespace: "storage-system".into(),
            lease_name: "shared-volume-controller".into(),
            leader: Some(parse(json!({"metadata": {"name": "shared-volume-controller"},
                "spec": {"holderIdentity": "controller-0", "leaseDurationSeconds": 15, "renewTime": "2026-11-26T12:00:25.000000Z"}}))),
            agent_pods: vec![
                parse(
                    json!({"metadata": {"name": "agent-a"}, "spec": {"nodeName": "node-a", "containers": []},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
                ),
                parse(
                    json!({"metadata": {"name": "agent-b"}, "spec": {"nodeName": "node-b", "containers": []},
                    "status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
                ),
            ],
            repair_pods: vec![
                parse(
                    json!({"metadata": {"name": "conntrack-a"}, "spec": {"nodeName": "node-a", "containers": []},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}],
                        "containerStatuses": [{"name": "conntrack", "image": "x", "imageID": "", "ready": true,
                            "restartCount": 0, "state": {"running": {}}}]}}),
                ),
                parse(
                    json!({"metadata": {"name": "conntrack-b"}, "spec": {"nodeName": "node-b", "containers": []},
                    "status": {"conditions": [{"type": "Ready", "status": "False"}],
                        "containerStatuses": [{"name": "conntrack", "image": "x", "imageID": "", "ready": false,
                            "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}}),
                ),
            ],
            leases: vec![
                parse(json!({"metadata": {"name": "shared-volume-agent-node-a"},
                    "spec": {"renewTime": "2026-11-26T12:00:28.000000Z"}})),
                parse(json!({"metadata": {"name": "shared-volume-agent-report-node-a",
                    "annotations": {"storageos.com/drbd-report": report}}})),
                parse(json!({"metadata": {"name": "shared-volume-agent-fail-over-guard",
                    "annotations": {"storageos.com/fail-over-reservations":
                        r#"{"node-b":"2026-11-26T12:02:00Z","node-c":"2026-11-26T11:00:00Z"}"#}}})),
            ],
            nodes: vec![parse(json!({"metadata": {"name": "node-b"}, "spec": {"taints": [
                {"key": "drbd.linbit.com/lost-quorum", "value": "fail-over", "effect": "NoSchedule"},
                {"key": "other", "effect": "NoSchedule"}]}}))],
            claims: vec![
                parse(
                    json!({"metadata": {"namespace": "apps", "name": "data"}, "spec": {"volumeName": "pv-1"},
                    "status": {"conditions": [{"type": "SharedVolumeReady", "status": "True", "reason": "ServedAfterMove",
                        "message": "clients mount 10.96.0.10:2049", "lastTransitionTime": "2026-11-26T12:00:00Z"}]}}),
                ),
                parse(json!({"metadata": {"namespace": "apps", "name": "rwo"}, "spec": {"volumeName": "pv-2"}})),
                parse(
                    json!({"metadata": {"namespace": "apps", "name": "theirs"}, "spec": {"volumeName": "pv-3"},
                    "status": {"conditions": [{"type": "SharedVolumeReady", "status": "True", "reason": "ServedByLinstorCsi"}]}}),
                ),
            ],
            pvs: vec![
                parse(json!({"metadata": {"name": "pv-1", "annotations": {
                    "storageos.com/nfs-mount-endpoint": "10.96.0.10:2049",
                    "storageos.com/nfs-service-endpoint": "10.0.0.1:2049",
                    "storageos.com/nfs-server-not-answering":
                        r#"{"endpoint":"10.0.0.1:2049","since":"2026-11-26T12:00:10Z","why":"connection refused"}"#,
                    "storageos.com/nfs-endpoint-move": r#"{"endpoint":"10.0.0.1:2049","overPvVersion":"7","node":"node-a","at":"2026-11-26T11:59:00Z"}"#}},
                "spec": {"csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": "pvc-1/0"}}})),
                parse(
                    json!({"metadata": {"name": "pv-3"}, "spec": {"csi": {"driver": "linstor.csi.linbit.com",
                    "volumeHandle": "pvc-1", "volumeAttributes": {"linstor.csi.linbit.com/nfs-export":
                        "nfs://linstor-csi-nfs.piraeus-datastore.svc:2051/srv/linstor-csi-nfs/pvc-1"}}}}),
                ),
            ],
            linstor_slices: vec![parse(json!({
                "metadata": {"name": "pvc-1", "namespace": "piraeus-datastore", "creationTimestamp": "2026-11-26T11:58:00Z",
                    "labels": {"endpointslice.kubernetes.io/managed-by": "nfs-helper.linstor.csi.linbit.com"}},
                "addressType": "IPv4", "endpoints": [{"addresses": ["10.244.1.7"]}], "ports": [{"name": "pvc-1", "port": 2051}]}))],
        }
    }

    /// `status` lists the reservations the guard counts, by its own rule: one whose node is not
    /// tainted, made longer ago than twice the agents' `--operations-timeout` (their
    /// `OPERATIONS_TIMEOUT`, as the chart sets it), no longer counts though it has not expired;
    /// one of a tainted node counts until it expires, and so does a fresh one.
    #[test]
    fn the_view_lists_the_reservations_the_guard_counts() {
        let mut observed = observed();
        observed.leases.push(parse(json!({"metadata": {"name": "shared-volume-agent-fail-over-guard",
            "annotations": {"storageos.com/fail-over-reservations":
                r#"{"node-b":"2026-11-26T12:01:10Z","given-back":"2026-11-26T12:01:10Z","fresh":"2026-11-26T12:02:25Z"}"#}}})));
        observed.leases.swap_remove(2);
        let env = json!([{"name": "OPERATIONS_TIMEOUT", "value": "10s"}]);
        observed.agent_pods[0] = parse(json!({"metadata": {"name": "agent-a"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "agent", "env": env}]}}));
        let view = build(&observed, NOW.parse().unwrap());
        let listed: Vec<&str> = view.reservations.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(listed, ["fresh", "node-b"], "reserved 80 s ago, untainted: not counted");

        observed.agent_pods[0] = parse(json!({"metadata": {"name": "agent-a"},
            "spec": {"nodeName": "node-a", "containers": [{"name": "agent"}]}}));
        let view = build(&observed, NOW.parse().unwrap());
        let listed: Vec<&str> = view.reservations.iter().map(|r| r.node.as_str()).collect();
        assert_eq!(
            listed,
            ["fresh", "given-back", "node-b"],
            "the default timeout (1 min) counts them for two minutes, as long as they last"
        );
    }

    #[test]
    fn the_view_names_the_leader_each_agent_the_reservations_and_each_stated_claim() {
        let view = build(&observed(), NOW.parse().unwrap());
        assert_eq!(
            view.leader,
            Leader {
                lease: "shared-volume-controller".into(),
                holder: Some("controller-0".into()),
                renewed_seconds_ago: Some(5),
                fresh: true,
            }
        );
        assert_eq!(view.agents.len(), 2);
        let a = &view.agents[0];
        assert_eq!(
            (a.node.as_str(), a.ready, a.heartbeat_seconds_ago),
            ("node-a", true, Some(2))
        );
        assert_eq!((a.drbd_reported_seconds_ago, a.primaries), (Some(10), 1));
        let b = &view.agents[1];
        assert_eq!((b.ready, b.heartbeat_seconds_ago), (false, None));
        assert_eq!(b.taints, ["drbd.linbit.com/lost-quorum=fail-over:NoSchedule"]);
        assert_eq!(
            view.reservations,
            [Reservation {
                node: "node-b".into(),
                expires_in_seconds: 90
            }],
            "an expired reservation is no reservation"
        );
        assert_eq!(
            view.claims.len(),
            1,
            "a claim with no condition is not the controller's"
        );
        let claim = &view.claims[0];
        assert_eq!(claim.mount_endpoint.as_deref(), Some("10.96.0.10:2049"));
        assert_eq!(claim.primary_node.as_deref(), Some("node-a"), "by the agents' reports");
        assert_eq!(
            claim.last_move,
            Some(Move {
                node: Some("node-a".into()),
                at: Some("2026-11-26T11:59:00Z".into())
            })
        );
    }

    #[test]
    fn a_leader_lease_past_its_duration_is_stale_and_a_missing_one_names_no_holder() {
        let mut observed = observed();
        let late: Timestamp = "2026-11-26T12:01:00Z".parse().unwrap();
        assert!(!build(&observed, late).leader.fresh);
        assert!(table(&build(&observed, late)).contains("STALE: held by controller-0"));
        observed.leader = None;
        let view = build(&observed, NOW.parse().unwrap());
        assert_eq!((view.leader.holder, view.leader.fresh), (None, false));
    }

    #[test]
    fn the_table_lines_up_and_the_json_names_every_field() {
        let view = build(&observed(), NOW.parse().unwrap());
        let text = table(&view);
        assert!(
            text.starts_with("Leader (storage-system/shared-volume-controller): held by controller-0, renewed 5s ago")
        );
        let header = text.lines().find(|l| l.trim_start().starts_with("NODE")).unwrap();
        let row = text.lines().find(|l| l.trim_start().starts_with("node-a")).unwrap();
        assert_eq!(header.find("READY"), row.find("yes"), "{text}");
        assert!(
            text.contains("Fail-over guard reservations: node-b (expires in 90s)"),
            "{text}"
        );
        assert!(text.contains("apps/data"), "{text}");
        let repair_b = text
            .lines()
            .find(|l| l.trim_start().starts_with("node-b  conntrack-b"))
            .unwrap();
        assert!(
            repair_b.contains("NO") && repair_b.ends_with("ImagePullBackOff"),
            "{text}"
        );
        let json = serde_json::to_value(&view).unwrap();
        assert_eq!(json["repairs"][1]["notRunning"], "ImagePullBackOff");
        assert_eq!(json["repairs"][0]["ready"], true);
        let theirs = &json["servedByLinstor"][0];
        assert_eq!(theirs["name"], "theirs");
        assert_eq!(theirs["primaryNode"], "node-a", "by the agents' reports");
        assert!(theirs["export"].as_str().unwrap().starts_with("nfs://linstor-csi-nfs"));
        assert_eq!(json["servedByLinstor"].as_array().unwrap().len(), 1);
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("apps/theirs"))
            .unwrap();
        assert!(line.contains(":2051/") && line.ends_with("node-a"), "{text}");
        assert_eq!(theirs["server"], "10.244.1.7:2051");
        assert_eq!(theirs["since"], "2026-11-26T11:58:00Z");
        assert!(line.contains("10.244.1.7:2051  2026-11-26T11:58:00Z"), "{line}");
        let mut unadvertised = observed();
        unadvertised.linstor_slices.clear();
        let text = table(&build(&unadvertised, NOW.parse().unwrap()));
        assert!(text.contains("NONE ADVERTISED"), "{text}");
        assert_eq!(json["claims"][0]["primaryNode"], "node-a");
        assert_eq!(json["claims"][0]["serverNotAnswering"]["since"], "2026-11-26T12:00:10Z");
        assert_eq!(
            json["claims"].as_array().unwrap().len(),
            1,
            "LINSTOR's claim only apart: {json:#}"
        );
        assert_eq!(json["agents"][0]["drbdReportedSecondsAgo"], 10);
        assert_eq!(json["leader"]["fresh"], true);
    }
}
