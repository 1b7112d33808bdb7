//! The one way we write Kubernetes objects: server-side apply under a field manager, and only when
//! the object in the cluster differs from what we want (a converged object costs no write); and
//! the apply of one PV annotation, for the endpoints the two loops publish.

use std::fmt::Debug;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::converged::is_converged;
use crate::kube_client::api_status;

/// Applies `desired` with `field_manager` unless `current` already matches it. Returns the object
/// as stored after the write, or `None` when nothing was written.
pub async fn apply_if_changed<K>(
    api: &Api<K>,
    field_manager: &str,
    desired: &K,
    current: Option<&K>,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    if is_converged(desired, current) {
        return Ok(None);
    }
    apply(api, field_manager, desired).await.map(Some)
}

/// Applies `desired` with `field_manager`, taking over its fields from any other writer.
pub async fn apply<K>(api: &Api<K>, field_manager: &str, desired: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let params = PatchParams::apply(field_manager).force();
    api.patch(&desired.name_any(), &params, &Patch::Apply(desired)).await
}

/// Creates `desired` under `field_manager`; `None` when an object of that name exists already.
pub async fn create<K>(api: &Api<K>, field_manager: &str, desired: &K) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    let params = PostParams {
        field_manager: Some(field_manager.to_owned()),
        ..Default::default()
    };
    match api.create(&params, desired).await {
        Ok(created) => Ok(Some(created)),
        Err(err) if api_status(&err) == Some(409) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Like [`apply_if_changed`], for a `current` read from a cache: an object the cache does not
/// hold is created (one write, as a bare client would), and if it turns out to exist after all
/// it is read and applied.
pub async fn create_or_apply<K>(
    api: &Api<K>,
    field_manager: &str,
    desired: &K,
    current: Option<&K>,
) -> Result<Option<K>, kube::Error>
where
    K: Resource + Clone + Serialize + DeserializeOwned + Debug,
{
    if current.is_some() {
        return apply_if_changed(api, field_manager, desired, current).await;
    }
    if let Some(created) = create(api, field_manager, desired).await? {
        return Ok(Some(created));
    }
    let current = api.get_opt(&desired.name_any()).await?;
    apply_if_changed(api, field_manager, desired, current.as_ref()).await
}

/// Server-side apply of just these annotations of a PV under `field_manager`: the storage
/// system's annotations and every other field stay theirs. Returns the PV as stored.
pub async fn apply_annotations(
    pvs: &Api<PersistentVolume>,
    field_manager: &str,
    pv_name: &str,
    annotations: &[(&str, &str)],
) -> Result<PersistentVolume, kube::Error> {
    apply_annotations_over(pvs, field_manager, pv_name, annotations, None).await
}

/// [`apply_annotations`], written only while the PV is at `resource_version` (a 409 Conflict
/// otherwise): the write of a decision taken over that version.
pub async fn apply_annotations_over(
    pvs: &Api<PersistentVolume>,
    field_manager: &str,
    pv_name: &str,
    annotations: &[(&str, &str)],
    resource_version: Option<&str>,
) -> Result<PersistentVolume, kube::Error> {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(key, value)| (key.to_string(), Value::from(*value)))
        .collect();
    let mut patch = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "annotations": annotations},
    });
    if let Some(version) = resource_version.filter(|v| !v.is_empty()) {
        patch["metadata"]["resourceVersion"] = Value::from(version);
    }
    let params = PatchParams::apply(field_manager).force();
    pvs.patch(pv_name, &params, &Patch::Apply(&patch)).await
}
