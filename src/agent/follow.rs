//! Endpoints follow the primary: this node publishes itself as the volume's NFS service endpoint
//! and rewrites the volume's EndpointSlice (and its core/v1 Endpoints, where they are written) in
//! the same round trip, all stamped with the move, so clients of the unchanged ClusterIP reach the new primary without
//! waiting for the leader, and the controller knows the move for one in flight.

use k8s_openapi::api::core::v1::{Endpoints, PersistentVolume};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use std::time::Duration;

use crate::apply::apply_annotations_over;
use crate::kube_client::api_status;
use crate::names::{AGENT_FIELD_MANAGER, SERVICE_ENDPOINT_ANNOTATION};
use crate::sharedvolume::desired::{moved_endpoints, service_name};
use crate::sharedvolume::stamp::MoveStamp;
use crate::volume::{ClaimKey, NfsEndpoint};

/// What happened to the endpoints beside the publish.
#[derive(Debug, PartialEq, Eq)]
pub enum Followed {
    /// Endpoints and EndpointSlice now point here.
    Rewritten,
    /// Left to the controller, with the reason (not created yet, or a change of address family).
    Skipped(String),
    /// Nothing written: the PV changed since the move was decided (another node's move, most
    /// likely); the next round decides again over what it is now.
    Superseded,
}

/// One move of a volume's endpoints to this node.
pub struct Move<'a> {
    pub pv: &'a str,
    /// The claim the PV is bound to, as cached: where its Service and endpoints live.
    pub claim: &'a ClaimKey,
    pub endpoint: &'a str,
    /// The PV's resourceVersion the move was decided over.
    pub over_version: &'a str,
    /// This node: the stamp says who moved the endpoints, and when.
    pub node: &'a str,
    /// How long the endpoints' writes are tried again.
    pub retry_for: Duration,
    /// When the move was triggered (RFC 3339): the DRBD state that showed this node promoted.
    pub triggered_at: &'a str,
    /// Rewrite the core/v1 Endpoints too (`--write-endpoints`), not only the EndpointSlice.
    pub write_endpoints: bool,
}

/// Publishes the move's endpoint on the PV and points the claim's Endpoints and EndpointSlice at
/// it, the three writes at once. The endpoints are patched, not applied: objects the controller
/// has not created (no Service yet, or not a claim it serves) are not created here.
pub async fn publish_and_follow(client: &Client, to: Move<'_>) -> Result<Followed, kube::Error> {
    let server: NfsEndpoint = to.endpoint.parse().map_err(|err| {
        kube::Error::Service(format!("the agent's own endpoint {:?} does not parse: {err}", to.endpoint).into())
    })?;
    let stamp = MoveStamp {
        node: Some(to.node.to_owned()),
        at: Some(k8s_openapi::jiff::Timestamp::now().to_string()),
        ..MoveStamp::new(to.endpoint, to.over_version)
    };
    let (stamp_key, stamp_text) = stamp.annotation();
    let annotations = [
        (SERVICE_ENDPOINT_ANNOTATION, to.endpoint),
        (stamp_key, stamp_text.as_str()),
    ];
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &to.claim.namespace);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &to.claim.namespace);
    let name = service_name(to.pv);
    let (endpoints_patch, slice_patch) = moved_endpoints(server, &stamp, to.triggered_at);
    let (endpoints_patch, slice_patch) = (Patch::Merge(&endpoints_patch), Patch::Merge(&slice_patch));
    let params = PatchParams {
        field_manager: Some(AGENT_FIELD_MANAGER.into()),
        ..Default::default()
    };
    // The PV first, and only at the version the move was decided over: a newer move by another
    // node is never overwritten, and the endpoints are not pointed here for a move that lost.
    let published = apply_annotations_over(&pvs, AGENT_FIELD_MANAGER, to.pv, &annotations, Some(to.over_version)).await;
    if let Err(err) = &published
        && api_status(err) == Some(409)
    {
        return Ok(Followed::Superseded);
    }
    published?;
    // Then both endpoints at once, each tried again on a failure that may pass: once the PV
    // says this node, no publication is decided again to repair them.
    let endpoints = async {
        if !to.write_endpoints {
            return Ok(());
        }
        patch_retrying(&endpoints, &name, &params, &endpoints_patch, to.retry_for)
            .await
            .map(|_| ())
    };
    let (endpoints, slice) = tokio::join!(
        endpoints,
        patch_retrying(&slices, &name, &params, &slice_patch, to.retry_for),
    );
    let ClaimKey { namespace, .. } = to.claim;
    for written in [endpoints, slice.map(|_| ())] {
        match written {
            Ok(()) => {}
            Err(err) if api_status(&err) == Some(404) => {
                return Ok(Followed::Skipped(format!(
                    "the Endpoints or EndpointSlice {namespace}/{name} are not created by the controller yet"
                )));
            }
            // An EndpointSlice cannot change its address type: the controller replaces it.
            Err(err) if api_status(&err) == Some(422) => {
                return Ok(Followed::Skipped(format!(
                    "the NFS server changed address family: the controller replaces EndpointSlice {namespace}/{name}"
                )));
            }
            Err(err) => return Err(err),
        }
    }
    Ok(Followed::Rewritten)
}

