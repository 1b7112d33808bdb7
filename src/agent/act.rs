//! Carries out the decided actions: Kubernetes writes (with UID preconditions and optimistic
//! concurrency), `drbdsetup`, events and metrics. In dry-run mode it only reports.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, EvictParams, PostParams, Preconditions};
use kube::{Api, Client};

use super::action::{Action, PodRef};
use super::follow::{Followed, publish_and_follow};
use super::source::DrbdSource;
use crate::events::EventSink;
use crate::metrics::AgentMetrics;
use crate::names::AGENT_FIELD_MANAGER;

#[derive(Clone, Debug)]
pub struct ExecutorSettings {
    pub dry_run: bool,
    pub grace_period_seconds: u32,
    pub operations_timeout: Duration,
    /// An action done (or reported) is not repeated within this time while it stays decided
    /// (the cache may not show its effect yet).
    pub cooldown: Duration,
}

/// How one action ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Done; with a caveat worth telling (the endpoints were left to the controller).
    Done(Option<String>),
    /// Nothing to do any more (already gone, replaced, or left to the controller).
    Skipped(String),
    /// A PodDisruptionBudget does not allow it now; tried again next round.
    Blocked,
}

pub struct Executor {
    client: Client,
    drbd: Arc<dyn DrbdSource>,
    events: EventSink,
    metrics: AgentMetrics,
    settings: ExecutorSettings,
    /// Action description → when it was last done or reported.
    recent: HashMap<String, Instant>,
}

impl Executor {
    pub fn new(
        client: Client,
        drbd: Arc<dyn DrbdSource>,
        events: EventSink,
        metrics: AgentMetrics,
        settings: ExecutorSettings,
    ) -> Self {
        Self {
            client,
            drbd,
            events,
            metrics,
            settings,
            recent: HashMap::new(),
        }
    }

    /// Carries out `actions` in order. `drbd_read_at` is when the DRBD state they were decided
    /// on was read: the start of the endpoint-rewrite latency.
    pub async fn run(&mut self, actions: Vec<Action>, drbd_read_at: Instant) {
        let now = Instant::now();
        let decided: Vec<String> = actions.iter().map(Action::describe).collect();
        // An action no longer decided has taken effect (or its cause went away): when it is
        // needed again, it is carried out at once.
        let cooldown = self.settings.cooldown;
        self.recent
            .retain(|key, at| now.duration_since(*at) < cooldown && decided.contains(key));
        for (action, key) in actions.iter().zip(decided) {
            if self.recent.contains_key(&key) {
                continue;
            }
            if self.carry_out(action, drbd_read_at).await {
                self.recent.insert(key, Instant::now());
            }
        }
    }

    /// Returns whether the action is settled (not to be retried before the cooldown).
    async fn carry_out(&self, action: &Action, drbd_read_at: Instant) -> bool {
        let target = action.target();
        if let Action::Refused { action: inner, why } = action {
            self.metrics
                .refused_actions
                .with_label_values(&[inner.kind(), "guard"])
                .inc();
            let note = format!("{}: {why}", action.describe());
            self.events.warning(&target, "FailOverRefused", "Refuse", note).await;
            return true;
        }
        if self.settings.dry_run {
            self.metrics
                .refused_actions
                .with_label_values(&[action.kind(), "dry_run"])
                .inc();
            let note = format!("dry run: would {} ({})", action.describe(), action.note());
            self.events.normal(&target, "DryRun", "DryRun", note).await;
            return true;
        }
        let result = tokio::time::timeout(self.settings.operations_timeout, self.execute(action)).await;
        let result = result.unwrap_or_else(|_| Err(format!("timed out after {:?}", self.settings.operations_timeout)));
        let label = match &result {
            Ok(Outcome::Done(_)) => "ok",
            Ok(Outcome::Skipped(_)) => "skipped",
            Ok(Outcome::Blocked) => "blocked",
            Err(_) => "failed",
        };
        self.metrics.actions.with_label_values(&[action.kind(), label]).inc();
        match result {
            Ok(Outcome::Done(caveat)) => {
                if let (Action::PublishServiceEndpoint { .. }, None) = (action, &caveat) {
                    self.metrics
                        .endpoint_rewrite
                        .observe(drbd_read_at.elapsed().as_secs_f64());
                }
                let (warning, reason) = action.event_reason();
                let mut note = format!("{} ({})", action.describe(), action.note());
                if let Some(caveat) = caveat {
                    note.push_str(&format!("; {caveat}"));
                }
                if warning {
                    self.events.warning(&target, reason, action.kind(), note).await;
                } else {
                    self.events.normal(&target, reason, action.kind(), note).await;
                }
                true
            }
            Ok(Outcome::Skipped(why)) => {
                tracing::info!(action = %action.describe(), "skipped: {why}");
                true
            }
            Ok(Outcome::Blocked) => {
                let note = format!(
                    "cannot {} now: a PodDisruptionBudget does not allow it; retrying",
                    action.describe()
                );
                self.events
                    .warning_once(&target, "EvictionBlocked", action.kind(), note)
                    .await;
                false
            }
            Err(err) => {
                let note = format!("cannot {}: {err}; retrying", action.describe());
                self.events
                    .warning_once(&target, "FailOverActionFailed", action.kind(), note)
                    .await;
                false
            }
        }
    }

