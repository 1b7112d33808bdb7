//! Command line: one binary, two subcommands. Every flag has an environment fallback, named after
//! the flag in upper snake case (`--admin-addr` ↔ `ADMIN_ADDR`), unless noted.

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand, ValueEnum};
use humantime::Duration;

use crate::telemetry::LogFormat;

#[derive(Debug, Parser)]
#[command(name = "shared-volume-controller", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Flags that both subcommands take.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Address of the admin server (/metrics, /healthz, /readyz).
    #[arg(long, env = "ADMIN_ADDR", default_value = "0.0.0.0:8080", global = true)]
    pub admin_addr: SocketAddr,
    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
    /// Log filter in RUST_LOG syntax (RUST_LOG, when set, wins).
    #[arg(long, env = "LOG_LEVEL", default_value = "info", global = true)]
    pub log_level: String,
}

#[derive(Debug, Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once at start-up; boxing buys nothing
pub enum Command {
    /// Shared-volume loop: Service, Endpoints and EndpointSlice per RWX volume (leader-elected).
    Controller(ControllerArgs),
    /// DRBD HA agent: one per node, fail-over, taints and endpoints that follow the primary.
    Agent(AgentArgs),
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
    /// StorageOS API address (storageos backend); the port defaults to 5705.
    #[arg(long, env = "API_ENDPOINT", default_value = "http://storageos:5705")]
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
    pub namespace: Option<String>,
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
    /// Run only while holding the Lease (for more than one replica).
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "shared-volume-controller")]
    pub lease_name: String,
    /// Namespace of the leader-election Lease (env: POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
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

#[derive(Debug, Args)]
pub struct AgentArgs {}
