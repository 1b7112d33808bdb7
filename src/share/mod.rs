//! `share`: makes an existing DRBD resource (one LINSTOR created) a ReadWriteMany volume apps
//! mount. It writes the server side, a PV of the resource and the claim bound to it: the agents
//! then write the drbd-reactor promoter snippet on each node with a replica
//! (`--promoter-snippets-dir`), drbd-reactor starts the NFS server where DRBD promotes the
//! resource, the agent there publishes it and the controller serves the claim. Once it is
//! served, it writes the client side: an NFS PV naming the volume's mount endpoint and the claim
//! apps mount. It runs with the caller's own credentials.

mod manifest;
mod port_lock;

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::agent::report::Report;
use crate::cli::ShareArgs;
use crate::names::{AGENT_REPORT_LABEL, MOUNT_ENDPOINT_ANNOTATION};
use crate::sharedvolume::claim::{nfs_port, ready_condition};
use crate::volume::NfsEndpoint;
pub use manifest::ShareRequest;
use manifest::{
    claim, client_claim, client_volume, lowest_free_port, names_volume, persistent_volume, port_taken_by,
    same_client_volume, same_volume,
};

pub async fn run(args: ShareArgs, client: Client) -> Result<()> {
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
        nfs_port: args.nfs_port.unwrap_or(manifest::FIRST_AUTOMATIC_PORT),
        export_path: args.export_path.clone(),
        mount_options: args.mount_options.clone(),
    };
    if args.dry_run {
        let list = serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [persistent_volume(&request), claim(&request)],
        });
        println!("{}", serde_json::to_string_pretty(&list)?);
        eprintln!(
            "the client PV {} and claim {} name the volume's Service address, known once it is served: not printed",
            request.client_volume(),
            request.claim
        );
        return Ok(());
    }
    if !args.skip_resource_check {
        let nodes = nodes_with(&client, &request.resource).await?;
        println!("DRBD resource {} is on {}", request.resource, join(&nodes));
    }
    let lock = port_lock::PortLock::take(&client, &args.port_lock_namespace).await?;
    let created = create_volume(&client, request, args.nfs_port).await;
    lock.give_back().await;
    let request = created?;
    let server_claim = request.server_claim();
    create_claim(&client, &request.namespace, &claim(&request), &request.resource).await?;
    if args.wait.is_zero() {
        println!(
            "not waiting: run share again once claim {}/{server_claim} is served to write the claim apps mount",
            request.namespace
        );
        return Ok(());
    }
    let message = wait_served(&client, &request, *args.wait).await?;
    println!("{message}");
    let mount = mount_endpoint(&client, &request).await?;
    create_client_volume(&client, &request, mount).await?;
    create_claim(
        &client,
        &request.namespace,
        &client_claim(&request),
        &request.client_volume(),
    )
    .await?;
    println!(
        "apps mount claim {}/{} (NFS {}:{}; not {server_claim}, the volume's handle for this product)",
        request.namespace, request.claim, mount.ip, request.export_path
    );
    Ok(())
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

/// Creates the server PV with the port given, or the lowest free one; an existing PV that is this
/// volume's keeps its port. Run while holding the port lock: no other run picks meanwhile.
async fn create_volume(client: &Client, mut request: ShareRequest, given_port: Option<u16>) -> Result<ShareRequest> {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let name = request.resource.clone();
    match pvs.get_opt(&name).await.context("cannot read PersistentVolumes")? {
        Some(existing) if same_volume(&existing, &request) => {
            request.nfs_port = nfs_port(&existing).unwrap_or(request.nfs_port);
            println!("PV {name} already shares the resource (NFS port {})", request.nfs_port);
            return Ok(request);
        }
        Some(_) => bail!(
            "a PV named {name} exists and is not this resource's shared volume for claim {}/{}: \
             it was left as it is and nothing was created",
            request.namespace,
            request.server_claim()
        ),
        None => {}
    }
    let all = pvs
        .list(&ListParams::default())
        .await
        .context("cannot list PersistentVolumes to find a free NFS port")?;
    request.nfs_port = match given_port {
        Some(port) => match port_taken_by(&all.items, port, &request) {
            Some(other) => bail!(
                "NFS port {port} is PV {other}'s: pass another --nfs-port, or none for a free one; nothing was created"
            ),
            None => port,
        },
        None => {
            lowest_free_port(&all.items).context("every NFS port from 20490 up is named by a PV: pass --nfs-port")?
        }
    };
    pvs.create(&PostParams::default(), &persistent_volume(&request))
        .await
        .with_context(|| format!("cannot create PV {name}"))?;
    println!(
        "PV {name} created (ReadWriteMany, Retain; its NFS server listens on port {})",
        request.nfs_port
    );
    Ok(request)
}

