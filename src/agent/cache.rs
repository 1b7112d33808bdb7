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

use super::locality::{KeptKind, Locality, kept};
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
        let (pvs, pv_changes) = reflect_kept(Api::all(client.clone()), paged(), trim_pv, counter("pvs"), locality);
        let own_pods = all().fields(&format!("spec.nodeName={node}"));
        let (pods, pod_changes) = reflect(Api::all(client.clone()), own_pods, trim_pod, counter("pods"));
        let (attachments, attachment_changes) = reflect_kept(
            Api::all(client.clone()),
            paged(),
            trim_attachment,
            counter("attachments"),
            locality,
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
        .inspect_ok(move |event| count_delivered(&received, event))
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

/// Counts an object a watch delivered.
fn count_delivered<K>(received: &IntCounter, event: &watcher::Event<K>) {
    if matches!(
        event,
        watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitApply(_)
    ) {
        received.inc();
    }
}

/// A reflector that keeps only what the locality keeps, and lists again whenever it asks (what
/// it keeps changed): the fresh list replaces the store's contents, and once it is in the
/// locality is told.
fn reflect_kept<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
    received: IntCounter,
    locality: &Locality,
) -> (Store<K>, BoxStream<'static, ()>)
where
    K: KeptKind + Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone,
{
    let (store, mut writer) = reflector::store();
    let locality = locality.clone();
    let relist = locality.relist(K::KIND);
    let what = || K::kind(&Default::default()).to_string();
    let changes = producer::spawn(1, move |sender| async move {
        loop {
            // This list answers every ask so far: a waiting notification is spent.
            let _ = relist.notified().now_or_never();
            let asked = locality.list_started(K::KIND);
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
                let event = match event {
                    None => return,
                    Some(Err(err)) => {
                        tracing::warn!(kind = what(), error = %err, "watch failed; retrying");
                        continue;
                    }
                    Some(Ok(event)) => event,
                };
                count_delivered(&received, &event);
                let listed = matches!(event, watcher::Event::InitDone);
                let Some(event) = kept(event, |object: &K, from_list| object.kept_by(&locality, from_list)) else {
                    continue;
                };
                writer.apply_watcher_event(&event);
                if listed {
                    locality.list_done(K::KIND, asked);
                }
                let _ = sender.try_send(());
            }
            tracing::debug!(kind = what(), "listing again: the node's resources changed");
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
