//! Fail-over: a peer whose link to this node is down, with consumers of a volume on its node, is
//! failed over once the timeout ran out, and only when the evidence says it lost the volume (one
//! dropped link is a suspicion, not evidence) and this node's DRBD says it could take the data
//! over (its disk UpToDate, DRBD's own `may_promote`): a node DRBD outdated never fails anyone
//! over. Pods are force-deleted only on a node whose kubelet has stopped renewing its Lease. The
//! blast-radius guard refuses whole fail-overs past the limit.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Instant;

use super::select::{is_movable, volumes_with_quorum};
use super::settings::DecisionSettings;
use crate::agent::action::{Action, Cause};
use crate::agent::drbd::{CannotTakeOver, Resource, TakeOver};
use crate::agent::report::ResourceReport;
use crate::agent::view::{FailOverDone, Liveness, NodeView, Observed, PodView, Timers, VolumeView};
use crate::names::{LOST_QUORUM_TAINT, TAINT_BY_FAIL_OVER};
use crate::volume::NfsEndpoint;

/// What the evidence says about a peer whose link to this node is down.
#[derive(Clone, Debug, PartialEq)]
enum Evidence {
    /// It lost the volume: fail it over. Why, in words.
    Lost(String),
    /// It lost the volume and its agent is silent: a crashed node, whose pods cannot write (this
    /// side has the quorum) and are force-deleted at once, without waiting for NotReady.
    Crashed(String),
    /// It is alive and serving: hold. Why, in words.
    Alive(String),
}

/// Holds for peers the evidence says are alive, then the fail-overs of lost ones (each node's
/// steps taint first) past the guard. Starts and keeps the timers of disconnected peers with
/// consumers; the others reset.
pub(super) fn fail_overs(
    observed: &Observed,
    settings: &DecisionSettings,
    timers: &mut Timers,
    now: Instant,
) -> Vec<Action> {
    timers.note_readiness(&observed.nodes, &observed.unread_nodes, now);
    timers.holds_end.clear();
    let mut holds = Vec::new();
    let mut by_node: BTreeMap<String, Vec<Action>> = BTreeMap::new();
    let mut live_timers = Vec::new();
    for (resource, volume) in volumes_with_quorum(observed) {
        let Some(take_over) = weighs_fail_overs(resource) else {
            continue;
        };
        for peer in resource.connections.iter().filter(|c| !c.is_connected()) {
            let node = observed.kube_node(&peer.name);
            let key = (resource.name.clone(), peer.name.clone());
            let under_way = timers.fail_over.contains_key(&key) || tainted_by_fail_over(observed, node);
            let starts = writes_there(volume, node) || orphan_attachment_on_lost_node(observed, volume, node);
            if !(starts || under_way && still_holds(volume, node)) {
                continue;
            }
            let started = *timers.fail_over.entry(key.clone()).or_insert(now);
            live_timers.push(key);
            if now.duration_since(started) < settings.fail_over_timeout {
                continue;
            }
            // A node we know nothing of (neither cached nor found when read fresh) does not
            // exist: there is nothing to fail over, and it is never taken for NotReady.
            let Some(node) = observed.nodes.get(node) else { continue };
            let suspicion = Suspicion {
                resource,
                node,
                peer: &peer.name,
                seen: started,
                not_ready_since: timers.not_ready_since.get(&node.name).copied(),
            };
            let verdict = match &take_over {
                Ok(_) => evidence(observed, settings, &suspicion, now),
                Err(cannot) => Evidence::Alive(format!(
                    "{cannot}: the peer may be Primary and writing without this node, which could not take the data over"
                )),
            };
            match &verdict {
                Evidence::Alive(evidence) => {
                    timers.holds_end.extend(hold_ends(observed, settings, &suspicion, now));
                    holds.push(Action::HoldFailOver {
                        node: node.name.clone(),
                        resource: resource.name.clone(),
                        pv: volume.pv.clone(),
                        evidence: evidence.clone(),
                    })
                }
                Evidence::Lost(_) | Evidence::Crashed(_) => {
                    // Evicted while its kubelet may live: force-deleted once it stops renewing,
                    // and the loop looks again right then.
                    let kubelet_silent = observed.kubelet_silent_from.get(&node.name);
                    timers.holds_end.extend(kubelet_silent.filter(|from| **from > now));
                    // Evidence of a loss comes only where this node's DRBD could take over.
                    let Ok(drbd) = &take_over else { continue };
                    let steps = steps_off(observed, settings, &suspicion, volume, (&verdict, drbd), now);
                    by_node.entry(node.name.clone()).or_default().extend(steps);
                }
            }
        }
    }
    // Timers of peers that reconnected, lost their consumers, or whose resource went away reset;
    // a peer still away whose node the fail-over tainted lost its consumers to the fail-over.
    let ended = timers.fail_over.extract_if(|key, _| !live_timers.contains(key));
    for ((resource, peer), started) in ended {
        if let Some(done) = finished(observed, &resource, &peer, now.duration_since(started)) {
            timers.fail_overs_done.push(done);
        }
    }
    holds.extend(guard_fail_overs(observed, settings, by_node));
    holds
}

/// When a hold may let go by itself, for the loop to look again right then: a late detection's
/// window passes, or the suspect goes quiet.
fn hold_ends(observed: &Observed, settings: &DecisionSettings, suspicion: &Suspicion, now: Instant) -> Vec<Instant> {
    let window = observed.drbd.detection_window(&suspicion.resource.name, suspicion.peer);
    let quiet = observed.quiet_from(&suspicion.node.name).filter(|from| *from > now);
    [Some(suspicion.seen + window + settings.report_interval), quiet]
        .into_iter()
        .flatten()
        .collect()
}

/// Whether this node weighs fail-overs of `resource`, and what its DRBD says of taking the data
/// over. A diskless replica has no data to take over, where a peer is Primary its agent decides,
/// and a node without quorum has lost the volume itself: none weighs a fail-over, nor says
/// anything of one.
fn weighs_fail_overs(resource: &Resource) -> Option<Result<TakeOver, CannotTakeOver>> {
    let take_over = resource.take_over();
    let not_a_candidate = matches!(
        take_over,
        Err(CannotTakeOver::Diskless | CannotTakeOver::PrimaryPeer | CannotTakeOver::NoQuorum)
    );
    (!not_a_candidate).then_some(take_over)
}

/// The steps that move the volume off a suspect the evidence says lost it, each noting the
/// evidence and this node's DRBD verdict. Force-deletion is for a node that cannot stop its pods
/// (NotReady, or crashed), and never while its kubelet is seen renewing: it stops an evicted pod.
fn steps_off(
    observed: &Observed,
    settings: &DecisionSettings,
    suspicion: &Suspicion,
    volume: &VolumeView,
    (verdict, drbd): (&Evidence, &TakeOver),
    now: Instant,
) -> Vec<Action> {
    let (Evidence::Lost(evidence) | Evidence::Crashed(evidence) | Evidence::Alive(evidence)) = verdict;
    let (node, resource) = (suspicion.node, suspicion.resource);
    let note = format!(
        "node {} lost DRBD resource {} ({evidence}; link down for over {:?}; DRBD here: {drbd})",
        node.name, resource.name, settings.fail_over_timeout
    );
    let cannot_run = !node.ready || matches!(verdict, Evidence::Crashed(_));
    let gone = cannot_run && observed.kubelet_renews(&node.name, now) != Some(true);
    let taint = !settings.disable_node_taints && !may_be_a_healthy_primary(observed, &node.name);
    fail_over_steps(settings, volume, node, Steps { gone, taint }, &note)
}

