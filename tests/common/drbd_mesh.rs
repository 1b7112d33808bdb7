//! One DRBD resource across simulated nodes, as DRBD 9 behaves: quorum by majority of the nodes a
//! node is connected to (a diskless tie-breaker votes), a diskful Secondary *outdated* when the
//! Primary goes on with quorum without it, and promotion refused to a node whose disk is not
//! UpToDate, without quorum, or that can reach a Primary through any chain of live links (DRBD's
//! `may_promote`, printed by events2 with a `promotion_score`). Each node's view is written as
//! `drbdsetup status --json` prints it, and DRBD's word for the simulated events2.
//!
//! What it leaves out: the time each end takes to notice a drop (both notice at once here; see
//! `partition.rs` for staggered detection), resync (an outdated disk is UpToDate again as soon as
//! it reconnects to the Primary), fencing handlers, and DRBD's real `promotion_score` formula (the
//! simulated score only ranks an UpToDate disk with quorum above others).

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::drbd::{SimNode, resource};

#[derive(Clone, Debug)]
pub struct Mesh {
    resource: String,
    names: Vec<String>,
    diskless: Vec<bool>,
    up: Vec<bool>,
    /// Links that carry no traffic, as (lower index, higher index).
    cut: BTreeSet<(usize, usize)>,
    primary: Option<usize>,
    outdated: BTreeSet<usize>,
}

impl Mesh {
    /// `resource` on `nodes`, every link up, no Primary; the nodes at `diskless` hold no data.
    pub fn over(resource: &str, nodes: &[SimNode], diskless: &[usize]) -> Self {
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        Self::new(resource, &names, diskless)
    }

    /// [`Mesh::over`] nodes named `names`.
    pub fn new(resource: &str, names: &[&str], diskless: &[usize]) -> Self {
        Self {
            resource: resource.to_owned(),
            names: names.iter().map(|n| n.to_string()).collect(),
            diskless: (0..names.len()).map(|i| diskless.contains(&i)).collect(),
            up: vec![true; names.len()],
            cut: BTreeSet::new(),
            primary: None,
            outdated: BTreeSet::new(),
        }
    }

    /// Promotes node `i`, as `drbdadm primary` would: refused where DRBD would refuse it.
    pub fn promote(&mut self, i: usize) -> Result<(), String> {
        if !self.may_promote(i) {
            return Err(format!(
                "DRBD refuses to promote {}: {}",
                self.names[i],
                self.describe(i)
            ));
        }
        self.primary = Some(i);
        self.settle();
        Ok(())
    }

    /// The link between `i` and `j` stops carrying traffic (both ends notice at once).
    pub fn cut(&mut self, i: usize, j: usize) {
        self.cut.insert((i.min(j), i.max(j)));
        self.settle();
    }

    /// The link between `i` and `j` carries traffic again.
    pub fn heal(&mut self, i: usize, j: usize) {
        self.cut.remove(&(i.min(j), i.max(j)));
        self.settle();
    }

    /// Every link of node `i` stops carrying traffic: the node is cut off from its peers.
    pub fn isolate(&mut self, i: usize) {
        for j in 0..self.names.len() {
            if j != i {
                self.cut.insert((i.min(j), i.max(j)));
            }
        }
        self.settle();
    }

    /// Node `i` stops: no link of its carries anything, and it writes no state any more.
    pub fn crash(&mut self, i: usize) {
        self.up[i] = false;
        self.settle();
    }

    /// Whether node `i`'s disk is Outdated.
    pub fn is_outdated(&self, i: usize) -> bool {
        self.outdated.contains(&i)
    }

    fn connected(&self, i: usize, j: usize) -> bool {
        i != j && self.up[i] && self.up[j] && !self.cut.contains(&(i.min(j), i.max(j)))
    }

    /// A majority of all the resource's nodes, itself included, among those it is connected to.
    fn quorum(&self, i: usize) -> bool {
        let reached = 1 + (0..self.names.len()).filter(|&j| self.connected(i, j)).count();
        self.up[i] && 2 * reached > self.names.len()
    }

