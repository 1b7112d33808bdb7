//! Carries out the decided actions: Kubernetes writes (with UID preconditions and optimistic
//! concurrency), `drbdsetup`, events and metrics. In dry-run mode it only reports. Every call is
//! bounded by `--operations-timeout`; failed actions back off exponentially.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{ApiResource, DeleteParams, DynamicObject, EvictParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::EventType;
use kube::{Api, Client};
use serde_json::{Value, json};

use super::action::{Action, ActionKey, Cause, ENDPOINT_MOVED, PodRef, node_reference};
use super::error::AgentError;
use super::follow::{Followed, Move, publish_and_follow};
use super::guard::{FailOverGuard, Reservation};
use super::mass_move;
use super::source::DrbdSource;
use super::view::FailOverDone;
use crate::deadline::within;
use crate::events::EventSink;
use crate::kube_client::api_status;
use crate::metrics::AgentMetrics;
use crate::names::{AGENT_FIELD_MANAGER, LOST_QUORUM_TAINT};

#[derive(Clone, Debug)]
pub struct ExecutorSettings {
    /// This agent's node: moves are stamped with it.
    pub node: String,
    pub dry_run: bool,
    pub grace_period_seconds: u32,
    pub operations_timeout: Duration,
    /// An action done (or reported) is not repeated within this time while it stays decided
    /// (the cache may not show its effect yet).
    pub cooldown: Duration,
    /// How many publications run at once.
    pub max_concurrent_publications: usize,
    /// First retry delay of a failed action; it doubles up to [`ExecutorSettings::max_backoff`].
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// Oldest DRBD state a step that takes something may be carried out over.
    pub max_state_age: Duration,
    /// A move rewrites the core/v1 Endpoints too, not only the EndpointSlice.
    pub write_endpoints: crate::core_endpoints::EndpointsAnswer,
}

/// How one action ended.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// Done; with a caveat worth telling (the endpoints were left to the controller).
    Done(Option<String>),
    /// Nothing to do any more (already gone, replaced, or left to the controller).
    Skipped(String),
    /// A PodDisruptionBudget does not allow it now; tried again later.
    Blocked,
}

/// What the executor remembers of an action it carried out or reported.
#[derive(Debug, PartialEq, Eq)]
enum Remembered {
    /// Not repeated within the cooldown while it stays decided.
    ForCooldown,
    /// Not repeated for as long as it stays decided (reports such as a held fail-over).
    WhileDecided,
    /// The blast-radius guard refused this node's fail-over: none of its steps this round.
    Refused(String),
    /// Failed or blocked: retried after a back-off.
    Retry,
    /// Refused by the API server in a way no retry changes: retried at the slowest pace.
    RetrySlowly,
}

struct Backoff {
    retry_at: Instant,
    delay: Duration,
}

/// What one action is, for everything said about it: computed once per action.
struct About {
    /// For metrics, and the event's action.
    kind: &'static str,
    /// The object its events are about.
    target: ObjectReference,
    /// What it does, in words; for a refused action, what would have been done.
    description: String,
}

impl About {
    fn of(action: &Action) -> Self {
        let described = match action {
            Action::Refused { action, .. } => action,
            action => action,
        };
        Self {
            kind: action.kind(),
            target: action.target(),
            description: described.describe(),
        }
    }
}

/// The event that tells how an action ended.
struct Told {
    type_: EventType,
    reason: &'static str,
    action: &'static str,
    note: String,
    /// A Warning posted only while its note changes (something that keeps failing).
    once: bool,
}

impl Told {
    fn new(type_: EventType, reason: &'static str, action: &'static str, note: String) -> Self {
        Self {
            type_,
            reason,
            action,
            note,
            once: false,
        }
    }

    fn warning_once(reason: &'static str, action: &'static str, note: String) -> Self {
        Self {
            once: true,
            ..Self::new(EventType::Warning, reason, action, note)
        }
    }
}

pub struct Executor {
    client: Client,
    drbd: Arc<dyn DrbdSource>,
    events: EventSink,
    metrics: AgentMetrics,
    settings: ExecutorSettings,
    guard: Option<FailOverGuard>,
    /// When an action was last done or reported, and for how long that holds.
    recent: HashMap<ActionKey, (Instant, Remembered)>,
    /// When a failed action may be tried again.
    backoff: HashMap<ActionKey, Backoff>,
    /// UIDs of the VolumeAttachments deleted: none is deleted twice.
    deleted_attachments: Mutex<HashSet<String>>,
    /// The nodes this agent failed over (it put the fail-over taint): their volumes' fail-over
    /// durations are this agent's to report. At most one entry per node.
    failed_over: Mutex<HashSet<String>>,
}