/// Creates `wanted` unless a claim of its name already names `volume`; one that names another
/// volume is left as it is, and is an error.
async fn create_claim(client: &Client, namespace: &str, wanted: &PersistentVolumeClaim, volume: &str) -> Result<()> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let name = wanted.name_any();
    let shown = format!("{namespace}/{name}");
    match claims.get_opt(&name).await.context("cannot read the claim")? {
        Some(existing) if names_volume(&existing, volume) => println!("claim {shown} already names PV {volume}"),
        Some(_) => bail!(
            "claim {shown} exists and names another volume: it was left as it is (PV {volume} waits for a claim of that name)"
        ),
        None => {
            claims
                .create(&PostParams::default(), wanted)
                .await
                .with_context(|| format!("cannot create claim {shown}"))?;
            println!("claim {shown} created, bound to PV {volume}");
        }
    }
    Ok(())
}

/// The volume's mount endpoint (its Service's address), as the controller publishes it on the PV.
async fn mount_endpoint(client: &Client, request: &ShareRequest) -> Result<NfsEndpoint> {
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get(&request.resource)
        .await
        .with_context(|| format!("cannot read PV {}", request.resource))?;
    let published = pv.annotations().get(MOUNT_ENDPOINT_ANNOTATION).with_context(|| {
        format!(
            "PV {} has no {MOUNT_ENDPOINT_ANNOTATION} although its claim is served: is the controller's --publish-mount-endpoint off?",
            request.resource
        )
    })?;
    Ok(published.parse()?)
}

/// Creates the client PV, unless the one there is already it; one that names another address (a
/// Service made again) is left as it is, and is an error that says what to do.
async fn create_client_volume(client: &Client, request: &ShareRequest, mount: NfsEndpoint) -> Result<()> {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let name = request.client_volume();
    match pvs.get_opt(&name).await.context("cannot read PersistentVolumes")? {
        Some(existing) if same_client_volume(&existing, request, mount) => {
            println!("PV {name} already mounts the volume")
        }
        Some(_) => bail!(
            "a PV named {name} exists and does not mount {}:{} for claim {}/{}: it was left as it is \
             (if it names the volume's old Service address, delete it and its claim and run share again)",
            mount.ip,
            request.export_path,
            request.namespace,
            request.claim
        ),
        None => {
            pvs.create(&PostParams::default(), &client_volume(request, mount))
                .await
                .with_context(|| format!("cannot create PV {name}"))?;
            println!("PV {name} created (NFS {}:{})", mount.ip, request.export_path);
        }
    }
    Ok(())
}

/// Waits for the controller's condition on the server claim to say it is served; returns its
/// message.
async fn wait_served(client: &Client, request: &ShareRequest, wait: Duration) -> Result<String> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &request.namespace);
    let deadline = tokio::time::Instant::now() + wait;
    let mut last = String::from("no SharedVolumeReady condition yet");
    loop {
        let claim = claims.get_opt(&request.server_claim()).await?;
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
                "claim {}/{} not served after {wait:?}: {last}; the claim apps mount is written once it is (run share again)",
                request.namespace,
                request.server_claim()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn join(nodes: &BTreeSet<String>) -> String {
    nodes.iter().cloned().collect::<Vec<_>>().join(", ")
}
