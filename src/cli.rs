//! Command line: one binary, two subcommands. Every flag has an environment fallback, named after
//! the flag in upper snake case (`--admin-addr` ↔ `ADMIN_ADDR`), unless noted. The flags of the
//! Piraeus HA agent and of the StorageOS shared-volume controller are accepted too (see
//! [`crate::compat`], which also takes their single-dash spelling).

use std::ffi::OsString;
use std::net::SocketAddr;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use humantime::Duration;

use crate::telemetry::LogFormat;

/// The `--help` heading of the flags other tools spelt that way (Piraeus, StorageOS, klog).
pub const COMPATIBILITY: &str = "Compatibility (Piraeus, StorageOS)";

#[derive(Debug, Parser)]
#[command(name = "shared-volume-controller", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands a user runs as the kubectl plugin (`kubectl shared-volume status`).
const PLUGIN_SUBCOMMANDS: [&str; 2] = ["status", "share"];

impl Cli {
    /// Parses the command line (exits on bad input, as clap does). The plugin's subcommands take
    /// the global flags from the command line alone, as kubectl does: never from environment
    /// variables that a user's shell may set for something else (`LOG_LEVEL`, `ADMIN_ADDR`…).
    /// The loops' subcommands keep every environment fallback (the chart sets flags that way).
    pub fn parse_args(args: Vec<OsString>) -> Self {
        let without_env = Self::command().mut_args(|arg| if arg.is_global_set() { arg.env(None) } else { arg });
        if let Ok(matches) = without_env.try_get_matches_from(&args)
            && matches
                .subcommand_name()
                .is_some_and(|name| PLUGIN_SUBCOMMANDS.contains(&name))
            && let Ok(cli) = Self::from_arg_matches(&matches)
        {
            return cli;
        }
        Self::parse_from(args)
    }
}

/// Flags that both subcommands take.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Address of the admin server (/metrics, /healthz, /readyz): `IP:PORT`, or `[IP]:PORT` for
    /// either family (the chart passes the node's address from the downward API that way). The
    /// default, `[::]`, takes both families (IPv4 only on a host without IPv6).
    #[arg(long, env = "ADMIN_ADDR", default_value = "[::]:8080", global = true, value_parser = socket_address)]
    pub admin_addr: SocketAddr,
    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
    /// Log filter in RUST_LOG syntax (RUST_LOG, when set, wins).
    #[arg(long, env = "LOG_LEVEL", default_value = "info", global = true)]
    pub log_level: String,
    /// Path of a kubeconfig file (no env fallback: KUBECONFIG is read as usual). Default:
    /// in-cluster, or KUBECONFIG, or ~/.kube/config.
    #[arg(long, global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use (no env fallback, as kubectl). Default: its current context.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig cluster to use (no env fallback, as kubectl). Default: the context's.
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// The kubeconfig user to use (no env fallback, as kubectl). Default: the context's.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// The user to impersonate, as kubectl's --as.
    #[arg(long = "as", value_name = "USER", global = true)]
    pub impersonate: Option<String>,
    /// A group to impersonate (repeat for more), as kubectl's --as-group.
    #[arg(long = "as-group", value_name = "GROUP", global = true)]
    pub impersonate_groups: Vec<String>,
    /// Read and write timeout of each request to the Kubernetes API. Default: none (the agent
    /// bounds every call by --operations-timeout anyway).
    #[arg(long, env = "KUBE_API_TIMEOUT", global = true)]
    pub kube_api_timeout: Option<Duration>,
    /// A standing Warning (bad input that stays bad) is posted again this often while it lasts, so
    /// that it outlives the API server's event TTL (`--event-ttl`, 1h by default): keep it shorter.
    #[arg(long, env = "WARNING_REPEAT_INTERVAL", default_value = "30m", global = true)]
    pub warning_repeat_interval: Duration,
    /// Piraeus and klog: log verbosity (0–1 info, 2–4 debug, 5+ trace). Use --log-level.
    #[arg(help_heading = COMPATIBILITY, long = "v", value_name = "LEVEL", global = true)]
    pub verbosity: Option<u8>,
    /// Piraeus: the timeout of one API request ("0": none). Use --kube-api-timeout.
    #[arg(help_heading = COMPATIBILITY, long, value_name = "DURATION", global = true)]
    pub request_timeout: Option<String>,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start-up; boxing buys nothing
