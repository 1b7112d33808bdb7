//! The condition each managed claim carries (`SharedVolumeReady`): whether its shared endpoint is
//! ready, why, where clients mount it, which NFS server (and node) serves it and when an agent
//! last moved it. `kubectl describe pvc` shows it for as long as it holds, where events expire.
//! Written with server-side apply under the controller's field manager, and only when it says
//! something new: a converged claim costs no write.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::outcome::{Outcome, ReconcileError};
use crate::names::{CLAIM_CONDITION_TYPE, CONTROLLER_FIELD_MANAGER, SERVICE_ENDPOINT_ANNOTATION};
use crate::sharedvolume::claim::ready_condition;
use crate::sharedvolume::classify::Skip;
use crate::sharedvolume::desired::service_name;
use crate::sharedvolume::linstor::{LinstorExport, LinstorServer};
use crate::sharedvolume::silence::SilentServer;

/// What the condition states.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stated {
    pub ready: bool,
    pub reason: String,
    pub message: String,
}

impl Stated {
    fn new(ready: bool, reason: &str, message: String) -> Self {
        Self {
            ready,
            reason: reason.to_owned(),
            message,
        }
    }
}

/// What the claim's condition should state after a reconcile ended with `result`; `None`: leave
/// it as it is. A claim waiting for its volume is told so only when it is known to be ours: it
/// carried the condition before, or the controller is limited to named storage classes or CSI
/// drivers (unfiltered, every ReadWriteMany claim of any storage would be told it waits). A
/// failed reconcile states nothing: it is retried, and its events tell.
pub fn stated(
    result: &Result<Outcome, ReconcileError>,
    claim: &PersistentVolumeClaim,
    known_ours: bool,
) -> Option<Stated> {
    let known_ours = known_ours || ready_condition(claim).is_some();
    let pv = claim.spec.as_ref()?.volume_name.as_deref().unwrap_or_default();
    let stated = match result.as_ref().ok()? {
        Outcome::Shared {
            mount_endpoint,
            server,
            moved,
            silent,
            ..
        } => {
            let service = service_name(pv);
            let mut message = format!("clients mount {mount_endpoint} (Service {service}); the NFS server is {server}");
            if let Some(SilentServer { since, why, .. }) = silent {
                message.push_str(&format!(
                    ", which does not answer an RPC NULL call since {since} ({why}), as the agent on its node finds; \
                     the Warning NfsServerNotAnswering on PV {pv} says what to check"
                ));
                return Some(Stated::new(false, "NfsServerNotAnswering", message));
            }
            let reason = match moved {
                Some(stamp) => {
                    let node = stamp.node.as_deref().unwrap_or("a node its agent did not name");
                    let at = stamp.at.as_deref().unwrap_or("a time its agent did not say");
                    message.push_str(&format!(" on node {node}, where an agent moved it at {at}"));
                    "ServedAfterMove"
                }
                None => "Served",
            };
            Stated::new(true, reason, message)
        }
        Outcome::RepairDeferred(_) => Stated::new(
            true,
            "ManagedFieldsContested",
            "served, but another writer keeps changing its Service, Endpoints or EndpointSlice; the claim's events say more".into(),
        ),
        Outcome::Invalid(invalid) => Stated::new(false, invalid.reason, invalid.message.clone()),
        Outcome::Skipped(Skip::NoServiceEndpoint) if known_ours => Stated::new(
            false,
            "WaitingForNfsServer",
            format!(
                "PV {pv} does not say where its NFS server listens yet (annotation {SERVICE_ENDPOINT_ANNOTATION}, \
                 written by the storage system or by the HA agent on the volume's primary)"
            ),
        ),
        Outcome::Skipped(Skip::NotBound) if known_ours => {
            Stated::new(false, "NotBound", "the claim is not bound to a volume yet".into())
        }
        Outcome::ServedByLinstor { export, server } => served_by_linstor(export, server.as_ref()),
        // A move in flight lasts a round trip: the condition says where it went once it landed.
        Outcome::MoveHeld(_) | Outcome::Skipped(_) => return None,
    };
    Some(stated)
}

