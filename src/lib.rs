//! shared-volume-controller: stable NFS addresses for ReadWriteMany volumes replicated with DRBD.
//!
//! Two loops share this crate: the shared-volume controller (`controller` subcommand) and the
//! per-node DRBD HA agent (`agent` subcommand). See `README.md` for how they fit together.

pub mod admin;
pub mod agent;
pub mod apply;
pub mod cli;
pub mod compat;
pub mod controller;
pub mod deadline;
pub mod events;
pub mod feed;
pub mod kube_client;
pub mod metrics;
pub mod names;
pub mod sharedvolume;
pub mod shutdown;
pub mod telemetry;
pub mod volume;

use anyhow::Result;

use crate::cli::{Cli, Command};

/// Runs the chosen subcommand until it fails or a termination signal arrives.
pub async fn run(cli: Cli) -> Result<()> {
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
                controller::run(args, config, registry, probes.clone(), shutdown.clone()).await
            }
            Command::Agent(args) => {
                let client = kube_client::connect(&cli.common, false).await?;
                agent::run(args, client, registry, probes.clone(), shutdown.clone()).await
            }
        }
    }
    .await;
    shutdown.cancel();
    admin.await??;
    result
}
