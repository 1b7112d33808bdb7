//! Piraeus's own HA Controller (on by default in piraeus-operator v2) acts on the same
//! `drbd.linbit.com/` taints, evicts the same pods and deletes the same VolumeAttachments, with
//! none of this agent's evidence rules or guard. Both running is a misconfiguration this node can
//! see in its own pods: it says so (a Warning on the Node, and a metric), and changes nothing.

use crate::agent::action::Action;
use crate::agent::view::Observed;

pub(super) fn warnings(observed: &Observed) -> Vec<Action> {
    if observed.piraeus_ha_controllers.is_empty() {
        return Vec::new();
    }
    vec![Action::WarnCoexistence {
        node: observed.node.clone(),
        pods: observed.piraeus_ha_controllers.clone(),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::decide::fixtures::primary_lost;

    #[test]
    fn a_warning_only_while_piraeus_runs_here() {
        let cases = [
            ("none here", vec![], 0),
            ("one here", vec!["piraeus-datastore/ha-controller-x7".to_owned()], 1),
        ];
        for (case, pods, expected) in cases {
            let observed = Observed {
                piraeus_ha_controllers: pods,
                ..primary_lost()
            };
            assert_eq!(warnings(&observed).len(), expected, "{case}");
        }
    }
}
