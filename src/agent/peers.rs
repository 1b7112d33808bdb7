//! Fresh reads about suspected peers, the one place a round goes to the API instead of the cache:
//! the cache holds only this node's pods and Node, and heartbeats are not watched. What a
//! destructive step depends on is read here, every round that has a suspect.

use crate::sharedvolume::filters::Filters;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::ListParams;
use kube::{Api, Client};

use super::api_health::ApiHealth;
use super::cache::trim_pod;
use super::drbd::DrbdState;
use super::heartbeat::peer_now;
use super::observe::{Snapshot, drbd_peer_nodes, node_view, observe, suspected_peers};
use super::quiet;
use super::renewal_watch::RenewalWatch;
use super::renewals::LeaseKey;
use super::server_clock::ServerClock;
use super::view::{Liveness, Observed};
use crate::deadline::within;
use crate::names::{AGENT_FIELD_MANAGER, NODE_LEASE_NAMESPACE, lease_name};

/// Where a round's fresh reads go, and how long each may take.
pub(crate) struct PeerReads<'a> {
    pub client: &'a Client,
    pub leases: &'a Api<Lease>,
    pub timeout: Duration,
    /// Told how each read went.
    pub api: &'a ApiHealth,
    /// The API server's clock, which peers' Leases are judged on where no renewal was seen.
    pub clock: &'a ServerClock,
    /// The peers' renewals as this agent saw them, which silence is judged on first.
    pub renewals: &'a RenewalWatch,
    /// Where the agents' heartbeats are.
    pub lease_namespace: &'a str,
}

/// The Leases that say whether this node's DRBD peers live, with the field manager of their
/// writers: each peer's kubelet's node Lease and its agent's heartbeat.
pub(crate) fn peer_leases(
    node: &str,
    state: &DrbdState,
    snapshot: &Snapshot,
    lease_namespace: &str,
) -> BTreeMap<LeaseKey, Option<&'static str>> {
    drbd_peer_nodes(node, state, snapshot)
        .into_iter()
        .flat_map(|peer| {
            [
                ((NODE_LEASE_NAMESPACE.to_owned(), peer.clone()), None),
                (
                    (lease_namespace.to_owned(), lease_name(&peer)),
                    Some(AGENT_FIELD_MANAGER),
                ),
            ]
        })
        .collect()
}

impl PeerReads<'_> {
    /// This round's view of `node`: the cached `snapshot`, plus what is read fresh about the peers
    /// `state` gives reason to suspect. A suspect whose pods cannot be read is left out of the
    /// view: nothing may be done to a node without knowing what runs there.
    pub async fn observe(
        &self,
        node: &str,
        node_ip: Option<IpAddr>,
        state: &DrbdState,
        mut snapshot: Snapshot,
        publishable: &Filters,
    ) -> Observed {
        let suspects = suspected_peers(node, state, &snapshot);
        let unreadable = read_peer_pods(self.client, &suspects, &mut snapshot, self.timeout, self.api).await;
        let mut observed = observe(node, node_ip, state.clone(), &snapshot, publishable);
        if !suspects.is_empty() {
            add_uncached_peers(self.client, &mut observed, &suspects, self.timeout, self.api).await;
            let node_leases = Api::namespaced(self.client.clone(), NODE_LEASE_NAMESPACE);
            let reads = LeaseReads {
                agents: self.leases,
                kubelets: &node_leases,
                clock: self.clock,
                renewals: self.renewals,
                lease_namespace: self.lease_namespace,
                timeout: self.timeout,
                api: self.api,
            };
            confirm_alive(&reads, &mut observed, &suspects).await;
            for node in unreadable {
                observed.nodes.remove(&node);
                observed.unread_nodes.insert(node);
            }
        }
        observed
    }
}

/// Reads fresh the pods on suspected peers' nodes (the cache holds this node's only) into the
/// snapshot. Returns the nodes whose pods could not be read: without knowing what runs there,
/// nothing may be done to them this round.
async fn read_peer_pods(
    client: &Client,
    suspects: &BTreeSet<String>,
    snapshot: &mut Snapshot,
    timeout: Duration,
    api: &ApiHealth,
) -> BTreeSet<String> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut unreadable = BTreeSet::new();
    for node in suspects {
        let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let listed = within(timeout, pods.list(&on_node)).await;
        api.record(&listed);
        match listed {
            Ok(Ok(list)) => snapshot.pods.extend(list.items.into_iter().map(|mut pod| {
                trim_pod(&mut pod);
                Arc::new(pod)
            })),
            Ok(Err(err)) => {
                tracing::warn!(node = %node, error = %err, "cannot read the pods of a suspected peer's node");
                unreadable.insert(node.clone());
            }
            Err(timed_out) => {
                tracing::warn!(node = %node, "cannot read the pods of a suspected peer's node: {timed_out}");
                unreadable.insert(node.clone());
            }
        }
    }
    unreadable
}

