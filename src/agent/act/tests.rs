//! The executor's tests: what it carries out, remembers, tells and refuses, against a scripted API
//! server.

use super::*;
use crate::agent::act::writes::pod_outcome;
use crate::agent::action::{Cause, PodRef};
use crate::agent::source::{DrbdError, MockDrbdSource};
use crate::scripted_api;
use crate::volume::ClaimKey;
use mockall::predicate::eq;
use serde_json::{Value, json};
use std::sync::Mutex;

/// A client whose API server answers every request with 200 `{}` (events go nowhere).
fn stub_client() -> Client {
    scripted_api::client(|_| (200, "{}".into()))
}

fn stub_executor(drbd: MockDrbdSource, dry_run: bool) -> (Executor, AgentMetrics) {
    let metrics = AgentMetrics::register(&prometheus::Registry::new()).unwrap();
    let settings = ExecutorSettings {
        node: "node-b".into(),
        dry_run,
        grace_period_seconds: 10,
        operations_timeout: Duration::from_secs(5),
        cooldown: Duration::from_secs(60),
        max_concurrent_publications: 8,
        min_backoff: Duration::from_millis(50),
        max_state_age: Duration::from_secs(2),
        max_backoff: Duration::from_millis(400),
        write_endpoints: crate::core_endpoints::EndpointsAnswer::fixed(true),
    };
    let events = EventSink::new(stub_client(), "test", None);
    let executor = Executor::new(stub_client(), Arc::new(drbd), events, metrics.clone(), settings, None);
    (executor, metrics)
}

fn demote() -> Action {
    Action::ForceSecondary {
        resource: "pvc-1".into(),
        node: "node-b".into(),
        pv: Some("pv-1".into()),
    }
}

fn no_nodes() -> BTreeSet<String> {
    BTreeSet::new()
}

#[tokio::test]
async fn a_standing_report_is_told_again_each_repeat_interval() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let told = Arc::new(AtomicUsize::new(0));
    let client = scripted_api::client({
        let told = told.clone();
        move |request| {
            if request.path.contains("/events") {
                told.fetch_add(1, Ordering::SeqCst);
            }
            (200, "{}".into())
        }
    });
    let repeat = Duration::from_millis(200);
    let events = EventSink::new(client.clone(), "test", None).with(crate::events::EventSettings {
        warning_repeat_interval: repeat,
        remembered_warnings: 10,
    });
    let metrics = AgentMetrics::register(&prometheus::Registry::new()).unwrap();
    let settings = ExecutorSettings {
        cooldown: Duration::ZERO,
        ..stub_executor(MockDrbdSource::new(), false).0.settings
    };
    let mut executor = Executor::new(client, Arc::new(MockDrbdSource::new()), events, metrics, settings, None);
    let warning = Action::WarnCoexistence {
        node: "node-b".into(),
        pods: vec!["piraeus-datastore/ha-controller-x".into()],
    };
    let now = Instant::now();
    executor
        .run(Scope::Steps, vec![warning.clone()], now, &no_nodes())
        .await;
    executor
        .run(Scope::Steps, vec![warning.clone()], now, &no_nodes())
        .await;
    assert_eq!(told.load(Ordering::SeqCst), 1, "told once while it stands");
    tokio::time::sleep(repeat + Duration::from_millis(50)).await;
    executor.run(Scope::Steps, vec![warning], now, &no_nodes()).await;
    assert_eq!(told.load(Ordering::SeqCst), 2, "told again after the repeat interval");
}

#[tokio::test]
async fn an_action_done_is_not_repeated_while_it_stays_decided() {
    let mut drbd = MockDrbdSource::new();
    drbd.expect_force_secondary()
        .with(eq("pvc-1"))
        .times(2)
        .returning(|_| Ok(()));
    let (mut executor, metrics) = stub_executor(drbd, false);
    let now = Instant::now();
    executor.run(Scope::Steps, vec![demote()], now, &no_nodes()).await;
    executor.run(Scope::Steps, vec![demote()], now, &no_nodes()).await; // still decided: the cache lags, not repeated
    executor.run(Scope::Steps, vec![], now, &no_nodes()).await; // no longer decided: forgotten
    executor.run(Scope::Steps, vec![demote()], now, &no_nodes()).await; // needed again: done at once
    let done = metrics.actions.with_label_values(&["force_secondary", "ok"]).get();
    assert_eq!(done, 2);
}