pub enum Command {
    /// Shared-volume loop: Service, Endpoints and EndpointSlice per RWX volume (leader-elected).
    Controller(ControllerArgs),
    /// DRBD HA agent: one per node, fail-over, taints and endpoints that follow the primary.
    Agent(AgentArgs),
    /// Conntrack repair: one per client node; after a volume's endpoint moves, deletes the
    /// connection-tracking entries that still send its ClusterIP to the old NFS server.
    Conntrack(ConntrackArgs),
    /// Checks an installation (what `helm test` runs): the leader Lease held and fresh, every
    /// agent pod ready, the admission policies bound. Exits non-zero when a check fails.
    Selftest(SelftestArgs),
    /// The installation at a glance: the leader, each agent (node, ready, heartbeat, DRBD report,
    /// taints), the fail-over guard's reservations and each managed claim (condition, mount
    /// endpoint, primary node, last move). Read-only. As a kubectl plugin: `kubectl shared-volume
    /// status` (the binary installed as `kubectl-shared_volume`).
    Status(StatusArgs),
    /// Shares an existing DRBD resource (one LINSTOR created) as a ReadWriteMany filesystem claim:
    /// writes a PV of the resource and the claim bound to it, then waits until the controller says
    /// it is served. As a kubectl plugin: `kubectl shared-volume share`.
    Share(ShareArgs),
}

