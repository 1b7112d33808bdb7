//! The agent's actions as data, and everything about presenting one: its kind (metrics), its
//! description and note (logs and events), its event reason and the object the event is about.
//! [`super::decide`] produces them; [`super::act`] carries them out.

use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::view::PodView;

/// Why an action is taken; it names the events posted and the metrics counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A peer's node lost its DRBD connection (fail-over), or this node lost quorum.
    LostQuorum,
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
        name: String,
        note: String,
    },
    ForceSecondary {
        resource: String,
        pv: String,
    },
    PublishServiceEndpoint {
        pv: String,
        endpoint: String,
    },
    /// An action the blast-radius guard would not take.
    Refused {
        action: Box<Action>,
        why: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl From<&PodView> for PodRef {
    fn from(pod: &PodView) -> Self {
        Self {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        }
    }
}

impl Action {
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
            Self::Refused { action, .. } => action.kind(),
        }
    }

    /// What is done, in words (logs, events, and the key that keeps it from being repeated).
    pub fn describe(&self) -> String {
        match self {
            Self::Taint { node, key, .. } => format!("taint node {node} with {key}:NoSchedule"),
            Self::Untaint { node, key, .. } => format!("remove taint {key} from node {node}"),
            Self::Evict { pod, .. } => format!("evict pod {}/{}", pod.namespace, pod.name),
            Self::ForceDelete { pod, .. } => format!("force-delete pod {}/{}", pod.namespace, pod.name),
            Self::DeleteAttachment { name, .. } => format!("delete VolumeAttachment {name}"),
            Self::ForceSecondary { resource, .. } => format!("run drbdsetup secondary --force {resource}"),
            Self::PublishServiceEndpoint { pv, endpoint } => {
                format!("publish {endpoint} as the NFS service endpoint of PV {pv} and point its endpoints here")
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
            Self::ForceSecondary { .. } => "the resource is suspended and no running local pod uses it",
            Self::PublishServiceEndpoint { .. } => "this node is the DRBD primary with quorum",
            Self::Refused { why, .. } => why,
        }
    }

    /// (is a Warning, event reason). The reasons are Piraeus's where it has one.
    pub fn event_reason(&self) -> (bool, &'static str) {
        match self {
            Action::Taint {
                cause: Cause::ForceIoErrors,
                ..
            }
            | Action::Evict {
                cause: Cause::ForceIoErrors,
                ..
            } => (true, "VolumeForcingIoErrors"),
            Action::Taint { .. } => (true, "NodeStorageQuorumLost"),
            Action::Untaint {
                cause: Cause::ForceIoErrors,
                ..
            } => (false, "NodeStorageIoErrorsCleared"),
            Action::Untaint { .. } => (false, "NodeStorageQuorumRegained"),
            Action::Evict {
                cause: Cause::Evacuation,
                ..
            } => (false, "NodeEvacuation"),
            Action::Evict { .. } | Action::ForceDelete { .. } | Action::DeleteAttachment { .. } => {
                (true, "VolumeWithoutQuorum")
            }
            Action::ForceSecondary { .. } => (true, "SuspendedPrimaryDemoted"),
            Action::PublishServiceEndpoint { .. } => (false, "ServiceEndpointMoved"),
            Action::Refused { .. } => (true, "FailOverRefused"),
        }
    }

    /// The object the action's events are about.
    pub fn target(&self) -> ObjectReference {
        match self {
            Action::Taint { node, .. } | Action::Untaint { node, .. } => reference::<Node>(None, node, None),
            Action::Evict { pod, .. } | Action::ForceDelete { pod, .. } => {
                reference::<Pod>(Some(&pod.namespace), &pod.name, Some(&pod.uid))
            }
            Action::DeleteAttachment { name, .. } => reference::<VolumeAttachment>(None, name, None),
            Action::ForceSecondary { pv, .. } | Action::PublishServiceEndpoint { pv, .. } => {
                reference::<PersistentVolume>(None, pv, None)
            }
            Action::Refused { action, .. } => action.target(),
        }
    }
}

fn reference<K: k8s_openapi::Resource>(namespace: Option<&str>, name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::API_VERSION.into()),
        kind: Some(K::KIND.into()),
        namespace: namespace.map(Into::into),
        name: Some(name.into()),
        uid: uid.map(Into::into),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_name_the_cause_and_the_object() {
        let pod = PodRef {
            namespace: "apps".into(),
            name: "web".into(),
            uid: "u1".into(),
        };
        let evict = |cause| Action::Evict {
            pod: pod.clone(),
            cause,
            note: String::new(),
        };
        assert_eq!(evict(Cause::LostQuorum).event_reason(), (true, "VolumeWithoutQuorum"));
        assert_eq!(
            evict(Cause::ForceIoErrors).event_reason(),
            (true, "VolumeForcingIoErrors")
        );
        assert_eq!(evict(Cause::Evacuation).event_reason(), (false, "NodeEvacuation"));
        let target = evict(Cause::LostQuorum).target();
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
                cause: Cause::LostQuorum,
                note: String::new(),
            }),
            why: "guard".into(),
        };
        assert_eq!(refused.event_reason(), (true, "FailOverRefused"));
        assert_eq!(refused.target().kind.as_deref(), Some("Node"));
    }
}
