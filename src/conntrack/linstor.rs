//! The Service LINSTOR CSI serves its own RWX volumes through (`--linstor-nfs-service`), watched
//! in every namespace: nfs-helper's EndpointSlices name it, and its ClusterIP and per-volume ports
//! are what those volumes' clients mount.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};

/// How long the repair waits for the first list of the Service before it starts without it.
const FIRST_LIST: Duration = Duration::from_secs(30);

pub struct LinstorServices {
    store: Option<Store<Service>>,
}

impl LinstorServices {
    /// Watches the Services named `name` (none when empty); once listed, or after
    /// [`FIRST_LIST`] with a warning: nfs-helper's slices are then not repaired.
    pub async fn watch(client: Client, name: &str) -> Self {
        if name.is_empty() {
            return Self { store: None };
        }
        let (store, writer) = reflector::store();
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let events = watcher(Api::<Service>::all(client), config)
            .default_backoff()
            .reflect(writer)
            .for_each(|_| std::future::ready(()));
        tokio::spawn(events);
        if tokio::time::timeout(FIRST_LIST, store.wait_until_ready())
            .await
            .is_err()
        {
            tracing::warn!(
                service = name,
                "cannot list the Services named {name}: LINSTOR CSI's own RWX volumes are not repaired until they are (the repair needs list and watch on Services; --linstor-nfs-service \"\" turns this off)"
            );
        }
        Self { store: Some(store) }
    }

    pub fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.store.as_ref()?.get(&ObjectRef::new(name).within(namespace))
    }

    /// Whether nfs-helper's slices are followed.
    pub fn enabled(&self) -> bool {
        self.store.is_some()
    }
}
