//! The agent's view of Kubernetes: reflectors on PVs, this node's own Pods and Node,
//! VolumeAttachments, the LINSTOR satellite pods and the agents' report Leases, every object
//! trimmed to what the decisions read, and one stream that ticks whenever any of them changes.
//! Other nodes' Pods and Nodes are not watched: their number, and their churn (a Node's status is
//! rewritten every few minutes), would make every agent's memory and watch traffic grow with the
//! cluster. A suspected peer's pods and Node are read fresh instead. Of the PVs and
//! VolumeAttachments, only those of the node's own DRBD resources are kept ([`Locality`]).

use std::fmt::Debug;
use std::hash::Hash;

use futures::stream::{self, BoxStream};
use futures::{FutureExt, StreamExt, TryStreamExt, future};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::locality::{Kept, Locality, kept};
use super::observe::{PIRAEUS_HA_CONTROLLER_LABELS, Snapshot};
use crate::kube_client::{drop_managed_fields, paged};
use crate::names::{AGENT_REPORT_LABEL, IGNORE_FAIL_OVER_ANNOTATION};
use crate::producer;
use crate::sharedvolume::claim::trim_pv;
use prometheus::{IntCounter, IntCounterVec};

use tokio::sync::mpsc::error::TrySendError;

pub struct Cache {
    pvs: Store<PersistentVolume>,
    pods: Store<Pod>,
    attachments: Store<VolumeAttachment>,
    nodes: Store<Node>,
    satellites: Store<Pod>,
    leases: Store<Lease>,
}

impl Cache {
    /// Starts the reflectors, on a task of their own: the stores stay current while the loop is
    /// busy (a mass fail-over acting on hundreds of volumes). The returned stream yields when
    /// something changed since it last yielded; the reflectors stop when it is dropped.
    pub fn start(
        client: &Client,
        node: &str,
        (satellite_namespace, satellite_selector): (&str, &str),
        lease_namespace: &str,
        locality: &Locality,
        received: &IntCounterVec,
    ) -> (Self, BoxStream<'static, ()>) {
        let counter = |watch: &str| received.with_label_values(&[watch]);
        let all = watcher::Config::default;
        // The cluster's PVs and attachments, of which only the node's own are kept.
        let paged = || paged(all());
        let pvs_kept = {
            let locality = locality.clone();
            move |pv: &PersistentVolume, from_list| locality.keeps_pv(pv, from_list)
        };
        let (pvs, pv_changes) = reflect_kept(
            Reflected::new(Api::all(client.clone()), paged(), trim_pv, counter("pvs")),
            pvs_kept,
            (locality.clone(), Kept::Pvs),
        );
        let own_pods = all().fields(&format!("spec.nodeName={node}"));
        let (pods, pod_changes) = reflect(Api::all(client.clone()), own_pods, trim_pod, counter("pods"));
        let attachments_kept = {
            let locality = locality.clone();
            move |attachment: &VolumeAttachment, _| locality.keeps_attachment(attachment)
        };
        let (attachments, attachment_changes) = reflect_kept(
            Reflected::new(
                Api::all(client.clone()),
                paged(),
                trim_attachment,
                counter("attachments"),
            ),
            attachments_kept,
            (locality.clone(), Kept::Attachments),
        );
        let (nodes, node_changes) = reflect(
            Api::all(client.clone()),
            all().fields(&format!("metadata.name={node}")),
            trim_node,
            counter("nodes"),
        );
        let (satellites, satellite_changes) = reflect(
            Api::namespaced(client.clone(), satellite_namespace),
            all().labels(satellite_selector),
            trim_pod,
            counter("satellites"),
        );
        let (leases, lease_changes) = reflect(
            Api::namespaced(client.clone(), lease_namespace),
            all().labels(AGENT_REPORT_LABEL),
            drop_managed_fields,
            counter("leases"),
        );
        let mut reflected = stream::select_all([
            pv_changes,
            pod_changes,
            attachment_changes,
            node_changes,
            satellite_changes,
            lease_changes,
        ]);
        // One change waiting says it all: the loop reads the stores, not the changes.
        let changes = producer::spawn(1, |sender| async move {
            while reflected.next().await.is_some() {
                if let Err(TrySendError::Closed(())) = sender.try_send(()) {
                    return;
                }
            }
        });
        let cache = Self {
            pvs,
            pods,
            attachments,
            nodes,
            satellites,
            leases,
        };
        (cache, changes)
    }

    /// Resolves once every reflector has listed its objects.
    pub async fn synced(&self) {
        let _ = future::join(
            future::join5(
                self.pvs.wait_until_ready(),
                self.pods.wait_until_ready(),
                self.attachments.wait_until_ready(),
                self.nodes.wait_until_ready(),
                self.satellites.wait_until_ready(),
            ),
            self.leases.wait_until_ready(),
        )
        .await;
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pvs: self.pvs.state(),
            pods: self.pods.state(),
            attachments: self.attachments.state(),
            nodes: self.nodes.state(),
            satellites: self.satellites.state(),
            leases: self.leases.state(),
        }
    }
}