#[derive(Debug, Args)]
pub struct ShareArgs {
    /// The DRBD resource; also the PV's name and CSI volume handle.
    pub resource: String,
    /// The claims' namespace. Default: the kubeconfig context's namespace.
    #[arg(long, short = 'n', env = "SHARED_VOLUME_NAMESPACE")]
    pub namespace: Option<String>,
    /// The name of the claim apps mount (the server claim is `<claim>-drbd`). Default: the
    /// resource's name.
    #[arg(long, env = "SHARED_VOLUME_CLAIM")]
    pub claim: Option<String>,
    /// The resource's usable size, as a Kubernetes quantity (`10Gi`).
    #[arg(long, env = "SHARED_VOLUME_SIZE")]
    pub size: String,
    /// The StorageClass named by both objects (the filters of the controller and the agents see
    /// it); empty: none, so that they bind only to each other.
    #[arg(long, env = "SHARED_VOLUME_STORAGE_CLASS", default_value = "")]
    pub storage_class: String,
    /// The CSI driver named on the PV (the resource's own driver; `--csi-driver` filters see it).
    #[arg(long, env = "SHARED_VOLUME_CSI_DRIVER", default_value = "linstor.csi.linbit.com")]
    pub csi_driver: String,
    /// The port of the volume's own NFS server (the PV's `storageos.com/nfs-port`, which the
    /// agents publish and pass to the promoter's units). Default: the lowest from 20490 that no PV
    /// names.
    #[arg(long, env = "SHARED_VOLUME_NFS_PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub nfs_port: Option<u16>,
    /// The export's path as clients mount it (nfs-ganesha's `Pseudo`), on the client PV.
    #[arg(long, env = "SHARED_VOLUME_EXPORT_PATH", default_value = "/export")]
    pub export_path: String,
    /// The client PV's mount options, comma-separated.
    #[arg(
        long,
        env = "SHARED_VOLUME_MOUNT_OPTIONS",
        value_delimiter = ',',
        default_value = "nfsvers=4.2,hard,timeo=100,retrans=2"
    )]
    pub mount_options: Vec<String>,
    /// The namespace of the Lease a run holds while it picks a port and writes the PV that names
    /// it, so that two runs at once never take the same port.
    #[arg(long, env = "SHARED_VOLUME_PORT_LOCK_NAMESPACE", default_value = "kube-system")]
    pub port_lock_namespace: String,
    /// How long to wait for the server claim's SharedVolumeReady condition to be True before
    /// writing the client side; 0s: do not wait (run again once served for the client side).
    #[arg(long, env = "SHARED_VOLUME_WAIT", default_value = "2m")]
    pub wait: Duration,
    /// Create even when no agent reports the DRBD resource.
    #[arg(long, env = "SHARED_VOLUME_SKIP_RESOURCE_CHECK")]
    pub skip_resource_check: bool,
    /// Print the server PV and claim (a JSON List for `kubectl apply -f -`) and create nothing.
    #[arg(long, env = "SHARED_VOLUME_DRY_RUN")]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The release's namespace: its leader Lease, agent pods and agent Leases. Default: the
    /// kubeconfig context's namespace.
    #[arg(long, short = 'n', env = "SHARED_VOLUME_NAMESPACE")]
    pub namespace: Option<String>,
    /// The controller's leader Lease.
    #[arg(long, env = "SHARED_VOLUME_LEASE_NAME", default_value = "shared-volume-controller")]
    pub lease_name: String,
    /// Label selector of the agent pods.
    #[arg(
        long,
        env = "SHARED_VOLUME_AGENT_SELECTOR",
        default_value = "app.kubernetes.io/name=shared-volume-controller,app.kubernetes.io/component=agent"
    )]
    pub agent_selector: String,
    /// Label selector of the conntrack repair's pods.
    #[arg(
        long,
        env = "SHARED_VOLUME_REPAIR_SELECTOR",
        default_value = "app.kubernetes.io/name=shared-volume-controller,app.kubernetes.io/component=conntrack"
    )]
    pub repair_selector: String,
    /// `table` for people, `json` for scripts.
    #[arg(long, short = 'o', env = "SHARED_VOLUME_OUTPUT", value_enum, default_value = "table")]
    pub output: StatusOutput,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// The release's namespace: its Lease and its agent pods.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub namespace: String,
    /// The controller's leader Lease; unset: not checked (no controller installed).
    #[arg(long, env = "LEASE_NAME")]
    pub lease_name: Option<String>,
    /// Label selector of the agent pods; unset: not checked (no agent installed).
    #[arg(long, env = "AGENT_SELECTOR")]
    pub agent_selector: Option<String>,
    /// Label selector of the conntrack repair's pods; unset: not checked (no repair installed).
    #[arg(long, env = "REPAIR_SELECTOR")]
    pub repair_selector: Option<String>,
    /// Admission policies that must exist and be bound with Deny (comma-separated).
    #[arg(long, env = "POLICIES", value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Bound of one agent's or repair's `/readyz` request.
    #[arg(long, env = "TIMEOUT", default_value = "5s")]
    pub timeout: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VolumeBackendKind {
    /// PersistentVolume annotations storageos.com/nfs-{service,mount}-endpoint.
    Kubernetes,
    /// The StorageOS v2 REST API (polled).
    Storageos,
}

