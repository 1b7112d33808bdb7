//! The Lease a `share` run holds while it picks a port and writes the PV that names it: ports are
//! chosen from what the PVs name, so two runs that listed before either wrote would take the same.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::names::SHARE_PORT_LOCK_LEASE;

/// A run that dies holding the lock holds it this long: the PV it meant to write either exists
/// by then or never will.
const LOCK_SECONDS: u64 = 15;
/// How long a run waits for another to give the lock back.
const WAIT_FOR_LOCK: Duration = Duration::from_secs(60);

pub struct PortLock {
    held: watch::Receiver<bool>,
    task: JoinHandle<kube_lease_manager::Result<LeaseManager>>,
}

impl PortLock {
    pub async fn take(client: &Client, namespace: &str) -> Result<Self> {
        let identity = format!("share-{}-{}", hostname(), std::process::id());
        // A field manager of the run's own: the lock of a free Lease is a server-side apply, which
        // refuses a second run's only when their managers differ.
        let manager = LeaseManagerBuilder::new(client.clone(), SHARE_PORT_LOCK_LEASE)
            .with_namespace(namespace)
            .with_field_manager(format!("shared-volume-{identity}"))
            .with_identity(identity)
            .with_duration(LOCK_SECONDS)
            .with_grace(2)
            .build()
            .await
            .with_context(|| {
                format!("cannot use Lease {namespace}/{SHARE_PORT_LOCK_LEASE} (share needs get, create and update on Leases there; --port-lock-namespace names another namespace)")
            })?;
        let (mut held, task) = manager.watch().await;
        let waited = tokio::time::timeout(WAIT_FOR_LOCK, held.wait_for(|held| *held))
            .await
            .map(|taken| taken.is_ok());
        match waited {
            Ok(true) => Ok(Self { held, task }),
            Ok(false) => bail!(
                "cannot take Lease {namespace}/{SHARE_PORT_LOCK_LEASE}: {}",
                ended(task).await
            ),
            Err(_) => {
                task.abort();
                bail!(
                    "another share run has held Lease {namespace}/{SHARE_PORT_LOCK_LEASE} for {WAIT_FOR_LOCK:?}: nothing was created; run again"
                )
            }
        }
    }

    /// Gives the lock back at once, so that the next run need not wait for it to expire.
    pub async fn give_back(self) {
        drop(self.held);
        if let Ok(Err(err)) = self.task.await {
            tracing::warn!(error = %err, "cannot give the port lock back; it expires in {LOCK_SECONDS} s");
        }
    }
}

async fn ended(task: JoinHandle<kube_lease_manager::Result<LeaseManager>>) -> String {
    match task.await {
        Ok(Err(err)) => err.to_string(),
        Ok(Ok(_)) => "the lock's task ended".to_owned(),
        Err(err) => err.to_string(),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "unknown".to_owned(), |h| h.trim().to_owned())
}
