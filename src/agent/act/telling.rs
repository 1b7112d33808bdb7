//! What the executor says about each action: the Event that tells how it ended (pure), a round's
//! moves summed up past the first few, and the posting.

use k8s_openapi::api::core::v1::ObjectReference;

use super::Outcome;
use super::memory::Remembered;
use crate::agent::action::{Action, ENDPOINT_MOVED, node_reference};
use crate::agent::error::AgentError;
use crate::agent::mass_move;
use crate::events::EventSink;
use crate::tell::{Level, Tell};

/// What one action is, for everything said about it: computed once per action.
pub struct About {
    /// For metrics, and the event's action.
    pub kind: &'static str,
    /// The object its events are about.
    pub target: ObjectReference,
    /// What it does, in words; for a refused action, what would have been done.
    pub description: String,
}

impl About {
    pub fn of(action: &Action) -> Self {
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

/// A move told as it went: one of a mass move's.
fn is_move(told: &Tell) -> bool {
    told.reason == ENDPOINT_MOVED && told.level == Level::Normal
}

/// Posts the event that tells how an action went.
pub async fn tell(events: &EventSink, about: &About, told: Option<Tell>) {
    if let Some(told) = told {
        events.tell(&about.target, told).await;
    }
}

/// A round's moves told one by one up to [`mass_move::TOLD_ONE_BY_ONE`]; the rest in one Event
/// on `node`, this agent's.
pub fn sum_up_mass_move(tellings: Vec<(About, Option<Tell>)>, node: &str) -> Vec<(About, Option<Tell>)> {
    let is_move = |told: &Option<Tell>| told.as_ref().is_some_and(is_move);
    let (moves, mut others): (Vec<_>, Vec<_>) = tellings.into_iter().partition(|(_, told)| is_move(told));
    let mut moves: Vec<(String, (About, Option<Tell>))> = moves
        .into_iter()
        .map(|(about, told)| (about.target.name.clone().unwrap_or_default(), (about, told)))
        .collect();
    moves.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<String> = moves.iter().map(|(name, _)| name.clone()).collect();
    let (each, summary) = mass_move::split(&names, node);
    let told_each = each.len();
    others.extend(moves.into_iter().take(told_each).map(|(_, telling)| telling));
    if let Some(note) = summary {
        let about = About {
            kind: "publish",
            target: node_reference(node),
            description: format!("{} volumes moved here", names.len()),
        };
        let told = Tell::new(Level::Normal, "ServiceEndpointsMoved", "publish", note);
        others.push((about, Some(told)));
    }
    others
}

/// A report, not a write: told once while the same evidence holds.
pub fn report(action: &Action, about: &About) -> (Remembered, Option<Tell>) {
    let note = format!("{} ({})", about.description, action.note());
    let (level, reason) = action.event();
    (
        Remembered::WhileDecided,
        Some(Tell::new(level, reason, about.kind, note)),
    )
}

/// What a dry run says instead of acting.
pub fn dry_run(action: &Action, about: &About) -> (Remembered, Option<Tell>) {
    let note = format!("dry run: would {} ({})", about.description, action.note());
    (
        Remembered::ForCooldown,
        Some(Tell::new(Level::Normal, "DryRun", "DryRun", note)),
    )
}

/// A step the blast-radius guard refused; the rest of that node's fail-over (`failing_over`) is
/// skipped this round.
pub fn refusal(about: &About, failing_over: Option<&str>, why: &str) -> (Remembered, Option<Tell>) {
    let note = format!("refused to {}: {why}", about.description);
    let remembered = match failing_over {
        Some(node) => Remembered::Refused(node.to_owned()),
        None => Remembered::ForCooldown,
    };
    let told = Tell::new(Level::Warning, "FailOverRefused", "Refuse", note);
    (remembered, Some(told))
}

/// The guard could not tell whether `node`'s fail-over may go on: it does not, this round.
pub fn guard_failed(about: &About, node: &str, err: &dyn std::fmt::Display) -> (Remembered, Option<Tell>) {
    let note = format!("cannot {}: the blast-radius guard: {err}; retrying", about.description);
    let told = Tell::standing("FailOverActionFailed", about.kind, note);
    (Remembered::Unguarded(node.to_owned()), Some(told))
}

/// How an action carried out ended: what to remember of it and what to tell.
pub fn outcome(action: &Action, about: &About, result: Result<Outcome, AgentError>) -> (Remembered, Option<Tell>) {
    match result {
        Ok(Outcome::Done(caveat)) => {
            let (level, reason) = action.event();
            let mut note = format!("{} ({})", about.description, action.note());
            if let Some(caveat) = caveat {
                note.push_str(&format!("; {caveat}"));
            }
            (
                Remembered::ForCooldown,
                Some(Tell::new(level, reason, about.kind, note)),
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
            let told = Tell::standing("EvictionBlocked", about.kind, note);
            (Remembered::Retry, Some(told))
        }
        Err(err) if let Some(refusal) = err.refusal() => {
            let note = format!("cannot {}: {}", about.description, refusal.explain("the agent"));
            let told = Tell::standing("WriteRefused", about.kind, note);
            let remembered = if refusal.may_pass_soon() {
                Remembered::Retry
            } else {
                Remembered::RetrySlowly
            };
            (remembered, Some(told))
        }
        Err(err) => {
            let note = format!("cannot {}: {err}; retrying", about.description);
            let told = Tell::standing("FailOverActionFailed", about.kind, note);
            (Remembered::Retry, Some(told))
        }
    }
}
