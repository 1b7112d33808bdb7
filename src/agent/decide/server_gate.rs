//! A publication waits for the NFS server it names: a new publication of this node whose server
//! has not answered an RPC NULL call is held and said so, and a server that stops answering while
//! its endpoint is published is said so. The shell probes the servers these name.

use std::collections::{BTreeMap, BTreeSet};

use crate::agent::action::Action;
use crate::agent::view::Observed;

/// Servers that did not answer: endpoint → what happened instead.
pub type Unanswered = BTreeMap<String, String>;

/// The endpoints of the publications that change what is published, whose servers must answer
/// first. A confirmation of this node's endpoint, already published, waits for nothing.
pub fn endpoints_to_probe(publications: &[Action]) -> BTreeSet<String> {
    publications
        .iter()
        .filter_map(|action| match action {
            Action::PublishServiceEndpoint {
                endpoint,
                confirm_first: false,
                ..
            } => Some(endpoint.clone()),
            _ => None,
        })
        .collect()
}

/// `publications`, each new one whose server did not answer held in a warning that says why.
pub fn held_until_answered(observed: &Observed, publications: Vec<Action>, unanswered: &Unanswered) -> Vec<Action> {
    publications
        .into_iter()
        .map(|action| match &action {
            Action::PublishServiceEndpoint {
                pv,
                endpoint,
                confirm_first: false,
                ..
            } => match unanswered.get(endpoint) {
                Some(why) => warning(observed, pv, endpoint, false, why).unwrap_or(action),
                None => action,
            },
            _ => action,
        })
        .collect()
}

/// A warning for each of `served` (this node's publications already in place) whose server did
/// not answer.
pub fn served_but_not_answering(observed: &Observed, served: &[Action], unanswered: &Unanswered) -> Vec<Action> {
    served
        .iter()
        .filter_map(|action| match action {
            Action::PublishServiceEndpoint { pv, endpoint, .. } => {
                warning(observed, pv, endpoint, true, unanswered.get(endpoint)?)
            }
            _ => None,
        })
        .collect()
}

/// For each of `served` whose server answered while its PV says it does not (or says so of an
/// endpoint from before a move), the PV's word taken back.
pub fn answering_again(observed: &Observed, served: &[Action], unanswered: &Unanswered) -> Vec<Action> {
    served
        .iter()
        .filter_map(|action| match action {
            Action::PublishServiceEndpoint { pv, endpoint, .. } if !unanswered.contains_key(endpoint) => {
                let (resource, _) = observed
                    .volumes
                    .iter()
                    .find(|(_, v)| v.pv == *pv && v.silent_server.is_some())?;
                Some(Action::ServerAnswers {
                    node: observed.node.clone(),
                    resource: resource.clone(),
                    pv: pv.clone(),
                    endpoint: endpoint.clone(),
                })
            }
            _ => None,
        })
        .collect()
}

/// The resources `actions` warn of: held for their server (`published` false), or published
/// and not answering.
pub fn not_answering(actions: &[Action], published: bool) -> BTreeSet<String> {
    actions
        .iter()
        .filter_map(|action| match action {
            Action::WarnServerNotAnswering {
                resource, published: p, ..
            } if *p == published => Some(resource.clone()),
            _ => None,
        })
        .collect()
}

