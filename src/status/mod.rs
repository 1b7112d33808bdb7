//! `status`: the installation at a glance, for people (`kubectl shared-volume status`) and scripts
//! (`-o json`): the leader, each agent, each pod of the conntrack repair, the fail-over guard's
//! reservations and each claim the controller states a condition on. It only reads, with the caller's own credentials.

mod view;

use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cli::{StatusArgs, StatusOutput};
use crate::names::linstor_nfs_selector;
use view::{Observed, build, table};

pub async fn run(args: StatusArgs, client: Client) -> Result<()> {
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let observed = read(&client, namespace, &args).await?;
    let view = build(&observed, Timestamp::now());
    match args.output {
        StatusOutput::Table => print!("{}", table(&view)),
        StatusOutput::Json => println!("{}", serde_json::to_string_pretty(&view)?),
    }
    Ok(())
}

/// Every read `status` makes; a refused or failed one says which.
async fn read(client: &Client, namespace: String, args: &StatusArgs) -> Result<Observed> {
    let leases = Api::<Lease>::namespaced(client.clone(), &namespace);
    let all = ListParams::default();
    let what = |what: &str| format!("cannot read {what} (namespace {namespace}; see --namespace)");
    Ok(Observed {
        leader: leases
            .get_opt(&args.lease_name)
            .await
            .with_context(|| what("the leader Lease"))?,
        agent_pods: Api::<Pod>::namespaced(client.clone(), &namespace)
            .list(&ListParams::default().labels(&args.agent_selector))
            .await
            .with_context(|| what("the agent pods"))?
            .items,
        repair_pods: Api::<Pod>::namespaced(client.clone(), &namespace)
            .list(&ListParams::default().labels(&args.repair_selector))
            .await
            .with_context(|| what("the conntrack repair's pods"))?
            .items,
        leases: leases.list(&all).await.with_context(|| what("the Leases"))?.items,
        nodes: Api::<Node>::all(client.clone())
            .list(&all)
            .await
            .context("cannot list Nodes")?
            .items,
        claims: Api::<PersistentVolumeClaim>::all(client.clone())
            .list(&all)
            .await
            .context("cannot list PersistentVolumeClaims")?
            .items,
        pvs: Api::<PersistentVolume>::all(client.clone())
            .list(&all)
            .await
            .context("cannot list PersistentVolumes")?
            .items,
        linstor_slices: Api::<EndpointSlice>::all(client.clone())
            .list(&ListParams::default().labels(&linstor_nfs_selector()))
            .await
            .context("cannot list the EndpointSlices of LINSTOR CSI's nfs-helper")?
            .items,
        lease_name: args.lease_name.clone(),
        namespace,
    })
}
