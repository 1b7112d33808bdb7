//! Endpoints follow the primary: this node publishes itself as the volume's NFS service endpoint
//! and rewrites the volume's EndpointSlice (and its core/v1 Endpoints, where they are written) in
//! the same round trip, all stamped with the move, so clients of the unchanged ClusterIP reach the new primary without
//! waiting for the leader, and the controller knows the move for one in flight.

use k8s_openapi::api::core::v1::{Endpoints, PersistentVolume};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

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
    /// Nothing written: the PV and the EndpointSlice, read fresh, name this endpoint already.
    InPlace,
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
    /// Read the PV and the EndpointSlice first, and write nothing if both name the endpoint.
    pub confirm_first: bool,
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
    if to.confirm_first && in_place(&pvs, &slices, to.pv, &name, server).await {
        return Ok(Followed::InPlace);
    }
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
    // says this node, no publication is decided again to repair them. A retry first checks that
    // the PV still names this move: a late one must not undo a newer move by another node.
    let still_ours = || still_published(&pvs, to.pv, to.endpoint);
    let endpoints = async {
        if !to.write_endpoints {
            return Ok(true);
        }
        match patch_retrying(&endpoints, &name, &params, &endpoints_patch, to.retry_for, still_ours).await {
            // The controller keeps none (its answer to --write-endpoints): nothing to follow.
            Err(err) if api_status(&err) == Some(404) => Ok(true),
            written => written,
        }
    };
    let slice = patch_retrying(&slices, &name, &params, &slice_patch, to.retry_for, still_ours);
    let (endpoints, slice) = tokio::join!(endpoints, slice);
    let ClaimKey { namespace, .. } = to.claim;
    for written in [endpoints, slice] {
        match written {
            Ok(true) => {}
            Ok(false) => return Ok(Followed::Superseded),
            Err(err) if api_status(&err) == Some(404) => {
                return Ok(Followed::Skipped(format!(
                    "the EndpointSlice {namespace}/{name} is not created by the controller yet"
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
/// (a conflict, a throttle, a server error, a broken connection), for at most `retry_for`, and
/// only while `still_wanted` says so before each retry. `Ok(false)`: no longer wanted, not written.
async fn patch_retrying<K, W, Wanted>(
    api: &Api<K>,
    name: &str,
    params: &PatchParams,
    patch: &Patch<&serde_json::Value>,
    retry_for: Duration,
    still_wanted: W,
) -> Result<bool, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    W: Fn() -> Wanted,
    Wanted: std::future::Future<Output = bool>,
{
    let give_up = tokio::time::Instant::now() + retry_for;
    let mut pause = Duration::from_millis(100);
    loop {
        match api.patch(name, params, patch).await {
            Err(err) if may_pass(&err) && tokio::time::Instant::now() + pause < give_up => {
                tracing::debug!(object = %name, error = %err, "endpoint write failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
                if !still_wanted().await {
                    tracing::info!(object = %name, "the PV names another endpoint now: the endpoint write is not tried again");
                    return Ok(false);
                }
            }
            written => return written.map(|_| true),
        }
    }
}

/// Whether the PV and the EndpointSlice, read fresh, both name `server` already (the slice's only
/// address and its port). A read that fails says no: the move is written as usual.
async fn in_place(
    pvs: &Api<PersistentVolume>,
    slices: &Api<EndpointSlice>,
    pv: &str,
    slice: &str,
    server: NfsEndpoint,
) -> bool {
    let endpoint = server.to_string();
    if !still_published(pvs, pv, &endpoint).await {
        return false;
    }
    let Ok(Some(slice)) = slices.get_opt(slice).await else {
        return false;
    };
    let ip = server.ip.to_string();
    let addresses: Vec<&String> = slice.endpoints.iter().flat_map(|e| &e.addresses).collect();
    let ports: Vec<Option<i32>> = slice.ports.iter().flatten().map(|p| p.port).collect();
    addresses == [&ip] && ports == [Some(i32::from(server.port))]
}

/// Whether the PV still names `endpoint`, read fresh (a list by name: the agent may not get PVs).
/// A read that fails leaves the retry to go on: it writes what it tried to write before.
async fn still_published(pvs: &Api<PersistentVolume>, pv: &str, endpoint: &str) -> bool {
    let by_name = ListParams::default().fields(&format!("metadata.name={pv}"));
    let Ok(listed) = pvs.list(&by_name).await else {
        return true;
    };
    listed
        .items
        .first()
        .is_some_and(|pv| pv.annotations().get(SERVICE_ENDPOINT_ANNOTATION).map(String::as_str) == Some(endpoint))
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

    /// [`a_move`] on a cluster where core/v1 Endpoints are not written.
    fn slices_only(claim: &ClaimKey) -> Move<'_> {
        Move {
            write_endpoints: false,
            ..a_move(claim)
        }
    }

    /// How many of the requests `seen` went to EndpointSlices.
    fn slice_requests(seen: &Mutex<Vec<String>>) -> usize {
        seen.lock()
            .unwrap()
            .iter()
            .filter(|p| p.contains("endpointslices"))
            .count()
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
            confirm_first: false,
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
        let slices = slice_requests(&seen);
        assert_eq!(slices, 3);
    }

    #[tokio::test]
    async fn a_resync_over_objects_in_place_writes_nothing() {
        const NAMES_B: &str = r#"{"kind":"PersistentVolumeList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"pvc-1","annotations":{"storageos.com/nfs-service-endpoint":"10.0.0.2:2049"}}}]}"#;
        const SLICE_AT_B: &str = r#"{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"pvc-1"},"addressType":"IPv4","endpoints":[{"addresses":["10.0.0.2"]}],"ports":[{"name":"nfs","port":2049,"protocol":"TCP"}]}"#;
        const SLICE_AT_A: &str = r#"{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"pvc-1"},"addressType":"IPv4","endpoints":[{"addresses":["10.0.0.1"]}],"ports":[{"name":"nfs","port":2049,"protocol":"TCP"}]}"#;
        let claim = claim();
        let resync = Move {
            confirm_first: true,
            ..a_move(&claim)
        };
        let (client, seen) = scripted(|path, _| match path {
            "/api/v1/persistentvolumes" => (200, NAMES_B),
            p if p.contains("endpointslices") => (200, SLICE_AT_B),
            _ => (200, "{}"),
        });
        assert_eq!(publish_and_follow(&client, resync).await.unwrap(), Followed::InPlace);
        assert_eq!(seen.lock().unwrap().len(), 2, "two reads, no write");
        // A slice someone pointed elsewhere is written again.
        let (client, _) = scripted(|path, _| match path {
            "/api/v1/persistentvolumes" => (200, NAMES_B),
            p if p.contains("endpointslices") => (200, SLICE_AT_A),
            _ => (200, "{}"),
        });
        let resync = Move {
            confirm_first: true,
            ..a_move(&claim)
        };
        assert_eq!(publish_and_follow(&client, resync).await.unwrap(), Followed::Rewritten);
    }

    #[tokio::test]
    async fn a_retry_stops_once_the_pv_names_another_node() {
        const MOVED_ON: &str = r#"{"kind":"PersistentVolumeList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"name":"pvc-1","annotations":{"storageos.com/nfs-service-endpoint":"10.0.0.3:2049"}}}]}"#;
        let (client, seen) = scripted(|path, _| {
            if path.contains("endpointslices") {
                (503, UNAVAILABLE)
            } else if path == "/api/v1/persistentvolumes" {
                (200, MOVED_ON)
            } else {
                (200, "{}")
            }
        });
        let claim = claim();
        assert_eq!(
            publish_and_follow(&client, slices_only(&claim)).await.unwrap(),
            Followed::Superseded
        );
        let slices = slice_requests(&seen);
        assert_eq!(slices, 1, "node c's newer move is not undone by a retry");
    }

    #[tokio::test]
    async fn without_core_endpoints_a_move_writes_the_pv_and_the_slice_only() {
        let (client, seen) = scripted(|_, _| (200, "{}"));
        let claim = claim();
        assert_eq!(
            publish_and_follow(&client, slices_only(&claim)).await.unwrap(),
            Followed::Rewritten
        );
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen.iter().all(|p| !p.contains("/endpoints/")), "{seen:?}");
    }

    /// The controller decides whether core/v1 Endpoints are kept (`--write-endpoints`): an agent
    /// that still writes them while the controller no longer does (one of them re-read the API
    /// server's version after an upgrade first) finds none, and the move still counts.
    #[tokio::test]
    async fn endpoints_the_controller_does_not_keep_do_not_stop_a_move() {
        const NOT_FOUND: &str =
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
        let (client, seen) = scripted(|path, _| match path.contains("/endpoints/") {
            true => (404, NOT_FOUND),
            false => (200, "{}"),
        });
        let claim = claim();
        assert_eq!(
            publish_and_follow(&client, a_move(&claim)).await.unwrap(),
            Followed::Rewritten
        );
        assert_eq!(slice_requests(&seen), 1);
    }
}
