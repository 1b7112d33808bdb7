//! Which PVs and VolumeAttachments an agent keeps: those of the DRBD resources on its node. Every
//! other volume of the cluster is dropped as it arrives, so that an agent's memory does not grow
//! with the volumes of other nodes. When its node gains a resource the PVs are listed again (and
//! the attachments, once a PV is newly kept from such a list), so that what was dropped before is
//! taken now; until that list is in, the agent's view is not [`Locality::current`] and it decides
//! nothing (a resource seen without its PV could look unused and be demoted).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use tokio::sync::Notify;

use crate::volume::csi_resource_name;

/// The two kept kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    Pvs,
    Attachments,
}

/// The node's resources and the names of their PVs, shared by the loop (which states the
/// resources after each DRBD read) and the two reflectors (which ask it what to keep).
#[derive(Clone, Default)]
pub struct Locality {
    local: Arc<Mutex<Local>>,
    relist_pvs: Arc<Notify>,
    relist_attachments: Arc<Notify>,
}

#[derive(Default)]
struct Local {
    resources: HashSet<String>,
    pvs: HashSet<String>,
    /// For each kept kind, (lists asked for, the newest asked-for list that is in).
    pv_lists: (u64, u64),
    attachment_lists: (u64, u64),
}

impl Local {
    fn lists(&mut self, kind: Kept) -> &mut (u64, u64) {
        match kind {
            Kept::Pvs => &mut self.pv_lists,
            Kept::Attachments => &mut self.attachment_lists,
        }
    }
}

impl Locality {
    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().expect("locality lock")
    }

    /// Notified when `kind` must be listed again.
    pub fn relist(&self, kind: Kept) -> Arc<Notify> {
        match kind {
            Kept::Pvs => self.relist_pvs.clone(),
            Kept::Attachments => self.relist_attachments.clone(),
        }
    }

    fn ask_for_list(&self, local: &mut Local, kind: Kept) {
        local.lists(kind).0 += 1;
        self.relist(kind).notify_one();
    }

    /// The resources on this node now, after a DRBD read.
    pub fn set_resources<'a>(&self, resources: impl IntoIterator<Item = &'a str>) {
        let resources: HashSet<String> = resources.into_iter().map(str::to_owned).collect();
        let mut local = self.local();
        let gained = resources.iter().any(|r| !local.resources.contains(r));
        local.resources = resources;
        if gained {
            self.ask_for_list(&mut local, Kept::Pvs);
        }
    }

    /// A list of `kind` starts: which asked-for list it answers.
    pub fn list_started(&self, kind: Kept) -> u64 {
        self.local().lists(kind).0
    }

    /// The list that answers `asked` is in.
    pub fn list_done(&self, kind: Kept, asked: u64) {
        let mut local = self.local();
        let lists = local.lists(kind);
        lists.1 = lists.1.max(asked);
    }

    /// Whether every list asked for is in: the kept objects are all those of the node's resources.
    pub fn current(&self) -> bool {
        let local = self.local();
        local.pv_lists.1 >= local.pv_lists.0 && local.attachment_lists.1 >= local.attachment_lists.0
    }

    /// Whether to keep `pv`. A PV newly kept from a list (its resource is new here, so its
    /// attachments may have been dropped) asks for the attachments again; a PV just created has
    /// none yet.
    pub fn keeps_pv(&self, pv: &PersistentVolume, from_list: bool) -> bool {
        let mut local = self.local();
        let keep = csi_resource_name(pv).is_some_and(|r| local.resources.contains(&r));
        let name = pv.name_any();
        if !keep {
            local.pvs.remove(&name);
        } else if local.pvs.insert(name) && from_list {
            self.ask_for_list(&mut local, Kept::Attachments);
        }
        keep
    }

    /// Whether to keep an attachment: it attaches a kept PV.
    pub fn keeps_attachment(&self, attachment: &VolumeAttachment) -> bool {
        let pv = attachment.spec.source.persistent_volume_name.as_deref();
        pv.is_some_and(|pv| self.local().pvs.contains(pv))
    }
}

