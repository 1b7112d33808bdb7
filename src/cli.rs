//! Command line: one binary, two subcommands. Every flag has an environment fallback, named after
//! the flag in upper snake case (`--admin-addr` ↔ `ADMIN_ADDR`).

use std::net::SocketAddr;

use clap::{Args, Parser, Subcommand};

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
pub enum Command {
    /// Shared-volume loop: Service, Endpoints and EndpointSlice per RWX volume (leader-elected).
    Controller(ControllerArgs),
    /// DRBD HA agent: one per node, fail-over, taints and endpoints that follow the primary.
    Agent(AgentArgs),
}

#[derive(Debug, Args)]
pub struct ControllerArgs {}

#[derive(Debug, Args)]
pub struct AgentArgs {}