/// Whether this node's DRBD says that, on some resource whose link to `node` is down, a Primary
/// goes on without this node (its disk outdated, or DRBD's may_promote:no): that Primary may be
/// `node`, healthy there. A node-wide taint would say otherwise, so none is put.
fn may_be_a_healthy_primary(observed: &Observed, node: &str) -> bool {
    observed.drbd.resources.iter().any(|r| {
        let away = r
            .connections
            .iter()
            .any(|c| !c.is_connected() && observed.kube_node(&c.name) == node);
        away && matches!(
            r.take_over(),
            Err(CannotTakeOver::Disk(_) | CannotTakeOver::DrbdSaysNo(_))
        )
    })
}

/// What the steps off a node may do: force-delete (`gone`: nothing there can stop a pod) and
/// put the node-wide taint.
struct Steps {
    gone: bool,
    taint: bool,
}

/// Whether a fail-over of the volume from the peer's node may start: a running pod there writes
/// to it. Readers lose nothing a fail-over would give back.
fn writes_there(volume: &VolumeView, node: &str) -> bool {
    volume.pods.iter().any(|p| p.node == node && p.running && !p.read_only)
}

/// Whether the peer's node is NotReady and holds an attachment of the volume that no pod there
/// uses any more (deleted, or finished): the pod's replacement elsewhere waits on it (Multi-Attach)
/// until Kubernetes detaches it from the unreachable node, about six minutes later.
fn orphan_attachment_on_lost_node(observed: &Observed, volume: &VolumeView, node: &str) -> bool {
    let not_ready = observed.nodes.get(node).is_some_and(|n| !n.ready);
    not_ready
        && volume.attachments.iter().any(|a| a.node == node)
        && !volume.pods.iter().any(|p| p.node == node && !p.finished)
}

/// Whether a fail-over under way still has something to move off the peer's node: a pod that
/// has not finished, or an attachment (its steps remove them one round after another).
fn still_holds(volume: &VolumeView, node: &str) -> bool {
    volume.pods.iter().any(|p| p.node == node && !p.finished) || volume.attachments.iter().any(|a| a.node == node)
}

/// The fail-over of `resource` from `peer` as finished, when its timer ended with the peer still
/// disconnected and its node tainted by a fail-over (not a peer that came back).
fn finished(observed: &Observed, resource: &str, peer: &str, took: std::time::Duration) -> Option<FailOverDone> {
    let resource_here = observed.drbd.resources.iter().find(|r| r.name == resource)?;
    let link = resource_here.connections.iter().find(|c| c.name == peer)?;
    let node = observed.kube_node(peer);
    (!link.is_connected() && tainted_by_fail_over(observed, node)).then(|| FailOverDone {
        resource: resource.to_owned(),
        node: node.to_owned(),
        took,
    })
}

/// Whether the peer's node carries the taint a fail-over put there: the fail-over was under way
/// before this agent's timers (a restart loses them).
fn tainted_by_fail_over(observed: &Observed, node: &str) -> bool {
    observed
        .nodes
        .get(node)
        .is_some_and(|n| n.taint_value(LOST_QUORUM_TAINT) == Some(TAINT_BY_FAIL_OVER))
}

/// A peer suspected of losing a resource: the resource here, the peer's Node, the peer as DRBD
/// names it, since when this node sees its link down, and since when its Node NotReady.
struct Suspicion<'a> {
    resource: &'a Resource,
    node: &'a NodeView,
    peer: &'a str,
    seen: Instant,
    not_ready_since: Option<Instant>,
}

/// Weighs what else is known about a peer whose link to this node is down. One link is a
/// suspicion; the peer is failed over only when nothing says it still holds the volume.
///
/// Its Node being NotReady counts once this agent has seen it so for the gate, while the API
/// server answers it now: right after a control-plane outage Kubernetes marks NotReady every node
/// whose kubelet could not renew its Lease, and the kubelets set them Ready again within their
/// status period. What the peer's agent said or did not say counts only once the API server has
/// answered this agent long enough for the peers to have spoken after an outage.
fn evidence(observed: &Observed, settings: &DecisionSettings, suspicion: &Suspicion, now: Instant) -> Evidence {
    let node = suspicion.node;
    let not_ready_for = suspicion
        .not_ready_since
        .map(|since| now.saturating_duration_since(since));
    let answering = observed.api_answering_since.is_some();
    if let Some(seen) = not_ready_for.filter(|seen| answering && *seen >= settings.not_ready_counts_after) {
        return Evidence::Lost(format!("node {} has been seen not Ready for {seen:?}", node.name));
    }
    let heard_long_enough = observed
        .api_answering_since
        .is_some_and(|since| now.saturating_duration_since(since) >= settings.peers_restate_within);
    let evidence = what_the_agents_said(observed, settings, suspicion, now);
    match evidence {
        Evidence::Lost(said) | Evidence::Crashed(said) if !heard_long_enough => Evidence::Alive(format!(
            "{said}, but the API server has not answered this agent for {:?} yet: after an outage the nodes and peers may not have spoken again",
            settings.peers_restate_within
        )),
        evidence => evidence,
    }
}

/// What the peer's own agent and third nodes' agents state about a Ready peer. A live agent whose
/// report still shows the link to this node up has not spoken yet: its DRBD notices a silent
/// drop on its own clock, up to the link's detection window after ours, and the agent reports
/// within one report interval after that. Only then does its silence count.
fn what_the_agents_said(
    observed: &Observed,
    settings: &DecisionSettings,
    suspicion: &Suspicion,
    now: Instant,
) -> Evidence {
    let Suspicion {
        resource,
        node,
        peer,
        seen,
        ..
    } = *suspicion;
    let alive_report = |name: &str| observed.alive_report(name, &resource.name);
    // A node whose agent and kubelet both stopped renewing said nothing since: what it said
    // before holds nothing, and third nodes alone can speak for it.
    let quiet = observed.quiet_from(&node.name).is_some_and(|from| from <= now);
    if let Some(own) = alive_report(&node.name).filter(|_| !quiet) {
        if !own.quorum {
            return Evidence::Lost("its agent reports the resource without quorum".into());
        }
        // It saw the link to us drop, and still states quorum: that was said after the drop.
        if own.disconnected.iter().any(|p| observed.is_this_node(p)) {
            let role = if own.primary { "Primary" } else { "Secondary" };
            return Evidence::Alive(format!(
                "its agent stated it is {role} with quorum after losing the link to {}",
                observed.node
            ));
        }
        let window = observed.drbd.detection_window(&resource.name, peer);
        if own.connected.iter().any(|p| observed.is_this_node(p))
            && now.saturating_duration_since(seen) < window + settings.report_interval
        {
            return Evidence::Alive(format!(
                "its agent still reports the link to {} up: its DRBD may take up to {window:?} to notice the drop (the link's net options), and its agent {:?} more to say so",
                observed.node, settings.report_interval
            ));
        }
    }
    if observed
        .reports
        .get(&node.name)
        .is_some_and(|r| r.liveness == Liveness::Unknown)
    {
        return Evidence::Alive(
            "its agent's heartbeat could not be read in this round (refused, throttled or timed out): unknown is not silent".into(),
        );
    }
    if let Some(held) = a_third_node_speaks_for_it(observed, resource, &node.name, now) {
        return held;
    }
    what_its_silence_says(observed, &node.name, now)
}

