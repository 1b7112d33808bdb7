//! What the soak plays: its layout, the simulated world (DRBD, scheduler, kubelets, attacher)
//! and the truth the watchers check against.

use super::*;

/// The soak's DRBD net options: a silent drop is noticed within `ping-int` 3 s + `ping-timeout`
/// 0.5 s (`timeout` 2.5 s stays below `ping-int`, as DRBD wants).
pub const PING_INT: Duration = Duration::from_secs(3);

/// The layout the soak plays, drawn from the seed (`SOAK_TOPOLOGY=three-diskful|tie-breaker`
/// chooses): three diskful nodes with an agent each, or the README's, where c is a diskless
/// tie-breaker on a node that runs no agent (the chart's nodeSelector leaving it out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    ThreeDiskful,
    TieBreaker,
}

impl Topology {
    pub fn of(seed: u64) -> Self {
        match std::env::var("SOAK_TOPOLOGY").as_deref() {
            Ok("three-diskful") => Self::ThreeDiskful,
            Ok("tie-breaker") => Self::TieBreaker,
            _ if (seed >> 1) & 1 == 0 => Self::TieBreaker,
            _ => Self::ThreeDiskful,
        }
    }

    pub fn diskless(self, i: usize) -> bool {
        self == Self::TieBreaker && i == 2
    }

    /// Whether node `i` runs an agent.
    pub fn agent_on(self, i: usize) -> bool {
        !self.diskless(i)
    }

    /// The node that serves volume `v` first.
    pub fn first_primary(self, v: usize) -> usize {
        v % if self == Self::TieBreaker { 2 } else { 3 }
    }
}

/// The DRBD world as the soak plays it: which nodes are up, which links carry traffic, the
/// primary of each volume, what each node's DRBD has not noticed yet, and the volumes whose IO is
/// suspended.
#[derive(Clone, Debug)]
pub struct World {
    pub topology: Topology,
    pub up: [bool; 3],
    pub link: [[bool; 3]; 3],
    pub primary: Vec<Option<usize>>,
    /// (i, j): until when node i's DRBD still sees its dropped link to j connected.
    pub unnoticed: HashMap<(usize, usize), Instant>,
    /// Volumes whose IO is suspended by request (`user`) on every replica.
    pub suspended: Vec<bool>,
    /// Per volume: a former primary cut off from the others that has not noticed all of it yet.
    /// It stays Primary in its own view (with quorum while it sees a peer, suspended without),
    /// until its links come back and it steps down (`on-suspended-primary-outdated
    /// force-secondary`), or its node goes.
    pub lingering: Vec<Option<usize>>,
    /// DRBD resources of no volume, being created on one node ([`Fault::CreateResources`]).
    pub scratch: Vec<Scratch>,
    /// Per volume: the nodes DRBD outdated (the primary went on with quorum without them); a node
    /// back in touch with the primary is in sync again at once.
    pub outdated: Vec<[bool; 3]>,
}

/// A resource created on `node` at `appears`, with quorum once it connects at `connects`.
#[derive(Clone, Debug)]
pub struct Scratch {
    pub node: usize,
    pub name: String,
    pub appears: Instant,
    pub connects: Instant,
}

impl World {
    pub fn new(topology: Topology) -> Self {
        Self {
            topology,
            up: [true; 3],
            link: [[true; 3]; 3],
            primary: (0..VOLUMES).map(|v| Some(topology.first_primary(v))).collect(),
            unnoticed: HashMap::new(),
            suspended: vec![false; VOLUMES],
            lingering: vec![None; VOLUMES],
            scratch: Vec::new(),
            outdated: vec![[false; 3]; VOLUMES],
        }
    }

    /// Whether node i's DRBD sees its link to j connected: it is, or i has not noticed the drop.
    pub fn seen_connected(&self, i: usize, j: usize) -> bool {
        let late = self.unnoticed.get(&(i, j)).is_some_and(|until| Instant::now() < *until);
        self.connected(i, j) || (late && self.up[i] && self.up[j])
    }

    /// Quorum as node i's DRBD sees it.
    pub fn seen_quorum(&self, i: usize) -> bool {
        self.up[i] && (0..3).any(|j| j != i && self.seen_connected(i, j))
    }

    pub fn connected(&self, i: usize, j: usize) -> bool {
        i != j && self.up[i] && self.up[j] && self.link[i][j] && self.link[j][i]
    }

    /// Majority of three: itself and one connected peer.
    pub fn quorum(&self, i: usize) -> bool {
        self.up[i] && (0..3).any(|j| self.connected(i, j))
    }

