//! Force-IO evictions: a local resource that forces IO errors has its local consumers evicted,
//! so that they restart where the volume works.

use super::{DecisionSettings, evictable};
use crate::agent::action::{Action, Cause};
use crate::agent::view::Observed;

/// Evictions of the movable local pods of every resource that forces IO errors here.
pub(super) fn evictions(observed: &Observed, settings: &DecisionSettings) -> Vec<Action> {
    let mut actions = Vec::new();
    for resource in observed.drbd.resources.iter().filter(|r| r.force_io_failures) {
        let Some(volume) = observed.volumes.get(&resource.name) else {
            continue;
        };
        for pod in evictable(volume, &observed.node, settings) {
            actions.push(Action::Evict {
                pod: pod.into(),
                cause: Cause::ForceIoErrors,
                note: format!("DRBD resource {} is forcing IO errors on this node", resource.name),
            });
        }
    }
    actions
}
