//! Carries out the decided actions: Kubernetes writes (with UID preconditions and optimistic
//! concurrency), `drbdsetup`, events and metrics. In dry-run mode it only reports. Every call is
//! bounded by `--operations-timeout`; failed actions back off exponentially.
//!
//! This room runs the steps; [`memory`] remembers what was done, [`telling`] says it, [`ledger`]
//! keeps what done steps leave behind, [`writes`] are the Kubernetes writes.

mod ledger;
mod memory;
mod telling;
#[cfg(test)]
mod tests;
mod writes;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use kube::Client;

use super::action::{Action, ActionKey};
use super::error::AgentError;
use super::follow::{Followed, Move, publish_and_follow};
use super::guard::{FailOverGuard, Reservation};
use super::source::DrbdSource;
use super::view::FailOverDone;
use crate::deadline::within;
use crate::events::EventSink;
use crate::metrics::AgentMetrics;
use crate::names::LOST_QUORUM_TAINT;
use crate::sharedvolume::silence::SilentServer;
use crate::tell::Tell;
use ledger::Ledger;
use memory::{Memory, Remembered};
use telling::{About, tell};

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

pub struct Executor {
    client: Client,
    drbd: Arc<dyn DrbdSource>,
    events: EventSink,
    metrics: AgentMetrics,
    settings: ExecutorSettings,
    guard: Option<FailOverGuard>,
    memory: Memory,
    ledger: Ledger,
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
            ActionKey::Publish { .. }
            | ActionKey::HoldPublication { .. }
            | ActionKey::WarnServerNotAnswering { .. }
            | ActionKey::ServerAnswers(_) => Self::Publications,
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
        let memory = Memory::new(settings.cooldown, settings.min_backoff, settings.max_backoff);
        Self {
            client,
            drbd,
            events,
            ledger: Ledger::new(metrics.clone()),
            metrics,
            settings,
            guard,
            memory,
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
        let repeat = self.events.warning_repeat_interval();
        self.memory
            .forget(now, repeat, |key| Scope::of(key) == scope && !decided.contains(key));
        if scope == Scope::Publications {
            return self.publish_all(actions, drbd_read_at, now).await;
        }
        // A refusal holds for the cooldown, like any remembered action: until then none of that
        // node's fail-over steps run, whichever round decides them. A guard that could not tell
        // holds them for this round only; its step backs off as a failed one does.
        let mut refused_nodes = self.memory.refused_nodes();
        // Each node's fail-over asks the guard once a round, at its first step carried out.
        let mut asked = HashSet::new();
        for action in &actions {
            let key = action.key();
            let refused = action.failing_over().is_some_and(|node| refused_nodes.contains(node));
            if refused || !self.memory.due(&key, now) || self.too_old(action, drbd_read_at) {
                continue;
            }
            let about = About::of(action);
            let reserve = action.failing_over().filter(|node| asked.insert(node.to_string()));
            let guard = reserve.map(|node| (node, storage_nodes));
            let (remembered, told) = self.attempt(action, &about, drbd_read_at, guard).await;
            if let Remembered::Refused(node) | Remembered::Unguarded(node) = &remembered {
                refused_nodes.insert(node.clone());
            }
            self.memory.remember(key, remembered, Instant::now());
            tell(&self.events, &about, told).await;
        }
    }

    /// Steps run one after another, each bounded by the operations timeout: the state a late one
    /// was decided over may be gone by its turn. The next round decides again.
    fn too_old(&self, action: &Action, drbd_read_at: Instant) -> bool {
        let state_age = drbd_read_at.elapsed();
        let too_old = action.takes_something() && state_age > self.settings.max_state_age;
        if too_old {
            tracing::warn!(
                action = %action.describe(),
                ?state_age,
                "the DRBD state this step was decided over is older than {:?}; it waits for the next round",
                self.settings.max_state_age
            );
        }
        too_old
    }