#[tokio::test]
async fn a_publication_superseded_in_the_cache_is_made_again_at_once() {
    let (mut executor, metrics) = stub_executor(MockDrbdSource::new(), false);
    let publish = |over_version: &str| Action::PublishServiceEndpoint {
        pv: "pv-1".into(),
        claim: ClaimKey {
            namespace: "apps".into(),
            name: "data".into(),
        },
        endpoint: "10.0.0.2:2049".into(),
        over_version: over_version.into(),
        confirm_first: false,
    };
    let now = Instant::now();
    executor
        .run(Scope::Publications, vec![publish("7")], now, &no_nodes())
        .await;
    // Decided again over the same PV: the cache has not seen the write yet.
    executor
        .run(Scope::Publications, vec![publish("7")], now, &no_nodes())
        .await;
    // Over a newer PV: another node published in between (this one was primary, then not,
    // then again, faster than its rounds), so it publishes again.
    executor
        .run(Scope::Publications, vec![publish("9")], now, &no_nodes())
        .await;
    let done = metrics.actions.with_label_values(&["publish", "ok"]).get();
    assert_eq!(done, 2);
}

#[tokio::test]
async fn a_mass_move_tells_ten_pvs_and_sums_up_the_rest_on_the_node() {
    let events = Arc::new(Mutex::new(Vec::<Value>::new()));
    let posted = events.clone();
    let client = scripted_api::client(move |request| {
        if request.path.contains("/events") {
            posted.lock().unwrap().push(request.body.clone());
            return (201, "{}".into());
        }
        (
            200,
            json!({"metadata": {"name": "x", "resourceVersion": "8"}}).to_string(),
        )
    });
    let (executor, _) = stub_executor(MockDrbdSource::new(), false);
    let mut executor = Executor {
        client: client.clone(),
        events: EventSink::new(client, "test", None),
        ..executor
    };
    let publications: Vec<Action> = (0..12)
        .map(|i| Action::PublishServiceEndpoint {
            pv: format!("pv-{i:02}"),
            claim: ClaimKey {
                namespace: "apps".into(),
                name: format!("data-{i:02}"),
            },
            endpoint: "10.0.0.2:2049".into(),
            over_version: "7".into(),
            confirm_first: false,
        })
        .collect();
    executor
        .run(Scope::Publications, publications, Instant::now(), &no_nodes())
        .await;
    let events = events.lock().unwrap().clone();
    let on = |kind: &str| events.iter().filter(|e| e["regarding"]["kind"] == kind).count();
    assert_eq!((on("PersistentVolume"), on("Node"), events.len()), (10, 1, 11));
    let summary = events.iter().find(|e| e["regarding"]["kind"] == "Node").unwrap();
    assert_eq!(summary["reason"], "ServiceEndpointsMoved");
    assert!(
        summary["note"].as_str().unwrap().contains("The other 2: pv-10, pv-11"),
        "{summary}"
    );
}

#[tokio::test]
async fn failed_actions_are_retried_and_dry_run_runs_nothing() {
    let mut drbd = MockDrbdSource::new();
    drbd.expect_force_secondary().times(2).returning(|_| {
        Err(DrbdError::Failed {
            command: "drbdsetup secondary --force pvc-1".into(),
            status: "exit status: 11".into(),
            stderr: "State change failed".into(),
            timed_out: false,
        })
    });
    let (mut executor, metrics) = stub_executor(drbd, false);
    let failed = || metrics.actions.with_label_values(&["force_secondary", "failed"]).get();
    executor
        .run(Scope::Steps, vec![demote()], Instant::now(), &no_nodes())
        .await;
    executor
        .run(Scope::Steps, vec![demote()], Instant::now(), &no_nodes())
        .await; // backing off: not tried
    assert_eq!(failed(), 1);
    tokio::time::sleep(Duration::from_millis(60)).await;
    executor
        .run(Scope::Steps, vec![demote()], Instant::now(), &no_nodes())
        .await; // after 50 ms: tried again
    assert_eq!(failed(), 2);
    tokio::time::sleep(Duration::from_millis(60)).await;
    executor
        .run(Scope::Steps, vec![demote()], Instant::now(), &no_nodes())
        .await; // the delay doubled: not yet
    assert_eq!(failed(), 2);

    let mut untouched = MockDrbdSource::new();
    untouched.expect_force_secondary().never();
    let (mut dry, metrics) = stub_executor(untouched, true);
    dry.run(Scope::Steps, vec![demote()], Instant::now(), &no_nodes()).await;
    let reported = metrics
        .refused_actions
        .with_label_values(&["force_secondary", "dry_run"])
        .get();
    assert_eq!(reported, 1);
}

