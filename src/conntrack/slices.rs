//! What each of the product's EndpointSlices says, and each of LINSTOR CSI's nfs-helper, remembered
//! between watch events, so that a change of backend reads as a move (pure). A slice deleted is
//! remembered for a day: made again with other backends, it is a move too, however long it was gone
//! (nfs-helper moves a volume so: it deletes the slice at the promotion's start, and the new primary
//! makes it again once its server runs, which can take as long as the promotion waits).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant, SystemTime};

use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;

use super::sweep::Served;
use crate::names::{
    LAST_CHANGE_TRIGGER_TIME_ANNOTATION, LINSTOR_NFS_SLICE_MANAGER, MOUNT_ENDPOINT_ANNOTATION, SLICE_MANAGED_BY_LABEL,
    SLICE_SERVICE_NAME_LABEL,
};

/// The Service of `namespace` and `name`, as watched (LINSTOR CSI's `linstor-csi-nfs`).
pub type ServiceOf<'a> = &'a dyn Fn(&str, &str) -> Option<Arc<Service>>;
use crate::volume::NfsEndpoint;

/// What one watch event of a slice means to the repair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not seen before: a new volume, or the first list after a start.
    First(Served),
    /// A backend it named before is gone: flows to it are stranded.
    Moved(Served),
    /// Nothing the repair cares about changed.
    Same,
    /// It cannot be repaired, and why.
    Unusable(String),
}

/// How long a deleted slice is remembered. A client holding its connection keeps its conntrack
/// entry to the old backend alive by retransmitting, whatever the gap, so the bound is memory's
/// alone: a deleted volume's slice (a few hundred bytes) goes after it.
const DELETED_REMEMBERED_FOR: Duration = Duration::from_secs(24 * 60 * 60);
/// At most this many deleted slices are remembered, the oldest forgotten first.
const DELETED_REMEMBERED_AT_MOST: usize = 10_000;

/// The slices seen, by `namespace/name`, and those deleted within the last day.
#[derive(Debug, Default)]
pub struct Slices {
    known: BTreeMap<String, Served>,
    /// What a deleted slice last said, and when it went.
    gone: BTreeMap<String, (Served, Instant)>,
}

impl Slices {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn seen(&mut self, key: &str, slice: &EndpointSlice, service_of: ServiceOf, now: Instant) -> Seen {
        let served = match served(slice, service_of) {
            Ok(served) => served,
            Err(why) => {
                self.known.remove(key);
                return Seen::Unusable(why);
            }
        };
        self.gone
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < DELETED_REMEMBERED_FOR);
        let before = self.known.insert(key.to_owned(), served.clone());
        match before.or_else(|| self.gone.remove(key).map(|(served, _)| served)) {
            None => Seen::First(served),
            Some(before) if before.backends.iter().any(|b| !served.backends.contains(b)) => Seen::Moved(served),
            Some(_) => Seen::Same,
        }
    }

    /// The slice was deleted at `now`.
    pub fn forget(&mut self, key: &str, now: Instant) {
        if let Some(served) = self.known.remove(key) {
            self.gone.insert(key.to_owned(), (served, now));
        }
        if self.gone.len() > DELETED_REMEMBERED_AT_MOST {
            let oldest = self
                .gone
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(key, _)| key.clone());
            oldest.map(|key| self.gone.remove(&key));
        }
    }

    /// Forgets every slice but `kept` (after a relist: the others were deleted meanwhile).
    pub fn keep_only(&mut self, kept: &std::collections::BTreeSet<String>, now: Instant) -> Vec<String> {
        let gone: Vec<String> = self.known.keys().filter(|k| !kept.contains(*k)).cloned().collect();
        for key in &gone {
            self.forget(key, now);
        }
        gone
    }
}

/// Whether the controller made `slice` for a claim's Service: owned by the claim, and named for
/// the Service it serves (as the controller names both). Another slice carrying the product's
/// label is someone else's, and never drives a delete.
fn made_for_a_claims_service(slice: &EndpointSlice) -> Result<(), String> {
    let by_claim = slice
        .owner_references()
        .iter()
        .any(|o| o.kind == "PersistentVolumeClaim" && o.api_version == "v1" && o.controller == Some(true));
    if !by_claim {
        return Err("not the controller's: no PersistentVolumeClaim controls it".into());
    }
    if slice.labels().get(SLICE_SERVICE_NAME_LABEL) != Some(&slice.name_any()) {
        return Err(format!(
            "not the controller's: its {SLICE_SERVICE_NAME_LABEL} label is not its own name"
        ));
    }
    Ok(())
}

