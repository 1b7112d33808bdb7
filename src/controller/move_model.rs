//! An exhaustive check of [`move_step`] against the agent's moves: every interleaving of an
//! agent's three concurrent writes (PV, Endpoints, EndpointSlice; two without the core/v1
//! Endpoints), of the controller's three watch
//! streams delivering them in any order relative to each other, of the controller's reconciles,
//! of an agent dying between its writes, and of a second move decided once the first one's PV
//! write landed. It holds when
//! - every controller write of the endpoints names what the PV says at that moment (so they
//!   never point back at a node the PV has moved off),
//! - the controller never undoes an agent's move whose PV write is still in flight (the
//!   bounce-back: endpoints at the new node, back at the old one, then at the new one again),
//! - once the writers are done or dead and the streams drained, the endpoints end at what the PV
//!   says.
//!
//! - the controller never writes a move the agent's write already put there.
//!
//! Time is abstract: a reconcile may come at any point (a watch event, a requeue), and a hold
//! runs out only once the agent that wrote the held move has finished or died: the hold (2 s) is
//! longer than one round trip of the agent's writes. A reconcile is one step: its fresh reads and
//! its writes are not interleaved with other steps.

use std::collections::{HashSet, VecDeque};

use super::plan::{Held, MoveStep, Pointing, PvSight, move_step};
use crate::sharedvolume::stamp::MoveStamp;
use crate::volume::NfsEndpoint;

/// The servers: the node that is lost, the first move's target and the second move's.
const A: u8 = 0;
const X: u8 = 1;
const Y: u8 = 2;