    /// The nodes `i` reaches through chains of live links, itself included.
    fn reachable(&self, i: usize) -> BTreeSet<usize> {
        let mut seen = BTreeSet::from([i]);
        let mut frontier = vec![i];
        while let Some(k) = frontier.pop() {
            for j in 0..self.names.len() {
                if self.connected(k, j) && seen.insert(j) {
                    frontier.push(j);
                }
            }
        }
        seen
    }

    fn up_to_date(&self, i: usize) -> bool {
        !self.diskless[i] && !self.outdated.contains(&i)
    }

    /// DRBD's `may_promote`: a Secondary with an UpToDate disk and quorum that reaches no Primary.
    fn may_promote(&self, i: usize) -> bool {
        let primary_reachable = self.primary.is_some_and(|p| p != i && self.reachable(i).contains(&p));
        self.up[i] && self.primary != Some(i) && self.up_to_date(i) && self.quorum(i) && !primary_reachable
    }

    /// A Primary that goes on with quorum outdates the diskful nodes it lost; a node back in
    /// touch with the Primary is UpToDate again (its resync taken as instant).
    fn settle(&mut self) {
        let Some(p) = self.primary.filter(|&p| self.up[p]) else {
            return;
        };
        for i in 0..self.names.len() {
            if i == p || self.diskless[i] {
                continue;
            }
            if self.connected(i, p) {
                self.outdated.remove(&i);
            } else if self.quorum(p) {
                self.outdated.insert(i);
            }
        }
    }

    fn disk(&self, i: usize) -> &'static str {
        match (self.diskless[i], self.outdated.contains(&i)) {
            (true, _) => "Diskless",
            (false, true) => "Outdated",
            (false, false) => "UpToDate",
        }
    }

    fn describe(&self, i: usize) -> String {
        format!("disk {}, quorum {}", self.disk(i), self.quorum(i))
    }

    /// Node `i`'s view, as `drbdsetup status --json` prints it, with DRBD's word for events2.
    pub fn state_of(&self, i: usize) -> Value {
        let peers: Vec<(String, &str, &str)> = (0..self.names.len())
            .filter(|&j| j != i)
            .map(|j| match (self.connected(i, j), self.primary == Some(j)) {
                (true, true) => (self.names[j].clone(), "Connected", "Primary"),
                (true, false) => (self.names[j].clone(), "Connected", "Secondary"),
                (false, _) => (self.names[j].clone(), "Connecting", "Unknown"),
            })
            .collect();
        let borrowed: Vec<(&str, &str, &str)> = peers.iter().map(|(n, s, r)| (n.as_str(), *s, *r)).collect();
        let role = if self.primary == Some(i) {
            "Primary"
        } else {
            "Secondary"
        };
        let mut state = resource(&self.resource, role, self.quorum(i), &borrowed);
        for device in state["devices"].as_array_mut().into_iter().flatten() {
            device["disk-state"] = json!(self.disk(i));
        }
        for (connection, j) in state["connections"]
            .as_array_mut()
            .into_iter()
            .flatten()
            .zip((0..self.names.len()).filter(|&j| j != i))
        {
            if self.connected(i, j) {
                for device in connection["peer_devices"].as_array_mut().into_iter().flatten() {
                    device["peer-disk-state"] = json!(self.disk(j));
                }
            }
        }
        if self.primary == Some(i) && !self.quorum(i) {
            state["suspended"] = json!(true);
            state["suspended-quorum"] = json!(true);
        }
        let score = if self.up_to_date(i) && self.quorum(i) { 10102 } else { 1 };
        state["_drbd"] = json!({"may_promote": self.may_promote(i), "promotion_score": score});
        state
    }

    /// Writes every running node's view to its simulated DRBD (a crashed node's stays as it was).
    pub fn write(&self, nodes: &[SimNode]) {
        for (i, node) in nodes.iter().enumerate().filter(|(i, _)| self.up[*i]) {
            node.set(&[self.state_of(i)]);
        }
    }
}