/// What the slice serves: one of LINSTOR CSI's, or the controller's.
pub fn served(slice: &EndpointSlice, service_of: ServiceOf) -> Result<Served, String> {
    if slice.labels().get(SLICE_MANAGED_BY_LABEL).map(String::as_str) == Some(LINSTOR_NFS_SLICE_MANAGER) {
        return served_by_linstor(slice, service_of);
    }
    served_by_the_controller(slice)
}

/// One of nfs-helper's slices: its one port, named after the volume, is the target of the
/// Service port of that name; clients mount the Service's ClusterIP on that port.
fn served_by_linstor(slice: &EndpointSlice, service_of: ServiceOf) -> Result<Served, String> {
    let namespace = slice.namespace().unwrap_or_default();
    let service_name = slice
        .labels()
        .get(SLICE_SERVICE_NAME_LABEL)
        .ok_or_else(|| format!("no {SLICE_SERVICE_NAME_LABEL} label"))?;
    let port = slice.ports.as_ref().and_then(|ports| ports.first()).ok_or("no port")?;
    let port_name = port.name.as_deref().ok_or("its port has no name")?;
    let target = port.port.and_then(|p| u16::try_from(p).ok()).ok_or("no port")?;
    let service = service_of(&namespace, service_name)
        .ok_or_else(|| format!("Service {namespace}/{service_name} not seen (--linstor-nfs-service names it)"))?;
    let spec = service.spec.as_ref().ok_or("its Service has no spec")?;
    let cluster_ip: IpAddr = spec
        .cluster_ip
        .as_deref()
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| format!("Service {namespace}/{service_name} has no ClusterIP"))?;
    let service_port = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(port_name))
        .and_then(|p| u16::try_from(p.port).ok())
        .ok_or_else(|| format!("Service {namespace}/{service_name} has no port named {port_name}"))?;
    Ok(Served {
        mount: SocketAddr::new(cluster_ip, service_port),
        backends: ready_backends(slice, target),
    })
}

/// The mount endpoint the controller stamped on the slice and its ready backends.
fn served_by_the_controller(slice: &EndpointSlice) -> Result<Served, String> {
    made_for_a_claims_service(slice)?;
    let annotations = slice.metadata.annotations.as_ref();
    let Some(mount) = annotations.and_then(|a| a.get(MOUNT_ENDPOINT_ANNOTATION)) else {
        return Err(format!(
            "no {MOUNT_ENDPOINT_ANNOTATION} annotation yet (the controller adds it once the mount endpoint is published)"
        ));
    };
    let mount = mount
        .parse::<NfsEndpoint>()
        .map(|m| SocketAddr::new(m.ip, m.port))
        .map_err(|err| format!("annotation {MOUNT_ENDPOINT_ANNOTATION}={mount:?} does not parse: {err}"))?;
    let port = slice
        .ports
        .as_ref()
        .and_then(|ports| ports.first()?.port)
        .and_then(|port| u16::try_from(port).ok())
        .ok_or("no port")?;
    Ok(Served {
        mount,
        backends: ready_backends(slice, port),
    })
}

/// The addresses of the slice's endpoints not marked unready, on `port`.
fn ready_backends(slice: &EndpointSlice, port: u16) -> Vec<SocketAddr> {
    slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect()
}