fn fail_over_of(node: &str) -> Vec<Action> {
    let pod = PodRef {
        namespace: "apps".into(),
        name: "app".into(),
        uid: "u1".into(),
        node: node.into(),
    };
    let taint = Action::Taint {
        node: node.into(),
        key: crate::names::LOST_QUORUM_TAINT,
        value: crate::names::TAINT_BY_FAIL_OVER,
        cause: Cause::FailOver,
        note: String::new(),
    };
    vec![
        Action::Refused {
            action: Box::new(taint),
            why: "guard".into(),
        },
        Action::ForceDelete {
            pod,
            note: String::new(),
        },
    ]
}

/// An API server whose guard Lease holds fresh reservations for `reserved`, with no agent
/// Leases and no tainted Node, its first `unreadable` reads of the guard Lease answered 500;
/// every other request is answered 200 `{}`. Counts pod deletions.
fn guard_api(reserved: &'static [&'static str], unreadable: usize) -> (Client, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let deletions = Arc::new(AtomicUsize::new(0));
    let counted = deletions.clone();
    let guard_reads = AtomicUsize::new(0);
    let client = scripted_api::client(move |request| {
        let path = &request.path;
        let listing = request.query.contains("labelSelector");
        if request.method == http::Method::DELETE && path.contains("/pods/") {
            counted.fetch_add(1, Ordering::SeqCst);
        }
        if path.ends_with(crate::names::FAIL_OVER_GUARD_LEASE)
            && request.method == http::Method::GET
            && guard_reads.fetch_add(1, Ordering::SeqCst) < unreadable
        {
            return (
                500,
                json!({"kind": "Status", "code": 500, "reason": "InternalError"}).to_string(),
            );
        }
        // Reserved 2 s ago (reservations last 120 s): their taints may still be on their way.
        let expiry = (k8s_openapi::jiff::Timestamp::now() + std::time::Duration::from_secs(118)).to_string();
        let body = if path.ends_with(crate::names::FAIL_OVER_GUARD_LEASE) {
            let held: std::collections::BTreeMap<&str, &str> = reserved.iter().map(|n| (*n, expiry.as_str())).collect();
            serde_json::json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": crate::names::FAIL_OVER_GUARD_LEASE, "resourceVersion": "1",
                    "annotations": {crate::names::FAIL_OVER_RESERVATIONS_ANNOTATION: serde_json::to_string(&held).unwrap()}}})
        } else if listing {
            serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {}, "items": []})
        } else {
            serde_json::json!({})
        };
        (200, body.to_string())
    });
    (client, deletions)
}

/// Node a's force-delete (its fail-over's first step with `--disable-node-taints`) carried out
/// by an executor with a guard over 4 storage nodes whose Lease holds `reserved`: (steps the
/// guard refused, pods deleted).
async fn force_delete_under_the_guard(reserved: &'static [&'static str]) -> (u64, usize) {
    let (client, deletions) = guard_api(reserved, 0);
    let (mut executor, metrics) = guarded_executor(client);
    executor
        .run(
            Scope::Steps,
            vec![fail_over_of("node-a").remove(1)],
            Instant::now(),
            &four_storage_nodes(),
        )
        .await;
    let refused = metrics
        .refused_actions
        .with_label_values(&["force_delete", "guard"])
        .get();
    (refused, deletions.load(std::sync::atomic::Ordering::SeqCst))
}

