//! The blast-radius guard: the fraction of storage nodes failed over at once.

use super::*;

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