/// Reads fresh the heartbeats and reports of the agents whose reports may weigh on a suspected
/// peer (the suspects' own, and those of the nodes that report on the same resources) and counts
/// their reports only while they renew. A suspect's kubelet's node Lease is read too: a node whose
/// agent and kubelet both went silent has gone quiet. Heartbeats are not watched: renewed all the time by every
/// agent, they would make each agent's watch traffic grow with the square of the cluster.
async fn confirm_alive(reads: &LeaseReads<'_>, observed: &mut Observed, suspects: &BTreeSet<String>) {
    let resources: BTreeSet<&str> = observed
        .drbd
        .resources
        .iter()
        .filter(|r| r.connections.iter().any(|c| !c.is_connected()))
        .map(|r| r.name.as_str())
        .collect();
    let relevant: Vec<String> = observed
        .reports
        .iter()
        .filter(|(node, _)| **node != observed.node)
        .filter(|(node, r)| {
            suspects.contains(*node) || r.report.resources.keys().any(|k| resources.contains(k.as_str()))
        })
        .map(|(node, _)| node.clone())
        .collect();
    // Every suspect's kubelet is read, agent or not, beside the agents' heartbeats, all at once.
    let kubelets = suspects
        .iter()
        .map(|node| async move { (node.clone(), kubelet_silent_from(reads, node).await) });
    let seen = Some((reads.renewals, reads.lease_namespace));
    let agents = futures::future::join_all(
        relevant
            .iter()
            .map(|node| peer_now(reads.agents, node, reads.clock, reads.timeout, reads.api, seen)),
    );
    let (kubelets, read) = futures::join!(futures::future::join_all(kubelets), agents);
    let kubelets: std::collections::HashMap<String, Instant> = kubelets
        .into_iter()
        .filter_map(|(node, from)| Some((node, from?)))
        .collect();
    for (node, now) in relevant.iter().zip(read) {
        let kubelet = kubelets.get(node).copied();
        let (Some(known), Some(now)) = (observed.reports.get_mut(node), now) else {
            continue;
        };
        // The watch may lag behind a restatement: what was read with the heartbeat counts.
        if let Some(stated) = now.report {
            known.report = stated;
        }
        known.liveness = if now.alive {
            Liveness::Renewing
        } else {
            Liveness::Expired
        };
        known.quiet_from = now.silent_from.zip(kubelet).map(|(agent, kubelet)| agent.max(kubelet));
        known.agent_silent_from = now.silent_from;
    }
    observed.kubelet_silent_from = kubelets;
}

/// Where the Leases of suspected peers are read, and what they are judged on.
struct LeaseReads<'a> {
    agents: &'a Api<Lease>,
    kubelets: &'a Api<Lease>,
    clock: &'a ServerClock,
    renewals: &'a RenewalWatch,
    lease_namespace: &'a str,
    timeout: Duration,
    api: &'a ApiHealth,
}

/// From when `node`'s kubelet counts as silent, as its node Lease says, read fresh and booked
/// beside what the watch saw of it. `None` when the Lease cannot be read: without the kubelet's
/// word, a node is never taken for quiet.
async fn kubelet_silent_from(reads: &LeaseReads<'_>, node: &str) -> Option<Instant> {
    let read = within(reads.timeout, reads.kubelets.get_opt(node)).await;
    reads.api.record(&read);
    match read {
        Ok(Ok(lease)) => {
            let lease = lease?;
            let key = (NODE_LEASE_NAMESPACE.to_owned(), node.to_owned());
            reads.renewals.observe(&key, &lease, None);
            quiet::kubelet_silent_from(&lease, reads.clock, reads.renewals.last_renewed(&key), Instant::now())
        }
        Ok(Err(err)) => {
            tracing::warn!(node = %node, error = %err, "cannot read the node's Lease in {NODE_LEASE_NAMESPACE} (the agent needs get on leases there): a crashed node's pods move only once the node is NotReady");
            None
        }
        Err(timed_out) => {
            tracing::warn!(node = %node, "cannot read the node's Lease in {NODE_LEASE_NAMESPACE}: {timed_out}");
            None
        }
    }
}

/// Reads fresh the Nodes of suspected peers (the cache holds this node's only): each is judged
/// by what it is now, never taken for NotReady for want of a look. A node that does not exist
/// stays unknown, and nothing is done to it.
async fn add_uncached_peers(
    client: &Client,
    observed: &mut Observed,
    suspects: &BTreeSet<String>,
    timeout: Duration,
    api: &ApiHealth,
) {
    let missing: Vec<&String> = suspects
        .iter()
        .filter(|node| !observed.nodes.contains_key(*node))
        .collect();
    let nodes: Api<Node> = Api::all(client.clone());
    for name in missing {
        let read = within(timeout, nodes.get_opt(name)).await;
        api.record(&read);
        match read {
            Ok(Ok(Some(node))) => {
                observed.nodes.insert(name.clone(), node_view(&node));
            }
            Ok(Ok(None)) => tracing::debug!(node = %name, "DRBD peer has no Node: nothing to fail over"),
            Ok(Err(err)) => {
                tracing::warn!(node = %name, error = %err, "cannot read the node of a DRBD peer");
                observed.unread_nodes.insert(name.clone());
            }
            Err(timed_out) => {
                tracing::warn!(node = %name, "cannot read the node of a DRBD peer: {timed_out}");
                observed.unread_nodes.insert(name.clone());
            }
        }
    }
}
