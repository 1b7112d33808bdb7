//! The agent's actions as data, and everything about presenting one: its kind (metrics), its
//! description and note (logs and events), its event reason and the object the event is about.
//! [`super::decide`] produces them; [`super::act`] carries them out.

use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::view::{AttachmentView, PodView};
use crate::tell::Level;
use crate::volume::ClaimKey;

/// Why an action is taken; it names the events posted and the metrics counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// This node lost quorum.
    LostQuorum,
    /// A peer's node lost the volume: it is failed over.
    FailOver,
    /// A local resource forces IO errors.
    ForceIoErrors,
    /// This node is cordoned or tainted for evacuation.
    Evacuation,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Taint {
        node: String,
        key: &'static str,
        /// Who put it ([`crate::names::TAINT_BY_OWN_AGENT`] or `TAINT_BY_FAIL_OVER`).
        value: &'static str,
        cause: Cause,
        note: String,
    },
    Untaint {
        node: String,
        key: &'static str,
        cause: Cause,
        note: String,
    },
    Evict {
        pod: PodRef,
        cause: Cause,
        note: String,
    },
    ForceDelete {
        pod: PodRef,
        note: String,
    },
    DeleteAttachment {
        attachment: AttachmentView,
        note: String,
    },
    ForceSecondary {
        resource: String,
        /// This node.
        node: String,
        pv: Option<String>,
    },
    PublishServiceEndpoint {
        pv: String,
        /// The claim the PV is bound to, as cached: its Service's namespace.
        claim: ClaimKey,
        endpoint: String,
        /// The PV's resourceVersion as cached when this was decided.
        over_version: String,
        /// The cached PV names this endpoint already (a resync, or a promotion over a cache that
        /// may lag): the executor reads the PV and slice first and writes only what differs.
        confirm_first: bool,
    },
    /// A fail-over the evidence does not support: the peer is alive and serving.
    HoldFailOver {
        node: String,
        resource: String,
        pv: String,
        evidence: String,
    },
    /// A publication of this node that would be wrong now: why, in words.
    HoldPublication {
        node: String,
        resource: String,
        pv: String,
        why: String,
    },
    /// The NFS server this node would publish, or has published, for a volume does not answer
    /// an RPC NULL call: not published until it does, or said so while it serves.
    WarnServerNotAnswering {
        node: String,
        resource: String,
        pv: String,
        endpoint: String,
        /// The endpoint is published already (the server stopped answering while serving).
        published: bool,
        why: String,
        /// Say so on the PV too (published, and the PV does not say it of this endpoint yet).
        mark: bool,
    },
    /// A published NFS server the PV says does not answer answers again (or the PV says it of
    /// an endpoint from before a move): the PV's word is taken away.
    ServerAnswers {
        node: String,
        resource: String,
        pv: String,
        endpoint: String,
    },
    /// An evacuation that would stop the volume: no connected peer has all of its data.
    HoldEvacuation {
        node: String,
        resource: String,
        pv: String,
    },
    /// Piraeus's own HA Controller runs on this node and acts on the same taints, pods and
    /// attachments: said so, nothing else.
    WarnCoexistence {
        node: String,
        /// Its pods here, `namespace/name`.
        pods: Vec<String>,
    },
    /// An action the blast-radius guard would not take.
    Refused {
        action: Box<Action>,
        why: String,
    },
}

/// What an action does to which object, as the executor remembers it ([`Action::key`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ActionKey {
    Taint {
        node: String,
        key: &'static str,
        value: &'static str,
    },
    Untaint {
        node: String,
        key: &'static str,
    },
    /// A pod, `namespace/name`.
    Evict(String),
    ForceDelete(String),
    DeleteAttachment(String),
    ForceSecondary(String),
    Publish {
        pv: String,
        endpoint: String,
        over_version: String,
    },
    HoldFailOver {
        node: String,
        resource: String,
        evidence: String,
    },
    HoldPublication {
        resource: String,
        why: String,
    },
    HoldEvacuation(String),
    WarnServerNotAnswering {
        resource: String,
        published: bool,
    },
    ServerAnswers(String),
    WarnCoexistence(Vec<String>),
    Refused(Box<ActionKey>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
}

impl From<&PodView> for PodRef {
    fn from(pod: &PodView) -> Self {
        Self {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            node: pod.node.clone(),
        }
    }
}

