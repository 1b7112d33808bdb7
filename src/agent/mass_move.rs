//! The Events of a mass move: when one round moves many volumes here, Kubernetes' own convention
//! for bursts applies (as the event recorder's aggregation does): the first few are told one by
//! one on their PVs, the rest in one Event on this node that counts and names them. Each claim's
//! `SharedVolumeReady` condition still states its own move, so nothing is lost for any volume,
//! and a fail-over of 500 volumes writes 11 Events, not 500.

/// Volumes told one Event each in one round; more are summed up on the node.
pub const TOLD_ONE_BY_ONE: usize = 10;

/// The longest note the API server takes (events.k8s.io/v1 `note`: 1 KiB).
const NOTE_LIMIT: usize = 1024;

/// Of the PVs one round moved here (sorted), those told one Event each, and the note of the
/// node's Event about the rest, if any.
pub fn split<'a>(moved: &'a [String], node: &str) -> (&'a [String], Option<String>) {
    if moved.len() <= TOLD_ONE_BY_ONE {
        return (moved, None);
    }
    let (each, rest) = moved.split_at(TOLD_ONE_BY_ONE);
    let head = format!(
        "{} volumes moved their NFS endpoint to node {node} at once; {TOLD_ONE_BY_ONE} are told on their PVs, \
         each claim's SharedVolumeReady condition names its move. The other {}: ",
        moved.len(),
        rest.len()
    );
    (each, Some(named_within(head, rest)))
}

/// `head` followed by as many of `names` as fit the note's limit, and how many did not.
fn named_within(head: String, names: &[String]) -> String {
    let mut note = head;
    for (shown, name) in names.iter().enumerate() {
        let tail = format!(" and {} more", names.len() - shown);
        let separator = if shown == 0 { "" } else { ", " };
        if note.len() + separator.len() + name.len() + tail.len() > NOTE_LIMIT {
            note.push_str(&tail);
            return note;
        }
        note.push_str(separator);
        note.push_str(name);
    }
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pvs(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("pvc-{i:04}")).collect()
    }

    #[test]
    fn a_few_moves_are_told_one_by_one() {
        let moved = pvs(TOLD_ONE_BY_ONE);
        let (each, summary) = split(&moved, "node-b");
        assert_eq!(each.len(), TOLD_ONE_BY_ONE);
        assert_eq!(summary, None);
    }

    #[test]
    fn a_mass_move_is_summed_up_on_the_node_within_the_note_limit() {
        let moved = pvs(500);
        let (each, summary) = split(&moved, "node-b");
        assert_eq!(each, &moved[..TOLD_ONE_BY_ONE]);
        let note = summary.unwrap();
        assert!(note.len() <= NOTE_LIMIT, "{}", note.len());
        assert!(
            note.starts_with("500 volumes moved their NFS endpoint to node node-b"),
            "{note}"
        );
        assert!(note.contains("The other 490: pvc-0010, pvc-0011"), "{note}");
        assert!(note.ends_with(" more"), "{note}");
        assert!(
            !note.contains("pvc-0009"),
            "the ones told on their PVs are not named again"
        );
    }

    #[test]
    fn a_rest_that_fits_is_named_in_full() {
        let moved = pvs(TOLD_ONE_BY_ONE + 3);
        let note = split(&moved, "n").1.unwrap();
        assert!(note.ends_with("pvc-0010, pvc-0011, pvc-0012"), "{note}");
    }
}
