//! What the executor remembers of the actions it carried out or reported (pure): which are not
//! to be repeated yet, which back off after a failure, which nodes' fail-overs the guard refused.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::agent::action::ActionKey;

/// What is remembered of one action.
#[derive(Debug, PartialEq, Eq)]
pub enum Remembered {
    /// Not repeated within the cooldown while it stays decided.
    ForCooldown,
    /// Not repeated for as long as it stays decided (reports such as a held fail-over).
    WhileDecided,
    /// The blast-radius guard refused this node's fail-over: none of its steps within the
    /// cooldown.
    Refused(String),
    /// The guard could not tell (its Lease unreadable): none of this node's steps this round,
    /// asked again after a back-off, as a failed action is.
    Unguarded(String),
    /// Failed or blocked: retried after a back-off.
    Retry,
    /// Refused by the API server in a way no retry changes: retried at the slowest pace.
    RetrySlowly,
}

struct Backoff {
    retry_at: Instant,
    delay: Duration,
}

/// The actions remembered, by key.
pub struct Memory {
    /// When an action was last done or reported, and for how long that holds.
    recent: HashMap<ActionKey, (Instant, Remembered)>,
    /// When a failed action may be tried again.
    backoff: HashMap<ActionKey, Backoff>,
    cooldown: Duration,
    min_backoff: Duration,
    max_backoff: Duration,
}

impl Memory {
    /// An action done is kept for `cooldown`; a failed one is retried after `min_backoff`,
    /// doubling up to `max_backoff`.
    pub fn new(cooldown: Duration, min_backoff: Duration, max_backoff: Duration) -> Self {
        Self {
            recent: HashMap::new(),
            backoff: HashMap::new(),
            cooldown,
            min_backoff,
            max_backoff,
        }
    }

    /// Forgets the actions `undecided` names (they took effect, or their cause went away: when
    /// needed again they are carried out at once) and those whose time is over; a report that
    /// still holds is kept for `repeat`, to be told again before the API server drops its Event.
    pub fn forget(&mut self, now: Instant, repeat: Duration, undecided: impl Fn(&ActionKey) -> bool) {
        let cooldown = self.cooldown;
        self.recent.retain(|key, (at, remembered)| {
            let age = now.duration_since(*at);
            !undecided(key) && ((*remembered == Remembered::WhileDecided && age < repeat) || age < cooldown)
        });
        self.backoff.retain(|key, _| !undecided(key));
    }

    /// The nodes whose fail-over the guard refused within the cooldown.
    pub fn refused_nodes(&self) -> HashSet<String> {
        self.recent
            .values()
            .filter_map(|(_, remembered)| match remembered {
                Remembered::Refused(node) => Some(node.clone()),
                _ => None,
            })
            .collect()
    }

    /// Whether the action of `key` may be carried out now: not settled within its cooldown, not
    /// backing off after a failure.
    pub fn due(&self, key: &ActionKey, now: Instant) -> bool {
        !self.recent.contains_key(key) && self.backoff.get(key).is_none_or(|b| b.retry_at <= now)
    }

    pub fn remember(&mut self, key: ActionKey, remembered: Remembered, now: Instant) {
        let retry_after = match remembered {
            Remembered::RetrySlowly => Some(self.max_backoff),
            Remembered::Retry | Remembered::Unguarded(_) => Some(
                self.backoff
                    .get(&key)
                    .map_or(self.min_backoff, |b| b.delay * 2)
                    .min(self.max_backoff),
            ),
            _ => None,
        };
        if let Some(delay) = retry_after {
            let retry_at = now + delay;
            self.backoff.insert(key, Backoff { retry_at, delay });
        } else {
            self.backoff.remove(&key);
            self.recent.insert(key, (now, remembered));
        }
    }

    /// When the action of `key` was last done or reported, if that still holds.
    #[cfg(test)]
    pub fn remembered_at(&self, key: &ActionKey) -> Option<Instant> {
        self.recent.get(key).map(|(at, _)| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(pod: &str) -> ActionKey {
        ActionKey::Evict(format!("apps/{pod}"))
    }

    #[test]
    fn a_failed_action_backs_off_doubling_up_to_the_slowest_pace() {
        let (ms, start) = (Duration::from_millis, Instant::now());
        let mut memory = Memory::new(ms(60_000), ms(50), ms(400));
        let mut retry_at = Vec::new();
        for _ in 0..5 {
            memory.remember(key("a"), Remembered::Retry, start);
            let first_due = (0..1000).map(ms).find(|after| memory.due(&key("a"), start + *after));
            retry_at.push(first_due.unwrap());
        }
        assert_eq!(retry_at, [ms(50), ms(100), ms(200), ms(400), ms(400)]);
        memory.remember(key("b"), Remembered::RetrySlowly, start);
        assert!(!memory.due(&key("b"), start + ms(399)) && memory.due(&key("b"), start + ms(400)));
    }

    #[test]
    fn a_refusal_holds_for_the_cooldown_and_an_undecided_action_is_forgotten() {
        let (ms, start) = (Duration::from_millis, Instant::now());
        let mut memory = Memory::new(ms(1000), ms(50), ms(400));
        memory.remember(key("a"), Remembered::Refused("node-a".into()), start);
        memory.remember(key("b"), Remembered::ForCooldown, start);
        assert_eq!(memory.refused_nodes(), HashSet::from(["node-a".to_owned()]));
        memory.forget(start + ms(500), ms(0), |k| *k == key("b"));
        assert!(memory.due(&key("b"), start + ms(500)), "no longer decided: due at once");
        assert!(!memory.due(&key("a"), start + ms(500)));
        memory.forget(start + ms(1000), ms(0), |_| false);
        assert!(memory.refused_nodes().is_empty(), "the cooldown is over");
    }
}