/// Whether a third node's agent says it is still connected to the suspect `node` (or last said
/// so, and could not be read this round): the suspect may be Primary with quorum through it. A
/// third node whose own agent has gone silent may say so from before; where this node's DRBD
/// itself says it could take the data over (it is the Primary, or events2 says may_promote,
/// which DRBD refuses while a Primary is reachable through any peer), its stale word holds
/// nothing.
fn a_third_node_speaks_for_it(observed: &Observed, resource: &Resource, node: &str, now: Instant) -> Option<Evidence> {
    let drbd_spoke = matches!(
        resource.take_over(),
        Ok(TakeOver::Holds | TakeOver::MayPromote(Some(_)))
    );
    let mut third_peers: Vec<&String> = observed.reports.keys().collect();
    third_peers.sort();
    for other in third_peers {
        if *other == node || *other == observed.node {
            continue;
        }
        let said = &observed.reports[other];
        if drbd_spoke && said.agent_silent_from.is_some_and(|from| from <= now) {
            continue;
        }
        let connected = |view: &ResourceReport| view.connected.iter().any(|p| observed.kube_node(p) == node);
        if observed.alive_report(other, &resource.name).is_some_and(connected) {
            return Some(Evidence::Alive(format!("node {other} is still connected to it")));
        }
        if said.liveness == Liveness::Unknown && said.report.resources.get(&resource.name).is_some_and(connected) {
            return Some(Evidence::Alive(format!(
                "node {other} last stated it is connected to it, and its heartbeat could not be read in this round"
            )));
        }
    }
    None
}

/// What a peer's agent's silence since the link dropped says, nobody speaking for it: nothing
/// when most peers' agents are silent at once; a crashed node once its kubelet stopped renewing
/// too; else a lost volume whose pods are evicted, not force-deleted (a live kubelet, or one not
/// read, is evidence of life), and only because this node's DRBD could take the data over.
fn what_its_silence_says(observed: &Observed, node: &str, now: Instant) -> Evidence {
    const SILENT: &str = "its agent has stated nothing since the link dropped";
    if let Some(many) = silent_at_once(observed) {
        return Evidence::Alive(format!(
            "{SILENT}, but {many} at once: silence that wide is the API server's trouble, not the nodes' (held until their renewals resume)"
        ));
    }
    if observed.kubelet_renews(node, now) == Some(false) {
        return Evidence::Crashed(format!("{SILENT}, and its kubelet stopped renewing its node Lease"));
    }
    Evidence::Lost(format!(
        "{SILENT}, while this node holds the quorum without it; its kubelet is not known to have stopped"
    ))
}

/// Whether most of the peers' agents read this round are silent at once (two or more, over half):
/// as Kubernetes's node-lifecycle controller holds evictions when most of a zone looks
/// unhealthy, silence that wide is taken for the API server's trouble, not the nodes'. Says how
/// many of how many.
fn silent_at_once(observed: &Observed) -> Option<String> {
    let read: Vec<Liveness> = observed
        .reports
        .iter()
        .filter(|(node, _)| **node != observed.node)
        .map(|(_, report)| report.liveness)
        .filter(|liveness| *liveness != Liveness::Unknown)
        .collect();
    let silent = read.iter().filter(|l| **l == Liveness::Expired).count();
    (silent >= 2 && 2 * silent > read.len())
        .then(|| format!("{silent} of the {} peers' agents read are silent", read.len()))
}

/// Whether the volume's NFS server listens on `node` (its service endpoint is one of the node's
/// addresses).
fn serves(volume: &VolumeView, node: &NodeView) -> bool {
    let Some(endpoint) = volume
        .service_endpoint
        .as_deref()
        .and_then(|e| e.parse::<NfsEndpoint>().ok())
    else {
        return false;
    };
    node.addresses.iter().any(|a| a.parse().ok() == Some(endpoint.ip))
}

/// The steps that move the volume off a lost peer's node, taint first. `gone`: the node is
/// NotReady, or crashed as far as its silence says: no kubelet will finish an eviction, so its
/// pods are force-deleted and the attachment released in the same round.
fn fail_over_steps(
    settings: &DecisionSettings,
    volume: &VolumeView,
    node: &NodeView,
    allowed: Steps,
    note: &str,
) -> Vec<Action> {
    let Steps { gone, taint } = allowed;
    // Clients of a shared volume reach it over the ClusterIP, not DRBD: on a Ready node only
    // the side that holds DRBD open, the NFS server, is failed over (silent agent or not).
    if volume.shared_claim.is_some() && node.ready && !serves(volume, node) {
        return Vec::new();
    }
    let mut steps = Vec::new();
    if taint && !node.has_taint(LOST_QUORUM_TAINT) {
        steps.push(Action::Taint {
            node: node.name.clone(),
            key: LOST_QUORUM_TAINT,
            value: TAINT_BY_FAIL_OVER,
            cause: Cause::FailOver,
            note: note.to_owned(),
        });
    }
    let holders: Vec<&PodView> = volume
        .pods
        .iter()
        .filter(|p| p.node == node.name && !p.finished)
        .collect();
    let (movable, left_alone): (Vec<&PodView>, Vec<&PodView>) =
        holders.into_iter().partition(|p| is_movable(p, settings));
    if !gone {
        for pod in movable.iter().filter(|p| !p.terminating) {
            steps.push(Action::Evict {
                pod: (*pod).into(),
                cause: Cause::FailOver,
                note: note.to_owned(),
            });
        }
    } else {
        // Without a kubelet to finish them, terminating pods would hold the volume forever.
        for pod in &movable {
            steps.push(Action::ForceDelete {
                pod: (*pod).into(),
                note: note.to_owned(),
            });
        }
    }
    // The attachment goes only once nothing on the node holds the volume: no pod we left alone,
    // and on a Ready node no eviction still under way (or held back by a PodDisruptionBudget).
    let still_held = !left_alone.is_empty() || (!gone && !movable.is_empty());
    if !still_held {
        for attachment in volume.attachments.iter().filter(|a| a.node == node.name) {
            steps.push(Action::DeleteAttachment {
                attachment: attachment.clone(),
                note: note.to_owned(),
            });
        }
    }
    steps
}

/// The blast-radius guard over whole fail-overs: a node whose fail-over would leave more than the
/// allowed share of storage nodes tainted or failed over is not failed over at all (one Refused
/// instead), whether or not its steps taint it. This counts the taints it can see (this node and the suspected peers); before a taint is written
/// the executor counts again from fresh reads of every storage node (`super::guard`).
fn guard_fail_overs(
    observed: &Observed,
    settings: &DecisionSettings,
    fail_overs: BTreeMap<String, Vec<Action>>,
) -> Vec<Action> {
    let storage = observed.storage_nodes();
    let mut tainted: BTreeSet<String> = storage
        .iter()
        .filter(|n| observed.has_taint(n, LOST_QUORUM_TAINT))
        .cloned()
        .collect();
    let mut actions = Vec::new();
    for (node, mut steps) in fail_overs {
        let mut seen = HashSet::new();
        steps.retain(|step| seen.insert(step.key()));
        if steps.is_empty() {
            continue;
        }
        // Every fail-over counts, tainted or not (`--disable-node-taints`, its own agent's taint
        // already there); one the guard let through before (its taint says so) goes on.
        let allowed = if tainted_by_fail_over(observed, &node) {
            Ok(())
        } else {
            guard_allows(&tainted, &node, storage.len(), settings.max_tainted_fraction)
        };
        match allowed {
            Ok(()) => {
                tainted.insert(node);
                actions.extend(steps);
            }
            Err(over) => actions.push(Action::Refused {
                action: Box::new(steps.swap_remove(0)),
                why: over.to_string(),
            }),
        }
    }
    actions
}

/// A fail-over the blast-radius guard refuses: tainting `node` would leave `after` of `total`
/// storage nodes tainted, over `max_fraction`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error(
    "failing over {node} would leave {after} of {total} storage nodes tainted {LOST_QUORUM_TAINT}, over the limit of {max_fraction}; nothing is done to it"
)]
pub struct OverLimit {
    node: String,
    after: usize,
    total: usize,
    max_fraction: f64,
}

