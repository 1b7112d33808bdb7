//! Publication: the node that is the DRBD primary of a shared volume, with quorum and no primary
//! peer, publishes itself as the volume's NFS service endpoint (and the endpoints follow).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::select::volumes_with_quorum;
use super::settings::DecisionSettings;
use crate::agent::action::Action;
use crate::agent::drbd::{NetOptions, Resource};
use crate::agent::report::ResourceReport;
use crate::agent::view::{HeldPublication, Observed, Publication, Timers, VolumeView};
use crate::volume::NfsEndpoint;

/// Publications this node owes now; `timers` remembers which volumes it serves, so that a node
/// just promoted publishes even when its cache still shows its own endpoint from before, and what
/// it last published over which DRBD view, so that it does not publish back over another node's
/// newer move while its own view has not changed (the side of a partition whose DRBD has not
/// noticed it yet). Such a hold ends when the mover states it is no longer Primary with quorum,
/// and in any case once [`hold_limit`] has passed.
pub(super) fn publications(
    observed: &Observed,
    settings: &DecisionSettings,
    timers: &mut Timers,
    now: Instant,
) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut serving = BTreeSet::new();
    let mut held = BTreeSet::new();
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
        if !promoted && let Some(hold_now) = held_by(observed, settings, timers, resource, volume, now) {
            let mover = hold_now.mover;
            timers
                .held_publications
                .entry(resource.name.clone())
                .or_insert_with(|| HeldPublication {
                    since: now,
                    mover_said: hold_now.said.cloned(),
                });
            held.insert(resource.name.clone());
            let limit = hold_limit(observed, settings, resource);
            actions.push(hold(
                observed,
                resource,
                volume,
                format!(
                    "node {mover} moved the endpoint after this node's last publication, and this node's DRBD state has not changed since: it may not have noticed what node {mover} noticed; held until node {mover} states it is no longer Primary with quorum, at most {limit:?}"
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
    timers.held_publications.retain(|name, _| held.contains(name));
    actions
}

/// A hold over another node's newer move: who moved, and what its agent states of the resource.
struct Hold<'a> {
    mover: &'a str,
    said: Option<&'a ResourceReport>,
}

/// The hold of this node's publication of `resource`, if it still holds: another node moved the
/// endpoint over this node's unchanged view ([`newer_move_by_another`]), and neither has the
/// mover stated since that it lost quorum or is no longer Primary, nor has the hold lasted
/// [`hold_limit`]. A report that already said "not Primary with quorum" when the hold began may
/// be older than the move (the watches of PVs and Leases are not ordered), unless it says the
/// mover is Primary without quorum: that it can only have become after the move.
fn held_by<'a>(
    observed: &'a Observed,
    settings: &DecisionSettings,
    timers: &Timers,
    resource: &Resource,
    volume: &'a VolumeView,
    now: Instant,
) -> Option<Hold<'a>> {
    let mover = newer_move_by_another(observed, timers, resource, volume)?;
    let said = observed
        .reports
        .get(mover)
        .and_then(|r| r.report.resources.get(&resource.name));
    let began = timers.held_publications.get(&resource.name);
    if began.is_some_and(|h| now.saturating_duration_since(h.since) >= hold_limit(observed, settings, resource)) {
        return None;
    }
    let released = match said {
        Some(s) if s.primary && !s.quorum => true,
        Some(s) => !s.primary && began.is_some_and(|h| h.mover_said.as_ref() != Some(s)),
        None => false,
    };
    (!released).then_some(Hold { mover, said })
}

