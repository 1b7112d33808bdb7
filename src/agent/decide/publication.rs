//! Publication: the node that is the DRBD primary of a shared volume, with quorum and no primary
//! peer, publishes itself as the volume's NFS service endpoint (and the endpoints follow).

use std::collections::BTreeSet;

use super::{DecisionSettings, volumes_with_quorum};
use crate::agent::action::Action;
use crate::agent::drbd::Resource;
use crate::agent::view::{Observed, Timers, VolumeView};
use crate::volume::NfsEndpoint;

/// Publications this node owes now; `timers` remembers which volumes it serves, so that a node
/// just promoted publishes even when its cache still shows its own endpoint from before.
pub(super) fn publications(observed: &Observed, settings: &DecisionSettings, timers: &mut Timers) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut serving = BTreeSet::new();
    for (resource, volume) in volumes_with_quorum(observed) {
        let Some(publish) = own_publication(observed, settings, resource, volume) else {
            continue;
        };
        // Just promoted: the cache may not have seen the previous primary's publication yet,
        // and still show this node's own from before; a freshly listed cache holds.
        let promoted = timers.serving.as_ref().is_some_and(|s| !s.contains(&resource.name));
        if promoted || volume.service_endpoint.as_deref() != publish.published_endpoint() {
            actions.push(publish);
        }
        serving.insert(resource.name.clone());
    }
    timers.serving = Some(serving);
    actions
}

/// The publication of this node's NFS endpoint, when it should serve the shared volume: it is
/// the DRBD primary, every local device has quorum and no peer is primary. An isolated node
/// never qualifies.
fn own_publication(
    observed: &Observed,
    settings: &DecisionSettings,
    resource: &Resource,
    volume: &VolumeView,
) -> Option<Action> {
    if !(resource.is_primary() && resource.may_promote()) {
        return None;
    }
    let claim = volume.shared_claim.clone()?;
    let ip = observed.node_ip.as_deref()?.parse().ok()?;
    Some(Action::PublishServiceEndpoint {
        pv: volume.pv.clone(),
        claim,
        endpoint: NfsEndpoint::new(ip, settings.nfs_port).to_string(),
        over_version: volume.pv_version.clone(),
    })
}

/// Publications of every shared volume this node serves, whatever is published now: the
/// periodic resync repairs what was changed behind our back.
pub fn republish(observed: &Observed, settings: &DecisionSettings) -> Vec<Action> {
    volumes_with_quorum(observed)
        .filter_map(|(resource, volume)| own_publication(observed, settings, resource, volume))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;

    #[test]
    fn a_primary_with_quorum_publishes_itself_and_an_isolated_one_never() {
        let mut primary = primary_lost();
        primary.drbd.resources[0] = resource("Primary", true, &[("node-a", "Connecting", "Unknown")]);
        primary.volumes.get_mut("pvc-1").unwrap().attachments.clear();
        primary.volumes.get_mut("pvc-1").unwrap().pods.clear();
        assert_eq!(
            kinds(&decide(&primary, &settings(), &mut Timers::new(), Instant::now())),
            ["publish pvc-1 10.0.0.2:2049"]
        );
        let mut isolated = primary.clone();
        isolated.drbd.resources[0].devices[0].quorum = false;
        let actions = kinds(&decide(&isolated, &settings(), &mut Timers::new(), Instant::now()));
        assert!(!actions.iter().any(|a| a.starts_with("publish")), "{actions:?}");
        let mut published = primary.clone();
        published.volumes.get_mut("pvc-1").unwrap().service_endpoint = Some("10.0.0.2:2049".into());
        assert!(decide(&published, &settings(), &mut Timers::new(), Instant::now()).is_empty());
        assert_eq!(
            kinds(&republish(&published, &settings())),
            ["publish pvc-1 10.0.0.2:2049"]
        );
        assert!(republish(&isolated, &settings()).is_empty());
        let mut ipv6 = primary;
        ipv6.node_ip = Some("fd00::2".into());
        assert_eq!(
            kinds(&decide(&ipv6, &settings(), &mut Timers::new(), Instant::now())),
            ["publish pvc-1 [fd00::2]:2049"]
        );
    }

    #[test]
    fn a_new_primary_publishes_even_when_its_cache_still_shows_its_own_endpoint() {
        // This node served the volume before; the primary moved away and back faster than the
        // other node's publication reached this node's cache.
        let mut secondary = served_from_here("Secondary");
        secondary.volumes.get_mut("pvc-1").unwrap().pods.clear();
        let mut primary = secondary.clone();
        primary.drbd.resources[0] = resource("Primary", true, &[]);

        let mut timers = Timers::new();
        let now = Instant::now();
        assert!(
            decide(&primary, &settings(), &mut timers, now).is_empty(),
            "a freshly listed cache is believed"
        );
        assert!(decide(&secondary, &settings(), &mut timers, now).is_empty());
        assert_eq!(
            kinds(&decide(&primary, &settings(), &mut timers, now)),
            ["publish pvc-1 10.0.0.2:2049"],
            "promoted: published whatever the cache says"
        );
        assert!(
            decide(&primary, &settings(), &mut timers, now).is_empty(),
            "still primary: the cache decides again"
        );
    }
}