fn server(node: u8) -> NfsEndpoint {
    NfsEndpoint::new([10, 0, 0, node + 1].into(), 2049)
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Pv {
    version: u32,
    server: u8,
    /// The move stamped on it: (server, version decided over).
    stamp: Option<(u8, u32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Object {
    server: u8,
    stamp: Option<(u8, u32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Write {
    Pv,
    Endpoints,
    Slice,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Agent {
    to: u8,
    over: u32,
    pending: Vec<Write>,
    dead: bool,
}

impl Agent {
    fn done(&self) -> bool {
        self.dead || self.pending.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    pv: Pv,
    endpoints: Object,
    slice: Object,
    /// What the controller's caches hold, and what its three watches have still to deliver.
    cached_pv: Pv,
    cached_endpoints: Object,
    cached_slice: Object,
    pv_events: VecDeque<Pv>,
    endpoint_events: VecDeque<Object>,
    slice_events: VecDeque<Object>,
    agents: Vec<Agent>,
    /// The stamp the claim is held for.
    held: Option<(u8, u32)>,
    second_move: bool,
    /// `--write-endpoints` resolved to no: neither loop writes the core/v1 Endpoints.
    slices_only: bool,
}

fn stamp_of((to, over): (u8, u32)) -> MoveStamp {
    MoveStamp::new(server(to).to_string(), over.to_string())
}

fn pointing(object: &Object) -> Pointing {
    Pointing {
        server: Some(server(object.server)),
        stamp: object.stamp.map(stamp_of),
    }
}

fn sight(pv: &Pv, fresh: bool) -> PvSight {
    PvSight {
        version: pv.version.to_string(),
        server: server(pv.server),
        stamp: pv.stamp.map(stamp_of),
        fresh,
    }
}

impl World {
    /// What an agent's move writes.
    fn move_writes(&self) -> Vec<Write> {
        if self.slices_only {
            vec![Write::Pv, Write::Slice]
        } else {
            vec![Write::Pv, Write::Endpoints, Write::Slice]
        }
    }

    /// The endpoint objects both loops write.
    fn endpoint_objects(&self) -> Vec<Write> {
        self.move_writes().into_iter().filter(|w| *w != Write::Pv).collect()
    }

    fn start(second_move: bool, slices_only: bool) -> Self {
        let pv = Pv {
            version: 1,
            server: A,
            stamp: None,
        };
        let at_a = Object { server: A, stamp: None };
        let mut world = Self {
            cached_pv: pv.clone(),
            pv,
            endpoints: at_a,
            slice: at_a,
            cached_endpoints: at_a,
            cached_slice: at_a,
            pv_events: VecDeque::new(),
            endpoint_events: VecDeque::new(),
            slice_events: VecDeque::new(),
            agents: Vec::new(),
            held: None,
            second_move,
            slices_only,
        };
        let pending = world.move_writes();
        world.agents.push(Agent {
            to: X,
            over: 1,
            pending,
            dead: false,
        });
        world
    }

    fn object(&self, which: Write) -> Object {
        match which {
            Write::Endpoints => self.endpoints,
            Write::Slice => self.slice,
            Write::Pv => unreachable!("the PV is no endpoint object"),
        }
    }

    fn agent_write(&mut self, agent: usize, write: Write) {
        let Agent { to, over, .. } = self.agents[agent];
        let stamped = Object {
            server: to,
            stamp: Some((to, over)),
        };
        match write {
            Write::Pv => {
                self.pv = Pv {
                    version: self.pv.version + 1,
                    server: to,
                    stamp: Some((to, over)),
                };
                self.pv_events.push_back(self.pv.clone());
            }
            Write::Endpoints => {
                self.endpoints = stamped;
                self.endpoint_events.push_back(stamped);
            }
            Write::Slice => {
                self.slice = stamped;
                self.slice_events.push_back(stamped);
            }
        }
        self.agents[agent].pending.retain(|w| *w != write);
    }

    /// The controller writes an object (server-side apply: the agent's stamp annotation is not
    /// the controller's field, so it stays). A write that changes nothing makes no event.
    fn controller_write(&mut self, which: Write, to: u8) {
        let object = match which {
            Write::Endpoints => &mut self.endpoints,
            Write::Slice => &mut self.slice,
            Write::Pv => unreachable!("the controller does not write the service endpoint"),
        };
        if object.server == to {
            return;
        }
        object.server = to;
        let written = *object;
        match which {
            Write::Endpoints => self.endpoint_events.push_back(written),
            _ => self.slice_events.push_back(written),
        }
    }

    /// One reconcile, as the shell runs it: [`move_step`] over the caches, reading fresh what it
    /// asks for, then writing from the PV it ended with. `hold_expired`: the hold has run out.
    fn reconcile(&mut self, hold_expired: bool) -> Result<(), String> {
        let mut pv = self.cached_pv.clone();
        let mut pv_fresh = false;
        let mut objects = (self.cached_endpoints, self.cached_slice);
        let mut objects_fresh = false;
        let held_stamp = self.held.map(stamp_of);
        loop {
            let held = held_stamp.as_ref().map(|stamp| Held {
                stamp,
                expired: hold_expired,
            });
            let pointing: Vec<Pointing> = self
                .endpoint_objects()
                .into_iter()
                .map(|which| {
                    pointing(if which == Write::Endpoints {
                        &objects.0
                    } else {
                        &objects.1
                    })
                })
                .collect();
            match move_step(&sight(&pv, pv_fresh), &pointing, objects_fresh, held) {
                MoveStep::ReadPv => {
                    pv = self.pv.clone();
                    pv_fresh = true;
                }
                MoveStep::ReadEndpoints => {
                    objects = (self.endpoints, self.slice);
                    objects_fresh = true;
                }
                MoveStep::Hold(stamp) => {
                    let key = (server_index(&stamp.endpoint), stamp.over_pv_version.parse().unwrap());
                    if self.held != Some(key) {
                        self.held = Some(key);
                    }
                    return Ok(());
                }
                MoveStep::Proceed => break,
            }
        }
        // The shell writes what differs from what it read (apply only when changed).
        let written = self.endpoint_objects();
        for (which, read) in [(Write::Endpoints, objects.0), (Write::Slice, objects.1)] {
            if !written.contains(&which) {
                continue;
            }
            if read.server != pv.server {
                if pv.server != self.pv.server {
                    return Err(format!(
                        "the controller wrote {:?} to server {} while the PV says {}",
                        which, pv.server, self.pv.server
                    ));
                }
                let truth = self.object(which);
                let agents_move = truth.stamp.is_some_and(|(to, _)| to == truth.server);
                if truth.server == pv.server && agents_move {
                    return Err(format!(
                        "the controller wrote {which:?} a second time: the agent's move was there"
                    ));
                }
                let in_flight = self
                    .agents
                    .iter()
                    .any(|a| agents_move && a.to == truth.server && !a.dead && a.pending.contains(&Write::Pv));
                if in_flight {
                    return Err(format!(
                        "bounce-back: the controller put {which:?} back from {} to {} while the agent's PV write was in flight",
                        truth.server, pv.server
                    ));
                }
                self.controller_write(which, pv.server);
            }
        }
        Ok(())
    }

    fn converged(&self) -> bool {
        self.endpoint_objects()
            .into_iter()
            .all(|which| self.object(which).server == self.pv.server)
    }

    fn quiet(&self) -> bool {
        self.agents.iter().all(Agent::done)
            && self.pv_events.is_empty()
            && self.endpoint_events.is_empty()
            && self.slice_events.is_empty()
    }

    /// Every world one step away: (what happened, the world after it).
    fn next(&self) -> Vec<(String, Result<World, String>)> {
        let mut next = Vec::new();
        for (i, agent) in self.agents.iter().enumerate() {
            if agent.dead {
                continue;
            }
            for write in agent.pending.clone() {
                let mut world = self.clone();
                world.agent_write(i, write);
                next.push((format!("agent {i} writes {write:?}"), Ok(world)));
            }
            if !agent.pending.is_empty() {
                let mut world = self.clone();
                world.agents[i].dead = true;
                next.push((format!("agent {i} dies"), Ok(world)));
            }
        }
        // The second move: Y is promoted once the PV names X, and decides over the PV its cache
        // holds: the one X's move wrote, or, lagging, the one X's move was decided over.
        if self.second_move && self.agents.len() == 1 && self.pv.server == X {
            for over in [self.pv.version, self.agents[0].over] {
                let mut world = self.clone();
                world.agents.push(Agent {
                    to: Y,
                    over,
                    pending: self.move_writes(),
                    dead: false,
                });
                next.push((
                    format!("agent 1 decides to move to Y over PV version {over}"),
                    Ok(world),
                ));
            }
        }
        if let Some(pv) = self.pv_events.front() {
            let mut world = self.clone();
            world.cached_pv = pv.clone();
            world.pv_events.pop_front();
            next.push(("PV event delivered".into(), Ok(world)));
        }
        if let Some(object) = self.endpoint_events.front() {
            let mut world = self.clone();
            world.cached_endpoints = *object;
            world.endpoint_events.pop_front();
            next.push(("Endpoints event delivered".into(), Ok(world)));
        }
        if let Some(object) = self.slice_events.front() {
            let mut world = self.clone();
            world.cached_slice = *object;
            world.slice_events.pop_front();
            next.push(("EndpointSlice event delivered".into(), Ok(world)));
        }
        let mut world = self.clone();
        let result = world.reconcile(false).map(|()| world);
        next.push(("reconcile".into(), result));
        // A hold runs out only once the writer it waits for is done.
        let holder_done = self
            .held
            .is_some_and(|(to, _)| self.agents.iter().filter(|a| a.to == to).all(Agent::done));
        if holder_done {
            let mut world = self.clone();
            let result = world.reconcile(true).map(|()| world);
            next.push(("reconcile after the hold ran out".into(), result));
        }
        next
    }
}

fn server_index(endpoint: &str) -> u8 {
    [A, X, Y]
        .into_iter()
        .find(|node| server(*node).to_string() == endpoint)
        .expect("a model server")
}

/// Every world reachable from `start`; panics with the path to the first broken promise.
fn explore(start: World) -> usize {
    let mut seen = HashSet::new();
    let mut stack = vec![(start, Vec::<String>::new())];
    while let Some((world, path)) = stack.pop() {
        if !seen.insert(world.clone()) {
            continue;
        }
        if world.quiet() {
            // Nothing left in flight: the controller settles it, with any hold run out.
            let mut settled = world.clone();
            for _ in 0..4 {
                settled
                    .reconcile(true)
                    .unwrap_or_else(|e| panic!("{e}\nafter: {path:#?}"));
                while let Some(pv) = settled.pv_events.pop_front() {
                    settled.cached_pv = pv;
                }
                while let Some(object) = settled.endpoint_events.pop_front() {
                    settled.cached_endpoints = object;
                }
                while let Some(object) = settled.slice_events.pop_front() {
                    settled.cached_slice = object;
                }
            }
            assert!(
                settled.converged(),
                "the endpoints did not end at what the PV says: {settled:?}\nafter: {path:#?}"
            );
        }
        for (step, result) in world.next() {
            let mut path = path.clone();
            path.push(step);
            match result {
                Ok(next) => stack.push((next, path)),
                Err(broken) => panic!("{broken}\nafter: {path:#?}"),
            }
        }
    }
    seen.len()
}

#[test]
fn every_interleaving_of_one_move_ends_at_the_pv_and_never_points_back() {
    let worlds = explore(World::start(false, false));
    assert!(worlds > 100, "explored only {worlds} worlds");
}

#[test]
fn every_interleaving_of_two_moves_ends_at_the_pv_and_never_points_back() {
    let worlds = explore(World::start(true, false));
    assert!(worlds > 10_000, "explored only {worlds} worlds");
}

#[test]
fn without_core_endpoints_every_interleaving_of_one_move_ends_at_the_pv() {
    let worlds = explore(World::start(false, true));
    assert!(worlds > 20, "explored only {worlds} worlds");
}

#[test]
fn without_core_endpoints_every_interleaving_of_two_moves_ends_at_the_pv() {
    let worlds = explore(World::start(true, true));
    assert!(worlds > 500, "explored only {worlds} worlds");
}