    /// drbd-reactor: a primary that lost quorum steps down; a volume without a primary is promoted
    /// on a node with quorum.
    pub fn react(&mut self) {
        for v in 0..VOLUMES {
            if let Some(p) = self.primary[v].filter(|&p| !self.quorum(p)) {
                // The others no longer count it; it counts itself Primary until it notices.
                let unaware = self.up[p] && (0..3).any(|j| self.unnoticed.contains_key(&(p, j)));
                self.lingering[v] = unaware.then_some(p);
                self.primary[v] = None;
            }
            // Back in touch with a peer (or gone): a lingering primary steps down.
            if self.lingering[v].is_some_and(|p| !self.up[p] || self.quorum(p)) {
                self.lingering[v] = None;
            }
            if self.primary[v].is_none() {
                // DRBD refuses to promote a node it outdated.
                let outdated = self.outdated[v];
                let candidate = |i: usize| self.quorum(i) && !outdated[i] && !self.topology.diskless(i);
                self.primary[v] = (0..3).map(|k| (v + k) % 3).find(|&i| candidate(i));
            }
            self.outdate(v);
        }
    }

    /// DRBD outdates the nodes a primary with quorum goes on without (down ones too); a node
    /// connected to the primary again has its data back.
    pub fn outdate(&mut self, v: usize) {
        let Some(p) = self.primary[v].filter(|&p| self.quorum(p)) else {
            return;
        };
        for i in (0..3).filter(|&i| i != p && !self.topology.diskless(i)) {
            self.outdated[v][i] = !self.connected(i, p);
        }
    }

    /// One line for the soak's log: nodes up, links down, primaries.
    pub fn describe(&self) -> String {
        let down: Vec<String> = (0..3)
            .flat_map(|i| (i + 1..3).map(move |j| (i, j)))
            .filter(|&(i, j)| !self.link[i][j])
            .map(|(i, j)| format!("{}-{}", NODES[i], NODES[j]))
            .collect();
        let primaries: Vec<&str> = self.primary.iter().map(|p| p.map_or("-", |p| NODES[p])).collect();
        format!("up {:?}, links down {down:?}, primaries {primaries:?}", self.up)
    }

    pub fn healthy_primary(&self, v: usize) -> Option<usize> {
        self.primary[v].filter(|&p| self.quorum(p))
    }

    /// Node `i`'s DRBD state of every volume, as `drbdsetup status --json` prints it.
    pub fn state_of(&self, i: usize, nodes: &[SimNode], pvs: &[String]) -> Vec<serde_json::Value> {
        let now = Instant::now();
        let scratch = self
            .scratch
            .iter()
            .filter(|r| r.node == i && r.appears <= now)
            .map(|r| {
                let connected = now >= r.connects;
                let peers: Vec<(&str, &str, &str)> = (0..3)
                    .filter(|&j| j != i)
                    .map(|j| match connected && self.seen_connected(i, j) {
                        true => (nodes[j].name.as_str(), "Connected", "Secondary"),
                        false => (nodes[j].name.as_str(), "Connecting", "Unknown"),
                    })
                    .collect();
                resource(&r.name, "Secondary", connected && self.seen_quorum(i), &peers)
            });
        let volumes = (0..VOLUMES).map(|v| {
            let peers: Vec<(&str, &str, &str)> = (0..3)
                .filter(|&j| j != i)
                .map(|j| {
                    // A link i has not noticed is down: i sees the peer as it last was.
                    let primary_there = self.primary[v] == Some(j) && self.connected(i, j);
                    let (state, role) = match (self.seen_connected(i, j), primary_there) {
                        (true, true) => ("Connected", "Primary"),
                        (true, false) => ("Connected", "Secondary"),
                        (false, _) => ("Connecting", "Unknown"),
                    };
                    (nodes[j].name.as_str(), state, role)
                })
                .collect();
            let lingers = self.lingering[v] == Some(i);
            let role = if self.primary[v] == Some(i) || lingers {
                "Primary"
            } else {
                "Secondary"
            };
            let mut state = resource(&pvs[v], role, self.seen_quorum(i), &peers);
            let disk = match (self.topology.diskless(i), self.outdated[v][i]) {
                (true, _) => Some("Diskless"),
                (false, true) => Some("Outdated"),
                (false, false) => None,
            };
            for device in state["devices"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .filter(|_| disk.is_some())
            {
                device["disk-state"] = serde_json::json!(disk);
            }
            if self.topology == Topology::TieBreaker && i != 2 {
                state = with_diskless_peer(state, &nodes[2].name);
            }
            if self.suspended[v] {
                suspended(state, "user")
            } else if lingers && !self.seen_quorum(i) {
                suspended(state, "quorum")
            } else {
                state
            }
        });
        volumes.chain(scratch).collect()
    }
}

/// What the watchers judge against: since when each volume has had its healthy primary.
#[derive(Default)]
pub struct Truth {
    pub healthy: Vec<Option<(usize, Instant)>>,
    /// Per node: since when it has been down, without a break.
    pub down_since: [Option<Instant>; 3],
    /// Per node: since when its agent has run without a stop (killed and stalled agents do not).
    pub agent_since: [Option<Instant>; 3],
    /// Since when the control plane has run without a restart; `None` while one is under way
    /// (nothing can be written then).
    pub control_plane_since: Option<Instant>,
    /// The agents' reads of their peers' Leases are refused now.
    pub lease_reads_refused: bool,
    /// Since when they have been allowed again, after the last refusal.
    pub lease_reads_since: Option<Instant>,
    pub violations: Vec<String>,
}

impl Truth {
    pub fn update(&mut self, world: &World) {
        for (i, up) in world.up.iter().enumerate() {
            match (up, self.down_since[i]) {
                (true, _) => self.down_since[i] = None,
                (false, None) => self.down_since[i] = Some(Instant::now()),
                (false, Some(_)) => {}
            }
        }
        self.healthy.resize(VOLUMES, None);
        for v in 0..VOLUMES {
            let now = world.healthy_primary(v);
            if self.healthy[v].map(|(p, _)| p) != now {
                self.healthy[v] = now.map(|p| (p, Instant::now()));
            }
        }
    }

