//! The blast-radius guard across agents. Before a fail-over taint an agent reserves the node in
//! one shared Lease, written with optimistic concurrency and counted from fresh reads, so that
//! agents deciding at once never take the cluster past `--max-tainted-fraction`. Each agent's
//! own round already refuses what its cache shows to be too much ([`super::decide`]); this is
//! the check that holds when several decide at the same time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};

mod reservations;

use reservations::RESERVATION_TTL;
pub use reservations::{live_reservations, reservations};

use super::decide::guard_allows;
use super::error::AgentError;
use super::observe::node_view;
use super::server_clock::ServerClock;
use crate::deadline::within;
use crate::kube_client::api_status;
use crate::names::{
    AGENT_LEASE_LABEL, FAIL_OVER_GUARD_LEASE, FAIL_OVER_RESERVATIONS_ANNOTATION, LOST_QUORUM_TAINT, TAINT_BY_FAIL_OVER,
};

/// What the guard said to a fail-over.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reservation {
    Reserved,
    /// Past the limit: why, in words.
    Refused(String),
}

const ATTEMPTS: usize = 5;

#[derive(Clone)]
pub struct FailOverGuard {
    pub nodes: Api<Node>,
    pub leases: Api<Lease>,
    pub node_selector: String,
    pub max_fraction: f64,
    pub timeout: Duration,
    /// Reservations expire on the API server's clock: they are written and read by agents whose
    /// own clocks may disagree.
    pub clock: ServerClock,
}

impl FailOverGuard {
    pub fn new(
        client: &Client,
        lease_namespace: &str,
        node_selector: &str,
        max_fraction: f64,
        timeout: Duration,
    ) -> Self {
        Self {
            nodes: Api::all(client.clone()),
            leases: Api::namespaced(client.clone(), lease_namespace),
            node_selector: node_selector.to_owned(),
            max_fraction,
            timeout,
            clock: ServerClock::default(),
        }
    }

    /// Reads the time off `clock` (this node's wall clock until it knows the server's).
    pub fn with_clock(self, clock: ServerClock) -> Self {
        Self { clock, ..self }
    }

    /// Reserves a fail-over of `node`, or says why the guard refuses it; an error when it
    /// cannot tell (then nothing may be done to the node).
    pub async fn reserve(&self, node: &str, storage_nodes: &BTreeSet<String>) -> Result<Reservation, AgentError> {
        within(self.timeout, self.try_reserve(node, storage_nodes)).await?
    }

    async fn try_reserve(&self, node: &str, storage_nodes: &BTreeSet<String>) -> Result<Reservation, AgentError> {
        for _ in 0..ATTEMPTS {
            let agents = self
                .leases
                .list(&ListParams::default().labels(AGENT_LEASE_LABEL))
                .await?;
            let mut storage = storage_nodes.clone();
            storage.extend(
                agents
                    .items
                    .iter()
                    .filter_map(|l| l.spec.as_ref()?.holder_identity.clone()),
            );
            let nodes = self
                .nodes
                .list(&ListParams::default().labels(&self.node_selector))
                .await?;
            let mut counted: BTreeSet<String> = nodes
                .items
                .iter()
                .map(node_view)
                .filter(|n| n.has_taint(LOST_QUORUM_TAINT) && storage.contains(&n.name))
                .map(|n| n.name)
                .collect();
            let current = self.leases.get_opt(FAIL_OVER_GUARD_LEASE).await?;
            let now = self.clock.now().unwrap_or_else(Timestamp::now);
            let held = current.as_ref().map(reservations).unwrap_or_default();
            let mut reservations = live_reservations(held, &counted, now, self.timeout);
            // A fail-over under way keeps the reservation it was given: counted again, other
            // nodes' taints since would refuse its later steps (the attachment) half done.
            let failing_over = nodes.items.iter().any(|n| {
                n.name_any() == node && node_view(n).taint_value(LOST_QUORUM_TAINT) == Some(TAINT_BY_FAIL_OVER)
            });
            if reservations.contains_key(node) || failing_over {
                return Ok(Reservation::Reserved);
            }
            counted.extend(reservations.keys().cloned());
            if let Err(over) = guard_allows(&counted, node, storage.len(), self.max_fraction) {
                return Ok(Reservation::Refused(over.to_string()));
            }
            let expiry = now.checked_add(RESERVATION_TTL)?;
            reservations.insert(node.to_owned(), expiry);
            let text = stored(&reservations)?;
            let written = match current {
                Some(mut lease) => {
                    lease
                        .annotations_mut()
                        .insert(FAIL_OVER_RESERVATIONS_ANNOTATION.into(), text);
                    self.leases
                        .replace(FAIL_OVER_GUARD_LEASE, &PostParams::default(), &lease)
                        .await
                }
                None => {
                    let lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(FAIL_OVER_GUARD_LEASE.into()),
                            annotations: Some([(FAIL_OVER_RESERVATIONS_ANNOTATION.to_string(), text)].into()),
                            ..Default::default()
                        },
                        spec: None,
                    };
                    self.leases.create(&PostParams::default(), &lease).await
                }
            };
            match written {
                Ok(_) => return Ok(Reservation::Reserved),
                // Another agent reserved first: count again with what it wrote.
                Err(err) if api_status(&err) == Some(409) => continue,
                Err(other) => return Err(other.into()),
            }
        }
        Err(AgentError::Contended("the guard Lease"))
    }
}

impl FailOverGuard {
    /// Gives `node`'s reservation back, if it holds one: its agent has removed the taint of its
    /// fail-over (the node is back), and the reservation would otherwise count against other
    /// nodes' fail-overs until it lapses.
    pub async fn give_back(&self, node: &str) -> Result<(), AgentError> {
        within(self.timeout, self.try_give_back(node)).await?
    }

    async fn try_give_back(&self, node: &str) -> Result<(), AgentError> {
        for _ in 0..ATTEMPTS {
            let Some(mut lease) = self.leases.get_opt(FAIL_OVER_GUARD_LEASE).await? else {
                return Ok(());
            };
            let mut held = reservations(&lease);
            if held.remove(node).is_none() {
                return Ok(());
            }
            let text = stored(&held)?;
            lease
                .annotations_mut()
                .insert(FAIL_OVER_RESERVATIONS_ANNOTATION.into(), text);
            match self
                .leases
                .replace(FAIL_OVER_GUARD_LEASE, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => return Ok(()),
                Err(err) if api_status(&err) == Some(409) => continue,
                Err(other) => return Err(other.into()),
            }
        }
        Err(AgentError::Contended("the guard Lease"))
    }
}

/// The guard Lease's annotation holding `reservations`.
fn stored(reservations: &BTreeMap<String, Timestamp>) -> Result<String, AgentError> {
    let stored: BTreeMap<&String, String> = reservations.iter().map(|(n, t)| (n, t.to_string())).collect();
    Ok(serde_json::to_string(&stored)?)
}