/// An executor over `client` with a blast-radius guard (limit 0.5).
fn guarded_executor(client: Client) -> (Executor, AgentMetrics) {
    let metrics = AgentMetrics::register(&prometheus::Registry::new()).unwrap();
    let guard = FailOverGuard::new(&client, "default", "", 0.5, Duration::from_secs(5));
    let settings = stub_executor(MockDrbdSource::new(), false).0.settings;
    let events = EventSink::new(client.clone(), "test", None);
    let drbd = Arc::new(MockDrbdSource::new());
    let executor = Executor::new(client, drbd, events, metrics.clone(), settings, Some(guard));
    (executor, metrics)
}

fn four_storage_nodes() -> BTreeSet<String> {
    ["node-a", "node-b", "node-c", "node-d"].map(String::from).into()
}

#[tokio::test]
async fn a_guard_that_could_not_be_read_is_asked_again_after_the_back_off() {
    // One failed read of the guard Lease (a blip of the API server) holds node a's fail-over for
    // the back-off (50 ms here), not for the cooldown (60 s) a refusal holds it for: behind a
    // flaky API server a crashed node's pods would wait a minute per failed read.
    let (client, deletions) = guard_api(&[], 1);
    let (mut executor, _) = guarded_executor(client);
    let force_delete = fail_over_of("node-a").remove(1);
    let deleted = || deletions.load(std::sync::atomic::Ordering::SeqCst);
    for (after_ms, expected, why) in [
        (0, 0, "nothing while the guard cannot tell"),
        (0, 0, "nothing again within the back-off"),
        (60, 1, "asked again once the back-off is over: the pod deleted"),
    ] {
        tokio::time::sleep(Duration::from_millis(after_ms)).await;
        let steps = vec![force_delete.clone()];
        executor
            .run(Scope::Steps, steps, Instant::now(), &four_storage_nodes())
            .await;
        assert_eq!(deleted(), expected, "{why}");
    }
}

#[tokio::test]
async fn a_fail_over_without_a_taint_still_asks_the_guard() {
    // --disable-node-taints: the fail-over's first step is a force-delete. Nodes c and d are
    // reserved by other agents; a would make 3 of 4 storage nodes, over 0.5.
    assert_eq!(force_delete_under_the_guard(&["node-c", "node-d"]).await, (1, 0));
}

#[tokio::test]
async fn a_fail_over_under_way_keeps_its_reservation() {
    // Node a's fail-over reserved it in an earlier round; nodes c and d were reserved (or
    // tainted themselves) since. Counting again would refuse a's attachment step and leave
    // the replacement pod to the attach-detach controller's six minutes.
    assert_eq!(
        force_delete_under_the_guard(&["node-a", "node-c", "node-d"]).await,
        (0, 1)
    );
}

#[tokio::test]
async fn a_refused_fail_over_does_nothing_else_to_that_node() {
    let mut drbd = MockDrbdSource::new();
    drbd.expect_force_secondary().times(1).returning(|_| Ok(()));
    let (mut executor, metrics) = stub_executor(drbd, false);
    let mut actions = fail_over_of("node-a");
    actions.push(demote());
    executor.run(Scope::Steps, actions, Instant::now(), &no_nodes()).await;
    let refused = metrics.refused_actions.with_label_values(&["taint", "guard"]).get();
    let deleted = metrics.actions.with_label_values(&["force_delete", "ok"]).get();
    let demoted = metrics.actions.with_label_values(&["force_secondary", "ok"]).get();
    assert_eq!((refused, deleted, demoted), (1, 0, 1));
    // The next round decides the same again: the refusal is not repeated, and still holds.
    executor
        .run(Scope::Steps, fail_over_of("node-a"), Instant::now(), &no_nodes())
        .await;
    let refused = metrics.refused_actions.with_label_values(&["taint", "guard"]).get();
    let deleted = metrics.actions.with_label_values(&["force_delete", "ok"]).get();
    assert_eq!((refused, deleted), (1, 0));
}