/// The longest a publication is held over another node's move: by then this node's DRBD has
/// noticed any silent drop of its links (the longest detection window of the resource's links),
/// and its agent has had a fail-over timeout to say so. A view unchanged after that is as good
/// as the mover's.
fn hold_limit(observed: &Observed, settings: &DecisionSettings, resource: &Resource) -> Duration {
    let window = resource
        .connections
        .iter()
        .map(|c| observed.drbd.detection_window(&resource.name, &c.name))
        .max()
        .unwrap_or_else(|| NetOptions::default().detection_window());
    window + settings.fail_over_timeout
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
    if !(resource.is_primary() && resource.quorum_without_primary_peer()) {
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
    let endpoint = NfsEndpoint::new(ip, volume.nfs_port.unwrap_or(settings.nfs_port)).to_string();
    Some(Ok(Action::PublishServiceEndpoint {
        pv: volume.pv.clone(),
        claim,
        confirm_first: volume.service_endpoint.as_deref() == Some(endpoint.as_str()),
        endpoint,
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
/// over this node's unchanged view while that holds (see [`publications`]).
pub fn republish(observed: &Observed, settings: &DecisionSettings, timers: &Timers, now: Instant) -> Vec<Action> {
    volumes_with_quorum(observed)
        .filter(|(resource, volume)| held_by(observed, settings, timers, resource, volume, now).is_none())
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
            kinds(&republish(&published, &settings(), &Timers::new(), Instant::now())),
            ["publish pvc-1 10.0.0.2:2049"]
        );
        assert!(republish(&isolated, &settings(), &Timers::new(), Instant::now()).is_empty());
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
            republish(&moved_away, &settings(), &timers, now).is_empty(),
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

    /// Node b published over version 1; node a then moved the endpoint to itself (version 7)
    /// while b's DRBD view stayed as it was: b holds. Returns b's view of that, and its timers.
    fn held_over_a_move_by_node_a(now: Instant) -> (Observed, Timers) {
        let mut mine = served_from_here("Primary");
        let volume = mine.volumes.get_mut("pvc-1").unwrap();
        volume.pods.clear();
        volume.service_endpoint = Some("10.0.0.1:2049".into());
        let mut timers = Timers::new();
        assert_eq!(
            kinds(&decide(&mine, &settings(), &mut timers, now)),
            ["publish pvc-1 10.0.0.2:2049"]
        );
        let volume = mine.volumes.get_mut("pvc-1").unwrap();
        volume.moved_by = Some("node-a".into());
        volume.pv_version = "7".into();
        (mine, timers)
    }

    fn with_report_of_a(observed: &Observed, primary: bool, quorum: bool) -> Observed {
        let mut observed = observed.clone();
        let said = report(primary, quorum, &["node-c"], &["node-b"], true);
        observed.reports.insert("node-a".into(), said);
        observed
    }

    #[test]
    fn a_held_publication_ends_when_the_mover_states_it_lost_quorum() {
        let now = Instant::now();
        let (moved_away, mut timers) = held_over_a_move_by_node_a(now);
        let serving = with_report_of_a(&moved_away, true, true);
        assert_eq!(
            kinds(&decide(&serving, &settings(), &mut timers, now)),
            ["hold publication pvc-1"]
        );
        assert_eq!(timers.held_publications.len(), 1, "the hold is counted");
        let later = now + Duration::from_secs(1);
        assert_eq!(
            kinds(&decide(&serving, &settings(), &mut timers, later)),
            ["hold publication pvc-1"],
            "a mover that states it serves keeps the hold"
        );
        let without_quorum = with_report_of_a(&moved_away, true, false);
        assert_eq!(
            kinds(&decide(&without_quorum, &settings(), &mut timers, later)),
            ["publish pvc-1 10.0.0.2:2049"],
            "a Primary without quorum cannot serve"
        );
        assert!(timers.held_publications.is_empty(), "no hold left");
    }

    #[test]
    fn a_held_publication_ends_when_the_movers_report_changes_to_not_serving() {
        let now = Instant::now();
        let (moved_away, mut timers) = held_over_a_move_by_node_a(now);
        // The report seen when the hold began may be older than the move: it does not end it.
        let stale = with_report_of_a(&moved_away, false, true);
        assert_eq!(
            kinds(&decide(&stale, &settings(), &mut timers, now)),
            ["hold publication pvc-1"]
        );
        let later = now + Duration::from_secs(1);
        assert_eq!(
            kinds(&decide(&stale, &settings(), &mut timers, later)),
            ["hold publication pvc-1"]
        );
        let serving = with_report_of_a(&moved_away, true, true);
        assert_eq!(
            kinds(&decide(&serving, &settings(), &mut timers, later)),
            ["hold publication pvc-1"]
        );
        let mut demoted = with_report_of_a(&moved_away, false, true);
        demoted
            .reports
            .get_mut("node-a")
            .unwrap()
            .report
            .resources
            .get_mut("pvc-1")
            .unwrap()
            .connected
            .clear();
        assert_eq!(
            kinds(&decide(&demoted, &settings(), &mut timers, later)),
            ["publish pvc-1 10.0.0.2:2049"],
            "stated after the hold began: node a no longer serves"
        );
    }

    #[test]
    fn a_held_publication_ends_within_the_detection_window_and_the_timeout_whatever_is_said() {
        let now = Instant::now();
        let (moved_away, mut timers) = held_over_a_move_by_node_a(now);
        let serving = with_report_of_a(&moved_away, true, true);
        decide(&serving, &settings(), &mut timers, now);
        // No net options read: DRBD's defaults, a 10.5 s window; the tests' timeout is 5 s.
        let limit = Duration::from_millis(15_500);
        let before = now + limit - Duration::from_millis(1);
        assert_eq!(
            kinds(&decide(&serving, &settings(), &mut timers, before)),
            ["hold publication pvc-1"]
        );
        assert_eq!(
            kinds(&republish(&serving, &settings(), &timers, before)),
            Vec::<String>::new(),
            "nor at the resync while it holds"
        );
        assert_eq!(
            kinds(&decide(&serving, &settings(), &mut timers, now + limit)),
            ["publish pvc-1 10.0.0.2:2049"],
            "the bound: this node's DRBD has noticed whatever it was going to"
        );
        // Silence is no reason to hold for ever either: no report at all.
        let (silent, mut timers) = held_over_a_move_by_node_a(now);
        decide(&silent, &settings(), &mut timers, now);
        assert_eq!(
            kinds(&decide(&silent, &settings(), &mut timers, now + limit)),
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
