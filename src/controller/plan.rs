//! The pure middle of a reconcile: what a shared volume's objects should be, built once; whether
//! endpoints that differ from the PV are an agent's move in flight ([`move_step`]); and whether
//! what was read drifted from what this replica converged it to ([`Plan::drift`]).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use kube::ResourceExt;

use crate::converged::is_converged;
use crate::names::APP_MANAGED_BY_LABEL;
use crate::sharedvolume::desired::{self, EndpointObjects, SharedVolume};
use crate::sharedvolume::stamp::MoveStamp;
use crate::volume::NfsEndpoint;

/// The objects one shared volume wants, built once per reconcile: the drift check and every
/// write work from these.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub service: Service,
    pub endpoints: EndpointObjects,
    /// The core/v1 Endpoints are written too; without them, the volume should have none.
    pub writes_endpoints: bool,
    /// A digest of what the objects are built from (see [`desired::fingerprint`]).
    pub fingerprint: u64,
}

/// The volume's objects as read (from the caches or the API); `None` where there is none.
#[derive(Clone, Debug, Default)]
pub(crate) struct Current {
    pub service: Option<Service>,
    pub endpoints: Option<Endpoints>,
    pub slice: Option<EndpointSlice>,
}

/// What to do about the objects as read, against what this replica converged them to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drift {
    /// In line, or the desired state moved on since we converged it: write as usual.
    InLine,
    /// Something else changed them: write them back now, counted as a repair.
    Repair,
    /// Changed again and again by something else: wait this long before writing them back.
    Wait(Duration),
}

impl Plan {
    pub fn of(shared: &SharedVolume, writes_endpoints: bool) -> Self {
        Self {
            service: desired::service(shared),
            endpoints: EndpointObjects::of(shared),
            writes_endpoints,
            fingerprint: desired::fingerprint(shared),
        }
    }

    /// Whether every object read already has every field this plan sets.
    pub fn is_in_line(&self, current: &Current) -> bool {
        let endpoints_in_line = if self.writes_endpoints {
            is_converged(&self.endpoints.endpoints, current.endpoints.as_ref())
        } else {
            // Someone else's Endpoints of that name are left alone, and no drift of ours.
            current
                .endpoints
                .as_ref()
                .is_none_or(|endpoints| !written_by_us(endpoints, &self.endpoints.endpoints))
        };
        is_converged(&self.service, current.service.as_ref())
            && endpoints_in_line
            && is_converged(&self.endpoints.slice, current.slice.as_ref())
    }

    /// Drift is an object out of line with the very state this replica converged before
    /// (`converged_before`); `repair_wait` is how long a repair must still wait, if at all.
    pub fn drift(&self, current: &Current, converged_before: bool, repair_wait: Option<Duration>) -> Drift {
        if !converged_before || self.is_in_line(current) {
            return Drift::InLine;
        }
        match repair_wait {
            Some(wait) => Drift::Wait(wait),
            None => Drift::Repair,
        }
    }
}

/// Whether `current` is Endpoints this controller wrote for the same claim as `desired`: its
/// managed-by label and its owner, the claim.
pub(crate) fn written_by_us(current: &Endpoints, desired: &Endpoints) -> bool {
    let label = |object: &Endpoints| object.labels().get(APP_MANAGED_BY_LABEL).cloned();
    let owner = |object: &Endpoints| object.owner_references().first().map(|owner| owner.uid.clone());
    label(current).is_some() && label(current) == label(desired) && owner(current) == owner(desired)
}

impl Current {
    /// Where the endpoint objects written point, and the stamps they carry: the
    /// Endpoints (when written) and the EndpointSlice. Endpoints left from before are not a
    /// move: the plan deletes them.
    pub fn pointing(&self, writes_endpoints: bool) -> Vec<Pointing> {
        let [endpoints, slice] = self.pointing_of_both();
        if writes_endpoints {
            vec![endpoints, slice]
        } else {
            vec![slice]
        }
    }

    fn pointing_of_both(&self) -> [Pointing; 2] {
        let endpoints = self.endpoints.as_ref().map(|endpoints| {
            let subset = endpoints.subsets.as_ref().and_then(|s| s.first());
            let ip = subset
                .and_then(|s| s.addresses.as_ref()?.first())
                .map(|a| a.ip.as_str());
            let port = subset.and_then(|s| s.ports.as_ref()?.first()).map(|p| p.port);
            Pointing::at(ip, port, endpoints.metadata.annotations.as_ref())
        });
        let slice = self.slice.as_ref().map(|slice| {
            let ip = slice
                .endpoints
                .first()
                .and_then(|e| e.addresses.first())
                .map(String::as_str);
            let port = slice.ports.as_ref().and_then(|p| p.first()?.port);
            Pointing::at(ip, port, slice.metadata.annotations.as_ref())
        });
        [endpoints.unwrap_or_default(), slice.unwrap_or_default()]
    }
}

