//! When a fail-over starts and ends: the timeout, a link that comes back, DRBD's detection window.

use super::*;

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
    let at = |observed: &Observed, seconds: f64| decided_after(observed, &settings, Duration::from_secs_f64(seconds));
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