    /// A mass fail-over moves many volumes: each publication waits only for its own writes, and
    /// no write waits for another's event.
    async fn publish_all(&mut self, actions: Vec<Action>, drbd_read_at: Instant, now: Instant) {
        let due: Vec<(ActionKey, &Action)> = actions
            .iter()
            .map(|action| (action.key(), action))
            .filter(|(key, _)| self.memory.due(key, now))
            .collect();
        let concurrency = self.settings.max_concurrent_publications.max(1);
        let this = &*self;
        let settled: Vec<(ActionKey, About, Remembered, Option<Tell>)> = futures::stream::iter(due)
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
            self.memory.remember(key, remembered, Instant::now());
            tellings.push((about, told));
        }
        let tellings = telling::sum_up_mass_move(tellings, &self.settings.node);
        let events = &self.events;
        futures::stream::iter(tellings)
            .for_each_concurrent(
                concurrency,
                |(about, told)| async move { tell(events, &about, told).await },
            )
            .await;
    }

    /// Carries out one action (or reports it), after asking the guard for `reserve` (the node
    /// whose fail-over this step starts in this round, and the storage nodes), if any; what to
    /// remember of it and what to tell.
    async fn attempt(
        &self,
        action: &Action,
        about: &About,
        drbd_read_at: Instant,
        reserve: Option<(&str, &BTreeSet<String>)>,
    ) -> (Remembered, Option<Tell>) {
        match action {
            Action::Refused { action: refused, why } => {
                self.count_refused(about, "guard");
                return telling::refusal(about, refused.failing_over(), why);
            }
            // Said on the PV first (a write, retried on failure), then reported as the others.
            Action::WarnServerNotAnswering { mark: true, .. } if !self.settings.dry_run => {
                let result = self.execute_in_time(action, drbd_read_at).await;
                return match result {
                    Ok(_) => telling::report(action, about),
                    Err(_) => telling::outcome(action, about, result),
                };
            }
            Action::HoldFailOver { .. }
            | Action::HoldPublication { .. }
            | Action::WarnServerNotAnswering { .. }
            | Action::HoldEvacuation { .. }
            | Action::WarnCoexistence { .. } => {
                if let Action::HoldFailOver { .. } = action {
                    self.metrics.held_fail_overs.inc();
                }
                return telling::report(action, about);
            }
            _ if self.settings.dry_run => {
                self.count_refused(about, "dry_run");
                return telling::dry_run(action, about);
            }
            _ => {}
        }
        if let Some((node, storage_nodes)) = reserve
            && let Some(refused) = self.reserve(node, about, storage_nodes).await
        {
            return refused;
        }
        let result = self.execute_in_time(action, drbd_read_at).await;
        let label = match &result {
            Ok(Outcome::Done(_)) => "ok",
            Ok(Outcome::Skipped(_)) => "skipped",
            Ok(Outcome::Blocked) => "blocked",
            Err(_) => "failed",
        };
        self.metrics.actions.with_label_values(&[about.kind, label]).inc();
        if let Ok(Outcome::Done(caveat)) = &result {
            self.ledger.done(action, caveat.is_none(), drbd_read_at);
        }
        telling::outcome(action, about, result)
    }

    fn count_refused(&self, about: &About, by: &str) {
        self.metrics.refused_actions.with_label_values(&[about.kind, by]).inc();
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
    ) -> Option<(Remembered, Option<Tell>)> {
        let guard = self.guard.as_ref()?;
        match guard.reserve(node, storage_nodes).await {
            Ok(Reservation::Reserved) => None,
            Ok(Reservation::Refused(why)) => {
                self.count_refused(about, "guard");
                Some(telling::refusal(about, Some(node), &why))
            }
            Err(err) => {
                self.metrics.actions.with_label_values(&[about.kind, "failed"]).inc();
                Some(telling::guard_failed(about, node, &err))
            }
        }
    }

    /// [`Self::execute`] within `--operations-timeout`.
    async fn execute_in_time(&self, action: &Action, drbd_read_at: Instant) -> Result<Outcome, AgentError> {
        within(self.settings.operations_timeout, self.execute(action, drbd_read_at))
            .await
            .unwrap_or_else(|timed_out| Err(timed_out.into()))
    }

    async fn execute(&self, action: &Action, drbd_read_at: Instant) -> Result<Outcome, AgentError> {
        let (client, grace) = (&self.client, self.settings.grace_period_seconds);
        let outcome = match action {
            Action::Taint { node, key, value, .. } => writes::change_taint(client, node, key, Some(value)).await?,
            Action::Untaint { node, key, .. } => {
                let outcome = writes::change_taint(client, node, key, None).await?;
                if *key == LOST_QUORUM_TAINT && matches!(outcome, Outcome::Done(_)) {
                    self.give_back(node).await;
                }
                outcome
            }
            Action::Evict { pod, .. } => writes::evict(client, pod, grace).await?,
            Action::ForceDelete { pod, .. } => writes::force_delete(client, pod).await?,
            Action::DeleteAttachment { attachment, .. } if self.ledger.attachment_deleted(&attachment.uid) => {
                Outcome::Skipped("this attachment was deleted already".into())
            }
            Action::DeleteAttachment { attachment, .. } => writes::delete_attachment(client, attachment, grace).await?,
            Action::ForceSecondary { resource, .. } => {
                self.drbd.force_secondary(resource).await?;
                Outcome::Done(None)
            }
            Action::PublishServiceEndpoint { .. } => self.publish(action, drbd_read_at).await?,
            Action::WarnServerNotAnswering {
                pv,
                endpoint,
                why,
                mark: true,
                ..
            } => {
                let silent = SilentServer {
                    endpoint: endpoint.clone(),
                    since: k8s_openapi::jiff::Timestamp::now().to_string(),
                    why: why.clone(),
                };
                writes::say_server_silent(client, pv, Some(&silent.text())).await?
            }
            Action::ServerAnswers { pv, .. } => writes::say_server_silent(client, pv, None).await?,
            Action::HoldFailOver { .. }
            | Action::HoldPublication { .. }
            | Action::WarnServerNotAnswering { .. }
            | Action::HoldEvacuation { .. }
            | Action::WarnCoexistence { .. }
            | Action::Refused { .. } => Outcome::Skipped("nothing to write".into()),
        };
        Ok(outcome)
    }

    /// Publishes the new service endpoint and has the volume's endpoints follow it.
    async fn publish(&self, action: &Action, drbd_read_at: Instant) -> Result<Outcome, AgentError> {
        let Action::PublishServiceEndpoint {
            pv,
            claim,
            endpoint,
            over_version,
            confirm_first,
        } = action
        else {
            return Ok(Outcome::Skipped("not a publication".into()));
        };
        let planned = Move {
            pv,
            claim,
            endpoint,
            over_version,
            confirm_first: *confirm_first,
            node: &self.settings.node,
            retry_for: self.settings.operations_timeout / 2,
            triggered_at: &wall_clock_of(drbd_read_at),
            write_endpoints: self.settings.write_endpoints.writes(),
        };
        Ok(match publish_and_follow(&self.client, planned).await? {
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
        })
    }

    /// Records the fail-overs finished since the last round, those of nodes this agent failed
    /// over (every agent that saw the loss sees them finish; the one that tainted reports them).
    pub fn record_fail_overs_done(&self, done: impl IntoIterator<Item = FailOverDone>) {
        self.ledger.fail_overs_done(done);
    }
}

/// The wall-clock time (RFC 3339) of an instant in the past.
fn wall_clock_of(instant: Instant) -> String {
    let then = std::time::SystemTime::now() - instant.elapsed();
    k8s_openapi::jiff::Timestamp::try_from(then)
        .unwrap_or_else(|_| k8s_openapi::jiff::Timestamp::now())
        .to_string()
}