/// Where one of a volume's endpoint objects points, and the stamp of the agent's move on it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pointing {
    pub server: Option<NfsEndpoint>,
    pub stamp: Option<MoveStamp>,
}

impl Pointing {
    fn at(
        ip: Option<&str>,
        port: Option<i32>,
        annotations: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Self {
        let server = match (
            ip.and_then(|ip| ip.parse().ok()),
            port.and_then(|p| u16::try_from(p).ok()),
        ) {
            (Some(ip), Some(port)) => Some(NfsEndpoint::new(ip, port)),
            _ => None,
        };
        Self {
            server,
            stamp: MoveStamp::read(annotations),
        }
    }

    /// The stamp of the move that put this object where it points, if an agent's move did.
    fn own_move(&self) -> Option<&MoveStamp> {
        self.stamp
            .as_ref()
            .filter(|stamp| stamp.endpoint.parse::<NfsEndpoint>().ok() == self.server)
    }
}

/// The PV as one reconcile read it (from the cache, or fresh from the API).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PvSight {
    pub version: String,
    /// Where it says the NFS server listens.
    pub server: NfsEndpoint,
    /// The stamp of the last agent move written on it.
    pub stamp: Option<MoveStamp>,
    /// Read from the API in this reconcile, not from the cache.
    pub fresh: bool,
}

/// What a reconcile does next about endpoints that differ from the PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MoveStep {
    /// Plan from the PV as read and write what is out of line (a repair, if it was drift).
    Proceed,
    /// The endpoints carry an agent's move the cached PV does not show: the PV may just lag in
    /// the cache (its watch is another stream), so read it fresh and decide again.
    ReadPv,
    /// The PV shows an agent's move the cached endpoints do not: the agent writes them in the
    /// same round trip, so read them fresh before writing them a second time.
    ReadEndpoints,
    /// The fresh PV is still at exactly the version the move was decided over: the agent's PV
    /// write is in flight. Hold this stamp (once: a writer that died is repaired after the hold).
    Hold(MoveStamp),
}

/// Whether the PV write of the move `stamp` may still be on its way: the PV is at exactly the
/// version the move was decided over, or its last move was not decided later than this one (two
/// agents, one of whose caches lagged, decided over the same PV; DRBD made the later one primary).
/// A move decided before the PV's last one is a stale writer's.
fn pv_write_in_flight(pv: &PvSight, stamp: &MoveStamp) -> bool {
    match &pv.stamp {
        // This very move is on the PV: the PV changed after it, so it is not in flight.
        Some(last) if last == stamp => false,
        Some(last) => !decided_before(stamp, last),
        None => pv.version == stamp.over_pv_version,
    }
}

/// Whether `a` was decided over an older PV than `b`. resourceVersions are etcd revisions, ordered
/// integers; one that is not a number is ordered by nothing but equality.
fn decided_before(a: &MoveStamp, b: &MoveStamp) -> bool {
    match (a.over_pv_version.parse::<u64>(), b.over_pv_version.parse::<u64>()) {
        (Ok(a), Ok(b)) => a < b,
        _ => a.over_pv_version != b.over_pv_version,
    }
}

/// Whether this claim was held for `stamp` already, long enough.
fn ran_out(held: Option<Held>, stamp: &MoveStamp) -> bool {
    held.is_some_and(|held| held.stamp == stamp && held.expired)
}

/// A move this claim was held for, and whether the hold has run out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Held<'a> {
    pub stamp: &'a MoveStamp,
    pub expired: bool,
}

