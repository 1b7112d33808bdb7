//! Every well-known name the project reads or writes: annotations, labels, ports, field managers.

// In StorageOS the service endpoint is the volume's `nfs.serviceEndpoint` field and the mount
// endpoint the volume label `storageos.com/nfs/mount-endpoint`. On a PV both live in annotations,
// and an annotation key may hold only one `/` (the apiserver rejects the label's spelling there):
// the PV keys replace the second `/` with `-`.
/// PV annotation where the storage system (or our agent) writes where the NFS server listens.
pub const SERVICE_ENDPOINT_ANNOTATION: &str = "storageos.com/nfs-service-endpoint";
/// PV annotation where the controller publishes the address clients mount.
pub const MOUNT_ENDPOINT_ANNOTATION: &str = "storageos.com/nfs-mount-endpoint";
/// The stamp of an agent's move, on the PV, Endpoints and EndpointSlice it writes: where the
/// endpoints move to and the PV resourceVersion the move was decided over (JSON). The controller
/// tells a move in flight from drift by it.
pub const MOVE_STAMP_ANNOTATION: &str = "storageos.com/nfs-endpoint-move";
/// The agent on a volume's primary, on the PV: its published NFS server does not answer
/// (`SilentServer` as JSON); taken away once it answers again.
pub const SILENT_SERVER_ANNOTATION: &str = "storageos.com/nfs-server-not-answering";
/// Kubernetes's annotation on Endpoints and EndpointSlices: when the change they carry was
/// triggered. kube-proxy's `network_programming_duration_seconds` is measured from it.
pub const LAST_CHANGE_TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";
/// StorageOS volume label holding the published mount endpoint (StorageOS labels allow the `/`).
pub const STORAGEOS_MOUNT_ENDPOINT_LABEL: &str = "storageos.com/nfs/mount-endpoint";
/// The condition the controller keeps on every claim it manages: is its shared endpoint ready.
pub const CLAIM_CONDITION_TYPE: &str = "SharedVolumeReady";
/// On a PersistentVolume, `"false"`: neither loop publishes or serves it over NFS (the HA rules
/// still apply to its DRBD resource).
pub const SHARED_VOLUME_OPT_OUT_ANNOTATION: &str = "storageos.com/shared-volume";
/// On a PersistentVolume, the port its own NFS server listens on (one server per volume, as
/// `share` allocates them); the agent publishes `<node IP>:<port>`. Unset: `--nfs-port`.
pub const NFS_PORT_ANNOTATION: &str = "storageos.com/nfs-port";
/// On the objects `share` writes: `nfs-server` on the DRBD resource's PV and claim (the volume's
/// handle for this product; no pod mounts it, an admission policy refuses one that tries),
/// `nfs-client` on the NFS PV and claim apps mount.
pub const SHARE_ROLE_LABEL: &str = "storageos.com/shared-volume-role";
pub const SHARE_ROLE_SERVER: &str = "nfs-server";
pub const SHARE_ROLE_CLIENT: &str = "nfs-client";
/// Any non-empty value keeps Piraeus's LINSTOR affinity controller from replacing a PV.
pub const SKIP_AFFINITY_CONTROLLER_ANNOTATION: &str = "piraeus.io/skip-affinity-controller";
/// The Lease `share` holds while it picks a port and writes the PV that names it, so that two
/// runs at once never take the same port.
pub const SHARE_PORT_LOCK_LEASE: &str = "shared-volume-share-ports";
/// CSI volume attributes that say another NFS server serves the volume on its own address:
/// LINSTOR CSI's NFS export (1.10+, `nfs://<its Service>:<port>/…`).
pub const SERVED_ELSEWHERE_ATTRIBUTES: [&str; 1] = ["linstor.csi.linbit.com/nfs-export"];
/// Label on every object we create, naming the volume it serves.
pub const VOLUME_ID_LABEL: &str = "storageos.com/volume-id";

/// The `app.kubernetes.io/*` labels we put on every object we create.
pub const APP_NAME_LABEL: &str = "app.kubernetes.io/name";
pub const APP_COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const APP_MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const APP_NAME: &str = "shared-volume";
pub const APP_COMPONENT: &str = "nfs-endpoint";
/// Also the EndpointSlice `managed-by` value and the events' reporting controller.
pub const CONTROLLER_NAME: &str = "shared-volume-controller";

/// Tells the EndpointSlice mirroring controller to leave our Endpoints alone.
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
pub const SLICE_SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
pub const SLICE_MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// The EndpointSlice `managed-by` label value (must look like a domain-qualified name).
pub const SLICE_MANAGER: &str = "shared-volume-controller.storageos.com";
/// The manager of the EndpointSlices LINSTOR CSI's nfs-helper writes for its own RWX volumes:
/// one per volume, named after the resource, for its `linstor-csi-nfs` Service.
pub const LINSTOR_NFS_SLICE_MANAGER: &str = "nfs-helper.linstor.csi.linbit.com";

