//! Publication: the node that is the DRBD primary of a shared volume, with quorum and no primary
//! peer, publishes itself as the volume's NFS service endpoint (and the endpoints follow).

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::select::volumes_with_quorum;
use super::settings::DecisionSettings;
use crate::agent::action::Action;
use crate::agent::drbd::Resource;
use crate::agent::view::{Observed, Publication, Timers, VolumeView};
use crate::volume::NfsEndpoint;

/// Publications this node owes now; `timers` remembers which volumes it serves, so that a node
/// just promoted publishes even when its cache still shows its own endpoint from before, and what
/// it last published over which DRBD view, so that it does not publish back over another node's
/// newer move while its own view has not changed (the side of a partition whose DRBD has not
/// noticed it yet).
pub(super) fn publications(observed: &Observed, settings: &DecisionSettings, timers: &mut Timers) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut serving = BTreeSet::new();
    for (resource, volume) in volumes_with_quorum(observed) {
        let publish = match own_publication(observed, settings, resource, volume) {
            None => continue,
            Some(Err(hold)) => {
                actions.push(hold);
                continue;
            }
            Some(Ok(publish)) => publish,
        };
        serving.insert(resource.name.clone());
        // Just promoted: the cache may not have seen the previous primary's publication yet,
        // and still show this node's own from before; a freshly listed cache holds.
        let promoted = timers.serving.as_ref().is_some_and(|s| !s.contains(&resource.name));
        let differs = volume.service_endpoint.as_deref() != publish.published_endpoint();
        if !(promoted || differs) {
            continue;
        }
        if !promoted && let Some(mover) = newer_move_by_another(observed, timers, resource, volume) {
            actions.push(hold(
                observed,
                resource,
                volume,
                format!(
                    "node {mover} moved the endpoint after this node's last publication, and this node's DRBD state has not changed since: it may not have noticed what node {mover} noticed"
                ),
            ));
            continue;
        }
        let last = Publication {
            over_version: volume.pv_version.clone(),
            view: resource.clone(),
        };
        timers.published.insert(resource.name.clone(), last);
        actions.push(publish);
    }
    timers.serving = Some(serving);
    timers.published.retain(|name, _| observed.volumes.contains_key(name));
    actions
}

/// The node that moved the endpoint away after this node's last publication, if this node's
/// DRBD view of the resource is still the one that publication was decided over. A publication
/// that failed left the PV at the version it was decided over: no newer move, it is retried.
fn newer_move_by_another<'a>(
    observed: &Observed,
    timers: &Timers,
    resource: &Resource,
    volume: &'a VolumeView,
) -> Option<&'a str> {
    let mover = volume.moved_by.as_deref().filter(|n| *n != observed.node)?;
    let last = timers.published.get(&resource.name)?;
    (last.view == *resource && last.over_version != volume.pv_version).then_some(mover)
}

/// The publication of this node's NFS endpoint, when it should serve the shared volume: it is
/// the DRBD primary, every local device has quorum and no peer is primary. An isolated node
/// never qualifies. `Err`: it should, but cannot (no address of the Service's family).
fn own_publication(
    observed: &Observed,
    settings: &DecisionSettings,
    resource: &Resource,
    volume: &VolumeView,
) -> Option<Result<Action, Action>> {
    if !(resource.is_primary() && resource.may_promote()) {
        return None;
    }
    let claim = volume.shared_claim.clone()?;
    let ip: IpAddr = observed.node_ip.as_deref()?.parse().ok()?;
    let Some(ip) = address_of_the_services_family(observed, volume, ip) else {
        let why = format!(
            "the Service serves {} and node {} has no such address (status.addresses); a Service cannot change its address family",
            family_of(volume).unwrap_or("its family"),
            observed.node
        );
        return Some(Err(hold(observed, resource, volume, why)));
    };
    Some(Ok(Action::PublishServiceEndpoint {
        pv: volume.pv.clone(),
        claim,
        endpoint: NfsEndpoint::new(ip, volume.nfs_port.unwrap_or(settings.nfs_port)).to_string(),
        over_version: volume.pv_version.clone(),
    }))
}

/// `ip`, or, when the published endpoint is of the other family, this node's first address of
/// the published one: the volume's Service keeps the family it was created with.
fn address_of_the_services_family(observed: &Observed, volume: &VolumeView, ip: IpAddr) -> Option<IpAddr> {
    let Some(published) = published_ip(volume) else {
        return Some(ip);
    };
    if published.is_ipv4() == ip.is_ipv4() {
        return Some(ip);
    }
    observed
        .nodes
        .get(&observed.node)?
        .addresses
        .iter()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(|a| a.is_ipv4() == published.is_ipv4())
}

fn published_ip(volume: &VolumeView) -> Option<IpAddr> {
    Some(volume.service_endpoint.as_deref()?.parse::<NfsEndpoint>().ok()?.ip)
}

fn family_of(volume: &VolumeView) -> Option<&'static str> {
    published_ip(volume).map(|ip| if ip.is_ipv4() { "IPv4" } else { "IPv6" })
}

