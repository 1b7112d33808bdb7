//! `share`: makes an existing DRBD resource (one LINSTOR created) a ReadWriteMany filesystem claim
//! the controller serves. It writes a PV of the resource and the claim bound to it, nothing else:
//! the agents then write the drbd-reactor promoter snippet on each node with a replica
//! (`--promoter-snippets-dir`), drbd-reactor starts the NFS server where DRBD promotes the
//! resource, and the agent there publishes it. It runs with the caller's own credentials.

mod manifest;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::agent::report::Report;
use crate::cli::ShareArgs;
use crate::names::AGENT_REPORT_LABEL;
use crate::sharedvolume::claim::ready_condition;
pub use manifest::ShareRequest;
use manifest::{claim, lowest_free_port, persistent_volume, same_claim, same_volume};

pub async fn run(args: ShareArgs, client: Client) -> Result<()> {
    let nfs_port = match args.nfs_port {
        Some(port) => port,
        None => free_port(&client).await?,
    };
    let request = ShareRequest {
        resource: args.resource.clone(),
        namespace: args
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned()),
        claim: args.claim.clone().unwrap_or_else(|| args.resource.clone()),
        size: args.size.clone(),
        storage_class: args.storage_class.clone(),
        csi_driver: args.csi_driver.clone(),
        nfs_port,
    };
    if args.dry_run {
        let list = serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [persistent_volume(&request), claim(&request)],
        });
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    if !args.skip_resource_check {
        let nodes = nodes_with(&client, &request.resource).await?;
        println!("DRBD resource {} is on {}", request.resource, join(&nodes));
    }
    create_volume(&client, &request).await?;
    create_claim(&client, &request).await?;
    if !args.wait.is_zero() {
        let message = wait_served(&client, &request, *args.wait).await?;
        println!("{message}");
    }
    Ok(())
}

async fn free_port(client: &Client) -> Result<u16> {
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .context("cannot list PersistentVolumes to find a free NFS port (or pass --nfs-port)")?;
    lowest_free_port(&pvs.items).context("every NFS port from 20490 up is named by a PV: pass --nfs-port")
}

/// The nodes whose agents report the resource; none is an error that says what to do.
async fn nodes_with(client: &Client, resource: &str) -> Result<BTreeSet<String>> {
    let leases = Api::<Lease>::all(client.clone())
        .list(&ListParams::default().labels(AGENT_REPORT_LABEL))
        .await
        .context("cannot list Leases to find the agents' DRBD reports (or pass --skip-resource-check)")?;
    let nodes: BTreeSet<String> = leases
        .items
        .iter()
        .filter_map(|lease| {
            let report = Report::of_lease(lease)?;
            report.resources.contains_key(resource).then(|| {
                lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.clone())
                    .unwrap_or_else(|| lease.name_any())
            })
        })
        .collect();
    if nodes.is_empty() {
        bail!(
            "no agent reports a DRBD resource named {resource}: create it first (for instance \
             `linstor resource-group spawn-resources <group> {resource} <size>`), check its name, \
             or pass --skip-resource-check if the agents are not running yet; nothing was created"
        );
    }
    Ok(nodes)
}

async fn create_volume(client: &Client, request: &ShareRequest) -> Result<()> {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let name = &request.resource;
    match pvs.get_opt(name).await.context("cannot read PersistentVolumes")? {
        Some(existing) if same_volume(&existing, request) => println!("PV {name} already shares the resource"),
        Some(_) => bail!(
            "a PV named {name} exists and is not this resource's shared volume for claim {}/{}: \
             it was left as it is and nothing was created",
            request.namespace,
            request.claim
        ),
        None => {
            pvs.create(&PostParams::default(), &persistent_volume(request))
                .await
                .with_context(|| format!("cannot create PV {name}"))?;
            println!(
                "PV {name} created (ReadWriteMany, Retain; its NFS server listens on port {})",
                request.nfs_port
            );
        }
    }
    Ok(())
}

async fn create_claim(client: &Client, request: &ShareRequest) -> Result<()> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &request.namespace);
    let name = format!("{}/{}", request.namespace, request.claim);
    match claims.get_opt(&request.claim).await.context("cannot read the claim")? {
        Some(existing) if same_claim(&existing, request) => println!("claim {name} already names the PV"),
        Some(_) => bail!(
            "claim {name} exists and names another volume: it was left as it is (PV {} waits for a claim of that name)",
            request.resource
        ),
        None => {
            claims
                .create(&PostParams::default(), &claim(request))
                .await
                .with_context(|| format!("cannot create claim {name}"))?;
            println!("claim {name} created, bound to PV {}", request.resource);
        }
    }
    Ok(())
}

/// Waits for the controller's condition on the claim to say it is served; returns its message.
async fn wait_served(client: &Client, request: &ShareRequest, wait: Duration) -> Result<String> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &request.namespace);
    let deadline = tokio::time::Instant::now() + wait;
    let mut last = String::from("no SharedVolumeReady condition yet");
    loop {
        let claim = claims.get_opt(&request.claim).await?;
        if let Some(condition) = claim.as_ref().and_then(ready_condition) {
            let message = format!(
                "{} {}: {}",
                condition.status,
                condition.reason.as_deref().unwrap_or_default(),
                condition.message.as_deref().unwrap_or_default()
            );
            if condition.status == "True" {
                return Ok(message);
            }
            last = message;
        }
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "claim {}/{} not served after {wait:?}: {last}",
                request.namespace,
                request.claim
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn join(nodes: &BTreeSet<String>) -> String {
    nodes.iter().cloned().collect::<Vec<_>>().join(", ")
}