/// Which of a round's actions one [`Executor::run`] carries out: the publications go first, on
/// their own, while the round reads what the other steps need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Publications,
    Steps,
}

impl Scope {
    fn of(key: &ActionKey) -> Self {
        match key {
            // A held publication is decided with the publications: the steps' run must not take
            // it for undecided and forget it, or it is told again every round.
            ActionKey::Publish { .. } | ActionKey::HoldPublication { .. } => Self::Publications,
            _ => Self::Steps,
        }
    }
}

impl Executor {
    pub fn new(
        client: Client,
        drbd: Arc<dyn DrbdSource>,
        events: EventSink,
        metrics: AgentMetrics,
        settings: ExecutorSettings,
        guard: Option<FailOverGuard>,
    ) -> Self {
        Self {
            client,
            drbd,
            events,
            metrics,
            settings,
            guard,
            recent: HashMap::new(),
            backoff: HashMap::new(),
            deleted_attachments: Mutex::default(),
            failed_over: Mutex::default(),
        }
    }

    /// Carries out the `actions` of one `scope` that this round decided: publications all at
    /// once (bounded by `--max-concurrent-publications`), their events after every write; the
    /// other steps in order. `drbd_read_at` is when the DRBD state they were decided on was
    /// read: the start of the endpoint-rewrite latency. `storage_nodes` are the nodes the
    /// blast-radius guard counts, as this round saw them.
    pub async fn run(
        &mut self,
        scope: Scope,
        actions: Vec<Action>,
        drbd_read_at: Instant,
        storage_nodes: &BTreeSet<String>,
    ) {
        let now = Instant::now();
        let decided: HashSet<ActionKey> = actions.iter().map(Action::key).collect();
        // An action of this scope no longer decided has taken effect (or its cause went away):
        // when it is needed again, it is carried out at once.
        let cooldown = self.settings.cooldown;
        // A report that still holds is told again before the API server's event TTL drops it.
        let repeat = self.events.warning_repeat_interval();
        let undecided = |key: &ActionKey| Scope::of(key) == scope && !decided.contains(key);
        self.recent.retain(|key, (at, remembered)| {
            let age = now.duration_since(*at);
            !undecided(key) && ((*remembered == Remembered::WhileDecided && age < repeat) || age < cooldown)
        });
        self.backoff.retain(|key, _| !undecided(key));
        if scope == Scope::Publications {
            return self.publish_all(actions, drbd_read_at, now).await;
        }
        // A refusal holds for the cooldown, like any remembered action: until then none of that
        // node's fail-over steps run, whichever round decides them.
        let mut refused_nodes: HashSet<String> = self
            .recent
            .values()
            .filter_map(|(_, remembered)| match remembered {
                Remembered::Refused(node) => Some(node.clone()),
                _ => None,
            })
            .collect();
        // Each node's fail-over asks the guard once a round, at its first step carried out.
        let mut asked = HashSet::new();
        for action in &actions {
            let key = action.key();
            if action.failing_over().is_some_and(|node| refused_nodes.contains(node)) || !self.due(&key, now) {
                continue;
            }
            // Steps run one after another, each bounded by the operations timeout: the state a
            // late one was decided over may be gone by its turn. The next round decides again.
            let state_age = drbd_read_at.elapsed();
            if action.takes_something() && state_age > self.settings.max_state_age {
                tracing::warn!(
                    action = %action.describe(),
                    ?state_age,
                    "the DRBD state this step was decided over is older than {:?}; it waits for the next round",
                    self.settings.max_state_age
                );
                continue;
            }
            let about = About::of(action);
            let reserve = action.failing_over().filter(|node| asked.insert(node.to_string()));
            let guard = reserve.map(|node| (node, storage_nodes));
            let (remembered, told) = self.attempt(action, &about, drbd_read_at, guard).await;
            if let Remembered::Refused(node) = &remembered {
                refused_nodes.insert(node.clone());
            }
            self.remember(key, remembered);
            self.tell(&about, told).await;
        }
    }