/// The rule that keeps the controller from pointing the endpoints back at a node the agent just
/// moved them off, and from writing a move the agent already wrote. Where existing endpoints
/// differ from the PV, the controller reads the PV fresh before it writes; where an agent's move
/// is involved (a stamp on the endpoints naming where they point, or one on the PV naming what it
/// says), it reads the endpoints fresh too. The PV stays the only source of truth: a stamp is a
/// reason to look again or to wait, never a reason to write what the PV does not say. A move is
/// held first, before anything is read, for a bounded time and once, while one of its writes is
/// in flight: the PV's (see [`pv_write_in_flight`]) or the endpoints' (the PV shows the move, the
/// endpoints have not seen it); the writes' own events usually end the hold. A hand edit (no stamp), a stale stamp (decided before the PV's last move, or over an
/// older PV than a PV no agent moved) or a hold run out is drift, repaired at once.
pub(crate) fn move_step(pv: &PvSight, objects: &[Pointing], objects_fresh: bool, held: Option<Held>) -> MoveStep {
    // Objects still to be created are not a move.
    let elsewhere: Vec<&Pointing> = objects
        .iter()
        .filter(|o| o.server.is_some_and(|server| server != pv.server))
        .collect();
    if elsewhere.is_empty() {
        return MoveStep::Proceed;
    }
    let in_flight = elsewhere.iter().find_map(|o| o.own_move());
    let moved_by_agent = pv
        .stamp
        .as_ref()
        .is_some_and(|stamp| stamp.endpoint.parse::<NfsEndpoint>().ok() == Some(pv.server));
    // A move is held before anything is read: its other writes left in the same round trip, and
    // their events are on their way (a mass move costs the API server no reads).
    if let Some(stamp) = in_flight
        && pv_write_in_flight(pv, stamp)
        && !ran_out(held, stamp)
    {
        return MoveStep::Hold(stamp.clone());
    }
    // The PV shows an agent's move the endpoints have not seen: their writes are on their way.
    if let Some(stamp) = pv.stamp.as_ref().filter(|_| moved_by_agent && in_flight.is_none())
        && elsewhere.iter().any(|o| o.stamp.as_ref() != Some(stamp))
        && !ran_out(held, stamp)
    {
        return MoveStep::Hold(stamp.clone());
    }
    // Nothing is written from a cached PV that disagrees with the endpoints: the cache may be
    // the one behind (the controller's own earlier writes included).
    if !pv.fresh {
        return MoveStep::ReadPv;
    }
    if (in_flight.is_some() || moved_by_agent) && !objects_fresh {
        return MoveStep::ReadEndpoints;
    }
    MoveStep::Proceed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharedvolume::desired::tests::shared_volume;
    use crate::sharedvolume::stamp::MoveStamp;

    fn current_of(plan: &Plan) -> Current {
        Current {
            service: Some(plan.service.clone()),
            endpoints: Some(plan.endpoints.endpoints.clone()),
            slice: Some(plan.endpoints.slice.clone()),
        }
    }

    #[test]
    fn without_core_endpoints_a_leftover_one_is_drift_and_never_a_move() {
        let plan = Plan::of(&shared_volume("192.0.2.1:2049"), false);
        let leftover = current_of(&plan);
        assert!(!plan.is_in_line(&leftover), "Endpoints left from before are to go");
        let slice_only = Current {
            endpoints: None,
            ..leftover.clone()
        };
        assert!(plan.is_in_line(&slice_only));
        let mut moved_leftover = leftover;
        moved_leftover.endpoints = Some(Plan::of(&shared_volume("192.0.2.9:2049"), false).endpoints.endpoints);
        let pointing = moved_leftover.pointing(false);
        assert_eq!(pointing.len(), 1, "the slice alone");
        assert_eq!(pointing[0].server, Some("192.0.2.1:2049".parse().unwrap()));
    }

    #[test]
    fn drift_is_a_change_to_what_we_converged() {
        let plan = Plan::of(&shared_volume("192.0.2.1:2049"), true);
        let in_line = current_of(&plan);
        let mut moved = in_line.clone();
        moved.endpoints = Some(Plan::of(&shared_volume("192.0.2.9:2049"), true).endpoints.endpoints);
        let wait = Some(Duration::from_secs(2));
        let cases = [
            (&in_line, true, None, Drift::InLine),
            (&in_line, true, wait, Drift::InLine),
            (&moved, false, None, Drift::InLine),
            (&moved, true, None, Drift::Repair),
            (&moved, true, wait, Drift::Wait(Duration::from_secs(2))),
            (&Current::default(), true, None, Drift::Repair),
            (&Current::default(), false, None, Drift::InLine),
        ];
        for (current, converged_before, repair_wait, expected) in cases {
            assert_eq!(
                plan.drift(current, converged_before, repair_wait),
                expected,
                "{converged_before} {repair_wait:?}"
            );
        }
    }

    fn at(last: u8, stamp: Option<(u8, &str)>) -> Pointing {
        Pointing {
            server: Some(NfsEndpoint::new([10, 0, 0, last].into(), 2049)),
            stamp: stamp.map(|(to, over)| MoveStamp::new(format!("10.0.0.{to}:2049"), over)),
        }
    }

    fn pv_at(last: u8, version: &str, fresh: bool) -> PvSight {
        PvSight {
            version: version.into(),
            server: NfsEndpoint::new([10, 0, 0, last].into(), 2049),
            stamp: None,
            fresh,
        }
    }

    /// Endpoints an agent moved to 10.0.0.2 over PV version 7.
    fn in_flight() -> Pointing {
        at(2, Some((2, "7")))
    }

    fn hold() -> MoveStep {
        MoveStep::Hold(in_flight().stamp.unwrap())
    }

    /// The PV after the agent's move: at 10.0.0.2, version 8, carrying the move's stamp.
    fn moved() -> PvSight {
        PvSight {
            stamp: in_flight().stamp,
            ..pv_at(2, "8", true)
        }
    }

    fn held(stamp: &MoveStamp, expired: bool) -> Held<'_> {
        Held { stamp, expired }
    }

    /// The case's name, the PV, [Endpoints, EndpointSlice], whether those were read fresh, a
    /// hold, and the step expected.
    type StepCase<'a> = (&'a str, PvSight, [Pointing; 2], bool, Option<Held<'a>>, MoveStep);

    fn check_steps<const N: usize>(cases: [StepCase; N]) {
        for (name, pv, objects, objects_fresh, held, expected) in cases {
            assert_eq!(move_step(&pv, &objects, objects_fresh, held), expected, "{name}");
        }
    }

    /// Endpoints off the PV with no move involved: the PV is read fresh, then they are repaired.
    #[test]
    fn drift_without_a_move_is_repaired_from_a_fresh_pv() {
        check_steps([
            (
                "in line",
                pv_at(1, "7", false),
                [at(1, None), at(1, None)],
                false,
                None,
                MoveStep::Proceed,
            ),
            (
                "not created yet",
                pv_at(1, "7", false),
                [Pointing::default(), Pointing::default()],
                false,
                None,
                MoveStep::Proceed,
            ),
            (
                "hand edit, cached PV",
                pv_at(1, "7", false),
                [at(9, None), at(1, None)],
                false,
                None,
                MoveStep::ReadPv,
            ),
            (
                "hand edit, fresh PV: repaired",
                pv_at(1, "7", true),
                [at(9, None), at(1, None)],
                false,
                None,
                MoveStep::Proceed,
            ),
        ]);
    }

    /// Endpoints an agent moved ahead of the PV: held, then read fresh and put back once the hold runs out.
    #[test]
    fn a_move_in_flight_is_held_until_its_hold_runs_out() {
        let stamp = in_flight().stamp.unwrap();
        check_steps([
            (
                "a move, held before anything is read",
                pv_at(1, "7", false),
                [in_flight(), at(1, None)],
                false,
                None,
                hold(),
            ),
            (
                "a move, PV at its version: held",
                pv_at(1, "7", true),
                [in_flight(), at(1, None)],
                false,
                None,
                hold(),
            ),
            (
                "still held",
                pv_at(1, "7", true),
                [in_flight(), at(1, None)],
                false,
                Some(held(&stamp, false)),
                hold(),
            ),
            (
                "hold run out",
                pv_at(1, "7", true),
                [in_flight(), at(1, None)],
                false,
                Some(held(&stamp, true)),
                MoveStep::ReadEndpoints,
            ),
            (
                "hold run out, read fresh: repaired",
                pv_at(1, "7", true),
                [in_flight(), at(1, None)],
                true,
                Some(held(&stamp, true)),
                MoveStep::Proceed,
            ),
            (
                "a stale stamp: the PV moved on",
                pv_at(1, "9", true),
                [in_flight(), at(1, None)],
                false,
                None,
                MoveStep::ReadEndpoints,
            ),
        ]);
    }

    /// A PV that shows the move: held until both endpoints do; stale writers and later hand edits repaired.
    #[test]
    fn a_move_the_pv_shows_is_written_once_both_endpoints_show_it() {
        let stamp = in_flight().stamp.unwrap();
        check_steps([
            (
                "the PV shows the move, an endpoint not yet: held",
                moved(),
                [in_flight(), at(1, None)],
                false,
                None,
                hold(),
            ),
            (
                "the fresh endpoints show it too",
                moved(),
                [in_flight(), in_flight()],
                true,
                None,
                MoveStep::Proceed,
            ),
            (
                "an older move on the PV, decided over the same version (a lagging cache): held",
                PvSight {
                    stamp: Some(MoveStamp::new("10.0.0.1:2049", "7")),
                    ..pv_at(1, "8", true)
                },
                [in_flight(), at(1, None)],
                false,
                None,
                hold(),
            ),
            (
                "a move decided before the PV's last one: a stale writer, repaired",
                PvSight {
                    stamp: Some(MoveStamp::new("10.0.0.1:2049", "8")),
                    ..pv_at(1, "9", true)
                },
                [in_flight(), at(1, None)],
                true,
                None,
                MoveStep::Proceed,
            ),
            (
                "one fresh endpoint not yet: held",
                moved(),
                [in_flight(), at(1, None)],
                true,
                None,
                hold(),
            ),
            (
                "that hold run out: written",
                moved(),
                [in_flight(), at(1, None)],
                true,
                Some(held(&stamp, true)),
                MoveStep::Proceed,
            ),
            (
                "a hand edit after the move: repaired",
                moved(),
                [in_flight(), at(9, Some((2, "7")))],
                true,
                None,
                MoveStep::Proceed,
            ),
        ]);
    }
}
