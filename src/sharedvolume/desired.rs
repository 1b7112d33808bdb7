//! Pure builders of the objects that give a shared volume its stable address. The controller and
//! the HA agent both build the endpoints here, so their writes always agree.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort as SlicePort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use sha2::{Digest, Sha256};

use super::stamp::MoveStamp;
use crate::names::*;
use crate::volume::NfsEndpoint;

/// Everything the three objects are built from.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedVolume {
    /// Namespace of the claim, and of the objects.
    pub namespace: String,
    /// Name of the Service, Endpoints and EndpointSlice ([`service_name`] of the PV).
    pub service_name: String,
    /// The volume id, already a valid label value ([`label_value`]).
    pub volume_id: String,
    /// Controller reference to the claim: the objects are garbage-collected with it.
    pub owner: OwnerReference,
    /// Where the NFS server listens now.
    pub server: NfsEndpoint,
    /// What clients mount (`<ClusterIP>:2049`), once published: carried on the EndpointSlice so
    /// that each node's conntrack repair, which may read nothing but slices, knows which
    /// connections a move strands.
    pub mount_endpoint: Option<NfsEndpoint>,
}

const MAX_NAME: usize = 63;
const HASH_LEN: usize = 10;

/// The Service name for a PV: the PV name itself when it is a valid DNS-1035 label (as dynamic
/// `pvc-<uid>` names are), else a readable prefix of it plus a short stable hash of the whole.
pub fn service_name(pv_name: &str) -> String {
    if is_dns1035_label(pv_name) {
        return pv_name.to_owned();
    }
    let mut prefix: String = pv_name
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    if !prefix.starts_with(|c: char| c.is_ascii_lowercase()) {
        prefix.insert_str(0, "pv-");
    }
    prefix.truncate(MAX_NAME - HASH_LEN - 1);
    let prefix = prefix.trim_end_matches('-');
    format!("{prefix}-{}", short_hash(pv_name))
}

/// `value` when it is a valid label value, else a readable prefix plus a short stable hash.
pub fn label_value(value: &str) -> String {
    if is_label_value(value) {
        return value.to_owned();
    }
    let mut prefix: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    prefix.truncate(MAX_NAME - HASH_LEN - 1);
    let prefix = prefix.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let prefix = prefix.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        short_hash(value)
    } else {
        format!("{prefix}-{}", short_hash(value))
    }
}

fn short_hash(value: &str) -> String {
    let digest = Sha256::digest(value.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect::<String>()[..HASH_LEN].to_owned()
}

pub fn is_dns1035_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAME
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && !name.ends_with('-')
}

