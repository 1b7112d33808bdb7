//! shared-volume-controller: stable NFS addresses for ReadWriteMany volumes replicated with DRBD.
//!
//! Two loops share this crate: the shared-volume controller (`controller` subcommand) and the
//! per-node DRBD HA agent (`agent` subcommand). See `docs/explanation/how-it-works.md` for how they fit together.
//!
//! Every module is private; the crate's public surface is the list of re-exports below: what the
//! binary needs ([`Cli`], [`run`], the StorageOS flag mapping, logging), and the pure pieces the
//! property tests and benchmarks drive directly (the DRBD parsers, [`decide`] over [`observe`],
//! the shared-volume builders in [`desired`], [`NfsEndpoint`]).

mod admin;
mod agent;
mod apply;
mod cli;
mod compat;
// ctnetlink and network namespaces are Linux's: elsewhere (the kubectl plugin on macOS) the
// repair is not built, and its subcommand says so.
#[cfg(target_os = "linux")]
mod conntrack;
mod controller;
mod converged;
mod core_endpoints;
mod deadline;
mod event_series;
mod events;
mod kube_client;
mod metrics;
mod names;
mod producer;
#[cfg(test)]
mod scripted_api;
mod selftest;
mod share;
mod sharedvolume;
mod shutdown;
mod status;
mod telemetry;
mod tell;
mod volume;

// The public surface. Every module is private, so `pub` inside one means crate-wide; what leaves
// the crate is listed here.
//
// For the binary (src/main.rs): the command line, the StorageOS flag mapping, logging.
pub use cli::{COMPATIBILITY, Cli};
pub use compat::{apply as apply_legacy_flags, normalize as normalize_legacy_flags};
pub use telemetry::init as init_logging;
// For the property tests and the benchmarks: the DRBD parsers, the agent's pure core, the
// shared-volume model, the endpoint parser and the conntrack table.
pub use agent::decide::{DecisionSettings, decide};
pub use agent::drbd::{Connection, Device, DrbdState, Resource, parse_quorum_enabled, parse_status};
pub use agent::observe::{Snapshot, observe};
pub use agent::view::Timers;
#[cfg(target_os = "linux")]
pub use conntrack::Flow;
#[cfg(target_os = "linux")]
pub use conntrack::table::{Table as ConntrackTable, TableError as ConntrackError};
pub use core_endpoints::WriteEndpoints;
pub use sharedvolume::claim::bound_claim;
pub use sharedvolume::classify::claim_owner;
pub use sharedvolume::desired::{self, SharedVolume, is_dns1035_label, service_name};
pub use sharedvolume::filters::Filters;
pub use volume::NfsEndpoint;

use anyhow::Result;

use crate::cli::Command;

/// Runs the chosen subcommand until it fails or a termination signal arrives.
pub async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Selftest(args) => {
            let client = kube_client::connect(&cli.common, false).await?;
            return selftest::run(args, client).await;
        }
        Command::Status(args) => {
            let client = kube_client::connect(&cli.common, false).await?;
            return status::run(args, client).await;
        }
        Command::Share(args) => {
            let client = kube_client::connect(&cli.common, false).await?;
            return share::run(args, client).await;
        }
        _ => {}
    }
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        admin_addr = %cli.common.admin_addr,
        log_level = %cli.common.log_level,
        log_format = ?cli.common.log_format,
        kube_api_timeout = %cli.common.kube_api_timeout.map_or("none".into(), |t| t.to_string()),
        "settings"
    );
    let shutdown = shutdown::on_signals();
    let probes = admin::Probes::default();
    let registry = metrics::new_registry()?;
    let events = events::EventSettings::of(&cli.common);
    let admin = admin::serve(
        cli.common.admin_addr,
        registry.clone(),
        probes.clone(),
        shutdown.clone(),
    )
    .await?;
    let result = async {
        match cli.command {
            Command::Controller(args) => {
                let config = kube_client::config(&cli.common, true).await?;
                controller::run(args, config, registry, probes.clone(), shutdown.clone(), events).await
            }
            Command::Agent(args) => {
                let client = kube_client::connect(&cli.common, false).await?;
                agent::run(args, client, registry, probes.clone(), shutdown.clone(), events).await
            }
            #[cfg(target_os = "linux")]
            Command::Conntrack(args) => {
                let client = kube_client::connect(&cli.common, false).await?;
                conntrack::run(args, client, registry, probes.clone(), shutdown.clone()).await
            }
            #[cfg(not(target_os = "linux"))]
            Command::Conntrack(_) => {
                anyhow::bail!(
                    "the conntrack repair runs on Linux nodes only (it needs ctnetlink): run the chart's DaemonSet"
                )
            }
            Command::Selftest(_) | Command::Status(_) | Command::Share(_) => {
                anyhow::bail!("selftest, status and share run without the admin server")
            }
        }
    }
    .await;
    shutdown.cancel();
    admin.await??;
    result
}