/// Whether tainting `node` keeps the share of tainted storage nodes within the limit.
pub fn guard_allows(
    tainted: &BTreeSet<String>,
    node: &str,
    storage_nodes: usize,
    max_fraction: f64,
) -> Result<(), OverLimit> {
    let after = tainted.len() + usize::from(!tainted.contains(node));
    let total = storage_nodes.max(after).max(1);
    if after as f64 / total as f64 > max_fraction {
        return Err(OverLimit {
            node: node.to_owned(),
            after,
            total,
            max_fraction,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::*;
    use super::*;
    use crate::agent::drbd::PromotionWord;

    #[test]
    fn fails_over_a_lost_peer_only_after_the_timeout() {
        let t0 = Instant::now();
        let mut timers = Timers::new();
        let observed = primary_lost();
        assert!(decide(&observed, &settings(), &mut timers, t0).is_empty());
        assert!(decide(&observed, &settings(), &mut timers, t0 + Duration::from_secs(4)).is_empty());
        let actions = decide(&observed, &settings(), &mut timers, t0 + Duration::from_secs(5));
        assert_eq!(
            kinds(&actions),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "force-delete app",
                "delete-attachment csi-att-1"
            ]
        );
        let Action::Taint { value, .. } = &actions[0] else {
            unreachable!()
        };
        assert_eq!(*value, TAINT_BY_FAIL_OVER);
    }

    #[test]
    fn a_fail_over_is_done_once_nothing_of_it_is_left_on_the_lost_node() {
        let t0 = Instant::now();
        let mut timers = Timers::new();
        let lost = primary_lost();
        decide(&lost, &settings(), &mut timers, t0);
        decide(&lost, &settings(), &mut timers, t0 + Duration::from_secs(5));
        assert!(timers.fail_overs_done.is_empty(), "steps decided, not yet seen done");
        // The cache shows the steps done: the node tainted, its pod and attachment gone.
        let mut done = lost.clone();
        done.nodes
            .extend([node_with("node-a", false, &[(LOST_QUORUM_TAINT, TAINT_BY_FAIL_OVER)])]);
        let volume = done.volumes.get_mut("pvc-1").unwrap();
        volume.pods.clear();
        volume.attachments.clear();
        decide(&done, &settings(), &mut timers, t0 + Duration::from_millis(6500));
        assert_eq!(
            timers.fail_overs_done,
            [FailOverDone {
                resource: "pvc-1".into(),
                node: "node-a".into(),
                took: Duration::from_millis(6500),
            }]
        );
        // A peer that came back was not failed over: no duration.
        let mut timers = Timers::new();
        decide(&lost, &settings(), &mut timers, t0);
        let mut back = lost.clone();
        back.drbd.resources[0].connections[0].connection_state = "Connected".into();
        decide(&back, &settings(), &mut timers, t0 + Duration::from_secs(2));
        assert!(timers.fail_overs_done.is_empty());
    }

    #[test]
    fn the_timer_resets_when_the_peer_reconnects() {
        let t0 = Instant::now();
        let mut timers = Timers::new();
        let lost = primary_lost();
        decide(&lost, &settings(), &mut timers, t0);
        let mut back = lost.clone();
        back.drbd.resources[0].connections[0].connection_state = "Connected".into();
        back.drbd.resources[0].connections[0].peer_role = "Primary".into();
        assert!(decide(&back, &settings(), &mut timers, t0 + Duration::from_secs(3)).is_empty());
        assert!(timers.fail_over.is_empty());
        // Lost again: a fresh timeout, not the remainder of the old one.
        assert!(decide(&lost, &settings(), &mut timers, t0 + Duration::from_secs(6)).is_empty());
        assert!(!decide(&lost, &settings(), &mut timers, t0 + Duration::from_secs(11)).is_empty());
    }

    #[test]
    fn one_dropped_link_is_not_evidence_enough() {
        // An agent that still speaks keeps the careful path: its pods are evicted.
        let fail_over = vec![
            "taint node-a drbd.linbit.com/lost-quorum".to_string(),
            "evict app".to_string(),
        ];
        // A silent one is taken for crashed: its pods cannot write (this side has the quorum)
        // and are force-deleted, and the attachment released at once, as the seeds do.
        let crashed = vec![
            "taint node-a drbd.linbit.com/lost-quorum".to_string(),
            "force-delete app".to_string(),
            "delete-attachment csi-att-1".to_string(),
        ];
        let hold = vec!["hold node-a".to_string()];
        type Case = (&'static str, Vec<(&'static str, PeerReport)>, Vec<String>);
        let cases: Vec<Case> = vec![
            ("a's agent silent (no report)", vec![], crashed.clone()),
            (
                "a re-asserts Primary with quorum after losing b",
                vec![("node-a", report(true, true, &["node-c"], &["node-b"], true))],
                hold.clone(),
            ),
            (
                "a's last report is from before the drop: its DRBD may not have noticed yet",
                vec![("node-a", report(true, true, &["node-b", "node-c"], &[], true))],
                hold.clone(),
            ),
            (
                "a reports its quorum lost",
                vec![("node-a", report(true, false, &[], &["node-b", "node-c"], true))],
                fail_over.clone(),
            ),
            (
                "a's Lease expired: its report no longer counts",
                vec![("node-a", report(true, true, &["node-c"], &["node-b"], false))],
                crashed.clone(),
            ),
            (
                "node c still sees a connected",
                vec![("node-c", report(false, true, &["node-a", "node-b"], &[], true))],
                hold.clone(),
            ),
            (
                "node c lost a too",
                vec![("node-c", report(false, true, &["node-b"], &["node-a"], true))],
                crashed.clone(),
            ),
        ];
        for (case, reports, expected) in cases {
            let mut observed = kubelet_stopped(link_lost());
            observed.reports = reports.into_iter().map(|(n, r)| (n.to_string(), r)).collect();
            let alive = if expected == crashed {
                fail_over.clone()
            } else {
                expected.clone()
            };
            decided_whatever_the_kubelet(case, &observed, &expected, &alive);
        }
        let mut not_ready = primary_lost();
        not_ready.reports = [("node-a".to_string(), report(true, true, &["node-c"], &["node-b"], true))].into();
        assert_eq!(
            after_timeout(&not_ready, &settings())[0],
            "taint node-a drbd.linbit.com/lost-quorum",
            "a NotReady node is lost whatever it said"
        );
    }

    /// `expected` with node a's kubelet stopped, and `alive` with it renewing or not read: a live
    /// kubelet is evidence of life, so nothing is force-deleted on its node, and a silent agent's
    /// pods are evicted (this node's DRBD holds the data without it).
    fn decided_whatever_the_kubelet(case: &str, stopped: &Observed, expected: &[String], alive: &[String]) {
        assert_eq!(after_timeout(stopped, &settings()), expected, "{case}");
        let renewing = kubelet_renewing(stopped.clone());
        assert_eq!(
            after_timeout(&renewing, &settings()),
            alive,
            "{case}, its kubelet renewing"
        );
        let mut unread = stopped.clone();
        unread.kubelet_silent_from.clear();
        assert_eq!(
            after_timeout(&unread, &settings()),
            alive,
            "{case}, its kubelet not read"
        );
    }

    /// The loop wakes when a late detection's hold lets go, not at its next interval: the
    /// benchmark's P3s saw a crashed node failed over 4.3 s after its hold ended (a 5 s interval).
    #[test]
    fn a_hold_for_late_detection_wakes_the_loop_when_it_ends() {
        let mut observed = link_lost();
        observed.reports = [(
            "node-a".to_string(),
            report(true, true, &["node-b", "node-c"], &[], true),
        )]
        .into();
        let settings = settings();
        let (mut timers, t0) = (Timers::new(), Instant::now());
        decide(&observed, &settings, &mut timers, t0);
        let held = decide(&observed, &settings, &mut timers, t0 + settings.fail_over_timeout);
        assert_eq!(kinds(&held), ["hold node-a"]);
        let window = observed.drbd.detection_window("pvc-1", "node-a");
        let end = t0 + window + settings.report_interval;
        assert!(
            timers
                .deadlines(settings.fail_over_timeout, settings.not_ready_counts_after)
                .any(|d| d == end),
            "the loop wakes when the hold ends"
        );
    }

    #[test]
    fn a_peer_still_reporting_the_link_up_has_until_drbds_detection_window_to_speak() {
        // b's DRBD noticed the drop at t0; a's notices it on its own clock, up to the detection
        // window later (ping-int 10 s + ping-timeout 0.5 s by default), and its agent reports it
        // within one report interval after that.
        let settings = DecisionSettings {
            report_interval: Duration::from_secs(2),
            ..settings()
        };
        let mut not_yet = kubelet_stopped(link_lost());
        not_yet.reports = [(
            "node-a".to_string(),
            report(true, true, &["node-b", "node-c"], &[], true),
        )]
        .into();
        let at =
            |observed: &Observed, seconds: f64| decided_after(observed, &settings, Duration::from_secs_f64(seconds));
        assert_eq!(at(&not_yet, 5.0), ["hold node-a"], "5 s: a may not have noticed yet");
        assert_eq!(at(&not_yet, 12.4), ["hold node-a"], "10.5 s + 2 s not over yet");
        assert_eq!(
            at(&not_yet, 12.5),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "force-delete app",
                "delete-attachment csi-att-1"
            ],
            "past the window: its silence counts, and a silent node is taken for crashed"
        );
        // The window follows the connection's own net options, as `drbdsetup show` gives them.
        let mut slow = not_yet.clone();
        slow.drbd
            .detection_windows
            .insert(("pvc-1".into(), "node-a".into()), Duration::from_secs(20));
        assert_eq!(at(&slow, 21.0), ["hold node-a"]);
        assert_eq!(at(&slow, 22.0)[0], "taint node-a drbd.linbit.com/lost-quorum");
        // A dead agent's last report does not hold anything.
        let mut dead = not_yet.clone();
        dead.reports.get_mut("node-a").unwrap().liveness = Liveness::Expired;
        assert_eq!(at(&dead, 5.0)[0], "taint node-a drbd.linbit.com/lost-quorum");
    }

    /// A crashed node: its last report still shows the link up (it said nothing since), but its
    /// agent and its kubelet both stopped renewing their Leases. Its silence counts from then, not
    /// from the end of the link's detection window (P3s: 15.8 s after the survivors' detection).
    #[test]
    fn a_node_whose_agent_and_kubelet_went_quiet_fails_over_at_the_timeout() {
        let settings = settings();
        let crashed_at = |quiet_after: Duration| {
            let mut observed = link_lost();
            let (t0, mut timers) = (Instant::now(), Timers::new());
            let mut said = report(true, true, &["node-b", "node-c"], &[], true);
            said.quiet_from = Some(t0 + quiet_after);
            observed.reports = [("node-a".to_string(), said)].into();
            observed.kubelet_silent_from.insert("node-a".into(), t0 + quiet_after);
            decide(&observed, &settings, &mut timers, t0);
            (observed, timers, t0)
        };
        let (observed, mut timers, t0) = crashed_at(Duration::from_secs(3));
        assert_eq!(
            kinds(&decide(
                &observed,
                &settings,
                &mut timers,
                t0 + settings.fail_over_timeout
            )),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "force-delete app",
                "delete-attachment csi-att-1"
            ],
            "quiet before the timeout ran out: failed over as soon as it did"
        );
        // Quiet only later: held until then, and the loop wakes right then.
        let (observed, mut timers, t0) = crashed_at(Duration::from_secs(8));
        let held = decide(&observed, &settings, &mut timers, t0 + settings.fail_over_timeout);
        assert_eq!(kinds(&held), ["hold node-a"]);
        let quiet = t0 + Duration::from_secs(8);
        let deadlines = timers.deadlines(settings.fail_over_timeout, settings.not_ready_counts_after);
        assert!(
            deadlines.collect::<Vec<_>>().contains(&quiet),
            "the loop wakes when it goes quiet"
        );
        assert_eq!(
            kinds(&decide(&observed, &settings, &mut timers, quiet))[0],
            "taint node-a drbd.linbit.com/lost-quorum"
        );
    }

    /// Quiet is not enough where another node still speaks for it: a node cut off from the API
    /// server, whose DRBD still reaches a third node, may be Primary with quorum through it.
    #[test]
    fn a_quiet_node_a_third_node_is_still_connected_to_is_held() {
        let mut observed = link_lost();
        let mut said = report(true, true, &["node-b", "node-c"], &["node-b"], true);
        said.quiet_from = Some(Instant::now());
        let c_said = report(false, true, &["node-a"], &["node-b"], true);
        observed.reports = [("node-a".to_string(), said), ("node-c".to_string(), c_said)].into();
        assert_eq!(
            decided_after(&observed, &settings(), Duration::from_secs(60)),
            ["hold node-a"],
            "however long the link stays down"
        );
    }

    #[test]
    fn a_peer_whose_heartbeat_cannot_be_read_is_unknown_never_dead() {
        // a's Lease reads were refused or throttled this round: nothing is known of its agent.
        let mut unread = link_lost();
        let mut said = report(true, true, &["node-b", "node-c"], &[], true);
        said.liveness = Liveness::Unknown;
        unread.reports = [("node-a".to_string(), said)].into();
        assert_eq!(
            decided_after(&unread, &settings(), Duration::from_secs(60)),
            ["hold node-a"],
            "however long the link stays down"
        );
        // Nor does an unread third peer that was connected to it count as gone.
        let mut third = link_lost();
        let mut c_said = report(false, true, &["node-a", "node-b"], &[], true);
        c_said.liveness = Liveness::Unknown;
        third.reports = [("node-c".to_string(), c_said)].into();
        assert_eq!(
            decided_after(&third, &settings(), Duration::from_secs(60)),
            ["hold node-a"]
        );
        // Kubernetes's own word still counts: NotReady fails it over, reads refused or not.
        let mut not_ready = unread.clone();
        not_ready.nodes.get_mut("node-a").unwrap().ready = false;
        assert_eq!(
            after_timeout(&not_ready, &settings())[0],
            "taint node-a drbd.linbit.com/lost-quorum"
        );
    }

    #[test]
    fn a_ready_peers_silence_counts_only_once_the_api_server_answered_long_enough() {
        let settings = DecisionSettings {
            peers_restate_within: Duration::from_secs(10),
            ..settings()
        };
        let t0 = Instant::now();
        let at = |observed: &Observed, seconds: u64| decided_after(observed, &settings, Duration::from_secs(seconds));
        let mut silent = kubelet_stopped(link_lost());
        silent.api_answering_since = Some(t0);
        assert_eq!(at(&silent, 5), ["hold node-a"], "answering for 5 s of 10");
        assert_eq!(
            at(&silent, 10),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "force-delete app",
                "delete-attachment csi-att-1"
            ],
            "answering for 10 s: the peer had time to speak"
        );
        silent.api_answering_since = None;
        assert_eq!(at(&silent, 60), ["hold node-a"], "not answering now");
        // A stated loss of quorum waits the same. (A NotReady node has a gate of its own: see
        // `not_ready_counts_once_seen_for_the_gate_whatever_the_api_servers_answers_did_meanwhile`.)
        let mut says_lost = silent.clone();
        says_lost.reports = [(
            "node-a".to_string(),
            report(true, false, &[], &["node-b", "node-c"], true),
        )]
        .into();
        assert_eq!(at(&says_lost, 60), ["hold node-a"]);
    }

    /// NotReady counts once this agent has seen it for the gate, on its own clock, without a Ready
    /// read between: not sooner because the API server has answered for long (a node marked
    /// NotReady by a control-plane outage is Ready again within the kubelet's status period), and
    /// not never because some of this agent's calls fail (a flaky API).
    #[test]
    fn not_ready_counts_once_seen_for_the_gate_whatever_the_api_servers_answers_did_meanwhile() {
        let settings = DecisionSettings {
            peers_restate_within: Duration::from_secs(10),
            not_ready_counts_after: Duration::from_secs(20),
            ..settings()
        };
        // A NotReady node whose agent states it is Primary with quorum past the drop: only the
        // NotReady can make it lost.
        let mut observed = primary_lost();
        observed.reports = [("node-a".to_string(), report(true, true, &["node-c"], &["node-b"], true))].into();
        let t0 = Instant::now();
        let at = |timers: &mut Timers, observed: &Observed, seconds: u64| {
            kinds(&decide(observed, &settings, timers, t0 + Duration::from_secs(seconds)))
        };

        let mut answering_for_long = observed.clone();
        answering_for_long.api_answering_since = Some(t0 - Duration::from_secs(3600));
        let mut timers = Timers::new();
        assert!(
            at(&mut timers, &answering_for_long, 0).is_empty(),
            "the fail-over timer starts"
        );
        for second in [5, 10, 19] {
            assert_eq!(
                at(&mut timers, &answering_for_long, second),
                ["hold node-a"],
                "NotReady seen for {second} s"
            );
        }
        assert_eq!(
            at(&mut timers, &answering_for_long, 20)[0],
            "taint node-a drbd.linbit.com/lost-quorum"
        );

        // Every other call fails: the last one answered, NotReady seen for the gate.
        let mut timers = Timers::new();
        let mut flaky = observed.clone();
        for second in 0..=20 {
            flaky.api_answering_since = Some(t0 + Duration::from_secs(second));
            let decided = at(&mut timers, &flaky, second);
            if second < settings.fail_over_timeout.as_secs() {
                continue;
            }
            let expected = if second < 20 {
                "hold node-a"
            } else {
                "taint node-a drbd.linbit.com/lost-quorum"
            };
            assert_eq!(decided[0], expected, "flaky API, NotReady seen for {second} s");
        }
        flaky.api_answering_since = None;
        assert_eq!(at(&mut timers, &flaky, 30), ["hold node-a"], "not answering now: blind");

        // A Ready read between starts the count again.
        let mut timers = Timers::new();
        at(&mut timers, &answering_for_long, 0);
        let mut ready_again = answering_for_long.clone();
        ready_again.nodes.get_mut("node-a").unwrap().ready = true;
        at(&mut timers, &ready_again, 15);
        at(&mut timers, &answering_for_long, 16);
        assert_eq!(
            at(&mut timers, &answering_for_long, 35),
            ["hold node-a"],
            "NotReady again for 19 s"
        );
        assert_eq!(
            at(&mut timers, &answering_for_long, 36)[0],
            "taint node-a drbd.linbit.com/lost-quorum"
        );
    }

    #[test]
    fn ready_nodes_get_evictions_and_protected_pods_keep_the_attachment() {
        let mut observed = link_lost_speaking();
        let pods = &mut observed.volumes.get_mut("pvc-1").unwrap().pods;
        pods.push(PodView {
            ignore_fail_over: true,
            ..pod("ignored", "node-a")
        });
        pods.push(PodView {
            has_owner: false,
            ..pod("bare", "node-a")
        });
        pods.push(PodView {
            unsafe_volumes: true,
            ..pod("hostpath", "node-a")
        });
        pods.push(PodView {
            read_only: true,
            ..pod("reader", "node-a")
        });
        assert_eq!(
            after_timeout(&observed, &settings()),
            ["taint node-a drbd.linbit.com/lost-quorum", "evict app"]
        );
        let unsafe_ok = DecisionSettings {
            fail_over_unsafe_pods: true,
            ..settings()
        };
        assert!(after_timeout(&observed, &unsafe_ok).contains(&"evict hostpath".to_string()));
    }

    #[test]
    fn the_attachment_goes_only_once_nothing_holds_the_volume() {
        // Ready node: evictions first; the attachment once the evicted pods are gone.
        let mut evicting = link_lost_speaking();
        assert!(
            !after_timeout(&evicting, &settings())
                .iter()
                .any(|a| a.starts_with("delete-attachment"))
        );
        evicting.volumes.get_mut("pvc-1").unwrap().pods[0].terminating = true;
        assert!(
            !after_timeout(&evicting, &settings())
                .iter()
                .any(|a| a.starts_with("delete-attachment"))
        );
        evicting.volumes.get_mut("pvc-1").unwrap().pods.clear();
        assert_eq!(
            continued(&link_lost_speaking(), &evicting, &settings()),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "delete-attachment csi-att-1"
            ]
        );
        // NotReady node: an ignored pod keeps it, finished pods do not.
        let mut ignored = primary_lost();
        ignored.volumes.get_mut("pvc-1").unwrap().pods.push(PodView {
            ignore_fail_over: true,
            ..pod("ignored", "node-a")
        });
        assert_eq!(
            after_timeout(&ignored, &settings()),
            ["taint node-a drbd.linbit.com/lost-quorum", "force-delete app"]
        );
        let mut finished = primary_lost();
        finished.volumes.get_mut("pvc-1").unwrap().pods[0] = PodView {
            running: false,
            finished: true,
            ..pod("job", "node-a")
        };
        assert_eq!(
            continued(&primary_lost(), &finished, &settings()),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "delete-attachment csi-att-1"
            ]
        );
    }

    #[test]
    fn a_writer_or_a_dead_pods_attachment_on_the_peer_starts_a_fail_over() {
        let mut readers = primary_lost();
        for pod in &mut readers.volumes.get_mut("pvc-1").unwrap().pods {
            pod.read_only = true;
        }
        let mut attachment_alone = primary_lost();
        attachment_alone.volumes.get_mut("pvc-1").unwrap().pods.clear();
        let mut finished = primary_lost();
        finished.volumes.get_mut("pvc-1").unwrap().pods[0].finished = true;
        finished.volumes.get_mut("pvc-1").unwrap().pods[0].running = false;
        let mut timers = Timers::new();
        assert!(after_timeout(&readers, &settings()).is_empty(), "readers only");
        decide(&readers, &settings(), &mut timers, Instant::now());
        assert!(timers.fail_over.is_empty(), "readers only: no timer");
        // The attachment of a pod already gone (deleted, or finished) on a lost node holds the
        // volume for Kubernetes's six minutes (Multi-Attach): it is removed.
        for (case, observed) in [
            ("an attachment without a pod", &attachment_alone),
            ("an attachment and a finished pod", &finished),
        ] {
            assert_eq!(
                after_timeout(observed, &settings()),
                [
                    "taint node-a drbd.linbit.com/lost-quorum",
                    "delete-attachment csi-att-1"
                ],
                "{case}"
            );
        }
        // A fail-over under way before this agent restarted (its taint is there) still removes
        // the attachment it left.
        attachment_alone
            .nodes
            .get_mut("node-a")
            .unwrap()
            .taints
            .insert(LOST_QUORUM_TAINT.into(), TAINT_BY_FAIL_OVER.into());
        assert_eq!(
            after_timeout(&attachment_alone, &settings()),
            ["delete-attachment csi-att-1"]
        );
        // On a Ready node whose agent is silent, an attachment alone is Kubernetes's to detach.
        let mut ready = link_lost();
        ready.volumes.get_mut("pvc-1").unwrap().pods.clear();
        assert!(
            after_timeout(&ready, &settings()).is_empty(),
            "a Ready node's attachment"
        );
    }

    #[test]
    fn nfs_clients_on_a_ready_node_are_left_alone() {
        // Node a runs clients of the shared volume, whose NFS server is node c.
        let mut clients = link_lost();
        clients.volumes.get_mut("pvc-1").unwrap().service_endpoint = Some("10.0.0.3:2049".into());
        assert!(after_timeout(&clients, &settings()).is_empty());
        // On a NotReady node they are force-deleted as before.
        clients.nodes.insert("node-a".into(), node("node-a", false, &[]).1);
        assert_eq!(
            after_timeout(&clients, &settings()),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "force-delete app",
                "delete-attachment csi-att-1"
            ]
        );
        // A volume that is not shared is held by its consumers: they are moved.
        let mut rwo = link_lost_speaking();
        let volume = rwo.volumes.get_mut("pvc-1").unwrap();
        volume.shared_claim = None;
        volume.service_endpoint = None;
        assert_eq!(
            after_timeout(&rwo, &settings()),
            ["taint node-a drbd.linbit.com/lost-quorum", "evict app"]
        );
    }

    #[test]
    fn a_node_nobody_knows_is_not_failed_over() {
        let mut observed = primary_lost();
        observed.nodes.remove("node-a");
        assert!(after_timeout(&observed, &settings()).is_empty());
    }

    #[test]
    fn no_fail_over_without_quorum_or_consumers_or_pv() {
        let mut no_quorum = primary_lost();
        no_quorum.drbd.resources[0].devices[0].quorum = false;
        let mut no_devices = primary_lost();
        no_devices.drbd.resources[0].devices.clear();
        let mut no_consumers = primary_lost();
        let volume = no_consumers.volumes.get_mut("pvc-1").unwrap();
        volume.pods.clear();
        volume.attachments.clear();
        let mut no_pv = primary_lost();
        no_pv.volumes.clear();
        let mut not_quorum_enabled = primary_lost();
        not_quorum_enabled.drbd.quorum_enabled.clear();
        for (case, observed, expected) in [
            ("no quorum", no_quorum, vec!["taint node-b drbd.linbit.com/lost-quorum"]),
            (
                "no devices",
                no_devices,
                vec!["taint node-b drbd.linbit.com/lost-quorum"],
            ),
            ("no consumers", no_consumers, vec![]),
            ("no PV", no_pv, vec![]),
            ("quorum not enabled", not_quorum_enabled, vec![]),
        ] {
            assert_eq!(after_timeout(&observed, &settings()), expected, "{case}");
        }
    }

    #[test]
    fn satellite_pods_map_drbd_names_to_nodes() {
        let mut observed = primary_lost();
        observed.drbd.resources[0].connections[0].name = "linstor-a".into();
        observed.satellite_nodes.insert("linstor-a".into(), "node-a".into());
        assert_eq!(
            after_timeout(&observed, &settings())[0],
            "taint node-a drbd.linbit.com/lost-quorum"
        );
    }

    #[test]
    fn the_guard_refuses_the_whole_fail_over_past_the_fraction() {
        let mut observed = primary_lost();
        observed
            .nodes
            .insert("node-c".into(), node("node-c", true, &[LOST_QUORUM_TAINT]).1);
        assert_eq!(
            after_timeout(&observed, &settings()),
            ["refused taint node-a drbd.linbit.com/lost-quorum"],
            "no force-delete and no attachment deletion either"
        );
        // Nodes outside the storage nodes (no agent, no DRBD peer) do not dilute the fraction.
        for extra in ["node-d", "node-e", "node-f"] {
            observed.nodes.insert(extra.into(), node(extra, true, &[]).1);
        }
        assert_eq!(after_timeout(&observed, &settings()).len(), 1);
        observed.agent_nodes = ["node-d", "node-e", "node-f"].map(String::from).into();
        assert_eq!(
            after_timeout(&observed, &settings())[0],
            "taint node-a drbd.linbit.com/lost-quorum",
            "2 of 6 storage nodes"
        );
    }

    #[test]
    fn the_guard_counts_fail_overs_not_taints() {
        // Node c already failed over: 2 of 3 storage nodes would be, over 0.5.
        let mut observed = primary_lost();
        observed
            .nodes
            .insert("node-c".into(), node("node-c", true, &[LOST_QUORUM_TAINT]).1);
        let quiet = DecisionSettings {
            disable_node_taints: true,
            ..settings()
        };
        assert_eq!(
            after_timeout(&observed, &quiet),
            ["refused force-delete app"],
            "without taints, the fail-over is still counted and refused whole"
        );
        // Node a already carries the taint: counted once, and its other steps still pass only
        // within the limit.
        observed
            .nodes
            .insert("node-a".into(), node("node-a", false, &[LOST_QUORUM_TAINT]).1);
        assert_eq!(
            after_timeout(&observed, &settings()),
            ["refused force-delete app"],
            "a and c tainted: 2 of 3"
        );
    }

    #[test]
    fn the_guard_counts_tainted_and_reserved_nodes() {
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        assert!(guard_allows(&set(&[]), "a", 6, 0.5).is_ok());
        assert!(guard_allows(&set(&["b", "c"]), "a", 6, 0.5).is_ok());
        assert!(guard_allows(&set(&["b", "c", "d"]), "a", 6, 0.5).is_err());
        assert!(
            guard_allows(&set(&["a", "b", "c"]), "a", 6, 0.5).is_ok(),
            "already counted"
        );
        assert!(guard_allows(&set(&[]), "a", 1, 0.5).is_err());
        assert!(guard_allows(&set(&[]), "a", 0, 1.0).is_ok());
    }

    #[test]
    fn terminating_pods_on_a_dead_node_are_force_deleted() {
        let mut observed = primary_lost();
        observed.volumes.get_mut("pvc-1").unwrap().pods[0].terminating = true;
        assert!(after_timeout(&observed, &settings()).contains(&"force-delete app".to_string()));
    }

    /// Kinds and the hold's evidence of the actions decided past the timeout, and for a minute.
    fn held_for_a_minute(observed: &Observed) -> Vec<String> {
        let settings = settings();
        for elapsed in [settings.fail_over_timeout, Duration::from_secs(60)] {
            let decided = decided_after(observed, &settings, elapsed);
            assert!(
                decided.iter().all(|a| a.starts_with("hold")),
                "{decided:?} after {elapsed:?}"
            );
        }
        let (t0, mut timers) = (Instant::now(), Timers::new());
        decide(observed, &settings, &mut timers, t0);
        decide(observed, &settings, &mut timers, t0 + Duration::from_secs(60))
            .iter()
            .map(|a| match a {
                Action::HoldFailOver { evidence, .. } => evidence.clone(),
                other => panic!("not a hold: {other:?}"),
            })
            .collect()
    }

    /// The strongest case for a fail-over (the peer NotReady, its agent and kubelet silent):
    /// still nothing while this node's DRBD could not take the data over, and said so.
    #[test]
    fn a_node_that_could_not_take_the_data_over_never_fails_anyone_over() {
        let lost = kubelet_stopped(primary_lost());
        let with = |change: &dyn Fn(&mut Resource)| {
            let mut observed = lost.clone();
            change(&mut observed.drbd.resources[0]);
            observed
        };
        let outdated = with(&|r| r.devices[0].disk_state = "Outdated".into());
        let inconsistent = with(&|r| r.devices[0].disk_state = "Inconsistent".into());
        let drbd_says_no = with(&|r| {
            r.drbd_says = Some(PromotionWord {
                may_promote: false,
                promotion_score: 10101,
            })
        });
        let suspended = with(&|r| r.suspended = true);
        for (case, observed, says) in [
            ("outdated", &outdated, "this node's disk is Outdated, not UpToDate"),
            ("inconsistent", &inconsistent, "this node's disk is Inconsistent"),
            (
                "DRBD says no",
                &drbd_says_no,
                "DRBD says may_promote:no (promotion_score 10101)",
            ),
            ("suspended", &suspended, "suspended"),
        ] {
            let evidence = held_for_a_minute(observed);
            assert!(evidence.iter().all(|e| e.contains(says)), "{case}: {evidence:?}");
        }
        // A diskless tie-breaker has nothing to take over, and a Primary peer decides for itself:
        // neither says a word.
        let diskless = with(&|r| r.devices[0].disk_state = "Diskless".into());
        let primary_peer = with(&|r| r.connections[1].peer_role = "Primary".into());
        for observed in [&diskless, &primary_peer] {
            assert!(decided_after(observed, &settings(), Duration::from_secs(60)).is_empty());
        }
        // Once DRBD would promote it (the disk resynced, may_promote:yes), the fail-over goes on,
        // and its steps name the evidence.
        let mut resynced = outdated.clone();
        resynced.drbd.resources[0].devices[0].disk_state = "UpToDate".into();
        resynced.drbd.resources[0].drbd_says = Some(PromotionWord {
            may_promote: true,
            promotion_score: 10102,
        });
        let (t0, mut timers) = (Instant::now(), Timers::new());
        decide(&outdated, &settings(), &mut timers, t0);
        let steps = decide(&resynced, &settings(), &mut timers, t0 + settings().fail_over_timeout);
        assert_eq!(kinds(&steps)[1], "force-delete app");
        for step in &steps {
            let note = step.note();
            assert!(
                note.contains(
                    "DRBD here: this node's disk is UpToDate and DRBD says may_promote:yes (promotion_score 10102)"
                ),
                "{note}"
            );
        }
    }

    /// Nothing on a node whose kubelet renews is force-deleted, NotReady or not: its kubelet stops
    /// an evicted pod, and the attachment goes once it has.
    #[test]
    fn nothing_is_force_deleted_while_the_nodes_kubelet_renews() {
        let renewing = kubelet_renewing(primary_lost());
        assert_eq!(
            after_timeout(&renewing, &settings()),
            ["taint node-a drbd.linbit.com/lost-quorum", "evict app"]
        );
        assert_eq!(
            after_timeout(&kubelet_stopped(primary_lost()), &settings()),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "force-delete app",
                "delete-attachment csi-att-1"
            ]
        );
    }

    /// A Node that cannot be read in a round is neither Ready nor failed over in it: its NotReady
    /// count goes on (under a flaky API server a crashed node's pods do not wait for minutes).
    #[test]
    fn a_failed_read_of_a_suspect_keeps_its_not_ready_count() {
        let settings = DecisionSettings {
            not_ready_counts_after: Duration::from_secs(20),
            ..settings()
        };
        let mut observed = primary_lost();
        observed.reports = [("node-a".to_string(), report(true, true, &["node-c"], &["node-b"], true))].into();
        let mut unread = observed.clone();
        unread.nodes.remove("node-a");
        unread.unread_nodes.insert("node-a".into());
        let (t0, mut timers) = (Instant::now(), Timers::new());
        let at = |timers: &mut Timers, observed: &Observed, seconds: u64| {
            kinds(&decide(observed, &settings, timers, t0 + Duration::from_secs(seconds)))
        };
        at(&mut timers, &observed, 0);
        for second in [4, 9, 14, 19] {
            assert!(
                at(&mut timers, &unread, second).is_empty(),
                "unread at {second} s: nothing done"
            );
        }
        assert_eq!(
            at(&mut timers, &observed, 20)[0],
            "taint node-a drbd.linbit.com/lost-quorum",
            "NotReady since 0 s, whatever was unread between"
        );
    }

    /// When most of the peers' agents read look silent at once, silence is not evidence: held,
    /// and let go as soon as their renewals resume.
    #[test]
    fn silence_of_most_agents_at_once_is_not_evidence() {
        let mut observed = kubelet_stopped(link_lost());
        let silent = |node: &str| (node.to_string(), report(false, true, &[], &[], false));
        observed.reports = [silent("node-a"), silent("node-c"), silent("node-d")].into();
        let held = held_for_a_minute(&observed);
        assert!(held[0].contains("3 of the 3 peers' agents read are silent"), "{held:?}");
        observed
            .reports
            .insert("node-c".into(), report(false, true, &["node-b"], &["node-a"], true));
        observed
            .reports
            .insert("node-d".into(), report(false, true, &["node-b"], &["node-a"], true));
        assert_eq!(
            after_timeout(&observed, &settings()),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "force-delete app",
                "delete-attachment csi-att-1"
            ],
            "the others renew again: a alone is silent"
        );
        // A stated loss of quorum is no silence: it counts however many others are silent.
        let mut said = observed.clone();
        said.reports = [silent("node-c"), silent("node-d")].into();
        said.reports
            .insert("node-a".into(), report(true, false, &[], &["node-b", "node-c"], true));
        assert_eq!(
            after_timeout(&said, &settings())[0],
            "taint node-a drbd.linbit.com/lost-quorum"
        );
    }

    /// A node evicted while its kubelet may live is looked at again the moment its kubelet goes
    /// silent, not at the next interval: its pods are force-deleted then.
    #[test]
    fn the_loop_wakes_when_an_evicted_nodes_kubelet_goes_silent() {
        let settings = settings();
        let (t0, mut timers) = (Instant::now(), Timers::new());
        let mut observed = link_lost();
        let silent = t0 + settings.fail_over_timeout + Duration::from_secs(4);
        observed.kubelet_silent_from.insert("node-a".into(), silent);
        decide(&observed, &settings, &mut timers, t0);
        let evicted = decide(&observed, &settings, &mut timers, t0 + settings.fail_over_timeout);
        assert_eq!(
            kinds(&evicted),
            ["taint node-a drbd.linbit.com/lost-quorum", "evict app"]
        );
        let deadlines: Vec<Instant> = timers
            .deadlines(settings.fail_over_timeout, settings.not_ready_counts_after)
            .collect();
        assert!(
            deadlines.contains(&silent),
            "the loop wakes when a's kubelet goes silent"
        );
        assert!(kinds(&decide(&observed, &settings, &mut timers, silent)).contains(&"force-delete app".to_string()));
    }

    /// A third node whose agent has gone silent may say it is connected from before: where this
    /// node's DRBD itself says it could take the data over, that stale word holds nothing; where
    /// only the equivalent speaks (no events2 word), it still holds.
    #[test]
    fn a_silent_third_nodes_stale_report_holds_only_without_drbds_word() {
        let mut observed = kubelet_stopped(link_lost());
        let mut c_said = report(false, true, &["node-a", "node-b"], &[], true);
        c_said.agent_silent_from = Some(Instant::now().checked_sub(Duration::from_secs(1)).unwrap());
        observed.reports = [("node-c".to_string(), c_said)].into();
        assert_eq!(
            after_timeout(&observed, &settings()),
            ["hold node-a"],
            "no word from DRBD"
        );
        observed.drbd.resources[0].drbd_says = Some(PromotionWord {
            may_promote: true,
            promotion_score: 10102,
        });
        assert_eq!(
            after_timeout(&observed, &settings())[1],
            "force-delete app",
            "DRBD would refuse may_promote if a were Primary through c"
        );
        observed.reports.get_mut("node-c").unwrap().agent_silent_from = Some(Instant::now() + Duration::from_secs(60));
        assert_eq!(
            after_timeout(&observed, &settings()),
            ["hold node-a"],
            "c's agent renews: its word holds"
        );
    }

    /// A node-wide taint says more than one volume: none while this node's DRBD says a Primary
    /// goes on without it on another resource the suspect is away from (it may be the suspect,
    /// healthy there); the pods of the lost volume still go.
    #[test]
    fn no_taint_on_a_node_that_may_be_a_healthy_primary_elsewhere() {
        let mut observed = kubelet_stopped(primary_lost());
        let mut other = observed.drbd.resources[0].clone();
        other.name = "pvc-2".into();
        other.devices[0].disk_state = "Outdated".into();
        observed.drbd.resources.push(other);
        assert_eq!(
            after_timeout(&observed, &settings()),
            ["force-delete app", "delete-attachment csi-att-1"]
        );
        observed.drbd.resources[1].connections[0].connection_state = "Connected".into();
        assert_eq!(
            after_timeout(&observed, &settings())[0],
            "taint node-a drbd.linbit.com/lost-quorum",
            "the outdated resource's link to a is up: not a's doing"
        );
    }
}
