//! The HA agent's rules: a pure function from what this node observes ([`Observed`]: DRBD state,
//! the Kubernetes objects that matter, the running fail-over timers, now) to the [`Action`]s to
//! take. The shell fetches the observations and carries out the actions; nothing here does I/O.

use std::time::{Duration, Instant};

use super::action::{Action, Cause};
use super::drbd::Resource;
use super::view::{Observed, PodView, Timers, VolumeView};
use crate::names::{FORCE_IO_ERROR_TAINT, LOST_QUORUM_TAINT};

#[derive(Clone, Debug)]
pub struct DecisionSettings {
    pub fail_over_timeout: Duration,
    pub fail_over_unsafe_pods: bool,
    pub disable_node_taints: bool,
    /// Largest share of nodes that may carry the lost-quorum taint after we add one.
    pub max_tainted_fraction: f64,
    pub nfs_port: u16,
    /// `--node-drain-policy=evacuate`: the taint key that asks for evacuation, if enabled.
    pub evacuate_taint: Option<String>,
}

/// Decides what to do now. `timers` is updated in place: started, kept or reset.
pub fn decide(observed: &Observed, settings: &DecisionSettings, timers: &mut Timers, now: Instant) -> Vec<Action> {
    let mut actions = Vec::new();
    let mut live_timers = Vec::new();
    let mut lost_quorum_locally = Vec::new();
    let mut forcing_io_errors = Vec::new();

    for resource in &observed.drbd.resources {
        let volume = observed.volumes.get(&resource.name);
        if resource.force_io_failures {
            forcing_io_errors.push(resource.name.clone());
            if let Some(volume) = volume {
                for pod in evictable(volume, &observed.node, settings) {
                    actions.push(Action::Evict {
                        pod: pod.into(),
                        cause: Cause::ForceIoErrors,
                        note: format!("DRBD resource {} is forcing IO errors on this node", resource.name),
                    });
                }
            }
        }
        if !observed.drbd.quorum_enabled.contains(&resource.name) {
            continue;
        }
        if !resource.has_quorum() {
            lost_quorum_locally.push(resource.name.clone());
        }
        if resource.suspended
            && resource.is_primary()
            && let Some(volume) = volume
            && !volume
                .pods
                .iter()
                .any(|p| p.node == observed.node && p.running && !p.terminating)
        {
            actions.push(Action::ForceSecondary {
                resource: resource.name.clone(),
                pv: volume.pv.clone(),
            });
        }
        // A resource without a PV has no consumers we could move: nothing to fail over.
        let Some(volume) = volume else { continue };
        if resource.is_primary() && volume.shared && evacuating(observed, settings) {
            for pod in evictable(volume, &observed.node, settings) {
                actions.push(Action::Evict {
                    pod: pod.into(),
                    cause: Cause::Evacuation,
                    note: format!(
                        "node {} is being drained: moving the primary of DRBD resource {} elsewhere",
                        observed.node, resource.name
                    ),
                });
            }
        }
        if let Some(endpoint) = own_endpoint(observed, settings, resource, volume)
            && volume.service_endpoint.as_deref() != Some(endpoint.as_str())
        {
            actions.push(Action::PublishServiceEndpoint {
                pv: volume.pv.clone(),
                endpoint,
            });
        }
        if !resource.may_promote() {
            continue;
        }
        for peer in resource.connections.iter().filter(|c| !c.is_connected()) {
            let node = observed.kube_node(&peer.name);
            let consumers = volume.pods.iter().any(|p| p.node == node && p.running)
                || volume.attachments.iter().any(|(_, n)| n == node);
            if !consumers {
                continue;
            }
            let key = (resource.name.clone(), peer.name.clone());
            let started = *timers.entry(key.clone()).or_insert(now);
            live_timers.push(key);
            if now.duration_since(started) < settings.fail_over_timeout {
                continue;
            }
            actions.extend(fail_over(observed, settings, volume, &resource.name, node));
        }
    }
    // Timers of peers that reconnected, lost their consumers, or whose resource went away reset.
    timers.retain(|key, _| live_timers.contains(key));

    if !settings.disable_node_taints {
        own_taint(
            observed,
            &mut actions,
            LOST_QUORUM_TAINT,
            &lost_quorum_locally,
            Cause::LostQuorum,
        );
        own_taint(
            observed,
            &mut actions,
            FORCE_IO_ERROR_TAINT,
            &forcing_io_errors,
            Cause::ForceIoErrors,
        );
    }
    guard_blast_radius(observed, settings, actions)
}