fn hold(observed: &Observed, resource: &Resource, volume: &VolumeView, why: String) -> Action {
    Action::HoldPublication {
        node: observed.node.clone(),
        resource: resource.name.clone(),
        pv: volume.pv.clone(),
        why,
    }
}

/// Publications of every shared volume this node serves, whatever is published now: the
/// periodic resync repairs what was changed behind our back, but not another node's newer move
/// over this node's unchanged view (see [`publications`]).
pub fn republish(observed: &Observed, settings: &DecisionSettings, timers: &Timers) -> Vec<Action> {
    volumes_with_quorum(observed)
        .filter(|(resource, volume)| newer_move_by_another(observed, timers, resource, volume).is_none())
        .filter_map(|(resource, volume)| own_publication(observed, settings, resource, volume)?.ok())
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
            kinds(&republish(&published, &settings(), &Timers::new())),
            ["publish pvc-1 10.0.0.2:2049"]
        );
        assert!(republish(&isolated, &settings(), &Timers::new()).is_empty());
        // A volume published nowhere yet takes the node's address as it is.
        let mut ipv6 = primary;
        ipv6.node_ip = Some("fd00::2".into());
        ipv6.volumes.get_mut("pvc-1").unwrap().service_endpoint = None;
        assert_eq!(
            kinds(&decide(&ipv6, &settings(), &mut Timers::new(), Instant::now())),
            ["publish pvc-1 [fd00::2]:2049"]
        );
    }

    #[test]
    fn a_volume_with_its_own_nfs_port_is_published_on_it() {
        let mut primary = primary_lost();
        primary.drbd.resources[0] = resource("Primary", true, &[("node-a", "Connecting", "Unknown")]);
        let volume = primary.volumes.get_mut("pvc-1").unwrap();
        volume.attachments.clear();
        volume.pods.clear();
        volume.nfs_port = Some(20491);
        assert_eq!(
            kinds(&decide(&primary, &settings(), &mut Timers::new(), Instant::now())),
            ["publish pvc-1 10.0.0.2:20491"]
        );
    }

    #[test]
    fn no_republishing_over_another_nodes_newer_move_while_this_view_stands() {
        // Node b is primary with quorum in its own view and published itself over version 1.
        let mut mine = served_from_here("Primary");
        mine.volumes.get_mut("pvc-1").unwrap().pods.clear();
        let mut timers = Timers::new();
        let now = Instant::now();
        decide(&mine, &settings(), &mut timers, now);
        let mut stale = mine.clone();
        stale.volumes.get_mut("pvc-1").unwrap().service_endpoint = Some("10.0.0.1:2049".into());
        assert_eq!(
            kinds(&decide(&stale, &settings(), &mut timers, now)),
            ["publish pvc-1 10.0.0.2:2049"],
            "drift nobody stamped is repaired"
        );
        // Then node a moved it to itself (stamped, a newer PV version); b's DRBD view is as it was
        // when b published: b has not noticed what a noticed, and holds.
        let mut moved_away = stale.clone();
        let volume = moved_away.volumes.get_mut("pvc-1").unwrap();
        volume.moved_by = Some("node-a".into());
        volume.pv_version = "7".into();
        assert_eq!(
            kinds(&decide(&moved_away, &settings(), &mut timers, now)),
            ["hold publication pvc-1"]
        );
        assert!(
            republish(&moved_away, &settings(), &timers).is_empty(),
            "nor at the resync"
        );
        // Once b's own view changes, it publishes again.
        let mut changed = moved_away.clone();
        changed.drbd.resources[0] = resource("Primary", true, &[("node-c", "Connected", "Secondary")]);
        assert_eq!(
            kinds(&decide(&changed, &settings(), &mut timers, now)),
            ["publish pvc-1 10.0.0.2:2049"]
        );
        // A publication of b's that failed left the PV at the version it was decided over: retried.
        let mut timers = Timers::new();
        decide(&stale, &settings(), &mut timers, now);
        let mut failed = stale.clone();
        failed.volumes.get_mut("pvc-1").unwrap().moved_by = Some("node-a".into());
        assert_eq!(
            kinds(&decide(&failed, &settings(), &mut timers, now)),
            ["publish pvc-1 10.0.0.2:2049"]
        );
    }

    #[test]
    fn a_move_keeps_the_address_family_of_the_service() {
        let mut primary = served_from_here("Primary");
        primary.volumes.get_mut("pvc-1").unwrap().service_endpoint = Some("10.0.0.1:2049".into());
        primary.node_ip = Some("fd00::2".into());
        let mut dual_stack = primary.clone();
        dual_stack.nodes.get_mut("node-b").unwrap().addresses = vec!["fd00::2".into(), "10.0.0.2".into()];
        assert_eq!(
            kinds(&decide(&dual_stack, &settings(), &mut Timers::new(), Instant::now())),
            ["publish pvc-1 10.0.0.2:2049"],
            "the node's IPv4 address, as the Service's"
        );
        let mut v6_only = primary.clone();
        v6_only.nodes.get_mut("node-b").unwrap().addresses = vec!["fd00::2".into()];
        assert_eq!(
            kinds(&decide(&v6_only, &settings(), &mut Timers::new(), Instant::now())),
            ["hold publication pvc-1"],
            "no address of the Service's family: said, nothing written"
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
