//! The guard Lease's reservations as values (pure): which are stored, which still count.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use crate::names::FAIL_OVER_RESERVATIONS_ANNOTATION;

/// How long a reservation counts: by then the taint it stood for is on the Node.
pub const RESERVATION_TTL: SignedDuration = SignedDuration::from_secs(120);

/// The reservations that still stand for a fail-over: unexpired, and either of a node that carries
/// the taint (`tainted`) or young enough that its taint may still be on its way (two
/// `write_within`, the bound of the reserving agent's writes). One whose node is not tainted after
/// whose give-back was lost (the node returned and its agent removed the taint) or never used: it
/// would otherwise count against other nodes' fail-overs until it expires, 2 minutes.
pub fn live_reservations(
    mut held: BTreeMap<String, Timestamp>,
    tainted: &BTreeSet<String>,
    now: Timestamp,
    write_within: std::time::Duration,
) -> BTreeMap<String, Timestamp> {
    let young = |expiry: &Timestamp| {
        let reserved = expiry.checked_sub(RESERVATION_TTL).unwrap_or(*expiry);
        reserved.checked_add(2 * write_within).is_ok_and(|until| until > now)
    };
    held.retain(|node, expiry| *expiry > now && (tainted.contains(node) || young(expiry)));
    held
}

/// The reservations on the guard Lease, node → expiry (malformed entries count as none).
pub fn reservations(lease: &Lease) -> BTreeMap<String, Timestamp> {
    let stored: BTreeMap<String, String> = lease
        .annotations()
        .get(FAIL_OVER_RESERVATIONS_ANNOTATION)
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    stored
        .into_iter()
        .filter_map(|(node, expiry)| Some((node, expiry.parse().ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node failed over during an isolation, back and untainted by its own agent, no longer
    /// counts against another node's fail-over through its reservation: a 600 s soak (seed
    /// 1795802735307625081) saw the guard refuse a lost node's fail-over for that reason.
    #[test]
    fn a_reservation_counts_while_its_taint_may_be_on_its_way_or_is_on_the_node() {
        let now = Timestamp::now();
        let reserved_ago = |seconds: i64| {
            (now - SignedDuration::from_secs(seconds))
                .checked_add(RESERVATION_TTL)
                .unwrap()
        };
        let held: BTreeMap<String, Timestamp> = [
            ("fresh".to_string(), reserved_ago(3)),
            ("tainted".to_string(), reserved_ago(60)),
            ("given-back".to_string(), reserved_ago(30)),
            ("expired".to_string(), reserved_ago(130)),
        ]
        .into();
        let tainted: BTreeSet<String> = ["tainted".to_string(), "expired".to_string()].into();
        let live = live_reservations(held, &tainted, now, std::time::Duration::from_secs(10));
        assert_eq!(live.keys().collect::<Vec<_>>(), ["fresh", "tainted"]);
    }
}