/// A kind the agent keeps only of its node's resources.
pub trait KeptKind {
    const KIND: Kept;
    /// Whether the locality keeps it (`from_list`: it comes from a list, not a change).
    fn kept_by(&self, locality: &Locality, from_list: bool) -> bool;
}

impl KeptKind for PersistentVolume {
    const KIND: Kept = Kept::Pvs;
    fn kept_by(&self, locality: &Locality, from_list: bool) -> bool {
        locality.keeps_pv(self, from_list)
    }
}

impl KeptKind for VolumeAttachment {
    const KIND: Kept = Kept::Attachments;
    fn kept_by(&self, locality: &Locality, _: bool) -> bool {
        locality.keeps_attachment(self)
    }
}

/// A watch event as the store should see it when only what `keep` says is kept (`keep` is told
/// whether the object comes from a list): an object that stops being kept is deleted from the
/// store, one never kept never reaches it.
pub fn kept<K>(event: Event<K>, keep: impl Fn(&K, bool) -> bool) -> Option<Event<K>> {
    match event {
        Event::Apply(object) if !keep(&object, false) => Some(Event::Delete(object)),
        Event::InitApply(object) if !keep(&object, true) => None,
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use serde_json::json;

    fn pv(name: &str, resource: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": resource}},
        }))
        .unwrap()
    }

    fn attachment(pv: &str) -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": format!("csi-{pv}")},
            "spec": {"attacher": "linstor.csi.linbit.com", "nodeName": "b", "source": {"persistentVolumeName": pv}},
        }))
        .unwrap()
    }

    #[test]
    fn only_the_volumes_of_local_resources_are_kept() {
        let locality = Locality::default();
        locality.set_resources(["pvc-local"]);
        let keep = |pv: &PersistentVolume, from_list| locality.keeps_pv(pv, from_list);
        assert!(kept(Event::InitApply(pv("pvc-local", "pvc-local")), keep).is_some());
        assert!(kept(Event::InitApply(pv("pvc-elsewhere", "pvc-elsewhere")), keep).is_none());
        assert!(locality.keeps_attachment(&attachment("pvc-local")));
        assert!(!locality.keeps_attachment(&attachment("pvc-elsewhere")));
        // A kept PV that changes to another resource leaves the store, and its attachments go.
        assert!(matches!(
            kept(Event::Apply(pv("pvc-local", "pvc-moved")), keep),
            Some(Event::Delete(_))
        ));
        assert!(!locality.keeps_attachment(&attachment("pvc-local")));
    }

    #[test]
    fn a_resource_new_on_the_node_makes_the_view_wait_for_a_new_list() {
        let locality = Locality::default();
        assert!(locality.current());
        locality.set_resources(["pvc-1"]);
        assert!(!locality.current(), "gained pvc-1: its PV may have been dropped");
        assert!(locality.relist(Kept::Pvs).notified().now_or_never().is_some());
        let asked = locality.list_started(Kept::Pvs);
        // The list brings pvc-1's PV: its attachments are asked for in turn.
        assert!(locality.keeps_pv(&pv("pvc-1", "pvc-1"), true));
        locality.list_done(Kept::Pvs, asked);
        assert!(!locality.current(), "the attachments' list is not in");
        let asked = locality.list_started(Kept::Attachments);
        locality.list_done(Kept::Attachments, asked);
        assert!(locality.current());
        // The same resources again, or fewer: nothing to list.
        locality.set_resources(["pvc-1"]);
        locality.set_resources(Vec::<&str>::new());
        assert!(locality.current());
        assert!(locality.relist(Kept::Pvs).notified().now_or_never().is_none());
    }

    #[test]
    fn a_pv_created_for_a_local_resource_needs_no_new_list() {
        let locality = Locality::default();
        locality.set_resources(["pvc-1"]);
        let asked = locality.list_started(Kept::Pvs);
        locality.list_done(Kept::Pvs, asked);
        assert!(locality.keeps_pv(&pv("pvc-1", "pvc-1"), false));
        assert!(locality.current());
    }
}