#[derive(Debug, Args)]
pub struct ControllerArgs {
    /// Where volumes keep their NFS endpoints.
    #[arg(long, env = "VOLUME_BACKEND", value_enum, default_value = "kubernetes")]
    pub volume_backend: VolumeBackendKind,
    /// StorageOS API address (storageos backend); the scheme defaults to http, the port to 5705.
    #[arg(long, env = "API_ENDPOINT", default_value = "storageos")]
    pub api_endpoint: String,
    /// Directory with the files `username` and `password` for the StorageOS API (a mounted Secret).
    #[arg(long, env = "API_SECRET_PATH", default_value = "/etc/storageos/secrets/api")]
    pub api_secret_path: std::path::PathBuf,
    /// How long a StorageOS token is used before it is refreshed (tokens expire after 5m).
    #[arg(long, env = "API_REFRESH_INTERVAL", default_value = "1m")]
    pub api_refresh_interval: Duration,
    /// Timeout of one StorageOS API request.
    #[arg(long, env = "API_TIMEOUT", default_value = "10s")]
    pub api_timeout: Duration,
    /// How often StorageOS volumes are listed to find changes (it cannot be watched).
    #[arg(long, env = "VOLUME_POLL_INTERVAL", default_value = "5s")]
    pub volume_poll_interval: Duration,
    /// Manage only claims of this StorageClass (repeatable; env: comma-separated). Default: all.
    #[arg(long, env = "STORAGE_CLASS", value_delimiter = ',')]
    pub storage_class: Vec<String>,
    /// Manage only volumes of this CSI driver (repeatable; env: comma-separated). Default: all.
    #[arg(long, env = "CSI_DRIVER", value_delimiter = ',')]
    pub csi_driver: Vec<String>,
    /// Manage only claims in this namespace. Default: every namespace.
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub watch_namespace: Option<String>,
    /// How long to wait before reconciling a claim again after a failure (StorageOS's retry on
    /// API failure); doubled after each further failure of the same claim, up to
    /// `--max-retry-interval`, and reset by a success.
    #[arg(long, env = "API_RETRY_INTERVAL", default_value = "5s")]
    pub api_retry_interval: Duration,
    /// The longest one reconcile may take before it is dropped and retried (a hung API call
    /// must not hold a worker forever).
    #[arg(long, env = "RECONCILE_TIMEOUT", default_value = "1m")]
    pub reconcile_timeout: Duration,
    /// The longest wait between two attempts at a claim that keeps failing.
    #[arg(long, env = "MAX_RETRY_INTERVAL", default_value = "5m")]
    pub max_retry_interval: Duration,
    /// Claims reconciled at once.
    #[arg(long, env = "CONCURRENCY", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrency: u16,
    /// How often every claim is reconciled again even when nothing changed.
    #[arg(long, env = "RESYNC_INTERVAL", default_value = "10m")]
    pub resync_interval: Duration,
    /// After creating a Service, how often to read it back until it has a ClusterIP.
    #[arg(long, env = "K8S_CREATE_POLL_INTERVAL", default_value = "1s")]
    pub k8s_create_poll_interval: Duration,
    /// After creating a Service, how long to wait for its ClusterIP before retrying later.
    #[arg(long, env = "K8S_CREATE_WAIT_DURATION", default_value = "20s")]
    pub k8s_create_wait_duration: Duration,
    /// Whether to write each volume's core/v1 Endpoints beside its EndpointSlice: `auto` writes
    /// them below Kubernetes 1.33 only (they are deprecated from 1.33; kube-proxy reads slices).
    #[arg(long, env = "WRITE_ENDPOINTS", value_enum, default_value = "auto")]
    pub write_endpoints: crate::core_endpoints::WriteEndpoints,
    /// Run only while holding the Lease (for more than one replica).
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// StorageOS: enable leader election (`-enable-leader-election`, `=true` or `=false`).
    #[arg(help_heading = COMPATIBILITY, long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub enable_leader_election: Option<bool>,
    /// StorageOS: the metrics address (`:8080`). Sets --admin-addr.
    #[arg(help_heading = COMPATIBILITY, long, value_name = "ADDR")]
    pub metrics_addr: Option<String>,
    /// StorageOS: how often cached volumes are re-validated. Accepted, no effect: every poll
    /// lists every volume.
    #[arg(help_heading = COMPATIBILITY, long, value_name = "DURATION")]
    pub volume_expiry_interval: Option<Duration>,
    /// StorageOS (zap): log level, `debug`, `info`, `error` or a number. Sets --log-level.
    #[arg(help_heading = COMPATIBILITY, long, value_name = "LEVEL")]
    pub zap_log_level: Option<String>,
    /// StorageOS (zap): log encoding, `json` or `console`. Sets --log-format.
    #[arg(help_heading = COMPATIBILITY, long, value_name = "ENCODER")]
    pub zap_encoder: Option<String>,
    /// StorageOS (zap): development logging. Accepted, no effect.
    #[arg(help_heading = COMPATIBILITY, long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    pub zap_devel: Option<bool>,
    /// StorageOS (zap): stack trace level. Accepted, no effect.
    #[arg(help_heading = COMPATIBILITY, long, value_name = "LEVEL")]
    pub zap_stacktrace_level: Option<String>,
    /// StorageOS (zap): time encoding. Accepted, no effect.
    #[arg(help_heading = COMPATIBILITY, long, value_name = "ENCODING")]
    pub zap_time_encoding: Option<String>,
    /// Name of the leader-election Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "shared-volume-controller")]
    pub lease_name: String,
    /// Namespace of the leader-election Lease, where the controller is installed (env:
    /// POD_NAMESPACE; `--namespace` as in StorageOS).
    #[arg(long, alias = "namespace", env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Seconds a leader holds the Lease without renewing it.
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// Seconds before expiry at which the leader renews.
    #[arg(long, env = "LEASE_GRACE_SECONDS", default_value_t = 5)]
    pub lease_grace_seconds: u64,
    /// This replica's identity in the Lease and in events (env: POD_NAME).
    #[arg(long, env = "POD_NAME", default_value_t = default_identity())]
    pub identity: String,
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_else(|_| "unknown".into());
    format!("{}-{}", host.trim(), std::process::id())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DrainPolicy {
    /// Do nothing special when the node is drained.
    Ignore,
    /// Evict the local consumers of primaries of shared volumes when the node is cordoned or
    /// carries the evacuate taint, so the NFS service moves before the node goes down.
    Evacuate,
}

#[derive(Debug, Args)]
pub struct ConntrackArgs {
    /// The Kubernetes node this runs on (env: NODE_NAME, from the downward API); named in logs.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Deprecated and ignored: the table is read through ctnetlink, not the conntrack tool.
    #[arg(long, env = "CONNTRACK_PATH", help_heading = COMPATIBILITY)]
    pub conntrack_path: Option<String>,
    /// How often a volume whose endpoint moved is swept while its window lasts.
    #[arg(long, env = "SWEEP_PERIOD", default_value = "250ms")]
    pub sweep_period: Duration,
    /// How long after a move its volume is swept at most: until this node's kube-proxy has
    /// rewritten the Service's rules, a deleted entry comes back through the old ones. A sweep
    /// that finds a flow to the new NFS server ends the window early.
    #[arg(long, env = "SWEEP_FOR", default_value = "30s")]
    pub sweep_for: Duration,
    /// Bound of one read or delete of the conntrack table, and of one read of kube-proxy's
    /// metrics.
    #[arg(long, env = "COMMAND_TIMEOUT", default_value = "10s")]
    pub command_timeout: Duration,
    /// This node's kube-proxy `/metrics` (its `--metrics-bind-address`): once it holds no change
    /// for a sync, has synced after its last queued change and `--kube-proxy-settle` has passed
    /// since a move, the next sweep is the move's last. Empty: not asked; a sweep ends on a flow
    /// to the new server or with its window.
    #[arg(long, env = "KUBE_PROXY_METRICS", default_value = "http://127.0.0.1:10249/metrics")]
    pub kube_proxy_metrics: String,
    /// How far kube-proxy's watch may be behind this one's: after a move, kube-proxy's word is
    /// trusted from then on. A node without clients of the volume sweeps it once at the move and
    /// once then.
    #[arg(long, env = "KUBE_PROXY_SETTLE", default_value = "2s")]
    pub kube_proxy_settle: Duration,
    /// The Service LINSTOR CSI serves its own RWX volumes through (one port per volume): their
    /// moves are repaired too, read from nfs-helper's EndpointSlices. Empty: only this product's.
    #[arg(long, env = "LINSTOR_NFS_SERVICE", default_value = "linstor-csi-nfs")]
    pub linstor_nfs_service: String,
}

/// The systemd dependency kinds drbd-reactor's promoter takes for `dependencies-as` and `target-as`.
const SYSTEMD_DEPENDENCIES: [&str; 4] = ["Wants", "Requires", "Requisite", "BindsTo"];

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// The Kubernetes node this agent runs on (env: NODE_NAME, from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// This node's address for NFS clients. Default: the Node's InternalIP.
    #[arg(long, env = "NODE_IP")]
    pub node_ip: Option<std::net::IpAddr>,
    /// Port the NFS server listens on, published with the node IP as the service endpoint.
    #[arg(long, env = "NFS_PORT", default_value_t = crate::names::NFS_PORT)]
    pub nfs_port: u16,
    /// Whether a volume's NFS server must answer an RPC NULL call (NFS version 4, at the endpoint
    /// to publish) before this node is published as its endpoint, and is probed while published.
    /// Off for a server the agent's node cannot reach.
    #[arg(long, env = "NFS_PROBE", default_value_t = true, action = clap::ArgAction::Set)]
    pub nfs_probe: bool,
    /// How long one probe waits for the server's answer.
    #[arg(long, env = "NFS_PROBE_TIMEOUT", default_value = "1s")]
    pub nfs_probe_timeout: Duration,
    /// How often the server of a volume published here is probed again.
    #[arg(long, env = "NFS_PROBE_INTERVAL", default_value = "10s")]
    pub nfs_probe_interval: Duration,
    /// Whether to write each volume's core/v1 Endpoints beside its EndpointSlice: `auto` writes
    /// them below Kubernetes 1.33 only (they are deprecated from 1.33; kube-proxy reads slices).
    #[arg(long, env = "WRITE_ENDPOINTS", value_enum, default_value = "auto")]
    pub write_endpoints: crate::core_endpoints::WriteEndpoints,
    /// The drbdsetup binary.
    #[arg(long, env = "DRBDSETUP_PATH", default_value = "drbdsetup")]
    pub drbdsetup_path: std::path::PathBuf,
    /// DRBD's proc file; while it is missing the node has no DRBD resources.
    #[arg(long, env = "DRBD_PROC_PATH", default_value = "/proc/drbd")]
    pub drbd_proc_path: std::path::PathBuf,
    /// How often DRBD state is read even without an events2 change (a safety net).
    #[arg(long, env = "DRBD_STATUS_INTERVAL", default_value = "5s")]
    pub drbd_status_interval: Duration,
    /// How long a peer may stay disconnected before its node is failed over.
    #[arg(long, env = "FAIL_OVER_TIMEOUT", default_value = "5s")]
    pub fail_over_timeout: Duration,
    /// Grace period of deleting Kubernetes objects (evictions, attachments), in seconds; pods on
    /// a NotReady node are force-deleted with 0.
    #[arg(long, env = "GRACE_PERIOD_SECONDS", default_value_t = 10)]
    pub grace_period_seconds: u32,
    /// Timeout of one action (an API call or a drbdsetup command).
    #[arg(long, env = "OPERATIONS_TIMEOUT", default_value = "1m")]
    pub operations_timeout: Duration,
    /// Decisions are taken again at least this often, even when nothing changed.
    #[arg(long, env = "RECONCILE_INTERVAL", default_value = "5s")]
    pub reconcile_interval: Duration,
    /// How often the agent re-checks against the API what its caches say: the endpoints of the
    /// volumes this node serves are published again, repairing drift.
    #[arg(long, env = "RESYNC_INTERVAL", default_value = "5m")]
    pub resync_interval: Duration,
    /// Piraeus: address of the /healthz endpoint. Sets --admin-addr.
    #[arg(help_heading = COMPATIBILITY, long, value_name = "ADDR")]
    pub health_bind_address: Option<String>,
    /// Publish only volumes of this StorageClass (repeatable; env: comma-separated). Default: all.
    /// The HA rules apply to every DRBD volume whatever this says.
    #[arg(long, env = "STORAGE_CLASS", value_delimiter = ',')]
    pub storage_class: Vec<String>,
    /// Publish only volumes of this CSI driver (repeatable; env: comma-separated). Default: all.
    #[arg(long, env = "CSI_DRIVER", value_delimiter = ',')]
    pub csi_driver: Vec<String>,
    /// drbd-reactor's snippets directory: for each shared volume with a disk on this node the agent
    /// writes a promoter snippet there (`shared-volume-<resource>.toml`) and removes it once the
    /// volume leaves the node. Default: none written.
    #[arg(long, env = "PROMOTER_SNIPPETS_DIR")]
    pub promoter_snippets_dir: Option<std::path::PathBuf>,
    /// The systemd units a promoter snippet starts in order after promoting the resource
    /// (`{resource}`: the DRBD resource's name; `{port}`: its NFS server's port, the PV's
    /// `storageos.com/nfs-port` or `--nfs-port`).
    #[arg(
        long,
        env = "PROMOTER_START",
        value_delimiter = ',',
        default_value = "shared-volume-fs@{resource}.service,shared-volume-nfs@{resource}:{port}.service"
    )]
    pub promoter_start: Vec<String>,
    /// How each unit of a promoter snippet depends on the one before (drbd-reactor's
    /// `dependencies-as`): with `BindsTo`, a unit that dies stops the units after it.
    #[arg(
        long,
        env = "PROMOTER_DEPENDENCIES_AS",
        default_value = "BindsTo",
        value_parser = SYSTEMD_DEPENDENCIES
    )]
    pub promoter_dependencies_as: String,
    /// How the promoter's target depends on each unit of a snippet (drbd-reactor's `target-as`):
    /// with `BindsTo`, a unit that dies for good (the NFS server past its restarts) stops the
    /// target and so every unit of it, and drbd-reactor demotes the resource so that a peer
    /// takes over. drbd-reactor's own default, `Requires`, keeps the resource Primary behind a
    /// dead server.
    #[arg(
        long,
        env = "PROMOTER_TARGET_AS",
        default_value = "BindsTo",
        value_parser = SYSTEMD_DEPENDENCIES
    )]
    pub promoter_target_as: String,
    /// What systemd does when drbd-reactor cannot demote the resource (its
    /// `on-drbd-demote-failure`): a node that keeps a Primary it cannot give up blocks every peer.
    #[arg(
        long,
        env = "PROMOTER_DEMOTE_FAILURE",
        default_value = "reboot-immediate",
        value_parser = [
            "none", "reboot", "reboot-force", "reboot-immediate", "poweroff", "poweroff-force",
            "poweroff-immediate", "exit", "exit-force",
        ]
    )]
    pub promoter_demote_failure: String,
    /// Whether drbd-reactor runs `drbdadm adjust` on the resource when it starts (its
    /// `adjust-resource-on-start`). Off: LINSTOR's satellite adjusts the resources it manages,
    /// from resource files the host's drbdadm does not read.
    #[arg(long, env = "PROMOTER_ADJUST_ON_START", default_value_t = false, action = clap::ArgAction::Set)]
    pub promoter_adjust_on_start: bool,
    /// Also fail over pods with volumes that are not safe to fail over (hostPath, other network storage…).
    #[arg(long, env = "FAIL_OVER_UNSAFE_PODS")]
    pub fail_over_unsafe_pods: bool,
    /// Never taint nodes (fail-over still evicts and deletes attachments).
    #[arg(long, env = "DISABLE_NODE_TAINTS")]
    pub disable_node_taints: bool,
    /// Decide and report every action ("would …" in logs and events) but change nothing.
    #[arg(long, env = "DRY_RUN")]
    pub dry_run: bool,
    /// Never add a lost-quorum taint that would leave more than this share of nodes tainted.
    #[arg(long, env = "MAX_TAINTED_FRACTION", default_value_t = 0.5, value_parser = fraction)]
    pub max_tainted_fraction: f64,
    /// How many volumes a fail-over publishes at once when this node becomes the primary of many
    /// (each is three writes in one round trip).
    #[arg(long, env = "MAX_CONCURRENT_PUBLICATIONS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_concurrent_publications: u16,
    /// What to do when this node is cordoned or carries the evacuate taint.
    #[arg(long, env = "NODE_DRAIN_POLICY", value_enum, default_value = "ignore")]
    pub node_drain_policy: DrainPolicy,
    /// The taint key that asks for evacuation (any effect).
    #[arg(long, env = "EVACUATE_TAINT", default_value = "piraeus.io/evacuate")]
    pub evacuate_taint: String,
    /// Label selector of the LINSTOR satellite pods, whose names are the DRBD peer names.
    #[arg(
        long,
        env = "SATELLITE_POD_LABEL",
        default_value = "app.kubernetes.io/component=linstor-satellite"
    )]
    pub satellite_pod_label: String,
    /// Namespace of the LINSTOR satellite pods: only pods there map DRBD peer names to nodes, so
    /// that a pod labelled like a satellite elsewhere cannot redirect a fail-over. Default: the
    /// agent's own namespace (POD_NAMESPACE).
    #[arg(long, env = "SATELLITE_NAMESPACE")]
    pub satellite_namespace: Option<String>,
    /// Label selector of the storage nodes (the guard's fraction counts only these). Default: all.
    #[arg(long, env = "NODE_SELECTOR", default_value = "")]
    pub node_selector: String,
    /// Namespace of the per-node heartbeat Lease (env: POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Seconds the heartbeat Lease is valid: while it is, peers weigh what the agent reported.
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 40)]
    pub lease_duration_seconds: u32,
    /// How often the heartbeat Lease is renewed (whole seconds, at most a third of its duration).
    /// Peers take the agent for silent after two renewals missed, and a node whose agent and
    /// kubelet are both silent for crashed: shorter moves a crashed node's pods sooner, at one
    /// Lease write per node per interval.
    #[arg(long, env = "HEARTBEAT_INTERVAL", default_value = "5s", value_parser = whole_seconds)]
    pub heartbeat_interval: Duration,
}