impl Action {
    /// Every value [`Action::kind`] returns (metrics start each at 0).
    pub const KINDS: [&'static str; 11] = [
        "taint",
        "untaint",
        "evict",
        "force_delete",
        "delete_attachment",
        "force_secondary",
        "publish",
        "hold_fail_over",
        "hold_publication",
        "hold_evacuation",
        "warn_coexistence",
    ];

    /// What the executor remembers an action by while it stays decided: what it does, to which
    /// object. A publication counts as new when decided over a newer PV: another node published
    /// in between, faster than this node's rounds saw it lose the primary role. A hold counts as
    /// new with new evidence.
    pub fn key(&self) -> ActionKey {
        let object = |namespace: &str, name: &str| format!("{namespace}/{name}");
        match self {
            Self::Taint { node, key, value, .. } => ActionKey::Taint {
                node: node.clone(),
                key,
                value,
            },
            Self::Untaint { node, key, .. } => ActionKey::Untaint {
                node: node.clone(),
                key,
            },
            Self::Evict { pod, .. } => ActionKey::Evict(object(&pod.namespace, &pod.name)),
            Self::ForceDelete { pod, .. } => ActionKey::ForceDelete(object(&pod.namespace, &pod.name)),
            Self::DeleteAttachment { attachment, .. } => ActionKey::DeleteAttachment(attachment.name.clone()),
            Self::ForceSecondary { resource, .. } => ActionKey::ForceSecondary(resource.clone()),
            Self::PublishServiceEndpoint {
                pv,
                endpoint,
                over_version,
                ..
            } => ActionKey::Publish {
                pv: pv.clone(),
                endpoint: endpoint.clone(),
                over_version: over_version.clone(),
            },
            Self::HoldFailOver {
                node,
                resource,
                evidence,
                ..
            } => ActionKey::HoldFailOver {
                node: node.clone(),
                resource: resource.clone(),
                evidence: evidence.clone(),
            },
            Self::HoldPublication { resource, why, .. } => ActionKey::HoldPublication {
                resource: resource.clone(),
                why: why.clone(),
            },
            Self::HoldEvacuation { resource, .. } => ActionKey::HoldEvacuation(resource.clone()),
            Self::WarnServerNotAnswering {
                resource, published, ..
            } => ActionKey::WarnServerNotAnswering {
                resource: resource.clone(),
                published: *published,
            },
            Self::ServerAnswers { resource, .. } => ActionKey::ServerAnswers(resource.clone()),
            Self::WarnCoexistence { pods, .. } => ActionKey::WarnCoexistence(pods.clone()),
            Self::Refused { action, .. } => ActionKey::Refused(Box::new(action.key())),
        }
    }

    /// The service endpoint a publication writes.
    pub fn published_endpoint(&self) -> Option<&str> {
        match self {
            Self::PublishServiceEndpoint { endpoint, .. } => Some(endpoint),
            _ => None,
        }
    }