/// What LINSTOR CSI advertises for a volume it serves itself: who serves it, where and since
/// when, or that no server is advertised (before its server first starts, and during a move).
fn served_by_linstor(export: &LinstorExport, server: Option<&LinstorServer>) -> Stated {
    let LinstorExport {
        url,
        namespace,
        resource,
    } = export;
    let Some(server) = server else {
        let slice = match namespace {
            Some(namespace) => format!("no EndpointSlice {namespace}/{resource} of its nfs-helper"),
            None => {
                format!("the export names no <Service>.<namespace>.svc host, so its slice {resource} cannot be found")
            }
        };
        return Stated::new(
            false,
            "LinstorNfsNotAdvertised",
            format!(
                "LINSTOR CSI serves it (clients mount {url}) but advertises no NFS server for it: {slice}; nfs-helper writes one once the volume is primary and its server started, so a move lasts until then"
            ),
        );
    };
    let pod = server.pod.as_deref().unwrap_or("a pod it does not name");
    let since = server.since.as_deref().unwrap_or("a time it does not say");
    Stated::new(
        true,
        "ServedByLinstorCsi",
        format!(
            "LINSTOR CSI serves it: clients mount {url}; its NFS server is {} (pod {pod}), advertised since {since}",
            server.address
        ),
    )
}

/// How long after an agent's move its claim's condition waits to be written: a node's loss moves
/// hundreds of volumes at once, and their conditions then queue behind the endpoint writes clients
/// wait for instead of competing with them.
pub const MOVE_SETTLE: Duration = Duration::from_secs(3);

/// For a claim an agent moved less than [`MOVE_SETTLE`] ago (by the time in its stamp), how much
/// longer its condition waits; `None`: write it now.
pub fn settling(result: &Result<Outcome, ReconcileError>, now: Timestamp) -> Option<Duration> {
    let Ok(Outcome::Shared { moved: Some(stamp), .. }) = result else {
        return None;
    };
    let at: Timestamp = stamp.at.as_deref()?.parse().ok()?;
    let age = Duration::try_from(now.duration_since(at)).ok()?;
    MOVE_SETTLE.checked_sub(age).filter(|wait| !wait.is_zero())
}

/// A fingerprint of everything about a claim but its version, its managed fields and the
/// controller's own condition: equal fingerprints mean only the controller's own write changed it.
pub fn fingerprint_besides_own_condition(claim: &PersistentVolumeClaim) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut claim = claim.clone();
    claim.metadata.resource_version = None;
    claim.metadata.managed_fields = None;
    if let Some(status) = claim.status.as_mut() {
        let others: Vec<_> = status
            .conditions
            .take()
            .into_iter()
            .flatten()
            .filter(|c| c.type_ != CLAIM_CONDITION_TYPE)
            .collect();
        status.conditions = (!others.is_empty()).then_some(others);
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(&claim).unwrap_or_default().hash(&mut hasher);
    hasher.finish()
}

/// The condition to write, or `None` when the claim states it already. Its transition time moves
/// only when readiness changes.
pub fn to_write(
    claim: &PersistentVolumeClaim,
    stated: &Stated,
    now: Timestamp,
) -> Option<PersistentVolumeClaimCondition> {
    let status = if stated.ready { "True" } else { "False" };
    let current = ready_condition(claim);
    if let Some(current) = current
        && current.status == status
        && current.reason.as_deref() == Some(&stated.reason)
        && current.message.as_deref() == Some(&stated.message)
    {
        return None;
    }
    let since = match current {
        Some(current) if current.status == status => current.last_transition_time.clone(),
        _ => None,
    };
    Some(PersistentVolumeClaimCondition {
        type_: CLAIM_CONDITION_TYPE.into(),
        status: status.into(),
        reason: Some(stated.reason.clone()),
        message: Some(stated.message.clone()),
        last_transition_time: Some(since.unwrap_or(Time(now))),
        last_probe_time: None,
    })
}

