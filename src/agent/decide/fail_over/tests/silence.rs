//! What silence is evidence of: quiet agents and kubelets, Ready and NotReady, third nodes' word.

use super::*;

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
