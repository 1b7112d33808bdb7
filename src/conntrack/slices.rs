//! What each of the product's EndpointSlices says, remembered between watch events, so that a
//! change of backend reads as a move (pure).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::SystemTime;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::sweep::Served;
use crate::names::{LAST_CHANGE_TRIGGER_TIME_ANNOTATION, MOUNT_ENDPOINT_ANNOTATION};
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

/// The slices seen, by `namespace/name`.
#[derive(Debug, Default)]
pub struct Slices {
    known: BTreeMap<String, Served>,
}

impl Slices {
    pub fn seen(&mut self, key: &str, slice: &EndpointSlice) -> Seen {
        let served = match served(slice) {
            Ok(served) => served,
            Err(why) => {
                self.known.remove(key);
                return Seen::Unusable(why);
            }
        };
        match self.known.insert(key.to_owned(), served.clone()) {
            None => Seen::First(served),
            Some(before) if before.backends.iter().any(|b| !served.backends.contains(b)) => Seen::Moved(served),
            Some(_) => Seen::Same,
        }
    }

    pub fn forget(&mut self, key: &str) {
        self.known.remove(key);
    }

    /// Forgets every slice but `kept` (after a relist: the others were deleted meanwhile).
    pub fn keep_only(&mut self, kept: &std::collections::BTreeSet<String>) -> Vec<String> {
        let gone: Vec<String> = self.known.keys().filter(|k| !kept.contains(*k)).cloned().collect();
        for key in &gone {
            self.known.remove(key);
        }
        gone
    }
}

/// The mount endpoint the controller stamped on the slice and its ready backends.
pub fn served(slice: &EndpointSlice) -> Result<Served, String> {
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
    let backends = slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| e.addresses.iter())
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, port))
        .collect();
    Ok(Served { mount, backends })
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
            "metadata": {"name": "pvc-1", "namespace": "apps", "annotations": annotations},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": true}}],
            "ports": [{"name": "nfs", "port": 2049, "protocol": "TCP"}],
        }))
        .unwrap()
    }

    fn mounted(address: &str) -> EndpointSlice {
        slice(json!({MOUNT_ENDPOINT_ANNOTATION: "10.96.0.10:2049"}), address)
    }

    #[test]
    fn a_new_backend_is_a_move_and_the_same_one_is_not() {
        let mut slices = Slices::default();
        let first = slices.seen("apps/pvc-1", &mounted("10.211.1.2"));
        assert!(matches!(first, Seen::First(ref s) if s.backends == ["10.211.1.2:2049".parse().unwrap()]));
        assert_eq!(slices.seen("apps/pvc-1", &mounted("10.211.1.2")), Seen::Same);
        let moved = slices.seen("apps/pvc-1", &mounted("10.211.2.2"));
        assert!(matches!(moved, Seen::Moved(ref s) if s.mount == "10.96.0.10:2049".parse().unwrap()));
    }

    #[test]
    fn a_slice_without_the_mount_endpoint_cannot_be_repaired_and_says_why() {
        let mut slices = Slices::default();
        let Seen::Unusable(why) = slices.seen("apps/pvc-1", &slice(json!({}), "10.211.1.2")) else {
            panic!("usable without its mount endpoint")
        };
        assert!(why.contains(MOUNT_ENDPOINT_ANNOTATION), "{why}");
        let bad = slice(json!({MOUNT_ENDPOINT_ANNOTATION: "nowhere"}), "10.211.1.2");
        assert!(matches!(slices.seen("apps/pvc-1", &bad), Seen::Unusable(why) if why.contains("does not parse")));
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
    fn a_relist_forgets_the_slices_it_no_longer_lists() {
        let mut slices = Slices::default();
        slices.seen("apps/pvc-1", &mounted("10.211.1.2"));
        slices.seen("apps/pvc-2", &mounted("10.211.1.2"));
        let gone = slices.keep_only(&["apps/pvc-2".to_owned()].into());
        assert_eq!(gone, ["apps/pvc-1"]);
    }
}