/// A reflector whose every change ticks the returned stream; `received` counts the objects the
/// watch delivered.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    received: IntCounter,
) -> (Store<K>, BoxStream<'static, ()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (store, writer) = reflector::store();
    let changes = watcher(api, config)
        .default_backoff()
        .inspect_ok(move |event| {
            if matches!(
                event,
                watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitApply(_)
            ) {
                received.inc();
            }
        })
        .modify(trim)
        .reflect(writer)
        .filter_map(|event| {
            future::ready(match event {
                Ok(_) => Some(()),
                Err(err) => {
                    tracing::warn!(kind = K::kind(&Default::default()).as_ref(), error = %err, "watch failed; retrying");
                    None
                }
            })
        })
        .boxed();
    (store, changes)
}

/// What a reflector watches and how it trims and counts what arrives.
struct Reflected<K: Resource> {
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    received: IntCounter,
}

impl<K: Resource> Reflected<K> {
    fn new(api: Api<K>, config: watcher::Config, trim: fn(&mut K), received: IntCounter) -> Self {
        Self {
            api,
            config,
            trim,
            received,
        }
    }
}

/// A reflector that keeps only what `keep` says, and lists again whenever the locality asks (what
/// `keep` says changed): the fresh list replaces the store's contents, and once it is in the
/// locality is told.
fn reflect_kept<K>(
    reflected: Reflected<K>,
    keep: impl Fn(&K, bool) -> bool + Send + 'static,
    (locality, kind): (Locality, Kept),
) -> (Store<K>, BoxStream<'static, ()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (store, mut writer) = reflector::store();
    let Reflected {
        api,
        config,
        trim,
        received,
    } = reflected;
    let relist = locality.relist(kind);
    let changes = producer::spawn(1, move |sender| async move {
        loop {
            // This list answers every ask so far: a waiting notification is spent.
            let _ = relist.notified().now_or_never();
            let asked = locality.list_started(kind);
            let mut events = watcher(api.clone(), config.clone())
                .default_backoff()
                .modify(trim)
                .boxed();
            loop {
                let event = tokio::select! {
                    _ = sender.closed() => return,
                    _ = relist.notified() => break,
                    event = events.next() => event,
                };
                match event {
                    None => return,
                    Some(Err(err)) => {
                        tracing::warn!(kind = K::kind(&Default::default()).as_ref(), error = %err, "watch failed; retrying")
                    }
                    Some(Ok(event)) => {
                        if matches!(
                            event,
                            watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitApply(_)
                        ) {
                            received.inc();
                        }
                        let listed = matches!(event, watcher::Event::InitDone);
                        if let Some(event) = kept(event, &keep) {
                            writer.apply_watcher_event(&event);
                            if listed {
                                locality.list_done(kind, asked);
                            }
                            let _ = sender.try_send(());
                        }
                    }
                }
            }
            tracing::debug!(
                kind = K::kind(&Default::default()).as_ref(),
                "listing again: the node's resources changed"
            );
        }
    });
    (store, changes)
}

/// Drops what the decisions never read from a cached Node (its status lists images and
/// volumes, often the larger part of it): readiness, addresses, taints and cordon remain.
pub fn trim_node(node: &mut Node) {
    node.managed_fields_mut().clear();
    node.labels_mut().clear();
    node.annotations_mut().clear();
    if let Some(spec) = node.spec.take() {
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: spec.taints,
            unschedulable: spec.unschedulable,
            ..Default::default()
        });
    }
    if let Some(status) = node.status.take() {
        let ready = status
            .conditions
            .map(|c| c.into_iter().filter(|c| c.type_ == "Ready").collect());
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: ready,
            addresses: status.addresses,
            ..Default::default()
        });
    }
}

/// Drops what the decisions never read from a cached VolumeAttachment.
pub fn trim_attachment(attachment: &mut VolumeAttachment) {
    attachment.managed_fields_mut().clear();
    attachment.labels_mut().clear();
    attachment.annotations_mut().clear();
    attachment.status = None;
}

/// Drops what the decisions never read from a cached Pod, to keep the cache small.
pub fn trim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    pod.labels_mut()
        .retain(|k, _| PIRAEUS_HA_CONTROLLER_LABELS.iter().any(|(key, _)| key == k));
    pod.annotations_mut().retain(|k, _| k == IGNORE_FAIL_OVER_ANNOTATION);
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.clear();
        spec.init_containers = None;
        spec.ephemeral_containers = None;
        spec.affinity = None;
        spec.tolerations = None;
    }
    if let Some(status) = pod.status.as_mut() {
        *status = k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase.take(),
            ..Default::default()
        };
    }
}
