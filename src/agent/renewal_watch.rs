//! Watches the Leases that say whether this node's DRBD peers live (their kubelets' node Leases,
//! their agents' heartbeats), one small watch per Lease, and books every renewal as this agent
//! sees it ([`Renewals`]). A watch per named Lease of a peer keeps the traffic to what the peers
//! renew (a kubelet every 10 s, an agent every heartbeat interval), not every node's Lease.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use super::quiet::age_on_the_servers_clock;
use super::renewals::{LeaseKey, Renewals};
use super::server_clock::ServerClock;

pub struct RenewalWatch {
    client: Client,
    clock: ServerClock,
    renewals: Arc<Mutex<Renewals>>,
    watches: HashMap<LeaseKey, JoinHandle<()>>,
}

impl RenewalWatch {
    pub fn new(client: Client, clock: ServerClock) -> Self {
        Self {
            client,
            clock,
            renewals: Arc::default(),
            watches: HashMap::new(),
        }
    }

    /// Watches exactly `leases` from now on, each with the field manager of its writer (`None`:
    /// anyone), whose stamp places a Lease's first sight: new ones are watched, gone ones forgotten.
    pub fn follow(&mut self, leases: &BTreeMap<LeaseKey, Option<&'static str>>) {
        self.watches.retain(|key, task| {
            let keep = leases.contains_key(key);
            if !keep {
                task.abort();
            }
            keep
        });
        let keys: BTreeSet<LeaseKey> = leases.keys().cloned().collect();
        self.renewals.lock().unwrap().retain(&keys);
        for (key, manager) in leases {
            if !self.watches.contains_key(key) {
                let booking = Booking {
                    key: key.clone(),
                    manager: *manager,
                    clock: self.clock.clone(),
                    renewals: self.renewals.clone(),
                };
                self.watches
                    .insert(key.clone(), tokio::spawn(watch(self.client.clone(), booking)));
            }
        }
    }

    /// Books a Lease read elsewhere (a fresh read may see a renewal before the watch does).
    pub fn observe(&self, key: &LeaseKey, lease: &Lease, manager: Option<&'static str>) {
        let booking = Booking {
            key: key.clone(),
            manager,
            clock: self.clock.clone(),
            renewals: self.renewals.clone(),
        };
        booking.book(lease);
    }

    /// When `key` was last seen renewed; `None` if it is not watched or was never seen.
    pub fn last_renewed(&self, key: &LeaseKey) -> Option<Instant> {
        self.renewals.lock().unwrap().last_renewed(key)
    }
}

impl Drop for RenewalWatch {
    fn drop(&mut self) {
        for task in self.watches.values() {
            task.abort();
        }
    }
}

/// Where one Lease's renewals are booked.
struct Booking {
    key: LeaseKey,
    manager: Option<&'static str>,
    clock: ServerClock,
    renewals: Arc<Mutex<Renewals>>,
}

impl Booking {
    fn book(&self, lease: &Lease) {
        let Some(renew_time) = lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()) else {
            return;
        };
        let age = age_on_the_servers_clock(lease, self.manager, &self.clock);
        let marker = renew_time.0.to_string();
        self.renewals
            .lock()
            .unwrap()
            .observe(&self.key, &marker, Instant::now(), age);
    }
}

/// Follows one Lease until aborted; a broken watch is retried with kube-runtime's back-off.
async fn watch(client: Client, booking: Booking) {
    let (namespace, name) = &booking.key;
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(Api::<Lease>::namespaced(client, namespace), config)
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) => booking.book(&lease),
            Ok(_) => {}
            Err(err) => {
                tracing::debug!(namespace = %namespace, lease = %name, error = %err, "Lease watch failed; retrying")
            }
        }
    }
}