fn warning(observed: &Observed, pv: &str, endpoint: &str, published: bool, why: &str) -> Option<Action> {
    let (resource, volume) = observed.volumes.iter().find(|(_, v)| v.pv == pv)?;
    let said = volume.silent_server.as_ref().is_some_and(|s| s.endpoint == endpoint);
    Some(Action::WarnServerNotAnswering {
        mark: published && !said,
        node: observed.node.clone(),
        resource: resource.clone(),
        pv: pv.to_owned(),
        endpoint: endpoint.to_owned(),
        published,
        why: why.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::super::publications;
    use super::*;
    use crate::agent::view::Timers;
    use crate::sharedvolume::silence::SilentServer;
    use std::time::Instant;

    /// This node the primary of pvc-1 with quorum, its endpoint published at node a's.
    fn primary_here_published_elsewhere() -> Observed {
        let mut primary = primary_lost();
        primary.drbd.resources[0] = resource("Primary", true, &[("node-a", "Connecting", "Unknown")]);
        let volume = primary.volumes.get_mut("pvc-1").unwrap();
        volume.attachments.clear();
        volume.pods.clear();
        primary
    }

    fn unanswered(endpoint: &str) -> Unanswered {
        [(endpoint.to_owned(), "connection refused".to_owned())].into()
    }

    #[test]
    fn a_new_publication_waits_for_its_server_and_a_confirmation_does_not() {
        let observed = primary_here_published_elsewhere();
        let decided = publications(&observed, &settings(), &mut Timers::new(), Instant::now());
        let endpoints = endpoints_to_probe(&decided);
        assert_eq!(endpoints.len(), 1, "{decided:?}");
        let endpoint = endpoints.first().unwrap().clone();

        let held = held_until_answered(&observed, decided.clone(), &unanswered(&endpoint));
        assert!(
            matches!(&held[..], [Action::WarnServerNotAnswering { published: false, why, .. }] if why == "connection refused"),
            "{held:?}"
        );
        assert_eq!(not_answering(&held, false).len(), 1);
        assert_eq!(
            held_until_answered(&observed, decided.clone(), &Unanswered::new()),
            decided,
            "it answered"
        );

        let mut confirmation = decided;
        if let Action::PublishServiceEndpoint { confirm_first, .. } = &mut confirmation[0] {
            *confirm_first = true;
        }
        assert!(endpoints_to_probe(&confirmation).is_empty());
        let kept = held_until_answered(&observed, confirmation.clone(), &unanswered(&endpoint));
        assert_eq!(kept, confirmation, "what is published stays published");
        let warned = served_but_not_answering(&observed, &confirmation, &unanswered(&endpoint));
        assert!(
            matches!(&warned[..], [Action::WarnServerNotAnswering { published: true, .. }]),
            "{warned:?}"
        );
        assert!(not_answering(&warned, false).is_empty());
        assert_eq!(not_answering(&warned, true).len(), 1);
    }

    #[test]
    fn a_silent_server_is_said_on_its_pv_once_and_taken_back_when_it_answers() {
        let mut observed = primary_here_published_elsewhere();
        let decided = publications(&observed, &settings(), &mut Timers::new(), Instant::now());
        let Action::PublishServiceEndpoint { endpoint, .. } = &decided[0] else {
            panic!("{decided:?}")
        };
        let endpoint = endpoint.clone();
        let mark = |actions: &[Action]| match actions {
            [Action::WarnServerNotAnswering { mark, .. }] => *mark,
            other => panic!("{other:?}"),
        };
        let silent = unanswered(&endpoint);
        assert!(
            !mark(&held_until_answered(&observed, decided.clone(), &silent)),
            "unpublished: nothing to say on the PV"
        );
        assert!(
            mark(&served_but_not_answering(&observed, &decided, &silent)),
            "published: said on the PV"
        );
        assert!(answering_again(&observed, &decided, &silent).is_empty());
        assert!(
            answering_again(&observed, &decided, &Unanswered::new()).is_empty(),
            "nothing said, nothing to take back"
        );

        let said = |endpoint: &str| SilentServer {
            endpoint: endpoint.into(),
            since: "2026-11-28T12:00:00Z".into(),
            why: "connection refused".into(),
        };
        observed.volumes.get_mut("pvc-1").unwrap().silent_server = Some(said(&endpoint));
        assert!(
            !mark(&served_but_not_answering(&observed, &decided, &silent)),
            "said already"
        );
        assert!(answering_again(&observed, &decided, &silent).is_empty(), "still silent");
        let back = answering_again(&observed, &decided, &Unanswered::new());
        assert!(
            matches!(&back[..], [Action::ServerAnswers { pv, .. }] if pv == "pvc-1"),
            "{back:?}"
        );

        // Said of the endpoint before a move: this server's silence is said anew, its answer
        // takes the old word back.
        observed.volumes.get_mut("pvc-1").unwrap().silent_server = Some(said("10.9.9.9:2049"));
        assert!(mark(&served_but_not_answering(&observed, &decided, &silent)));
        assert_eq!(answering_again(&observed, &decided, &Unanswered::new()).len(), 1);
    }
}