#[tokio::test]
async fn each_step_that_takes_something_checks_the_age_of_the_state() {
    // The round read DRBD 10 s ago (its fresh reads waited on the API server): the demotion
    // waits for the next round; what takes nothing goes on.
    let mut drbd = MockDrbdSource::new();
    drbd.expect_force_secondary().times(0);
    let (mut executor, metrics) = stub_executor(drbd, false);
    let untaint = Action::Untaint {
        node: "node-b".into(),
        key: crate::names::LOST_QUORUM_TAINT,
        cause: Cause::LostQuorum,
        note: String::new(),
    };
    let read_at = Instant::now() - Duration::from_secs(10);
    executor
        .run(Scope::Steps, vec![demote(), untaint], read_at, &no_nodes())
        .await;
    let demoted = metrics.actions.with_label_values(&["force_secondary", "ok"]).get();
    let untaint_tried: u64 = ["ok", "skipped", "failed"]
        .iter()
        .map(|result| metrics.actions.with_label_values(&["untaint", result]).get())
        .sum();
    assert_eq!((demoted, untaint_tried), (0, 1));
}

#[tokio::test]
async fn a_held_fail_over_is_reported_once_while_the_evidence_stays() {
    let (mut executor, metrics) = stub_executor(MockDrbdSource::new(), true);
    let hold = |evidence: &str| Action::HoldFailOver {
        node: "node-a".into(),
        resource: "pvc-1".into(),
        pv: "pv-1".into(),
        evidence: evidence.into(),
    };
    for _ in 0..3 {
        executor
            .run(Scope::Steps, vec![hold("alive")], Instant::now(), &no_nodes())
            .await;
    }
    assert_eq!(metrics.held_fail_overs.get(), 1);
    executor
        .run(Scope::Steps, vec![hold("connected to c")], Instant::now(), &no_nodes())
        .await;
    assert_eq!(metrics.held_fail_overs.get(), 2, "new evidence is reported again");
}

#[tokio::test]
async fn a_held_publication_is_told_once_across_the_rounds_steps() {
    let (mut executor, _) = stub_executor(MockDrbdSource::new(), false);
    let hold = Action::HoldPublication {
        node: "node-b".into(),
        resource: "pvc-1".into(),
        pv: "pv-1".into(),
        why: "node node-a moved the endpoint".into(),
    };
    let told_at = |executor: &Executor| executor.memory.remembered_at(&hold.key());
    executor
        .run(Scope::Publications, vec![hold.clone()], Instant::now(), &no_nodes())
        .await;
    let first = told_at(&executor).expect("told and remembered");
    // The same round's steps, then the next round: still decided, not told again.
    executor.run(Scope::Steps, vec![], Instant::now(), &no_nodes()).await;
    executor
        .run(Scope::Publications, vec![hold.clone()], Instant::now(), &no_nodes())
        .await;
    assert_eq!(told_at(&executor), Some(first));
    // No longer decided: forgotten, told again when it comes back.
    executor
        .run(Scope::Publications, vec![], Instant::now(), &no_nodes())
        .await;
    assert_eq!(told_at(&executor), None);
}

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(kube::core::Status::failure("test", "Test").with_code(code).boxed())
}

#[test]
fn pod_answers_map_to_outcomes() {
    assert_eq!(pod_outcome(Ok(())).unwrap(), Outcome::Done(None));
    assert!(matches!(pod_outcome(Err(api_error(404))), Ok(Outcome::Skipped(_))));
    assert!(matches!(pod_outcome(Err(api_error(409))), Ok(Outcome::Skipped(_))));
    assert_eq!(pod_outcome(Err(api_error(429))).unwrap(), Outcome::Blocked);
    assert!(pod_outcome(Err(api_error(500))).is_err());
}
/// A client whose API server refuses every write to a node with `code`, has that node
/// tainted, and keeps the events posted.
fn refusing_client(code: u16) -> (Client, Arc<Mutex<Vec<Value>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let posted = events.clone();
    let client = scripted_api::client(move |request| {
        let (status, body) = if request.path.contains("/events") {
            posted.lock().unwrap().push(request.body.clone());
            (201, json!({}))
        } else if request.method == http::Method::GET {
            let taints = [json!({"key": crate::names::LOST_QUORUM_TAINT, "effect": "NoSchedule"})];
            (
                200,
                json!({"metadata": {"name": "node-b", "resourceVersion": "1"}, "spec": {"taints": taints}}),
            )
        } else {
            let refused = json!({"kind": "Status", "code": code, "message": "nodes \"node-b\" is forbidden"});
            (code, refused)
        };
        (status, body.to_string())
    });
    (client, events)
}