/// When the slice's last change was triggered, if it says (RFC 3339).
pub fn triggered(slice: &EndpointSlice) -> Option<SystemTime> {
    let text = slice
        .metadata
        .annotations
        .as_ref()?
        .get(LAST_CHANGE_TRIGGER_TIME_ANNOTATION)?;
    let at: k8s_openapi::jiff::Timestamp = text.parse().ok()?;
    Some(SystemTime::from(at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(annotations: serde_json::Value, address: &str) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {
                "name": "pvc-1", "namespace": "apps", "annotations": annotations,
                "labels": {SLICE_SERVICE_NAME_LABEL: "pvc-1"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": "u-1", "controller": true}],
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
            "ports": [{"name": "nfs", "port": 2049, "protocol": "TCP"}],
        }))
        .unwrap()
    }

    fn mounted(address: &str) -> EndpointSlice {
        slice(json!({MOUNT_ENDPOINT_ANNOTATION: "10.96.0.10:2049"}), address)
    }

    fn no_services(_: &str, _: &str) -> Option<Arc<Service>> {
        None
    }

    /// `seconds` after an instant of the tests.
    fn at(seconds: u64) -> Instant {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *START.get_or_init(Instant::now) + Duration::from_secs(seconds)
    }

    #[test]
    fn a_new_backend_is_a_move_and_the_same_one_is_not() {
        let mut slices = Slices::new();
        let first = slices.seen("apps/pvc-1", &mounted("10.211.1.2"), &no_services, at(0));
        assert!(matches!(first, Seen::First(ref s) if s.backends == ["10.211.1.2:2049".parse().unwrap()]));
        assert_eq!(
            slices.seen("apps/pvc-1", &mounted("10.211.1.2"), &no_services, at(0)),
            Seen::Same
        );
        let moved = slices.seen("apps/pvc-1", &mounted("10.211.2.2"), &no_services, at(0));
        assert!(matches!(moved, Seen::Moved(ref s) if s.mount == "10.96.0.10:2049".parse().unwrap()));
    }

    #[test]
    fn a_slice_without_the_mount_endpoint_cannot_be_repaired_and_says_why() {
        let mut slices = Slices::new();
        let Seen::Unusable(why) = slices.seen("apps/pvc-1", &slice(json!({}), "10.211.1.2"), &no_services, at(0))
        else {
            panic!("usable without its mount endpoint")
        };
        assert!(why.contains(MOUNT_ENDPOINT_ANNOTATION), "{why}");
        let bad = slice(json!({MOUNT_ENDPOINT_ANNOTATION: "nowhere"}), "10.211.1.2");
        assert!(
            matches!(slices.seen("apps/pvc-1", &bad, &no_services, at(0)), Seen::Unusable(why) if why.contains("does not parse"))
        );
    }

    #[test]
    fn the_trigger_time_is_read_when_the_slice_has_one() {
        let stamped = slice(
            json!({LAST_CHANGE_TRIGGER_TIME_ANNOTATION: "2026-11-26T10:00:00Z"}),
            "10.211.1.2",
        );
        let at = triggered(&stamped).unwrap();
        let seconds = at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(seconds, 1_795_687_200);
        assert_eq!(triggered(&mounted("10.211.1.2")), None);
    }

    #[test]
    fn a_slice_deleted_and_made_again_with_other_backends_is_a_move() {
        let mut slices = Slices::new();
        slices.seen("apps/pvc-1", &mounted("10.211.1.2"), &no_services, at(0));
        slices.forget("apps/pvc-1", at(1));
        let again = slices.seen("apps/pvc-1", &mounted("10.211.2.2"), &no_services, at(5));
        assert!(matches!(again, Seen::Moved(_)), "{again:?}");
        assert_eq!(
            slices.seen("apps/pvc-1", &mounted("10.211.2.2"), &no_services, at(6)),
            Seen::Same
        );

        // A day after its delete, a slice made again is a new volume's.
        slices.forget("apps/pvc-1", at(10));
        let later = slices.seen(
            "apps/pvc-1",
            &mounted("10.211.1.2"),
            &no_services,
            at(10) + DELETED_REMEMBERED_FOR,
        );
        assert!(matches!(later, Seen::First(_)), "{later:?}");
    }

    /// nfs-helper deletes its slice when the promotion starts and makes it again once the new
    /// server runs: a promotion longer than the sweep window (30 s) is still a move.
    #[test]
    fn a_linstor_slice_made_again_after_a_long_promotion_is_still_a_move() {
        let mut slices = Slices::new();
        let key = "piraeus-datastore/pvc-9";
        slices.seen(key, &linstor_slice("10.211.1.2"), &linstor_service, at(0));
        slices.forget(key, at(1));
        let moved = slices.seen(key, &linstor_slice("10.211.2.2"), &linstor_service, at(1 + 5 * 60));
        assert!(
            matches!(moved, Seen::Moved(ref s) if s.backends == ["10.211.2.2:2049".parse().unwrap()]),
            "{moved:?}"
        );
    }

    #[test]
    fn deleted_slices_are_remembered_up_to_a_bound_oldest_forgotten_first() {
        let mut slices = Slices::new();
        for i in 0..=DELETED_REMEMBERED_AT_MOST {
            let key = format!("apps/pvc-{i}");
            slices.seen(&key, &mounted("10.211.1.2"), &no_services, at(0));
            slices.forget(&key, at(i as u64));
        }
        assert_eq!(slices.gone.len(), DELETED_REMEMBERED_AT_MOST);
        assert!(!slices.gone.contains_key("apps/pvc-0"), "the oldest goes");
        assert!(
            slices
                .gone
                .contains_key(&format!("apps/pvc-{DELETED_REMEMBERED_AT_MOST}"))
        );
    }

    #[test]
    fn a_slice_not_made_for_a_claims_service_is_not_followed() {
        let mut slices = Slices::new();
        let mut unowned = mounted("10.211.1.2");
        unowned.metadata.owner_references = None;
        let seen = slices.seen("apps/pvc-1", &unowned, &no_services, at(0));
        assert!(
            matches!(seen, Seen::Unusable(ref why) if why.contains("no PersistentVolumeClaim")),
            "{seen:?}"
        );
        let mut misnamed = mounted("10.211.1.2");
        misnamed
            .labels_mut()
            .insert(SLICE_SERVICE_NAME_LABEL.into(), "other".into());
        let seen = slices.seen("apps/pvc-1", &misnamed, &no_services, at(0));
        assert!(
            matches!(seen, Seen::Unusable(ref why) if why.contains(SLICE_SERVICE_NAME_LABEL)),
            "{seen:?}"
        );
    }

    #[test]
    fn a_relist_forgets_the_slices_it_no_longer_lists() {
        let mut slices = Slices::new();
        slices.seen("apps/pvc-1", &mounted("10.211.1.2"), &no_services, at(0));
        slices.seen("apps/pvc-2", &mounted("10.211.1.2"), &no_services, at(0));
        let gone = slices.keep_only(&["apps/pvc-2".to_owned()].into(), at(0));
        assert_eq!(gone, ["apps/pvc-1"]);
    }

    /// One of nfs-helper's slices for volume `pvc-9` on `address`, port 2049 named after it.
    fn linstor_slice(address: &str) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {
                "name": "pvc-9", "namespace": "piraeus-datastore",
                "labels": {SLICE_SERVICE_NAME_LABEL: "linstor-csi-nfs", SLICE_MANAGED_BY_LABEL: LINSTOR_NFS_SLICE_MANAGER},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "nfs-a", "uid": "u-9", "controller": true}],
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address]}],
            "ports": [{"name": "pvc-9", "port": 2049}],
        }))
        .unwrap()
    }

    fn linstor_service(namespace: &str, name: &str) -> Option<Arc<Service>> {
        let service = json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": "10.96.7.7", "ports": [
                {"name": "pvc-8", "port": 2051, "targetPort": 2049},
                {"name": "pvc-9", "port": 2052, "targetPort": 2049}]},
        });
        (namespace == "piraeus-datastore" && name == "linstor-csi-nfs")
            .then(|| Arc::new(serde_json::from_value(service).unwrap()))
    }

    #[test]
    fn linstor_csis_slice_is_mounted_on_its_services_port_and_moves_by_delete_and_create() {
        let mut slices = Slices::new();
        let key = "piraeus-datastore/pvc-9";
        let Seen::First(served) = slices.seen(key, &linstor_slice("10.211.1.2"), &linstor_service, at(0)) else {
            panic!("a first sight")
        };
        assert_eq!(
            served.mount,
            "10.96.7.7:2052".parse().unwrap(),
            "the Service port of the volume's name"
        );
        assert_eq!(served.backends, ["10.211.1.2:2049".parse().unwrap()]);
        // nfs-helper on the new primary deletes the slice, then makes it again.
        slices.forget(key, at(1));
        let moved = slices.seen(key, &linstor_slice("10.211.2.2"), &linstor_service, at(2));
        assert!(matches!(moved, Seen::Moved(s) if s.backends == ["10.211.2.2:2049".parse().unwrap()]));
        let unseen = slices.seen(key, &linstor_slice("10.211.2.2"), &no_services, at(3));
        assert!(
            matches!(unseen, Seen::Unusable(why) if why.contains("not seen")),
            "no Service, no repair"
        );
    }
}