/// This node's NFS endpoint, when it should serve the volume: it is the DRBD primary, every
/// local device has quorum and no peer is primary. An isolated node never qualifies.
fn own_endpoint(
    observed: &Observed,
    settings: &DecisionSettings,
    resource: &Resource,
    volume: &VolumeView,
) -> Option<String> {
    if !(resource.is_primary() && resource.may_promote() && volume.shared) {
        return None;
    }
    let ip = observed.node_ip.as_deref()?.parse().ok()?;
    Some(crate::volume::NfsEndpoint::new(ip, settings.nfs_port).to_string())
}

/// Publications of every shared volume this node serves, whatever is published now: the
/// periodic resync repairs what was changed behind our back.
pub fn republish(observed: &Observed, settings: &DecisionSettings) -> Vec<Action> {
    observed
        .drbd
        .resources
        .iter()
        .filter(|r| observed.drbd.quorum_enabled.contains(&r.name))
        .filter_map(|resource| {
            let volume = observed.volumes.get(&resource.name)?;
            let endpoint = own_endpoint(observed, settings, resource, volume)?;
            Some(Action::PublishServiceEndpoint {
                pv: volume.pv.clone(),
                endpoint,
            })
        })
        .collect()
}

fn evacuating(observed: &Observed, settings: &DecisionSettings) -> bool {
    let Some(taint) = &settings.evacuate_taint else {
        return false;
    };
    observed
        .nodes
        .get(&observed.node)
        .is_some_and(|n| n.unschedulable || n.has_taint(taint))
}

/// Pods of the volume on `node` that we may move: owned, not opted out, safe to fail over.
fn movable<'a>(
    volume: &'a VolumeView,
    node: &'a str,
    settings: &'a DecisionSettings,
) -> impl Iterator<Item = &'a PodView> {
    volume.pods.iter().filter(move |p| {
        p.node == node && p.has_owner && !p.ignore_fail_over && (settings.fail_over_unsafe_pods || !p.unsafe_volumes)
    })
}

/// Movable pods that are not already on their way out.
fn evictable<'a>(
    volume: &'a VolumeView,
    node: &'a str,
    settings: &'a DecisionSettings,
) -> impl Iterator<Item = &'a PodView> {
    movable(volume, node, settings).filter(|p| !p.terminating)
}

fn fail_over(
    observed: &Observed,
    settings: &DecisionSettings,
    volume: &VolumeView,
    resource: &str,
    node: &str,
) -> Vec<Action> {
    let why = format!(
        "node {node} lost its connection to DRBD resource {resource} for {:?}",
        settings.fail_over_timeout
    );
    let mut actions = Vec::new();
    if !settings.disable_node_taints && !observed.has_taint(node, LOST_QUORUM_TAINT) {
        actions.push(Action::Taint {
            node: node.to_owned(),
            key: LOST_QUORUM_TAINT,
            cause: Cause::LostQuorum,
            note: why.clone(),
        });
    }
    let node_ready = observed.nodes.get(node).is_some_and(|n| n.ready);
    if node_ready {
        for pod in evictable(volume, node, settings) {
            actions.push(Action::Evict {
                pod: pod.into(),
                cause: Cause::LostQuorum,
                note: why.clone(),
            });
        }
    } else {
        // Without a kubelet to finish them, terminating pods would hold the volume forever.
        for pod in movable(volume, node, settings) {
            actions.push(Action::ForceDelete {
                pod: pod.into(),
                note: why.clone(),
            });
        }
    }
    for (name, _) in volume.attachments.iter().filter(|(_, n)| n == node) {
        actions.push(Action::DeleteAttachment {
            name: name.clone(),
            note: why.clone(),
        });
    }
    actions
}

