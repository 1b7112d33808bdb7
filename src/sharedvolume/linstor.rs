//! A volume LINSTOR CSI serves over NFS itself (1.10+): where its export says clients mount, and
//! which server its nfs-helper advertises for it. nfs-helper makes one EndpointSlice per volume
//! where the volume is primary and its server started, named after the resource, in the namespace
//! of its `linstor-csi-nfs` Service, owned by the server's pod; a move deletes it and makes it
//! anew on the new primary. Both loops only read these.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::claim::elsewhere_export;
use crate::names::{LINSTOR_NFS_SLICE_MANAGER, SLICE_MANAGED_BY_LABEL};
use crate::volume::csi_resource_name;

/// What a LINSTOR-served PV says about its export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinstorExport {
    /// As the PV carries it: `nfs://<Service>.<namespace>.svc:<port>/<path>`.
    pub url: String,
    /// The namespace of LINSTOR's Service, where nfs-helper writes its slices; `None` when the
    /// export names no `<Service>.<namespace>.svc` host.
    pub namespace: Option<String>,
    /// The DRBD resource: the name of the volume's slice.
    pub resource: String,
}

/// The server nfs-helper advertises for a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinstorServer {
    /// `IP:port` (IPv6 as `[ip]:port`).
    pub address: String,
    /// The server's pod (the slice's owner), `namespace/name`.
    pub pod: Option<String>,
    /// When nfs-helper advertised it (the slice's creation, RFC 3339): the last move's end.
    pub since: Option<String>,
}

/// The export of a PV LINSTOR CSI serves itself, if it is one.
pub fn export_of(pv: &PersistentVolume) -> Option<LinstorExport> {
    let url = elsewhere_export(pv)?;
    Some(LinstorExport {
        namespace: service_namespace(url),
        resource: csi_resource_name(pv)?,
        url: url.clone(),
    })
}

/// The namespace in `nfs://<Service>.<namespace>.svc[.<domain>]:<port>/…`.
fn service_namespace(url: &str) -> Option<String> {
    let host = url.strip_prefix("nfs://")?.split(['/', ':']).next()?;
    let mut labels = host.split('.');
    let (_service, namespace, svc) = (labels.next()?, labels.next()?, labels.next()?);
    (svc == "svc" && !namespace.is_empty()).then(|| namespace.to_owned())
}

/// The server a slice of nfs-helper advertises: its first endpoint not marked unready, on the
/// slice's port. `None`: the slice names no server (no endpoint, or no port), or is not
/// nfs-helper's.
pub fn advertised(slice: &EndpointSlice) -> Option<LinstorServer> {
    let manager = slice.metadata.labels.as_ref()?.get(SLICE_MANAGED_BY_LABEL)?;
    if manager != LINSTOR_NFS_SLICE_MANAGER {
        return None;
    }
    let port = slice.ports.as_ref()?.iter().find_map(|p| p.port)?;
    let ip = slice
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .find_map(|e| e.addresses.first())?;
    let address = if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    };
    let namespace = slice.metadata.namespace.as_deref().unwrap_or_default();
    let owners = slice.metadata.owner_references.iter().flatten();
    let pod = owners
        .filter(|o| o.kind == "Pod")
        .map(|o| format!("{namespace}/{}", o.name))
        .next();
    Some(LinstorServer {
        address,
        pod,
        since: slice.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pv(export: &str, handle: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": handle},
            "spec": {"csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": handle,
                     "volumeAttributes": {"linstor.csi.linbit.com/nfs-export": export}}},
        }))
        .unwrap()
    }

    /// As `advertise start` writes it (linstor-csi `cmd/nfs-helper/advertise.go`): one endpoint,
    /// the pod IP, no conditions; one port named after the resource; the server's pod as owner.
    fn slice(addresses: &[&str], ready: Option<bool>) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-1", "namespace": "piraeus-datastore",
                         "labels": {"endpointslice.kubernetes.io/managed-by": "nfs-helper.linstor.csi.linbit.com"},
                         "creationTimestamp": "2026-11-28T10:00:00Z",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "linstor-csi-nfs-server-x7k2p", "uid": "u-1"}]},
            "addressType": "IPv4",
            "endpoints": [{"addresses": addresses, "conditions": {"ready": ready}}],
            "ports": [{"name": "pvc-1", "port": 2050}],
        }))
        .unwrap()
    }

    #[test]
    fn the_export_names_the_slices_namespace_and_resource() {
        let export = export_of(&pv(
            "nfs://linstor-csi-nfs.piraeus-datastore.svc:2050/srv/linstor-csi-nfs/pvc-1",
            "pvc-1",
        ))
        .unwrap();
        assert_eq!(export.namespace.as_deref(), Some("piraeus-datastore"));
        assert_eq!(export.resource, "pvc-1");
        let qualified = "nfs://linstor-csi-nfs.storage.svc.cluster.local:2050/x";
        assert_eq!(service_namespace(qualified).as_deref(), Some("storage"));
        for unnamed in [
            "nfs://10.96.0.7:2050/x",
            "nfs://linstor-csi-nfs:2050/x",
            "http://a.b.svc/x",
        ] {
            assert_eq!(service_namespace(unnamed), None, "{unnamed}");
        }
        let mut theirs_not = pv("x", "pvc-1");
        theirs_not
            .spec
            .as_mut()
            .unwrap()
            .csi
            .as_mut()
            .unwrap()
            .volume_attributes = None;
        assert_eq!(export_of(&theirs_not), None);
    }

    #[test]
    fn a_slice_advertises_its_ready_endpoint_its_pod_and_when() {
        let server = advertised(&slice(&["10.244.1.7"], None)).unwrap();
        assert_eq!(
            server,
            LinstorServer {
                address: "10.244.1.7:2050".into(),
                pod: Some("piraeus-datastore/linstor-csi-nfs-server-x7k2p".into()),
                since: Some("2026-11-28T10:00:00Z".into()),
            }
        );
        assert_eq!(
            advertised(&slice(&["fd00::7"], Some(true))).unwrap().address,
            "[fd00::7]:2050"
        );
        assert_eq!(advertised(&slice(&["10.244.1.7"], Some(false))), None, "unready");
        assert_eq!(advertised(&slice(&[], None)), None, "no address");
        let mut someone_elses = slice(&["10.244.1.7"], None);
        someone_elses.metadata.labels = None;
        assert_eq!(advertised(&someone_elses), None, "not nfs-helper's");
        let mut portless = slice(&["10.244.1.7"], None);
        portless.ports = None;
        assert_eq!(advertised(&portless), None);
    }
}