    /// Short name, for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Taint { .. } => "taint",
            Self::Untaint { .. } => "untaint",
            Self::Evict { .. } => "evict",
            Self::ForceDelete { .. } => "force_delete",
            Self::DeleteAttachment { .. } => "delete_attachment",
            Self::ForceSecondary { .. } => "force_secondary",
            Self::PublishServiceEndpoint { .. } => "publish",
            Self::HoldFailOver { .. } => "hold_fail_over",
            Self::HoldPublication { .. } => "hold_publication",
            Self::HoldEvacuation { .. } => "hold_evacuation",
            Self::WarnServerNotAnswering { published: false, .. } => "wait_for_server",
            Self::WarnServerNotAnswering { .. } => "warn_server_not_answering",
            Self::ServerAnswers { .. } => "server_answers",
            Self::WarnCoexistence { .. } => "warn_coexistence",
            Self::Refused { action, .. } => action.kind(),
        }
    }

    /// What is done, in words (logs, events, and the key that keeps it from being repeated).
    pub fn describe(&self) -> String {
        match self {
            Self::Taint { node, key, value, .. } => format!("taint node {node} with {key}={value}:NoSchedule"),
            Self::Untaint { node, key, .. } => format!("remove taint {key} from node {node}"),
            Self::Evict { pod, .. } => format!("evict pod {}/{}", pod.namespace, pod.name),
            Self::ForceDelete { pod, .. } => format!("force-delete pod {}/{}", pod.namespace, pod.name),
            Self::DeleteAttachment { attachment, .. } => format!("delete VolumeAttachment {}", attachment.name),
            Self::ForceSecondary { resource, .. } => format!("run drbdsetup secondary --force {resource}"),
            Self::PublishServiceEndpoint { pv, endpoint, .. } => {
                format!("publish {endpoint} as the NFS service endpoint of PV {pv} and point its endpoints here")
            }
            Self::HoldFailOver {
                node,
                resource,
                evidence,
                ..
            } => format!("hold the fail-over of node {node} for DRBD resource {resource}: {evidence}"),
            Self::HoldPublication { node, pv, why, .. } => {
                format!("hold the publication of node {node} as the NFS server of PV {pv}: {why}")
            }
            Self::HoldEvacuation { node, resource, .. } => {
                format!("hold the evacuation of DRBD resource {resource} from node {node}")
            }
            Self::WarnServerNotAnswering {
                node,
                pv,
                endpoint,
                published: false,
                why,
                ..
            } => format!(
                "hold the publication of node {node} as the NFS server of PV {pv}: its server at {endpoint} does not answer an RPC NULL call ({why})"
            ),
            Self::WarnServerNotAnswering {
                node,
                pv,
                endpoint,
                why,
                ..
            } => format!(
                "warn that the NFS server of PV {pv} at {endpoint} on node {node}, its published endpoint, does not answer an RPC NULL call ({why})"
            ),
            Self::ServerAnswers { node, pv, endpoint, .. } => format!(
                "take back the word on PV {pv} that its NFS server does not answer: the server node {node} publishes at {endpoint} answers"
            ),
            Self::WarnCoexistence { node, pods } => {
                format!(
                    "warn that Piraeus's HA Controller runs on node {node} ({})",
                    pods.join(", ")
                )
            }
            Self::Refused { action, .. } => format!("refused to {}", action.describe()),
        }
    }

    /// Why it is done, in words (the note of its event).
    pub fn note(&self) -> &str {
        match self {
            Self::Taint { note, .. }
            | Self::Untaint { note, .. }
            | Self::Evict { note, .. }
            | Self::ForceDelete { note, .. }
            | Self::DeleteAttachment { note, .. } => note,
            Self::ForceSecondary { .. } => {
                "its IO is suspended for lost quorum, no local pod uses it, and a peer with quorum can take the primary role over"
            }
            Self::PublishServiceEndpoint { .. } => "this node is the DRBD primary with quorum",
            Self::HoldFailOver { .. } => "one disconnected link is not evidence that the peer lost the volume",
            Self::HoldPublication { .. } => {
                "the endpoint stays where it is until this node's DRBD state says otherwise; if it lasts, compare `drbdsetup status` on the nodes named"
            }
            Self::WarnServerNotAnswering { published: false, .. } => {
                "it is published once it answers: clients sent to a server that does not answer wait for nothing. Check the server on the node (drbd-reactorctl status; the volume's NFS unit), or, if the agent cannot reach it, turn the probe off (--nfs-probe=false)"
            }
            Self::WarnServerNotAnswering { .. } => {
                "its clients get no answer: with the promoter's BindsTo, drbd-reactor demotes the resource when the server's unit fails and a peer takes over; otherwise restart the server on the node (the volume's NFS unit)"
            }
            Self::ServerAnswers { .. } => "its clients get answers again",
            Self::HoldEvacuation { .. } => {
                "no connected peer has an UpToDate replica to take the primary role over: evicting its consumers would stop the volume; bring a replica up to date or add one"
            }
            Self::WarnCoexistence { .. } => {
                "it acts on the same drbd.linbit.com/ taints, evicts the same pods and deletes the same VolumeAttachments, without this agent's evidence rules or blast-radius guard: turn it off (piraeus-operator v2: LinstorCluster spec.highAvailabilityController.enabled: false; the standalone chart: helm uninstall it)"
            }
            Self::Refused { why, .. } => why,
        }
    }

    /// Whether it takes something away (a taint, a forced delete, an attachment, the primary
    /// role): the quorum settings it was decided over are read fresh before it is carried out.
    pub fn is_destructive(&self) -> bool {
        matches!(
            self,
            Self::Taint { .. } | Self::ForceDelete { .. } | Self::DeleteAttachment { .. } | Self::ForceSecondary { .. }
        )
    }

    /// Whether it must act on a fresh DRBD state: destructive, or a step of a fail-over.
    pub fn takes_something(&self) -> bool {
        self.is_destructive() || self.failing_over().is_some()
    }

    /// The node this action fails over, if it is part of a fail-over: the blast-radius guard
    /// refuses all of a node's fail-over or none of it.
    pub fn failing_over(&self) -> Option<&str> {
        match self {
            Self::Taint {
                node,
                cause: Cause::FailOver,
                ..
            } => Some(node),
            Self::Evict {
                pod,
                cause: Cause::FailOver,
                ..
            }
            | Self::ForceDelete { pod, .. } => Some(&pod.node),
            Self::DeleteAttachment { attachment, .. } => Some(&attachment.node),
            _ => None,
        }
    }

    /// The type and reason of the event that tells the action was done. The reasons are
    /// Piraeus's where it has one.
    pub fn event(&self) -> (Level, &'static str) {
        match self {
            Self::Taint {
                cause: Cause::ForceIoErrors,
                ..
            }
            | Self::Evict {
                cause: Cause::ForceIoErrors,
                ..
            } => (Level::Warning, "VolumeForcingIoErrors"),
            Self::Taint { .. } => (Level::Warning, "NodeStorageQuorumLost"),
            Self::Untaint {
                cause: Cause::ForceIoErrors,
                ..
            } => (Level::Normal, "NoVolumeForcingIoErrors"),
            Self::Untaint { .. } => (Level::Normal, "NodeStorageQuorumRegained"),
            Self::Evict {
                cause: Cause::Evacuation,
                ..
            } => (Level::Normal, "NodeEvacuation"),
            Self::Evict { .. } | Self::ForceDelete { .. } | Self::DeleteAttachment { .. } => {
                (Level::Warning, "VolumeWithoutQuorum")
            }
            // The seeds' reason: a forced demotion is what a volume without quorum gets.
            Self::ForceSecondary { .. } => (Level::Warning, "VolumeWithoutQuorum"),
            Self::PublishServiceEndpoint { .. } => (Level::Normal, ENDPOINT_MOVED),
            Self::HoldFailOver { .. } => (Level::Normal, "FailOverHeld"),
            Self::HoldPublication { .. } => (Level::Warning, "PublicationHeld"),
            Self::HoldEvacuation { .. } => (Level::Warning, "EvacuationHeld"),
            Self::WarnServerNotAnswering { .. } => (Level::Warning, "NfsServerNotAnswering"),
            Self::ServerAnswers { .. } => (Level::Normal, "NfsServerAnswering"),
            Self::WarnCoexistence { .. } => (Level::Warning, "PiraeusHaControllerRunning"),
            Self::Refused { .. } => (Level::Warning, "FailOverRefused"),
        }
    }

    /// The object the action's events are about.
    pub fn target(&self) -> ObjectReference {
        match self {
            Self::Taint { node, .. } | Self::Untaint { node, .. } => reference::<Node>(None, node, None),
            Self::Evict { pod, .. } | Self::ForceDelete { pod, .. } => {
                reference::<Pod>(Some(&pod.namespace), &pod.name, Some(&pod.uid))
            }
            Self::DeleteAttachment { attachment, .. } => {
                reference::<VolumeAttachment>(None, &attachment.name, Some(&attachment.uid))
            }
            Self::ForceSecondary { pv: Some(pv), .. }
            | Self::PublishServiceEndpoint { pv, .. }
            | Self::HoldFailOver { pv, .. }
            | Self::HoldPublication { pv, .. }
            | Self::WarnServerNotAnswering { pv, .. }
            | Self::ServerAnswers { pv, .. }
            | Self::HoldEvacuation { pv, .. } => reference::<PersistentVolume>(None, pv, None),
            Self::ForceSecondary { node, pv: None, .. } | Self::WarnCoexistence { node, .. } => {
                reference::<Node>(None, node, None)
            }
            Self::Refused { action, .. } => action.target(),
        }
    }
}

