//! One way to describe an Event, for both loops (pure): how loud it is, why, what was done, and
//! the words. The controller collects them while a reconcile runs, the agent's executor makes one
//! per action; [`crate::events::EventSink::tell`] posts them.

/// One Event to post.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tell {
    pub level: Level,
    /// Why, in CamelCase (`ServiceEndpointMoved`, `WriteRefused`).
    pub reason: &'static str,
    /// What was done or tried (`Reconcile`, `publish`, `taint`).
    pub action: &'static str,
    pub note: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Normal,
    /// Posted every time it is told.
    Warning,
    /// A Warning that stays while its cause does: posted once per message, then again every
    /// `--warning-repeat-interval`.
    StandingWarning,
}

impl Tell {
    pub fn new(level: Level, reason: &'static str, action: &'static str, note: String) -> Self {
        Self {
            level,
            reason,
            action,
            note,
        }
    }

    /// A Warning posted again only when its note changes or the repeat interval has passed.
    pub fn standing(reason: &'static str, action: &'static str, note: String) -> Self {
        Self::new(Level::StandingWarning, reason, action, note)
    }
}
