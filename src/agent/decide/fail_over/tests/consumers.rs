//! What a fail-over does to the lost node's consumers: evictions, force-deletions, attachments.

use super::*;

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
fn terminating_pods_on_a_dead_node_are_force_deleted() {
    let mut observed = primary_lost();
    observed.volumes.get_mut("pvc-1").unwrap().pods[0].terminating = true;
    assert!(after_timeout(&observed, &settings()).contains(&"force-delete app".to_string()));
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