    /// A mass fail-over moves many volumes: each publication waits only for its own writes, and
    /// no write waits for another's event.
    async fn publish_all(&mut self, actions: Vec<Action>, drbd_read_at: Instant, now: Instant) {
        let due: Vec<(ActionKey, &Action)> = actions
            .iter()
            .map(|action| (action.key(), action))
            .filter(|(key, _)| self.due(key, now))
            .collect();
        let concurrency = self.settings.max_concurrent_publications.max(1);
        let this = &*self;
        let settled: Vec<(ActionKey, About, Remembered, Option<Told>)> = futures::stream::iter(due)
            .map(|(key, action)| async move {
                let about = About::of(action);
                let (remembered, told) = this.attempt(action, &about, drbd_read_at, None).await;
                (key, about, remembered, told)
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let mut tellings = Vec::new();
        for (key, about, remembered, told) in settled {
            self.remember(key, remembered);
            tellings.push((about, told));
        }
        let tellings = self.sum_up_mass_move(tellings);
        let this = &*self;
        futures::stream::iter(tellings)
            .for_each_concurrent(
                concurrency,
                |(about, told)| async move { this.tell(&about, told).await },
            )
            .await;
    }

    /// A round's moves told one by one up to [`mass_move::TOLD_ONE_BY_ONE`]; the rest in one
    /// Event on this node.
    fn sum_up_mass_move(&self, tellings: Vec<(About, Option<Told>)>) -> Vec<(About, Option<Told>)> {
        let is_move = |told: &Option<Told>| {
            told.as_ref()
                .is_some_and(|t| t.reason == ENDPOINT_MOVED && t.type_ == EventType::Normal)
        };
        let (moves, mut others): (Vec<_>, Vec<_>) = tellings.into_iter().partition(|(_, told)| is_move(told));
        let mut moves: Vec<(String, (About, Option<Told>))> = moves
            .into_iter()
            .map(|(about, told)| (about.target.name.clone().unwrap_or_default(), (about, told)))
            .collect();
        moves.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<String> = moves.iter().map(|(name, _)| name.clone()).collect();
        let (each, summary) = mass_move::split(&names, &self.settings.node);
        let told_each = each.len();
        others.extend(moves.into_iter().take(told_each).map(|(_, telling)| telling));
        if let Some(note) = summary {
            let about = About {
                kind: "publish",
                target: node_reference(&self.settings.node),
                description: format!("{} volumes moved here", names.len()),
            };
            let told = Told::new(EventType::Normal, "ServiceEndpointsMoved", "publish", note);
            others.push((about, Some(told)));
        }
        others
    }

    /// Whether the action of `key` may be carried out now: not settled within its cooldown, not
    /// backing off after a failure.
    fn due(&self, key: &ActionKey, now: Instant) -> bool {
        !self.recent.contains_key(key) && self.backoff.get(key).is_none_or(|b| b.retry_at <= now)
    }

    fn remember(&mut self, key: ActionKey, remembered: Remembered) {
        let retry_after = match remembered {
            Remembered::RetrySlowly => Some(self.settings.max_backoff),
            Remembered::Retry => Some(
                self.backoff
                    .get(&key)
                    .map_or(self.settings.min_backoff, |b| b.delay * 2)
                    .min(self.settings.max_backoff),
            ),
            _ => None,
        };
        if let Some(delay) = retry_after {
            let retry_at = Instant::now() + delay;
            self.backoff.insert(key, Backoff { retry_at, delay });
        } else {
            self.backoff.remove(&key);
            self.recent.insert(key, (Instant::now(), remembered));
        }
    }

    /// Posts the event that tells how an action went.
    async fn tell(&self, about: &About, told: Option<Told>) {
        let Some(Told {
            type_,
            reason,
            action,
            note,
            once,
        }) = told
        else {
            return;
        };
        if once {
            self.events.warning_once(&about.target, reason, action, note).await;
        } else {
            self.events.tell(&about.target, type_, reason, action, note).await;
        }
    }

    /// Carries the action out (or reports it), and says what to remember of it and what to tell.
    /// Carries out one action, after asking the guard for `reserve` (the node whose fail-over
    /// this step starts in this round, and the storage nodes), if any.
    async fn attempt(
        &self,
        action: &Action,
        about: &About,
        drbd_read_at: Instant,
        reserve: Option<(&str, &BTreeSet<String>)>,
    ) -> (Remembered, Option<Told>) {
        match action {
            Action::Refused { action: refused, why } => return self.refusal(about, refused.failing_over(), why),
            // A report, not a write: told once while the same evidence holds.
            Action::HoldFailOver { .. }
            | Action::HoldPublication { .. }
            | Action::HoldEvacuation { .. }
            | Action::WarnCoexistence { .. } => {
                if let Action::HoldFailOver { .. } = action {
                    self.metrics.held_fail_overs.inc();
                }
                let note = format!("{} ({})", about.description, action.note());
                let (type_, reason) = action.event();
                let told = Told::new(type_, reason, about.kind, note);
                return (Remembered::WhileDecided, Some(told));
            }
            _ if self.settings.dry_run => {
                self.metrics
                    .refused_actions
                    .with_label_values(&[about.kind, "dry_run"])
                    .inc();
                let note = format!("dry run: would {} ({})", about.description, action.note());
                return (
                    Remembered::ForCooldown,
                    Some(Told::new(EventType::Normal, "DryRun", "DryRun", note)),
                );
            }
            _ => {}
        }
        if let Some((node, storage_nodes)) = reserve
            && let Some(refused) = self.reserve(node, about, storage_nodes).await
        {
            return refused;
        }
        let result = within(self.settings.operations_timeout, self.execute(action, drbd_read_at))
            .await
            .unwrap_or_else(|timed_out| Err(timed_out.into()));
        let label = match &result {
            Ok(Outcome::Done(_)) => "ok",
            Ok(Outcome::Skipped(_)) => "skipped",
            Ok(Outcome::Blocked) => "blocked",
            Err(_) => "failed",
        };
        self.metrics.actions.with_label_values(&[about.kind, label]).inc();
        self.outcome(action, about, result, drbd_read_at)
    }

    /// Gives back `node`'s guard reservation with its lost-quorum taint; failing that, the
    /// reservation lapses on its own (see `guard::live_reservations`).
    async fn give_back(&self, node: &str) {
        let Some(guard) = &self.guard else { return };
        if let Err(err) = guard.give_back(node).await {
            tracing::warn!(node, error = %err, "cannot give back the node's blast-radius guard reservation: it counts until it lapses");
        }
    }

    /// Asks the blast-radius guard before the first step of a peer's fail-over, taint or not:
    /// the guard counts fail-overs. `Some` when the fail-over must not go on (refused, or the
    /// guard could not tell).
    async fn reserve(
        &self,
        node: &str,
        about: &About,
        storage_nodes: &BTreeSet<String>,
    ) -> Option<(Remembered, Option<Told>)> {
        let guard = self.guard.as_ref()?;
        match guard.reserve(node, storage_nodes).await {
            Ok(Reservation::Reserved) => None,
            Ok(Reservation::Refused(why)) => Some(self.refusal(about, Some(node), &why)),
            Err(err) => {
                self.metrics.actions.with_label_values(&[about.kind, "failed"]).inc();
                let note = format!("cannot {}: the blast-radius guard: {err}; retrying", about.description);
                let told = Told::warning_once("FailOverActionFailed", about.kind, note);
                Some((Remembered::Refused(node.to_owned()), Some(told)))
            }
        }
    }

    /// A step the blast-radius guard refused; the rest of that node's fail-over (`failing_over`)
    /// is skipped this round.
    fn refusal(&self, about: &About, failing_over: Option<&str>, why: &str) -> (Remembered, Option<Told>) {
        self.metrics
            .refused_actions
            .with_label_values(&[about.kind, "guard"])
            .inc();
        let note = format!("refused to {}: {why}", about.description);
        let remembered = match failing_over {
            Some(node) => Remembered::Refused(node.to_owned()),
            None => Remembered::ForCooldown,
        };
        let told = Told::new(EventType::Warning, "FailOverRefused", "Refuse", note);
        (remembered, Some(told))
    }

    fn outcome(
        &self,
        action: &Action,
        about: &About,
        result: Result<Outcome, AgentError>,
        drbd_read_at: Instant,
    ) -> (Remembered, Option<Told>) {
        match result {
            Ok(Outcome::Done(caveat)) => {
                self.record_done(action, caveat.is_none(), drbd_read_at);
                let (type_, reason) = action.event();
                let mut note = format!("{} ({})", about.description, action.note());
                if let Some(caveat) = caveat {
                    note.push_str(&format!("; {caveat}"));
                }
                (
                    Remembered::ForCooldown,
                    Some(Told::new(type_, reason, about.kind, note)),
                )
            }
            Ok(Outcome::Skipped(why)) => {
                tracing::info!(action = %about.description, "skipped: {why}");
                (Remembered::ForCooldown, None)
            }
            Ok(Outcome::Blocked) => {
                let note = format!(
                    "cannot {} now: a PodDisruptionBudget does not allow it; retrying",
                    about.description
                );
                let told = Told::warning_once("EvictionBlocked", about.kind, note);
                (Remembered::Retry, Some(told))
            }
            Err(err) if let Some(refusal) = err.refusal() => {
                let note = format!("cannot {}: {}", about.description, refusal.explain("the agent"));
                let told = Told::warning_once("WriteRefused", about.kind, note);
                let remembered = if refusal.may_pass_soon() {
                    Remembered::Retry
                } else {
                    Remembered::RetrySlowly
                };
                (remembered, Some(told))
            }
            Err(err) => {
                let note = format!("cannot {}: {err}; retrying", about.description);
                let told = Told::warning_once("FailOverActionFailed", about.kind, note);
                (Remembered::Retry, Some(told))
            }
        }
    }

    /// What a done action leaves behind: the attachments not to delete again, the fail-over
    /// count, the endpoint-rewrite latency (only when the endpoints were rewritten).
    fn record_done(&self, action: &Action, followed: bool, drbd_read_at: Instant) {
        match action {
            Action::DeleteAttachment { attachment, .. } => {
                self.deleted_attachments
                    .lock()
                    .expect("deleted attachments poisoned")
                    .insert(attachment.uid.clone());
            }
            // The taint is the step that starts a peer's fail-over: count each once.
            Action::Taint {
                node,
                cause: Cause::FailOver,
                ..
            } => {
                self.metrics.fail_overs.with_label_values(&[node]).inc();
                self.failed_over
                    .lock()
                    .expect("failed-over nodes poisoned")
                    .insert(node.clone());
            }
            Action::PublishServiceEndpoint { .. } if followed => self
                .metrics
                .endpoint_rewrite
                .observe(drbd_read_at.elapsed().as_secs_f64()),
            _ => {}
        }
    }

    async fn execute(&self, action: &Action, drbd_read_at: Instant) -> Result<Outcome, AgentError> {
        let client = &self.client;
        let outcome = match action {
            Action::Taint { node, key, value, .. } => change_taint(client, node, key, Some(value)).await?,
            Action::Untaint { node, key, .. } => {
                let outcome = change_taint(client, node, key, None).await?;
                if *key == LOST_QUORUM_TAINT && matches!(outcome, Outcome::Done(_)) {
                    self.give_back(node).await;
                }
                outcome
            }
            Action::Evict { pod, .. } => {
                let params = EvictParams {
                    delete_options: Some(delete_params(&pod.uid, self.settings.grace_period_seconds)),
                    post_options: PostParams::default(),
                };
                let result = pods(client, pod).evict(&pod.name, &params).await;
                pod_outcome(result.map(|_| ()))?
            }
            Action::ForceDelete { pod, .. } => {
                let result = pods(client, pod).delete(&pod.name, &delete_params(&pod.uid, 0)).await;
                pod_outcome(result.map(|_| ()))?
            }
            Action::DeleteAttachment { attachment, .. } => self.delete_attachment(attachment).await?,
            Action::ForceSecondary { resource, .. } => {
                self.drbd.force_secondary(resource).await?;
                Outcome::Done(None)
            }
            Action::PublishServiceEndpoint {
                pv,
                claim,
                endpoint,
                over_version,
                confirm_first,
            } => match publish_and_follow(
                client,
                Move {
                    pv,
                    claim,
                    endpoint,
                    over_version,
                    confirm_first: *confirm_first,
                    node: &self.settings.node,
                    retry_for: self.settings.operations_timeout / 2,
                    triggered_at: &wall_clock_of(drbd_read_at),
                    write_endpoints: self.settings.write_endpoints.writes(),
                },
            )
            .await?
            {
                Followed::Rewritten => Outcome::Done(None),
                Followed::InPlace => Outcome::Skipped(format!(
                    "PV {pv} and its EndpointSlice name {endpoint} already: nothing written"
                )),
                Followed::Superseded => Outcome::Skipped(format!(
                    "PV {pv} changed since version {over_version}, which this was decided over"
                )),
                Followed::Skipped(why) => Outcome::Done(Some(format!(
                    "only the service endpoint was published, the endpoints are left to the controller: {why}"
                ))),
            },
            Action::HoldFailOver { .. }
            | Action::HoldPublication { .. }
            | Action::HoldEvacuation { .. }
            | Action::WarnCoexistence { .. }
            | Action::Refused { .. } => Outcome::Skipped("nothing to write".into()),
        };
        Ok(outcome)
    }

    /// Records the fail-overs finished since the last round, those of nodes this agent failed
    /// over (every agent that saw the loss sees them finish; the one that tainted reports them).
    pub fn record_fail_overs_done(&self, done: impl IntoIterator<Item = FailOverDone>) {
        let failed_over = self.failed_over.lock().expect("failed-over nodes poisoned");
        for done in done.into_iter().filter(|d| failed_over.contains(&d.node)) {
            tracing::info!(resource = %done.resource, node = %done.node, took = ?done.took, "fail-over done");
            self.metrics.fail_over_duration.observe(done.took.as_secs_f64());
        }
    }

    async fn delete_attachment(&self, attachment: &super::view::AttachmentView) -> Result<Outcome, kube::Error> {
        let deleted_before = self
            .deleted_attachments
            .lock()
            .expect("deleted attachments poisoned")
            .contains(&attachment.uid);
        if deleted_before {
            return Ok(Outcome::Skipped("this attachment was deleted already".into()));
        }
        let attachments: Api<VolumeAttachment> = Api::all(self.client.clone());
        let params = delete_params(&attachment.uid, self.settings.grace_period_seconds);
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

fn pod_outcome(result: Result<(), kube::Error>) -> Result<Outcome, kube::Error> {
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
async fn change_taint(client: &Client, node: &str, key: &str, value: Option<&str>) -> Result<Outcome, kube::Error> {
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

/// The wall-clock time (RFC 3339) of an instant in the past.
fn wall_clock_of(instant: Instant) -> String {
    let then = std::time::SystemTime::now() - instant.elapsed();
    k8s_openapi::jiff::Timestamp::try_from(then)
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::source::{DrbdError, MockDrbdSource};
    use crate::scripted_api;
    use crate::volume::ClaimKey;
    use mockall::predicate::eq;

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
    /// Leases and no tainted Node; every other request is answered 200 `{}`. Counts pod deletions.
    fn guard_api(reserved: &'static [&'static str]) -> (Client, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let deletions = Arc::new(AtomicUsize::new(0));
        let counted = deletions.clone();
        let client = scripted_api::client(move |request| {
            let path = &request.path;
            let listing = request.query.contains("labelSelector");
            if request.method == http::Method::DELETE && path.contains("/pods/") {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            // Reserved 2 s ago (reservations last 120 s): their taints may still be on their way.
            let expiry = (k8s_openapi::jiff::Timestamp::now() + std::time::Duration::from_secs(118)).to_string();
            let body = if path.ends_with(crate::names::FAIL_OVER_GUARD_LEASE) {
                let held: std::collections::BTreeMap<&str, &str> =
                    reserved.iter().map(|n| (*n, expiry.as_str())).collect();
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
        let (client, deletions) = guard_api(reserved);
        let metrics = AgentMetrics::register(&prometheus::Registry::new()).unwrap();
        let guard = FailOverGuard::new(&client, "default", "", 0.5, Duration::from_secs(5));
        let settings = stub_executor(MockDrbdSource::new(), false).0.settings;
        let events = EventSink::new(client.clone(), "test", None);
        let mut executor = Executor::new(
            client,
            Arc::new(MockDrbdSource::new()),
            events,
            metrics.clone(),
            settings,
            Some(guard),
        );
        let force_delete = fail_over_of("node-a").remove(1);
        let storage: BTreeSet<String> = ["node-a", "node-b", "node-c", "node-d"].map(String::from).into();
        executor
            .run(Scope::Steps, vec![force_delete], Instant::now(), &storage)
            .await;
        let refused = metrics
            .refused_actions
            .with_label_values(&["force_delete", "guard"])
            .get();
        (refused, deletions.load(std::sync::atomic::Ordering::SeqCst))
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
        let told_at = |executor: &Executor| executor.recent.get(&hold.key()).map(|(at, _)| *at);
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
                let taints = [
                    json!({"key": LOST_QUORUM_TAINT, "value": crate::names::TAINT_BY_FAIL_OVER, "effect": "NoSchedule"}),
                ];
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
        let left: std::collections::BTreeMap<String, String> =
            serde_json::from_str(annotation.as_str().unwrap()).unwrap();
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
}