/// Applies `condition` to the claim's status: only that condition is ours, the claim's other
/// conditions (a resize in progress) belong to their writers.
pub async fn apply(
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
    condition: &PersistentVolumeClaimCondition,
) -> Result<(), kube::Error> {
    let patch = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "status": {"conditions": [condition]},
    });
    let params = PatchParams::apply(CONTROLLER_FIELD_MANAGER).force();
    claims.patch_status(name, &params, &Patch::Apply(&patch)).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::sharedvolume::classify::Invalid;
    use crate::sharedvolume::stamp::MoveStamp;

    fn claim_with(condition: Option<Value>) -> PersistentVolumeClaim {
        let conditions: Vec<Value> = condition.into_iter().collect();
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "apps"},
            "spec": {"accessModes": ["ReadWriteMany"], "volumeName": "pv-data"},
            "status": {"phase": "Bound", "conditions": conditions},
        }))
        .unwrap()
    }

    fn served(moved: Option<MoveStamp>) -> Result<Outcome, ReconcileError> {
        Ok(Outcome::Shared {
            mount_endpoint: "10.96.0.10:2049".into(),
            published: false,
            server: "192.0.2.7:2049".into(),
            moved,
            silent: None,
        })
    }

    #[test]
    fn each_outcome_states_what_a_user_needs_or_nothing() {
        let claim = claim_with(None);
        let moved = MoveStamp {
            node: Some("node-b".into()),
            at: Some("2026-11-25T19:00:00Z".into()),
            ..MoveStamp::new("192.0.2.7:2049", "8")
        };
        let invalid = Ok(Outcome::Invalid(Invalid::new("ServiceNameTaken", "rename it".into())));
        let waiting = Ok(Outcome::Skipped(Skip::NoServiceEndpoint));
        // (case, how the reconcile ended, known to be ours, (ready, reason) stated)
        type Case = (
            &'static str,
            Result<Outcome, ReconcileError>,
            bool,
            Option<(bool, &'static str)>,
        );
        let cases: Vec<Case> = vec![
            ("served", served(None), false, Some((true, "Served"))),
            (
                "moved by an agent",
                served(Some(moved)),
                false,
                Some((true, "ServedAfterMove")),
            ),
            (
                "a move in flight: said once it landed",
                Ok(Outcome::MoveHeld(Duration::from_secs(2))),
                false,
                None,
            ),
            ("bad input", invalid, false, Some((false, "ServiceNameTaken"))),
            (
                "waiting, filters name the storage",
                waiting,
                true,
                Some((false, "WaitingForNfsServer")),
            ),
            (
                "waiting, unfiltered: maybe not ours",
                Ok(Outcome::Skipped(Skip::NoServiceEndpoint)),
                false,
                None,
            ),
            (
                "not ReadWriteMany",
                Ok(Outcome::Skipped(Skip::NotReadWriteMany)),
                true,
                None,
            ),
            (
                "a failed reconcile",
                Err(ReconcileError::Gone("pv-data".into())),
                true,
                None,
            ),
        ];
        for (case, result, known_ours, expected) in cases {
            let got = stated(&result, &claim, known_ours).map(|s| (s.ready, s.reason.clone()));
            let expected = expected.map(|(ready, reason)| (ready, reason.to_owned()));
            assert_eq!(got, expected, "{case}");
        }
        let message = stated(&served(Some(MoveStamp::new("192.0.2.7:2049", "8"))), &claim, false)
            .unwrap()
            .message;
        assert!(
            message.contains("10.96.0.10:2049") && message.contains("node"),
            "{message}"
        );
    }

    #[test]
    fn a_claim_linstor_serves_and_a_silent_server_are_stated_whatever_the_filters() {
        let claim = claim_with(None);
        let export = LinstorExport {
            url: "nfs://linstor-csi-nfs.piraeus-datastore.svc:2050/srv/pvc-1".into(),
            namespace: Some("piraeus-datastore".into()),
            resource: "pvc-1".into(),
        };
        let linstor = |server: Option<LinstorServer>| {
            Ok(Outcome::ServedByLinstor {
                export: export.clone(),
                server,
            })
        };
        let advertised = LinstorServer {
            address: "10.244.1.7:2050".into(),
            pod: Some("piraeus-datastore/linstor-csi-nfs-server-x7k2p".into()),
            since: Some("2026-11-28T10:00:00Z".into()),
        };
        let silent = Ok(Outcome::Shared {
            mount_endpoint: "10.96.0.10:2049".into(),
            published: true,
            server: "192.0.2.7:2049".into(),
            moved: None,
            silent: Some(SilentServer {
                endpoint: "192.0.2.7:2049".into(),
                since: "2026-11-28T12:00:00Z".into(),
                why: "connection refused".into(),
            }),
        });
        let reason = |result| stated(&result, &claim, false).map(|s| (s.ready, s.reason));
        assert_eq!(
            reason(linstor(Some(advertised.clone()))),
            Some((true, "ServedByLinstorCsi".into()))
        );
        assert_eq!(
            reason(linstor(None)),
            Some((false, "LinstorNfsNotAdvertised".into())),
            "a move"
        );
        assert_eq!(reason(silent), Some((false, "NfsServerNotAnswering".into())));
        let message = stated(&linstor(Some(advertised)), &claim, false).unwrap().message;
        for said in [
            "nfs://linstor-csi-nfs",
            "10.244.1.7:2050",
            "linstor-csi-nfs-server-x7k2p",
            "2026-11-28T10:00:00Z",
        ] {
            assert!(message.contains(said), "{said} in {message}");
        }
    }

    #[test]
    fn only_a_change_besides_the_own_condition_changes_the_fingerprint() {
        let mut plain = claim_with(None);
        // Before the first condition, a claim's status has no list at all.
        plain.status.as_mut().unwrap().conditions = None;
        let ours = claim_with(Some(
            json!({"type": CLAIM_CONDITION_TYPE, "status": "True", "reason": "Served"}),
        ));
        let resizing = claim_with(Some(json!({"type": "Resizing", "status": "True"})));
        let mut relabelled = plain.clone();
        relabelled.metadata.labels = Some([("team".to_owned(), "a".to_owned())].into());
        let fingerprint = fingerprint_besides_own_condition;
        assert_eq!(fingerprint(&plain), fingerprint(&ours));
        assert_ne!(fingerprint(&plain), fingerprint(&resizing));
        assert_ne!(fingerprint(&plain), fingerprint(&relabelled));
    }

    #[test]
    fn a_fresh_move_is_stated_once_it_settled() {
        let now: Timestamp = "2026-11-25T19:00:10Z".parse().unwrap();
        let moved_at = |at: &str| {
            served(Some(MoveStamp {
                at: Some(at.into()),
                ..MoveStamp::new("192.0.2.7:2049", "8")
            }))
        };
        assert_eq!(
            settling(&moved_at("2026-11-25T19:00:09Z"), now),
            Some(Duration::from_secs(2))
        );
        assert_eq!(settling(&moved_at("2026-11-25T19:00:00Z"), now), None, "settled");
        assert_eq!(
            settling(&moved_at("2026-11-25T19:00:30Z"), now),
            None,
            "a clock ahead: now"
        );
        assert_eq!(settling(&moved_at("garbage"), now), None);
        assert_eq!(
            settling(&served(Some(MoveStamp::new("192.0.2.7:2049", "8"))), now),
            None
        );
        assert_eq!(settling(&served(None), now), None);
    }

    #[test]
    fn a_claim_that_carried_the_condition_is_told_it_waits() {
        let claim = claim_with(Some(
            json!({"type": CLAIM_CONDITION_TYPE, "status": "True", "reason": "Served"}),
        ));
        let waiting = stated(&Ok(Outcome::Skipped(Skip::NoServiceEndpoint)), &claim, false).unwrap();
        assert_eq!((waiting.ready, waiting.reason.as_str()), (false, "WaitingForNfsServer"));
    }

    #[test]
    fn the_same_statement_is_not_written_twice_and_the_transition_time_moves_with_readiness() {
        let now: Timestamp = "2026-11-25T19:00:00Z".parse().unwrap();
        let later: Timestamp = "2026-11-25T20:00:00Z".parse().unwrap();
        let ready = Stated::new(true, "Served", "clients mount 10.96.0.10:2049".into());
        let first = to_write(&claim_with(None), &ready, now).expect("a new condition");
        assert_eq!(first.last_transition_time, Some(Time(now)));
        let claim = claim_with(Some(serde_json::to_value(&first).unwrap()));
        assert_eq!(to_write(&claim, &ready, later), None, "converged: no write");
        let moved = Stated::new(
            true,
            "ServedAfterMove",
            "clients mount 10.96.0.10:2049 on node b".into(),
        );
        let rewritten = to_write(&claim, &moved, later).expect("a new message");
        assert_eq!(
            rewritten.last_transition_time,
            Some(Time(now)),
            "still ready since then"
        );
        let broken = Stated::new(false, "VolumeNotFound", "gone".into());
        let fallen = to_write(&claim, &broken, later).expect("not ready any more");
        assert_eq!(fallen.last_transition_time, Some(Time(later)));
    }
}