    /// Whether `node` has been the healthy primary of `v` for [`HEALTHY_AFTER`].
    pub fn long_healthy(&self, v: usize, node: usize) -> bool {
        self.healthy
            .get(v)
            .copied()
            .flatten()
            .is_some_and(|(p, since)| p == node && since.elapsed() >= HEALTHY_AFTER)
    }

    /// The healthy primary of `v`, and since when a slice at it has been owed: it has been the
    /// healthy primary, its agent has run (a stopped agent publishes nothing) and so has the
    /// control plane.
    pub fn slice_owed_since(&self, v: usize) -> Option<(usize, Instant)> {
        let (primary, healthy) = self.healthy.get(v).copied().flatten()?;
        let since = healthy.max(self.agent_since[primary]?).max(self.control_plane_since?);
        Some((primary, since))
    }

    /// Since when the promise that node `i`'s consumer of volume `v` is gone has been owed: `i`
    /// down, `v` with a healthy primary elsewhere, the agent on that primary's node running (the
    /// others defer to a Primary peer's agent), and the control plane running. `None` while it is
    /// not owed (no quorum anywhere, the agent that could act stopped, or the control plane
    /// restarting).
    pub fn consumer_move_owed_since(&self, i: usize, v: usize) -> Option<Instant> {
        let down = self.down_since[i]?;
        let (primary, healthy) = self.healthy.get(v).copied().flatten()?;
        let agent = self.agent_since[primary]?;
        let control_plane = self.control_plane_since?;
        (primary != i).then(|| down.max(healthy).max(agent).max(control_plane))
    }

    /// Since when a consumer of `v` on node `i` has been owed a move, once it is late: within
    /// [`POD_MOVE_BOUND`] of when the agents could read their peers' Leases (again), and in any
    /// case within [`POD_MOVE_BOUND_UNREAD`].
    pub fn consumer_move_late(&self, i: usize, v: usize) -> Option<Instant> {
        let owed = self.consumer_move_owed_since(i, v)?;
        let readable =
            (!self.lease_reads_refused).then(|| self.lease_reads_since.map_or(owed, |since| since.max(owed)));
        let late =
            owed.elapsed() >= POD_MOVE_BOUND_UNREAD || readable.is_some_and(|since| since.elapsed() >= POD_MOVE_BOUND);
        late.then_some(owed)
    }

    pub fn lease_reads(&mut self, allowed: bool) {
        self.lease_reads_refused = !allowed;
        if allowed {
            self.lease_reads_since = Some(Instant::now());
        }
    }

    pub fn violation(&mut self, what: String) {
        println!("soak {}: VIOLATION {what}", wall_clock());
        self.violations.push(what);
    }
}

pub type Shared = Arc<Mutex<Truth>>;
