//! shared-volume-controller: stable NFS addresses for ReadWriteMany volumes replicated with DRBD.
//!
//! Two loops share this crate: the shared-volume controller (`controller` subcommand) and the
//! per-node DRBD HA agent (`agent` subcommand). See `README.md` for how they fit together.

pub mod admin;
pub mod agent;
pub mod apply;
pub mod cli;
pub mod controller;
pub mod events;
pub mod feed;
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
    let result = match cli.command {
        Command::Controller(args) => controller::run(args, registry, probes.clone(), shutdown.clone()).await,
        Command::Agent(args) => agent::run(args, registry, probes.clone(), shutdown.clone()).await,
    };
    shutdown.cancel();
    admin.await??;
    result
}