fn is_label_value(value: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    value.is_empty()
        || (value.len() <= MAX_NAME
            && value.chars().all(ok_char)
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// What clients mount: `<ClusterIP>:2049`, IPv6 in brackets. `None` for a missing or headless IP.
pub fn mount_endpoint(cluster_ip: &str) -> Option<String> {
    let ip: IpAddr = cluster_ip.parse().ok()?;
    Some(NfsEndpoint::new(ip, NFS_PORT).to_string())
}

fn labels(volume: &SharedVolume) -> BTreeMap<String, String> {
    [
        (VOLUME_ID_LABEL, volume.volume_id.as_str()),
        (APP_NAME_LABEL, APP_NAME),
        (APP_COMPONENT_LABEL, APP_COMPONENT),
        (APP_MANAGED_BY_LABEL, CONTROLLER_NAME),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

fn metadata(volume: &SharedVolume, name: &str, extra_labels: &[(&str, &str)]) -> ObjectMeta {
    let mut labels = labels(volume);
    labels.extend(extra_labels.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(volume.namespace.clone()),
        labels: Some(labels),
        owner_references: Some(vec![volume.owner.clone()]),
        ..Default::default()
    }
}

/// Selector-less ClusterIP Service, port `nfs` 2049/TCP → the NFS server's port.
pub fn service(volume: &SharedVolume) -> Service {
    Service {
        metadata: metadata(volume, &volume.service_name, &[]),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            ports: Some(vec![ServicePort {
                name: Some(NFS_PORT_NAME.into()),
                port: NFS_PORT.into(),
                protocol: Some("TCP".into()),
                target_port: Some(IntOrString::Int(volume.server.port.into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The Service to create: `applied` (what [`service`] built), single-stack in its NFS server's address family (an IPv6
/// server gets an IPv6 ClusterIP even where the cluster's first family is IPv4), and, when a mount
/// endpoint of that family was published, asking for that very ClusterIP, so that a deleted
/// Service (by hand, by a GitOps prune) comes back at the address clients already mount. Neither
/// can change on an existing Service; [`service`] is what is applied to one.
pub fn new_service(applied: &Service, volume: &SharedVolume, published: Option<&str>) -> Service {
    let mut service = applied.clone();
    let spec = service.spec.get_or_insert_with(Default::default);
    spec.ip_families = Some(vec![address_family(volume.server.ip).into()]);
    spec.ip_family_policy = Some("SingleStack".into());
    spec.cluster_ip = published
        .and_then(|published| published.parse::<NfsEndpoint>().ok())
        .map(|endpoint| endpoint.ip)
        .filter(|ip| ip.is_ipv6() == volume.server.is_ipv6())
        .map(|ip| ip.to_string());
    service
}

/// `IPv4` or `IPv6`, as Services and EndpointSlices spell address families.
pub fn address_family(ip: IpAddr) -> &'static str {
    if ip.is_ipv6() { "IPv6" } else { "IPv4" }
}

/// A digest of everything [`service`], [`endpoints`] and [`endpoint_slice`] are built from: two
/// volumes with the same fingerprint want the same objects.
pub fn fingerprint(volume: &SharedVolume) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    (
        &volume.namespace,
        &volume.service_name,
        &volume.volume_id,
        &volume.owner.uid,
        volume.server,
        volume.mount_endpoint,
    )
        .hash(&mut hasher);
    hasher.finish()
}

/// The Endpoints and EndpointSlice of one shared volume: both loops always write them together.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointObjects {
    pub endpoints: Endpoints,
    pub slice: EndpointSlice,
}

impl EndpointObjects {
    pub fn of(volume: &SharedVolume) -> Self {
        Self {
            endpoints: endpoints(volume),
            slice: endpoint_slice(volume),
        }
    }

    /// The namespace both live in.
    pub fn namespace(&self) -> &str {
        self.endpoints.metadata.namespace.as_deref().unwrap_or_default()
    }
}

/// Endpoints of the Service: the NFS server. Not mirrored: we write the EndpointSlice ourselves.
pub fn endpoints(volume: &SharedVolume) -> Endpoints {
    Endpoints {
        metadata: metadata(volume, &volume.service_name, &[(SKIP_MIRROR_LABEL, "true")]),
        subsets: Some(endpoint_subsets(volume.server)),
    }
}

fn endpoint_subsets(server: NfsEndpoint) -> Vec<EndpointSubset> {
    vec![EndpointSubset {
        addresses: Some(vec![EndpointAddress {
            ip: server.ip.to_string(),
            ..Default::default()
        }]),
        ports: Some(vec![EndpointPort {
            name: Some(NFS_PORT_NAME.into()),
            port: server.port.into(),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        ..Default::default()
    }]
}

/// The EndpointSlice of the Service: one ready endpoint, the NFS server.
pub fn endpoint_slice(volume: &SharedVolume) -> EndpointSlice {
    let mut metadata = metadata(
        volume,
        &volume.service_name,
        &[
            (SLICE_SERVICE_NAME_LABEL, &volume.service_name),
            (SLICE_MANAGED_BY_LABEL, SLICE_MANAGER),
        ],
    );
    if let Some(mount) = volume.mount_endpoint {
        metadata.annotations = Some([(MOUNT_ENDPOINT_ANNOTATION.to_owned(), mount.to_string())].into());
    }
    EndpointSlice {
        metadata,
        ..slice_at(volume.server)
    }
}

/// An EndpointSlice's address type, endpoint and port for `server`, without metadata.
fn slice_at(server: NfsEndpoint) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta::default(),
        address_type: address_family(server.ip).into(),
        endpoints: vec![Endpoint {
            addresses: vec![server.ip.to_string()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ports: Some(vec![SlicePort {
            name: Some(NFS_PORT_NAME.into()),
            port: Some(server.port.into()),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

/// What an agent's move changes on the Endpoints and the EndpointSlice the controller made: the
/// NFS server they point at, the stamp, and when the move was triggered (RFC 3339: the promotion
/// the agent saw; every node's kube-proxy measures its own programming latency from it), as two
/// JSON merge patches (neither names nor labels nor owners: the objects are the controller's).
pub fn moved_endpoints(
    server: NfsEndpoint,
    stamp: &MoveStamp,
    triggered_at: &str,
) -> (serde_json::Value, serde_json::Value) {
    let (key, text) = stamp.annotation();
    let metadata = serde_json::json!({"annotations": {key: text, LAST_CHANGE_TRIGGER_TIME_ANNOTATION: triggered_at}});
    let slice = slice_at(server);
    (
        serde_json::json!({"metadata": metadata, "subsets": endpoint_subsets(server)}),
        serde_json::json!({
            "metadata": metadata,
            "addressType": slice.address_type,
            "endpoints": slice.endpoints,
            "ports": slice.ports,
        }),
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn shared_volume(server: &str) -> SharedVolume {
        SharedVolume {
            namespace: "apps".into(),
            service_name: "pvc-1234".into(),
            volume_id: "vol-1".into(),
            owner: OwnerReference {
                api_version: "v1".into(),
                kind: "PersistentVolumeClaim".into(),
                name: "data".into(),
                uid: "uid-1".into(),
                controller: Some(true),
                ..Default::default()
            },
            server: server.parse().unwrap(),
            mount_endpoint: None,
        }
    }

    #[test]
    fn the_slice_carries_what_clients_mount_once_it_is_published() {
        let mut volume = shared_volume("10.0.0.5:2049");
        assert_eq!(endpoint_slice(&volume).metadata.annotations, None);
        volume.mount_endpoint = Some("10.96.4.7:2049".parse().unwrap());
        let slice = endpoint_slice(&volume);
        assert_eq!(
            slice.metadata.annotations.unwrap()[MOUNT_ENDPOINT_ANNOTATION],
            "10.96.4.7:2049"
        );
        assert_ne!(
            fingerprint(&volume),
            fingerprint(&shared_volume("10.0.0.5:2049")),
            "publishing the mount endpoint changes what the slice is built from"
        );
    }

    #[test]
    fn service_names() {
        let long = "a".repeat(64);
        let cases = [
            ("pvc-0b6f3c1e-2a1d-4c55-9a8e-1f2e3d4c5b6a", None),
            ("nfs-data", None),
            ("NFS_Data.v1", Some("nfs-data-v1-")),
            ("1-volume", Some("pv-1-volume-")),
            (long.as_str(), Some("aaaaaaaa")),
            ("trailing-", Some("trailing-")),
        ];
        for (pv, prefix) in cases {
            let name = service_name(pv);
            assert!(is_dns1035_label(&name), "{pv} -> {name} is not a DNS-1035 label");
            match prefix {
                None => assert_eq!(name, pv),
                Some(prefix) => {
                    assert!(name.starts_with(prefix), "{pv} -> {name}");
                    assert_eq!(name, service_name(pv), "not deterministic");
                }
            }
        }
        assert_ne!(
            service_name("A_b"),
            service_name("a.b"),
            "different PVs must not share a name"
        );
    }

    #[test]
    fn label_values() {
        assert_eq!(label_value("pvc-1"), "pvc-1");
        for raw in ["ns/vol/0", "-x-", &"v".repeat(80), "/"] {
            let value = label_value(raw);
            assert!(is_label_value(&value) && !value.is_empty(), "{raw} -> {value}");
        }
    }

    #[test]
    fn a_new_service_takes_the_servers_family_and_asks_for_the_published_address() {
        let four = shared_volume("10.0.0.5:2049");
        let six = shared_volume("[fd00::5]:2049");
        let asked = |volume: &SharedVolume, published| {
            let spec = new_service(&service(volume), volume, published).spec.unwrap();
            (spec.ip_families.unwrap()[0].clone(), spec.cluster_ip)
        };
        assert_eq!(
            asked(&four, Some("10.96.4.7:2049")),
            ("IPv4".into(), Some("10.96.4.7".into()))
        );
        assert_eq!(
            asked(&six, Some("[fd00:10:96::7]:2049")),
            ("IPv6".into(), Some("fd00:10:96::7".into()))
        );
        assert_eq!(
            asked(&six, Some("10.96.4.7:2049")),
            ("IPv6".into(), None),
            "another family cannot be asked for"
        );
        assert_eq!(asked(&four, Some("not an address")), ("IPv4".into(), None));
        assert_eq!(asked(&four, None), ("IPv4".into(), None));
        let created = new_service(&service(&four), &four, Some("10.96.4.7:2049"));
        let mut plain = service(&four);
        let spec = plain.spec.as_mut().unwrap();
        spec.cluster_ip = Some("10.96.4.7".into());
        spec.ip_families = Some(vec!["IPv4".into()]);
        spec.ip_family_policy = Some("SingleStack".into());
        assert_eq!(created, plain, "the applied Service plus what only a create can set");
    }

    #[test]
    fn mount_endpoints() {
        assert_eq!(mount_endpoint("10.96.0.12").as_deref(), Some("10.96.0.12:2049"));
        assert_eq!(mount_endpoint("fd00:10:96::c").as_deref(), Some("[fd00:10:96::c]:2049"));
        assert_eq!(mount_endpoint("None"), None);
        assert_eq!(mount_endpoint(""), None);
    }

    #[test]
    fn objects_point_at_the_nfs_server() {
        let v = shared_volume("10.0.0.5:30049");
        let svc = service(&v);
        let port = &svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
        assert_eq!((port.name.as_deref(), port.port), (Some("nfs"), 2049));
        assert_eq!(port.target_port, Some(IntOrString::Int(30049)));
        assert!(svc.spec.as_ref().unwrap().selector.is_none());
        assert_eq!(svc.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");

        let eps = endpoints(&v);
        let subset = &eps.subsets.as_ref().unwrap()[0];
        assert_eq!(subset.addresses.as_ref().unwrap()[0].ip, "10.0.0.5");
        assert_eq!(subset.ports.as_ref().unwrap()[0].port, 30049);
        assert_eq!(eps.metadata.labels.as_ref().unwrap()[SKIP_MIRROR_LABEL], "true");

        let slice = endpoint_slice(&v);
        assert_eq!(slice.address_type, "IPv4");
        assert_eq!(slice.endpoints[0].addresses, vec!["10.0.0.5"]);
        assert_eq!(
            slice.metadata.labels.as_ref().unwrap()[SLICE_SERVICE_NAME_LABEL],
            "pvc-1234"
        );
        for labels in [&svc.metadata.labels, &eps.metadata.labels, &slice.metadata.labels] {
            assert_eq!(labels.as_ref().unwrap()[VOLUME_ID_LABEL], "vol-1");
        }
    }

    #[test]
    fn an_agents_move_says_when_it_was_triggered_for_every_kube_proxy() {
        let stamp = MoveStamp::new("10.0.0.2:2049", "41");
        let server = "10.0.0.2:2049".parse().unwrap();
        let (endpoints, slice) = moved_endpoints(server, &stamp, "2026-11-26T09:30:41.139208786Z");
        for patch in [&endpoints, &slice] {
            let annotations = &patch["metadata"]["annotations"];
            assert_eq!(
                annotations[LAST_CHANGE_TRIGGER_TIME_ANNOTATION],
                "2026-11-26T09:30:41.139208786Z"
            );
            assert!(
                annotations[MOVE_STAMP_ANNOTATION]
                    .as_str()
                    .unwrap()
                    .contains("10.0.0.2:2049")
            );
        }
        assert_eq!(slice["endpoints"][0]["addresses"][0], "10.0.0.2");
    }

    #[test]
    fn ipv6_servers_get_ipv6_slices() {
        let slice = endpoint_slice(&shared_volume("[fd00::5]:2049"));
        assert_eq!(slice.address_type, "IPv6");
        assert_eq!(slice.endpoints[0].addresses, vec!["fd00::5"]);
    }
}