/// The Service port clients mount, and its name.
pub const NFS_PORT: u16 = 2049;
pub const NFS_PORT_NAME: &str = "nfs";

/// Server-side apply field managers, one per writer.
pub const CONTROLLER_FIELD_MANAGER: &str = "shared-volume-controller";
pub const AGENT_FIELD_MANAGER: &str = AGENT_NAME;
/// The HA agent's name as events' reporting controller.
pub const AGENT_NAME: &str = "shared-volume-agent";

/// Selects every object the shared-volume loop manages.
pub fn managed_selector() -> String {
    format!("{APP_MANAGED_BY_LABEL}={CONTROLLER_NAME}")
}

/// The label selector of the slices LINSTOR CSI's nfs-helper writes.
pub fn linstor_nfs_selector() -> String {
    format!("{SLICE_MANAGED_BY_LABEL}={LINSTOR_NFS_SLICE_MANAGER}")
}

/// Pods annotated with this key (any value) are never evicted or deleted by the HA agent.
pub const IGNORE_FAIL_OVER_ANNOTATION: &str = "drbd.linbit.com/ignore-fail-over";
/// Prefix of the per-node heartbeat Lease the HA agent renews.
pub const AGENT_LEASE_PREFIX: &str = "shared-volume-agent-";
/// Label on every heartbeat Lease (the guard counts the storage nodes by them).
pub const AGENT_LEASE_LABEL: &str = "storageos.com/drbd-agent-heartbeat";
/// Heartbeat Lease annotation: how often its agent renews it, in seconds. Peers count the agent
/// silent after two renewals missed.
pub const HEARTBEAT_INTERVAL_ANNOTATION: &str = "storageos.com/heartbeat-interval-seconds";
/// Where each kubelet renews its node's Lease, named after the node.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Prefix of the per-node Lease where each agent states its view of its DRBD resources. It is
/// written only when that view changes, so that every agent can watch all of them; heartbeats,
/// renewed all the time, are read only for a suspected peer.
pub const AGENT_REPORT_LEASE_PREFIX: &str = "shared-volume-agent-report-";

/// The heartbeat Lease of the agent on `node`.
pub fn lease_name(node: &str) -> String {
    format!("{AGENT_LEASE_PREFIX}{node}")
}

/// The Lease in which the agent on `node` reports its DRBD state.
pub fn report_lease_name(node: &str) -> String {
    format!("{AGENT_REPORT_LEASE_PREFIX}{node}")
}

/// Label on every report Lease, so that agents can watch each other's.
pub const AGENT_REPORT_LABEL: &str = "storageos.com/drbd-agent-report";
/// Report Lease annotation holding the view (JSON): the evidence peers weigh before failing a
/// node over.
pub const DRBD_REPORT_ANNOTATION: &str = "storageos.com/drbd-report";
/// Field manager of the report (apart from the heartbeat's, so neither apply drops the other).
pub const AGENT_REPORT_FIELD_MANAGER: &str = "shared-volume-agent-report";
/// The Lease, in the agents' namespace, through which agents reserve fail-over slots under the
/// blast-radius guard, with optimistic concurrency.
pub const FAIL_OVER_GUARD_LEASE: &str = "shared-volume-agent-fail-over-guard";
/// Its annotation: the nodes reserved, with when each reservation expires (JSON).
pub const FAIL_OVER_RESERVATIONS_ANNOTATION: &str = "storageos.com/fail-over-reservations";

/// The agents' `--operations-timeout` in their environment, and its default: the bound of one of
/// their writes, which the fail-over guard's rule and `status` both use.
pub const OPERATIONS_TIMEOUT_ENV: &str = "OPERATIONS_TIMEOUT";
pub const DEFAULT_OPERATIONS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Taint of a node whose DRBD resources lost quorum (Piraeus's key). Its value says who put it:
/// [`TAINT_BY_OWN_AGENT`] or [`TAINT_BY_FAIL_OVER`], and so who may remove it.
pub const LOST_QUORUM_TAINT: &str = "drbd.linbit.com/lost-quorum";
/// The value of a taint an agent puts on its own node (it removes it once quorum is back).
pub const TAINT_BY_OWN_AGENT: &str = "own-node";
/// The value of the lost-quorum taint a peer puts on a node it fails over (the node's own agent
/// removes it once the node is back and its DRBD resources reconnected).
pub const TAINT_BY_FAIL_OVER: &str = "fail-over";
/// Taint of a node where a DRBD resource forces IO errors (Piraeus's key).
pub const FORCE_IO_ERROR_TAINT: &str = "drbd.linbit.com/force-io-error";