    async fn execute(&self, action: &Action) -> Result<Outcome, String> {
        let client = &self.client;
        let kube = |err: kube::Error| err.to_string();
        match action {
            Action::Taint { node, key, .. } => change_taint(client, node, key, true).await.map_err(kube),
            Action::Untaint { node, key, .. } => change_taint(client, node, key, false).await.map_err(kube),
            Action::Evict { pod, .. } => {
                let params = EvictParams {
                    delete_options: Some(delete_params(pod, self.settings.grace_period_seconds)),
                    post_options: PostParams::default(),
                };
                let result = pods(client, pod).evict(&pod.name, &params).await;
                pod_outcome(result.map(|_| ())).map_err(kube)
            }
            Action::ForceDelete { pod, .. } => {
                let result = pods(client, pod).delete(&pod.name, &delete_params(pod, 0)).await;
                pod_outcome(result.map(|_| ())).map_err(kube)
            }
            Action::DeleteAttachment { name, .. } => {
                let attachments: Api<VolumeAttachment> = Api::all(client.clone());
                match attachments.delete(name, &DeleteParams::default()).await {
                    Ok(_) => Ok(Outcome::Done(None)),
                    Err(err) if status(&err) == Some(404) => Ok(Outcome::Skipped("already deleted".into())),
                    Err(err) => Err(err.to_string()),
                }
            }
            Action::ForceSecondary { resource, .. } => self
                .drbd
                .force_secondary(resource)
                .await
                .map(|_| Outcome::Done(None))
                .map_err(|err| err.to_string()),
            Action::PublishServiceEndpoint { pv, endpoint } => match publish_and_follow(client, pv, endpoint).await {
                Ok(Followed::Rewritten) => Ok(Outcome::Done(None)),
                Ok(Followed::Skipped(why)) => Ok(Outcome::Done(Some(format!(
                    "only the service endpoint was published, the endpoints are left to the controller: {why}"
                )))),
                Err(err) => Err(err.to_string()),
            },
            Action::Refused { .. } => Ok(Outcome::Skipped("refused".into())),
        }
    }
}

fn status(err: &kube::Error) -> Option<u16> {
    match err {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

fn pods(client: &Client, pod: &PodRef) -> Api<Pod> {
    Api::namespaced(client.clone(), &pod.namespace)
}

/// Deletes only the pod we decided about: a new pod of the same name has another UID.
fn delete_params(pod: &PodRef, grace_period_seconds: u32) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(grace_period_seconds),
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    }
}

fn pod_outcome(result: Result<(), kube::Error>) -> Result<Outcome, kube::Error> {
    match result {
        Ok(()) => Ok(Outcome::Done(None)),
        Err(err) => match status(&err) {
            Some(404) => Ok(Outcome::Skipped("the pod is gone".into())),
            Some(409) => Ok(Outcome::Skipped("the pod was replaced (UID precondition)".into())),
            Some(429) => Ok(Outcome::Blocked),
            _ => Err(err),
        },
    }
}