/// A merge patch, tried again with a growing pause while it fails for a reason that may pass
/// (a conflict, a throttle, a server error, a broken connection), for at most `retry_for`.
async fn patch_retrying<K>(
    api: &Api<K>,
    name: &str,
    params: &PatchParams,
    patch: &Patch<&serde_json::Value>,
    retry_for: Duration,
) -> Result<K, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let give_up = tokio::time::Instant::now() + retry_for;
    let mut pause = Duration::from_millis(100);
    loop {
        match api.patch(name, params, patch).await {
            Err(err) if may_pass(&err) && tokio::time::Instant::now() + pause < give_up => {
                tracing::debug!(object = %name, error = %err, "endpoint write failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            written => return written,
        }
    }
}

/// Whether a failed write may succeed when tried again as it is.
fn may_pass(err: &kube::Error) -> bool {
    match api_status(err) {
        Some(status) => status == 409 || status == 429 || status >= 500,
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::scripted_api;

    const CONFLICT: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Conflict","code":409}"#;
    const UNAVAILABLE: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":503}"#;

    /// A scripted API server: `answer(path, how many requests to that path before)` gives the
    /// status and body; every request's path is recorded.
    fn scripted(answer: fn(&str, usize) -> (u16, &'static str)) -> (Client, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let log = seen.clone();
        let client = scripted_api::client(move |request| {
            let mut seen = log.lock().unwrap();
            let before = seen.iter().filter(|p| **p == request.path).count();
            seen.push(request.path.clone());
            let (status, body) = answer(&request.path, before);
            (status, body.to_owned())
        });
        (client, seen)
    }

    fn a_move(claim: &ClaimKey) -> Move<'_> {
        Move {
            pv: "pvc-1",
            claim,
            endpoint: "10.0.0.2:2049",
            over_version: "41",
            node: "node-b",
            retry_for: Duration::from_secs(5),
            triggered_at: "2026-11-26T09:30:41Z",
            write_endpoints: true,
        }
    }

    fn claim() -> ClaimKey {
        ClaimKey {
            namespace: "apps".into(),
            name: "data".into(),
        }
    }

    #[tokio::test]
    async fn a_move_decided_over_an_older_pv_writes_nothing_else() {
        let (client, seen) = scripted(|path, _| match path.contains("persistentvolumes") {
            true => (409, CONFLICT),
            false => (200, "{}"),
        });
        let claim = claim();
        assert_eq!(
            publish_and_follow(&client, a_move(&claim)).await.unwrap(),
            Followed::Superseded
        );
        assert_eq!(seen.lock().unwrap().len(), 1, "the endpoints are not pointed here");
    }

    #[tokio::test]
    async fn an_endpoint_write_that_fails_for_a_while_is_tried_again() {
        let (client, seen) = scripted(|path, before| match path.contains("endpointslices") && before < 2 {
            true => (503, UNAVAILABLE),
            false => (200, "{}"),
        });
        let claim = claim();
        assert_eq!(
            publish_and_follow(&client, a_move(&claim)).await.unwrap(),
            Followed::Rewritten
        );
        let slices = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.contains("endpointslices"))
            .count();
        assert_eq!(slices, 3);
    }

    #[tokio::test]
    async fn without_core_endpoints_a_move_writes_the_pv_and_the_slice_only() {
        let (client, seen) = scripted(|_, _| (200, "{}"));
        let claim = claim();
        let slices_only = Move {
            write_endpoints: false,
            ..a_move(&claim)
        };
        assert_eq!(
            publish_and_follow(&client, slices_only).await.unwrap(),
            Followed::Rewritten
        );
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen.iter().all(|p| !p.contains("/endpoints/")), "{seen:?}");
    }
}
