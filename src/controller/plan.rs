//! The pure middle of a reconcile: what a shared volume's objects should be, built once, and
//! whether what was read of them drifted from what this replica converged them to.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::apply::is_converged;
use crate::sharedvolume::desired::{self, EndpointObjects, SharedVolume};

/// The objects one shared volume wants, built once per reconcile: the drift check and every
/// write work from these.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub service: Service,
    pub endpoints: EndpointObjects,
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
    pub fn of(shared: &SharedVolume) -> Self {
        Self {
            service: desired::service(shared),
            endpoints: EndpointObjects::of(shared),
            fingerprint: desired::fingerprint(shared),
        }
    }

    /// Whether every object read already has every field this plan sets.
    pub fn is_in_line(&self, current: &Current) -> bool {
        is_converged(&self.service, current.service.as_ref())
            && is_converged(&self.endpoints.endpoints, current.endpoints.as_ref())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharedvolume::desired::tests::shared_volume;

    fn current_of(plan: &Plan) -> Current {
        Current {
            service: Some(plan.service.clone()),
            endpoints: Some(plan.endpoints.endpoints.clone()),
            slice: Some(plan.endpoints.slice.clone()),
        }
    }

    #[test]
    fn drift_is_a_change_to_what_we_converged() {
        let plan = Plan::of(&shared_volume("192.0.2.1:2049"));
        let in_line = current_of(&plan);
        let mut moved = in_line.clone();
        moved.endpoints = Some(Plan::of(&shared_volume("192.0.2.9:2049")).endpoints.endpoints);
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
}