/// Adds or removes a NoSchedule taint, keeping every other taint: read, change, write with the
/// resourceVersion read, and start over when another writer got there first.
async fn change_taint(client: &Client, node: &str, key: &str, add: bool) -> Result<Outcome, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut attempts = 0;
    loop {
        attempts += 1;
        let mut current = nodes.get(node).await?;
        let taints = current
            .spec
            .get_or_insert_with(Default::default)
            .taints
            .get_or_insert_with(Vec::new);
        if taints.iter().any(|t| t.key == key) == add {
            return Ok(Outcome::Skipped("the taint is already as wanted".into()));
        }
        if add {
            taints.push(Taint {
                key: key.to_owned(),
                effect: "NoSchedule".into(),
                time_added: Some(Time(k8s_openapi::jiff::Timestamp::now())),
                value: None,
            });
        } else {
            taints.retain(|t| t.key != key);
        }
        let params = PostParams {
            field_manager: Some(AGENT_FIELD_MANAGER.into()),
            ..Default::default()
        };
        match nodes.replace(node, &params, &current).await {
            Ok(_) => return Ok(Outcome::Done(None)),
            Err(err) if status(&err) == Some(409) && attempts < 5 => continue,
            Err(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::source::{DrbdError, MockDrbdSource};
    use http_body_util::Full;
    use hyper::body::Bytes;
    use mockall::predicate::eq;

    /// A client whose API server answers every request with 200 `{}` (events go nowhere).
    fn stub_client() -> Client {
        let service = tower::service_fn(|_: http::Request<kube::client::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from_static(b"{}"))))
        });
        Client::new(service, "default")
    }

    fn stub_executor(drbd: MockDrbdSource, dry_run: bool) -> (Executor, AgentMetrics) {
        let metrics = AgentMetrics::register(&prometheus::Registry::new()).unwrap();
        let settings = ExecutorSettings {
            dry_run,
            grace_period_seconds: 10,
            operations_timeout: Duration::from_secs(5),
            cooldown: Duration::from_secs(60),
        };
        let events = EventSink::new(stub_client(), "test", None);
        let executor = Executor::new(stub_client(), Arc::new(drbd), events, metrics.clone(), settings);
        (executor, metrics)
    }

    fn demote() -> Action {
        Action::ForceSecondary {
            resource: "pvc-1".into(),
            pv: "pv-1".into(),
        }
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
        executor.run(vec![demote()], now).await;
        executor.run(vec![demote()], now).await; // still decided: the cache lags, not repeated
        executor.run(vec![], now).await; // no longer decided: forgotten
        executor.run(vec![demote()], now).await; // needed again: done at once
        let done = metrics.actions.with_label_values(&["force_secondary", "ok"]).get();
        assert_eq!(done, 2);
    }

    #[tokio::test]
    async fn failed_actions_are_retried_and_dry_run_runs_nothing() {
        let mut drbd = MockDrbdSource::new();
        drbd.expect_force_secondary().times(2).returning(|_| {
            Err(DrbdError::Failed {
                command: "drbdsetup secondary --force pvc-1".into(),
                status: "exit status: 11".into(),
                stderr: "State change failed".into(),
            })
        });
        let (mut executor, metrics) = stub_executor(drbd, false);
        executor.run(vec![demote()], Instant::now()).await;
        executor.run(vec![demote()], Instant::now()).await;
        let failed = metrics.actions.with_label_values(&["force_secondary", "failed"]).get();
        assert_eq!(failed, 2);

        let mut untouched = MockDrbdSource::new();
        untouched.expect_force_secondary().never();
        let (mut dry, metrics) = stub_executor(untouched, true);
        dry.run(vec![demote()], Instant::now()).await;
        let reported = metrics
            .refused_actions
            .with_label_values(&["force_secondary", "dry_run"])
            .get();
        assert_eq!(reported, 1);
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
}
