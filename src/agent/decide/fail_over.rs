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
mod tests;