/// `IP:PORT`, `[IPv6]:PORT`, and also `[IPv4]:PORT`, which Rust's own parser refuses.
pub fn socket_address(value: &str) -> Result<SocketAddr, String> {
    let bracketed = value
        .strip_prefix('[')
        .and_then(|rest| rest.split_once("]:"))
        .and_then(|(ip, port)| Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?)));
    bracketed
        .or_else(|| value.parse().ok())
        .ok_or_else(|| format!("{value:?} is not an address: write IP:PORT or [IP]:PORT"))
}

fn whole_seconds(value: &str) -> Result<Duration, String> {
    let duration: Duration = value.parse().map_err(|e| format!("{value:?} is not a duration: {e}"))?;
    match duration.as_secs() {
        0 => Err(format!("{value:?} is under a second: write 1s or more")),
        _ if duration.subsec_nanos() != 0 => Err(format!("{value:?} is not whole seconds")),
        _ => Ok(duration),
    }
}

fn fraction(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{value:?} is not a fraction between 0 and 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_addresses_of_either_family_with_or_without_brackets() {
        let parsed = |value| socket_address(value).map(|a| a.to_string());
        assert_eq!(parsed("0.0.0.0:8080"), Ok("0.0.0.0:8080".into()));
        assert_eq!(parsed("[10.0.0.7]:9820"), Ok("10.0.0.7:9820".into()));
        assert_eq!(parsed("[fd00::7]:9820"), Ok("[fd00::7]:9820".into()));
        assert!(parsed("[node-a]:9820").unwrap_err().contains("[IP]:PORT"));
        assert!(parsed("10.0.0.7").is_err());
    }

    /// `status` assumes the agents' default write bound where their pods set none.
    #[test]
    fn the_agents_operations_timeout_defaults_to_the_bound_status_assumes() {
        let cli = Cli::try_parse_from(["shared-volume-controller", "agent", "--node-name", "n"]).unwrap();
        let Command::Agent(args) = cli.command else {
            panic!("the agent subcommand");
        };
        assert_eq!(*args.operations_timeout, crate::names::DEFAULT_OPERATIONS_TIMEOUT);
    }
}