/// The reason of the Event on a PV whose endpoints this node took over.
pub const ENDPOINT_MOVED: &str = "ServiceEndpointMoved";

/// A reference to the Node `name`, for Events about it.
pub fn node_reference(name: &str) -> ObjectReference {
    reference::<Node>(None, name, None)
}

fn reference<K: k8s_openapi::Resource>(namespace: Option<&str>, name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::API_VERSION.into()),
        kind: Some(K::KIND.into()),
        namespace: namespace.map(Into::into),
        name: Some(name.into()),
        uid: uid.filter(|u| !u.is_empty()).map(Into::into),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evict(cause: Cause) -> Action {
        let pod = PodRef {
            namespace: "apps".into(),
            name: "web".into(),
            uid: "u1".into(),
            node: "node-a".into(),
        };
        Action::Evict {
            pod,
            cause,
            note: String::new(),
        }
    }

    #[test]
    fn events_name_the_cause_and_the_object() {
        assert_eq!(evict(Cause::FailOver).event(), (Level::Warning, "VolumeWithoutQuorum"));
        assert_eq!(
            evict(Cause::ForceIoErrors).event(),
            (Level::Warning, "VolumeForcingIoErrors")
        );
        assert_eq!(evict(Cause::Evacuation).event(), (Level::Normal, "NodeEvacuation"));
        let target = evict(Cause::FailOver).target();
        assert_eq!(
            (
                target.kind.as_deref(),
                target.namespace.as_deref(),
                target.uid.as_deref()
            ),
            (Some("Pod"), Some("apps"), Some("u1"))
        );
        let refused = Action::Refused {
            action: Box::new(Action::Taint {
                node: "n".into(),
                key: crate::names::LOST_QUORUM_TAINT,
                value: crate::names::TAINT_BY_FAIL_OVER,
                cause: Cause::FailOver,
                note: String::new(),
            }),
            why: "guard".into(),
        };
        assert_eq!(refused.event(), (Level::Warning, "FailOverRefused"));
        assert_eq!(refused.target().kind.as_deref(), Some("Node"));
    }

    #[test]
    fn fail_over_steps_name_their_node() {
        assert_eq!(evict(Cause::FailOver).failing_over(), Some("node-a"));
        assert_eq!(evict(Cause::ForceIoErrors).failing_over(), None);
        let own_taint = Action::Taint {
            node: "node-b".into(),
            key: crate::names::LOST_QUORUM_TAINT,
            value: crate::names::TAINT_BY_OWN_AGENT,
            cause: Cause::LostQuorum,
            note: String::new(),
        };
        assert_eq!(own_taint.failing_over(), None);
    }

    #[test]
    fn every_kind_is_listed_for_the_metrics() {
        let node = || "n".to_owned();
        let pod = || PodRef {
            namespace: "apps".into(),
            name: "web".into(),
            uid: "u1".into(),
            node: node(),
        };
        let every_variant = [
            Action::Taint {
                node: node(),
                key: crate::names::LOST_QUORUM_TAINT,
                value: crate::names::TAINT_BY_FAIL_OVER,
                cause: Cause::FailOver,
                note: String::new(),
            },
            Action::Untaint {
                node: node(),
                key: crate::names::LOST_QUORUM_TAINT,
                cause: Cause::LostQuorum,
                note: String::new(),
            },
            evict(Cause::FailOver),
            Action::ForceDelete {
                pod: pod(),
                note: String::new(),
            },
            Action::DeleteAttachment {
                attachment: AttachmentView {
                    name: "va".into(),
                    uid: "u2".into(),
                    node: node(),
                },
                note: String::new(),
            },
            Action::ForceSecondary {
                resource: "r".into(),
                node: node(),
                pv: None,
            },
            Action::PublishServiceEndpoint {
                pv: "pv".into(),
                claim: ClaimKey {
                    namespace: "ns".into(),
                    name: "data".into(),
                },
                endpoint: "10.0.0.1:2049".into(),
                over_version: "1".into(),
                confirm_first: false,
            },
            Action::HoldFailOver {
                node: node(),
                resource: "r".into(),
                pv: "pv".into(),
                evidence: String::new(),
            },
            Action::HoldPublication {
                node: node(),
                resource: "r".into(),
                pv: "pv".into(),
                why: "w".into(),
            },
            Action::HoldEvacuation {
                node: node(),
                resource: "r".into(),
                pv: "pv".into(),
            },
            Action::WarnCoexistence {
                node: node(),
                pods: vec!["piraeus-datastore/ha-controller-x".into()],
            },
        ];
        let kinds: Vec<&str> = every_variant.iter().map(Action::kind).collect();
        assert_eq!(kinds, Action::KINDS);
    }
}