/// Node b, back, removes the taint its fail-over left: its guard reservation goes with it,
/// instead of counting against other nodes' fail-overs until it lapses (2 minutes with the
/// default `--operations-timeout`).
#[tokio::test]
async fn a_node_back_from_a_fail_over_gives_its_guard_reservation_back() {
    let written = Arc::new(Mutex::new(Vec::new()));
    let kept = written.clone();
    let expiry = (k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(60)).to_string();
    let client = scripted_api::client(move |request| {
        let path = &request.path;
        let body = if path.ends_with(crate::names::FAIL_OVER_GUARD_LEASE) {
            if request.method == http::Method::PUT {
                kept.lock().unwrap().push(request.body.clone());
            }
            let held = json!({"node-b": expiry, "node-c": expiry}).to_string();
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": crate::names::FAIL_OVER_GUARD_LEASE, "resourceVersion": "1",
                    "annotations": {crate::names::FAIL_OVER_RESERVATIONS_ANNOTATION: held}}})
        } else if path.contains("/nodes/") {
            let taints =
                [json!({"key": LOST_QUORUM_TAINT, "value": crate::names::TAINT_BY_FAIL_OVER, "effect": "NoSchedule"})];
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-b", "resourceVersion": "1"}, "spec": {"taints": taints}})
        } else {
            json!({})
        };
        (200, body.to_string())
    });
    let (executor, metrics) = stub_executor(MockDrbdSource::new(), false);
    let guard = FailOverGuard::new(&client, "default", "", 0.5, Duration::from_secs(5));
    let mut executor = Executor {
        client: client.clone(),
        guard: Some(guard),
        ..executor
    };
    let untaint = Action::Untaint {
        node: "node-b".into(),
        key: LOST_QUORUM_TAINT,
        cause: Cause::LostQuorum,
        note: String::new(),
    };
    executor
        .run(Scope::Steps, vec![untaint], Instant::now(), &no_nodes())
        .await;
    assert_eq!(metrics.actions.with_label_values(&["untaint", "ok"]).get(), 1);
    let written = written.lock().unwrap().clone();
    assert_eq!(written.len(), 1, "the guard Lease written once");
    let annotation = &written[0]["metadata"]["annotations"][crate::names::FAIL_OVER_RESERVATIONS_ANNOTATION];
    let left: std::collections::BTreeMap<String, String> = serde_json::from_str(annotation.as_str().unwrap()).unwrap();
    assert_eq!(
        left.keys().collect::<Vec<_>>(),
        ["node-c"],
        "b's reservation given back, c's kept"
    );
}

#[tokio::test]
async fn a_write_no_retry_can_fix_is_told_at_once_and_retried_slowly() {
    let untaint = || Action::Untaint {
        node: "node-b".into(),
        key: crate::names::LOST_QUORUM_TAINT,
        cause: Cause::LostQuorum,
        note: String::new(),
    };
    for (code, retried_soon) in [(422, false), (403, true)] {
        let (client, events) = refusing_client(code);
        let (executor, metrics) = stub_executor(MockDrbdSource::new(), false);
        let mut executor = Executor {
            client: client.clone(),
            events: EventSink::new(client, "test", None),
            ..executor
        };
        let failed = || metrics.actions.with_label_values(&["untaint", "failed"]).get();
        executor
            .run(Scope::Steps, vec![untaint()], Instant::now(), &no_nodes())
            .await;
        let told = events.lock().unwrap().clone();
        assert_eq!(told.len(), 1, "{code}: one event");
        assert_eq!(
            (told[0]["reason"].as_str(), told[0]["type"].as_str()),
            (Some("WriteRefused"), Some("Warning"))
        );
        assert!(
            told[0]["note"].as_str().unwrap().contains("forbidden"),
            "{code}: the API's words"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        executor
            .run(Scope::Steps, vec![untaint()], Instant::now(), &no_nodes())
            .await;
        assert_eq!(failed() == 2, retried_soon, "{code}: retried after the first back-off");
        assert_eq!(
            events.lock().unwrap().len(),
            1,
            "{code}: told once while it stays the same"
        );
    }
}
