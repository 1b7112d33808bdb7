//! Which volumes and pods the rules act on: picks shared by several rules.

use super::settings::DecisionSettings;
use crate::agent::drbd::Resource;
use crate::agent::view::{Observed, PodView, VolumeView};

/// The quorum-enabled local resources that back a PV, with its volume: the only ones that are
/// published, evacuated or failed over (a resource without a PV has no consumers to move).
pub(super) fn volumes_with_quorum(observed: &Observed) -> impl Iterator<Item = (&Resource, &VolumeView)> {
    observed
        .drbd
        .resources
        .iter()
        .filter(|r| observed.drbd.quorum_enabled.contains(&r.name))
        .filter_map(|r| Some((r, observed.volumes.get(&r.name)?)))
}

/// Pods we may move: owned, not opted out, not read-only, safe to fail over.
pub(super) fn is_movable(pod: &PodView, settings: &DecisionSettings) -> bool {
    pod.has_owner && !pod.ignore_fail_over && !pod.read_only && (settings.fail_over_unsafe_pods || !pod.unsafe_volumes)
}

/// Pods of the volume on `node`, not already on their way out, that `may_move` lets go.
pub(super) fn evictable<'a>(
    volume: &'a VolumeView,
    node: &'a str,
    may_move: impl Fn(&PodView) -> bool + 'a,
) -> impl Iterator<Item = &'a PodView> {
    volume
        .pods
        .iter()
        .filter(move |p| p.node == node && !p.finished && !p.terminating && may_move(p))
}