fn own_taint(observed: &Observed, actions: &mut Vec<Action>, key: &'static str, resources: &[String], cause: Cause) {
    let node = observed.node.clone();
    let tainted = observed.has_taint(&node, key);
    let (lost, regained) = match cause {
        Cause::ForceIoErrors => ("force IO errors", "forces IO errors"),
        _ => ("lost quorum", "is without quorum"),
    };
    if !resources.is_empty() && !tainted {
        actions.push(Action::Taint {
            node,
            key,
            cause,
            note: format!("DRBD resource(s) {} {lost} on this node", resources.join(", ")),
        });
    } else if resources.is_empty() && tainted {
        actions.push(Action::Untaint {
            node,
            key,
            cause,
            note: format!("no DRBD resource on this node {regained} any more"),
        });
    }
}

/// Refuses lost-quorum taints that would leave more than the allowed share of nodes tainted.
fn guard_blast_radius(observed: &Observed, settings: &DecisionSettings, actions: Vec<Action>) -> Vec<Action> {
    let total = observed.nodes.len().max(1);
    let mut tainted = observed
        .nodes
        .values()
        .filter(|n| n.has_taint(LOST_QUORUM_TAINT))
        .count();
    actions
        .into_iter()
        .map(|action| match &action {
            Action::Taint { key, node, .. } if *key == LOST_QUORUM_TAINT => {
                let share = (tainted + 1) as f64 / total as f64;
                if share > settings.max_tainted_fraction {
                    let why = format!(
                        "tainting {node} would leave {} of {total} nodes tainted {LOST_QUORUM_TAINT}, over the limit of {}",
                        tainted + 1,
                        settings.max_tainted_fraction
                    );
                    Action::Refused {
                        action: Box::new(action),
                        why,
                    }
                } else {
                    tainted += 1;
                    action
                }
            }
            _ => action,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::drbd::{Connection, Device, DrbdState};
    use crate::agent::view::NodeView;
    use std::collections::HashMap;

    fn settings() -> DecisionSettings {
        DecisionSettings {
            fail_over_timeout: Duration::from_secs(5),
            fail_over_unsafe_pods: false,
            disable_node_taints: false,
            max_tainted_fraction: 0.5,
            nfs_port: 2049,
            evacuate_taint: None,
        }
    }

    fn resource(role: &str, quorum: bool, peers: &[(&str, &str, &str)]) -> Resource {
        Resource {
            name: "pvc-1".into(),
            role: role.into(),
            devices: vec![Device { volume: 0, quorum }],
            connections: peers
                .iter()
                .map(|(name, state, role)| Connection {
                    name: name.to_string(),
                    connection_state: state.to_string(),
                    peer_role: role.to_string(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn pod(name: &str, node: &str) -> PodView {
        PodView {
            namespace: "apps".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            node: node.into(),
            running: true,
            has_owner: true,
            ..Default::default()
        }
    }

    fn node(name: &str, ready: bool, taints: &[&str]) -> (String, NodeView) {
        let view = NodeView {
            name: name.into(),
            ready,
            taints: taints.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        };
        (name.to_string(), view)
    }

    /// Node b sees node a (the old primary, with a consumer pod and the attachment) disconnected.
    fn primary_lost() -> Observed {
        let volume = VolumeView {
            pv: "pvc-1".into(),
            pods: vec![pod("app", "node-a")],
            attachments: vec![("csi-att-1".into(), "node-a".into())],
            shared: true,
            service_endpoint: Some("10.0.0.1:2049".into()),
        };
        Observed {
            node: "node-b".into(),
            node_ip: Some("10.0.0.2".into()),
            drbd: DrbdState {
                resources: vec![resource(
                    "Secondary",
                    true,
                    &[
                        ("node-a", "Connecting", "Unknown"),
                        ("node-c", "Connected", "Secondary"),
                    ],
                )],
                quorum_enabled: ["pvc-1".to_string()].into(),
            },
            volumes: [("pvc-1".to_string(), volume)].into(),
            nodes: [
                node("node-a", false, &[]),
                node("node-b", true, &[]),
                node("node-c", true, &[]),
            ]
            .into(),
            satellite_nodes: HashMap::new(),
        }
    }

    fn kinds(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                Action::Taint { node, key, .. } => format!("taint {node} {key}"),
                Action::Untaint { node, key, .. } => format!("untaint {node} {key}"),
                Action::Evict { pod, .. } => format!("evict {}", pod.name),
                Action::ForceDelete { pod, .. } => format!("force-delete {}", pod.name),
                Action::DeleteAttachment { name, .. } => format!("delete-attachment {name}"),
                Action::ForceSecondary { resource, .. } => format!("secondary --force {resource}"),
                Action::PublishServiceEndpoint { pv, endpoint } => format!("publish {pv} {endpoint}"),
                Action::Refused { action, .. } => format!("refused {}", kinds(&[(**action).clone()])[0]),
            })
            .collect()
    }

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
        assert!(timers.is_empty());
        // Lost again: a fresh timeout, not the remainder of the old one.
        assert!(decide(&lost, &settings(), &mut timers, t0 + Duration::from_secs(6)).is_empty());
        assert!(!decide(&lost, &settings(), &mut timers, t0 + Duration::from_secs(11)).is_empty());
    }

    #[test]
    fn ready_nodes_get_evictions_and_protected_pods_are_left_alone() {
        let t0 = Instant::now();
        let mut observed = primary_lost();
        observed.nodes.insert("node-a".into(), node("node-a", true, &[]).1);
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
        let mut timers = Timers::new();
        decide(&observed, &settings(), &mut timers, t0);
        let later = t0 + Duration::from_secs(5);
        assert_eq!(
            kinds(&decide(&observed, &settings(), &mut timers, later)),
            [
                "taint node-a drbd.linbit.com/lost-quorum",
                "evict app",
                "delete-attachment csi-att-1"
            ]
        );
        let unsafe_ok = DecisionSettings {
            fail_over_unsafe_pods: true,
            ..settings()
        };
        assert!(kinds(&decide(&observed, &unsafe_ok, &mut timers, later)).contains(&"evict hostpath".to_string()));
    }

    #[test]
    fn no_fail_over_without_quorum_or_consumers_or_pv() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        let mut no_quorum = primary_lost();
        no_quorum.drbd.resources[0].devices[0].quorum = false;
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
            ("no consumers", no_consumers, vec![]),
            ("no PV", no_pv, vec![]),
            ("quorum not enabled", not_quorum_enabled, vec![]),
        ] {
            let mut timers = Timers::new();
            decide(&observed, &settings(), &mut timers, t0);
            assert_eq!(
                kinds(&decide(&observed, &settings(), &mut timers, later)),
                expected,
                "{case}"
            );
        }
    }

    #[test]
    fn satellite_pods_map_drbd_names_to_nodes() {
        let t0 = Instant::now();
        let mut observed = primary_lost();
        observed.drbd.resources[0].connections[0].name = "linstor-a".into();
        observed.satellite_nodes.insert("linstor-a".into(), "node-a".into());
        let mut timers = Timers::new();
        decide(&observed, &settings(), &mut timers, t0);
        let actions = decide(&observed, &settings(), &mut timers, t0 + Duration::from_secs(5));
        assert_eq!(kinds(&actions)[0], "taint node-a drbd.linbit.com/lost-quorum");
    }

    #[test]
    fn the_guard_refuses_taints_past_the_fraction() {
        let t0 = Instant::now();
        let mut observed = primary_lost();
        observed
            .nodes
            .insert("node-c".into(), node("node-c", true, &[LOST_QUORUM_TAINT]).1);
        let mut timers = Timers::new();
        decide(&observed, &settings(), &mut timers, t0);
        let actions = decide(&observed, &settings(), &mut timers, t0 + Duration::from_secs(5));
        assert_eq!(kinds(&actions)[0], "refused taint node-a drbd.linbit.com/lost-quorum");
    }

    #[test]
    fn own_taints_come_and_go() {
        let mut observed = primary_lost();
        observed.drbd.resources[0].connections.clear();
        observed.drbd.resources[0].devices[0].quorum = false;
        observed.drbd.resources[0].force_io_failures = true;
        observed.volumes.get_mut("pvc-1").unwrap().pods = vec![pod("local", "node-b")];
        let actions = decide(&observed, &settings(), &mut Timers::new(), Instant::now());
        assert_eq!(
            kinds(&actions),
            [
                "evict local",
                "taint node-b drbd.linbit.com/lost-quorum",
                "taint node-b drbd.linbit.com/force-io-error"
            ]
        );
        let mut healed = primary_lost();
        healed.drbd.resources[0].connections.clear();
        healed.nodes.insert(
            "node-b".into(),
            node("node-b", true, &[LOST_QUORUM_TAINT, FORCE_IO_ERROR_TAINT]).1,
        );
        let actions = decide(&healed, &settings(), &mut Timers::new(), Instant::now());
        assert_eq!(
            kinds(&actions),
            [
                "untaint node-b drbd.linbit.com/lost-quorum",
                "untaint node-b drbd.linbit.com/force-io-error"
            ]
        );
        let quiet = DecisionSettings {
            disable_node_taints: true,
            ..settings()
        };
        assert!(decide(&healed, &quiet, &mut Timers::new(), Instant::now()).is_empty());
    }

    #[test]
    fn a_suspended_primary_without_local_consumers_is_demoted() {
        let mut observed = primary_lost();
        observed.drbd.resources[0] = Resource {
            suspended: true,
            ..resource("Primary", false, &[])
        };
        let cases = [
            ("no local pod", vec![pod("remote", "node-a")], true),
            ("running local pod", vec![pod("local", "node-b")], false),
            (
                "terminating local pod",
                vec![PodView {
                    terminating: true,
                    ..pod("local", "node-b")
                }],
                true,
            ),
        ];
        for (case, pods, demoted) in cases {
            observed.volumes.get_mut("pvc-1").unwrap().pods = pods;
            let actions = kinds(&decide(&observed, &settings(), &mut Timers::new(), Instant::now()));
            assert_eq!(
                actions.contains(&"secondary --force pvc-1".to_string()),
                demoted,
                "{case}"
            );
        }
    }

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
    fn a_draining_node_moves_the_consumers_of_its_shared_primaries() {
        let mut observed = primary_lost();
        observed.drbd.resources[0] = resource("Primary", true, &[]);
        let volume = observed.volumes.get_mut("pvc-1").unwrap();
        volume.attachments.clear();
        volume.service_endpoint = Some("10.0.0.2:2049".into());
        volume.pods = vec![pod("server", "node-b"), pod("elsewhere", "node-c")];
        let evacuate = DecisionSettings {
            evacuate_taint: Some("piraeus.io/evacuate".into()),
            ..settings()
        };
        let cordoned = NodeView {
            unschedulable: true,
            ..node("node-b", true, &[]).1
        };
        let tainted = node("node-b", true, &["piraeus.io/evacuate"]).1;
        for (case, own, policy, expected) in [
            ("cordoned", cordoned.clone(), &evacuate, vec!["evict server"]),
            ("evacuate taint", tainted, &evacuate, vec!["evict server"]),
            ("policy ignore", cordoned, &settings(), vec![]),
            ("not draining", node("node-b", true, &[]).1, &evacuate, vec![]),
        ] {
            observed.nodes.insert("node-b".into(), own);
            let actions = kinds(&decide(&observed, policy, &mut Timers::new(), Instant::now()));
            assert_eq!(actions, expected, "{case}");
        }
    }

    #[test]
    fn terminating_pods_on_a_dead_node_are_force_deleted() {
        let t0 = Instant::now();
        let mut observed = primary_lost();
        observed.volumes.get_mut("pvc-1").unwrap().pods[0].terminating = true;
        let mut timers = Timers::new();
        decide(&observed, &settings(), &mut timers, t0);
        let actions = kinds(&decide(
            &observed,
            &settings(),
            &mut timers,
            t0 + Duration::from_secs(5),
        ));
        assert!(actions.contains(&"force-delete app".to_string()), "{actions:?}");
    }
}
