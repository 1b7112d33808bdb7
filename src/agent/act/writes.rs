//! The Kubernetes writes of the steps, each guarded so that it changes only what was decided
//! about: UID preconditions on deletes, the resourceVersion read on a taint's patch.

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{ApiResource, DeleteParams, DynamicObject, EvictParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::Outcome;
use crate::agent::action::PodRef;
use crate::agent::view::AttachmentView;
use crate::kube_client::api_status;
use crate::names::{AGENT_FIELD_MANAGER, SILENT_SERVER_ANNOTATION};

pub async fn evict(client: &Client, pod: &PodRef, grace_period_seconds: u32) -> Result<Outcome, kube::Error> {
    let params = EvictParams {
        delete_options: Some(delete_params(&pod.uid, grace_period_seconds)),
        post_options: PostParams::default(),
    };
    pod_outcome(pods(client, pod).evict(&pod.name, &params).await.map(drop))
}

pub async fn force_delete(client: &Client, pod: &PodRef) -> Result<Outcome, kube::Error> {
    let result = pods(client, pod).delete(&pod.name, &delete_params(&pod.uid, 0)).await;
    pod_outcome(result.map(drop))
}

pub async fn delete_attachment(
    client: &Client,
    attachment: &AttachmentView,
    grace_period_seconds: u32,
) -> Result<Outcome, kube::Error> {
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let params = delete_params(&attachment.uid, grace_period_seconds);
    match attachments.delete(&attachment.name, &params).await {
        Ok(_) => Ok(Outcome::Done(None)),
        Err(err) => match api_status(&err) {
            Some(404) => Ok(Outcome::Skipped("already deleted".into())),
            Some(409) => Ok(Outcome::Skipped(
                "the attachment was replaced (UID precondition)".into(),
            )),
            _ => Err(err),
        },
    }
}

fn pods(client: &Client, pod: &PodRef) -> Api<Pod> {
    Api::namespaced(client.clone(), &pod.namespace)
}

/// Deletes only the object we decided about: a new one of the same name has another UID.
fn delete_params(uid: &str, grace_period_seconds: u32) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(grace_period_seconds),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    }
}

pub fn pod_outcome(result: Result<(), kube::Error>) -> Result<Outcome, kube::Error> {
    match result {
        Ok(()) => Ok(Outcome::Done(None)),
        Err(err) => match api_status(&err) {
            Some(404) => Ok(Outcome::Skipped("the pod is gone".into())),
            Some(409) => Ok(Outcome::Skipped("the pod was replaced (UID precondition)".into())),
            Some(429) => Ok(Outcome::Blocked),
            _ => Err(err),
        },
    }
}

/// Adds (`value` given) or removes a NoSchedule taint, keeping every other taint as stored: the
/// taints are read and written as raw JSON (a field a newer cluster added survives), with a
/// merge patch guarded by the resourceVersion read; another writer first means starting over.
pub async fn change_taint(client: &Client, node: &str, key: &str, value: Option<&str>) -> Result<Outcome, kube::Error> {
    let nodes: Api<DynamicObject> = Api::all_with(client.clone(), &ApiResource::erase::<Node>(&()));
    let mut attempts = 0;
    loop {
        attempts += 1;
        let current = nodes.get(node).await?;
        let mut taints: Vec<Value> = current
            .data
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if taints.iter().any(|t| t["key"] == key) == value.is_some() {
            return Ok(Outcome::Skipped("the taint is already as wanted".into()));
        }
        match value {
            Some(value) => taints.push(json!({
                "key": key,
                "value": value,
                "effect": "NoSchedule",
                "timeAdded": k8s_openapi::jiff::Timestamp::now().to_string(),
            })),
            None => taints.retain(|t| t["key"] != key),
        }
        let patch = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "spec": {"taints": taints},
        });
        let params = PatchParams {
            field_manager: Some(AGENT_FIELD_MANAGER.into()),
            ..Default::default()
        };
        match nodes.patch(node, &params, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(Outcome::Done(None)),
            Err(err) if api_status(&err) == Some(409) && attempts < 5 => continue,
            Err(err) => return Err(err),
        }
    }
}

/// Says on the PV (`value` given) or takes back that its published NFS server does not answer:
/// a merge patch of that one annotation, so that the publication's own applied annotations are
/// left as they are. A PV gone is nothing to say.
pub async fn say_server_silent(client: &Client, pv: &str, value: Option<&str>) -> Result<Outcome, kube::Error> {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let patch = json!({"metadata": {"annotations": {SILENT_SERVER_ANNOTATION: value}}});
    let params = PatchParams {
        field_manager: Some(AGENT_FIELD_MANAGER.into()),
        ..Default::default()
    };
    match pvs.patch(pv, &params, &Patch::Merge(&patch)).await {
        Ok(_) => Ok(Outcome::Done(None)),
        Err(err) if api_status(&err) == Some(404) => Ok(Outcome::Skipped("the PV is gone".into())),
        Err(err) => Err(err),
    }
}
