//! Force-IO evictions: a local resource that forces IO errors has its local consumers evicted,
//! so that they restart where the volume works.

use super::select::evictable;
use crate::agent::action::{Action, Cause};
use crate::agent::view::{Observed, PodView};

/// Evictions of the local pods of every resource that forces IO errors here. Every pod that
/// keeps the device open keeps the resource failing and the node tainted, readers and pods with
/// unsafe volumes too: only owner-less pods (nothing would recreate them) and pods that opted out
/// stay.
pub(super) fn evictions(observed: &Observed) -> Vec<Action> {
    let mut actions = Vec::new();
    for resource in observed.drbd.resources.iter().filter(|r| r.force_io_failures) {
        let Some(volume) = observed.volumes.get(&resource.name) else {
            continue;
        };
        for pod in evictable(volume, &observed.node, opener_may_go) {
            actions.push(Action::Evict {
                pod: pod.into(),
                cause: Cause::ForceIoErrors,
                note: format!("DRBD resource {} is forcing IO errors on this node", resource.name),
            });
        }
    }
    actions
}

fn opener_may_go(pod: &PodView) -> bool {
    pod.has_owner && !pod.ignore_fail_over
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;

    #[test]
    fn every_local_opener_goes_but_owner_less_and_ignored_pods() {
        let mut observed = served_from_here("Secondary");
        observed.drbd.resources[0].force_io_failures = true;
        observed.volumes.get_mut("pvc-1").unwrap().pods = vec![
            pod("app", "node-b"),
            PodView {
                read_only: true,
                ..pod("reader", "node-b")
            },
            PodView {
                unsafe_volumes: true,
                ..pod("hostpath", "node-b")
            },
            PodView {
                has_owner: false,
                ..pod("bare", "node-b")
            },
            PodView {
                ignore_fail_over: true,
                ..pod("ignored", "node-b")
            },
            pod("elsewhere", "node-c"),
        ];
        assert_eq!(
            kinds(&evictions(&observed)),
            ["evict app", "evict reader", "evict hostpath"]
        );
        observed.drbd.resources[0].force_io_failures = false;
        assert!(evictions(&observed).is_empty());
    }
}
