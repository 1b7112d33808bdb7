//! Kubernetes events (events.k8s.io/v1), each also logged. Warnings about bad input are posted
//! once per change of message, and again every repeat interval while they last: an object that
//! stays broken does not flood the event stream, and its Warning outlives the API server's event
//! TTL. Every post is bounded by a timeout: a hanging API server cannot stall the caller.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::EventType;

use crate::event_series::{Reporter, SeriesPoster, Told};

use crate::deadline::within;
use crate::tell::{Level, Tell};

/// How standing warnings are repeated.
#[derive(Clone, Copy, Debug)]
pub struct EventSettings {
    /// A warning still standing is posted again after this long.
    pub warning_repeat_interval: Duration,
    /// The most warnings remembered; past it the oldest are forgotten (and posted again if they
    /// recur), so that the memory stays bounded however many objects go wrong.
    pub remembered_warnings: usize,
}

impl EventSettings {
    pub fn of(common: &crate::cli::CommonArgs) -> Self {
        Self {
            warning_repeat_interval: *common.warning_repeat_interval,
            ..Self::default()
        }
    }
}

impl Default for EventSettings {
    fn default() -> Self {
        Self {
            warning_repeat_interval: Duration::from_secs(30 * 60),
            remembered_warnings: 10_000,
        }
    }
}

/// Which warning: (object kind/namespace/name, reason). Nodes, PVs and attachments are told
/// apart by name as well as pods and claims.
type WarningKey = (String, &'static str);

pub struct EventSink {
    poster: SeriesPoster,
    /// The last warning note posted, and when, by object and reason.
    last_warning: Mutex<HashMap<WarningKey, (String, Instant)>>,
    timeout: Duration,
    settings: EventSettings,
}

/// How long one event post may take, unless [`EventSink::with_timeout`] says otherwise.
const DEFAULT_POST_TIMEOUT: Duration = Duration::from_secs(10);

impl EventSink {
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance: instance.unwrap_or_else(|| controller.to_owned()),
        };
        Self {
            poster: SeriesPoster::new(client, reporter),
            last_warning: Mutex::default(),
            timeout: DEFAULT_POST_TIMEOUT,
            settings: EventSettings::default(),
        }
    }

    /// Repeats and remembers warnings as `settings` say.
    pub fn with(self, settings: EventSettings) -> Self {
        Self { settings, ..self }
    }

    /// Bounds every post by `timeout`.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// How often a standing warning is posted again.
    pub fn warning_repeat_interval(&self) -> Duration {
        self.settings.warning_repeat_interval
    }

    /// Posts a Normal event.
    async fn normal(&self, regarding: &ObjectReference, reason: &str, action: &str, note: String) {
        tracing::info!(object = describe(regarding), reason, "{note}");
        self.post(regarding, EventType::Normal, reason, action, note).await;
    }

    /// Posts a Warning event every time it is called.
    async fn warning(&self, regarding: &ObjectReference, reason: &str, action: &str, note: String) {
        tracing::warn!(object = describe(regarding), reason, "{note}");
        self.post(regarding, EventType::Warning, reason, action, note).await;
    }

    /// Posts what `tell` describes, as loud as its level says.
    pub async fn tell(&self, regarding: &ObjectReference, tell: Tell) {
        let Tell {
            level,
            reason,
            action,
            note,
        } = tell;
        match level {
            Level::Normal => self.normal(regarding, reason, action, note).await,
            Level::Warning => self.warning(regarding, reason, action, note).await,
            Level::StandingWarning => self.warning_once(regarding, reason, action, note).await,
        }
    }

    /// Posts a Warning event unless the same one was the last posted for this object and reason,
    /// less than the repeat interval ago.
    async fn warning_once(&self, regarding: &ObjectReference, reason: &'static str, action: &str, note: String) {
        let key = (describe(regarding), reason);
        let due = {
            let mut last = self.last_warning.lock().expect("event cache poisoned");
            remember(&mut last, key, &note, Instant::now(), &self.settings)
        };
        if due {
            self.warning(regarding, reason, action, note).await;
        } else {
            tracing::debug!(object = describe(regarding), reason, "{note} (already reported)");
        }
    }

    /// Forgets the warnings posted for an object, so that a recurrence is reported again.
    pub fn clear_warnings(&self, regarding: &ObjectReference) {
        let object = describe(regarding);
        self.last_warning
            .lock()
            .expect("event cache poisoned")
            .retain(|(o, _), _| *o != object);
    }

    async fn post(&self, regarding: &ObjectReference, type_: EventType, reason: &str, action: &str, note: String) {
        let told = Told {
            type_,
            reason,
            action,
            note,
        };
        match within(self.timeout, self.poster.publish(told, regarding)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(object = describe(regarding), reason, error = %err, "cannot post event"),
            Err(timed_out) => tracing::warn!(object = describe(regarding), reason, "cannot post event: {timed_out}"),
        }
    }
}

/// Whether the warning `note` under `key` is due (new, changed, or last posted a repeat interval
/// ago); if so it is remembered as posted `now`, and when the memory is full the oldest half of it
/// is forgotten first.
fn remember(
    last: &mut HashMap<WarningKey, (String, Instant)>,
    key: WarningKey,
    note: &str,
    now: Instant,
    settings: &EventSettings,
) -> bool {
    if let Some((posted, at)) = last.get(&key)
        && posted == note
        && now.duration_since(*at) < settings.warning_repeat_interval
    {
        return false;
    }
    if !last.contains_key(&key) && last.len() >= settings.remembered_warnings.max(1) {
        let mut ages: Vec<Instant> = last.values().map(|(_, at)| *at).collect();
        ages.sort_unstable();
        let cutoff = ages[ages.len() / 2];
        last.retain(|_, (_, at)| *at > cutoff);
    }
    last.insert(key, (note.to_owned(), now));
    true
}

fn describe(reference: &ObjectReference) -> String {
    format!(
        "{}/{}/{}",
        reference.kind.as_deref().unwrap_or(""),
        reference.namespace.as_deref().unwrap_or(""),
        reference.name.as_deref().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(remembered: usize) -> EventSettings {
        EventSettings {
            warning_repeat_interval: Duration::from_secs(60),
            remembered_warnings: remembered,
        }
    }

    #[test]
    fn a_standing_warning_is_posted_again_each_repeat_interval_and_a_change_at_once() {
        let mut last = HashMap::new();
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let key = || ("PersistentVolumeClaim/apps/data".to_owned(), "InvalidServiceEndpoint");
        let settings = settings(100);
        let posts: Vec<bool> = [
            (0, "bad"),
            (30, "bad"),
            (59, "bad"),
            (60, "bad"),
            (61, "worse"),
            (90, "worse"),
        ]
        .into_iter()
        .map(|(secs, note)| remember(&mut last, key(), note, at(secs), &settings))
        .collect();
        assert_eq!(posts, [true, false, false, true, true, false]);
    }

    #[test]
    fn the_memory_stays_bounded_and_forgets_the_oldest() {
        let mut last = HashMap::new();
        let start = Instant::now();
        let settings = settings(10);
        for i in 0..100u64 {
            let key = (format!("Node//node-{i}"), "EvacuationHeld");
            assert!(remember(
                &mut last,
                key,
                "held",
                start + Duration::from_secs(i),
                &settings
            ));
            assert!(last.len() <= 10, "{} remembered", last.len());
        }
        assert!(last.contains_key(&("Node//node-99".to_owned(), "EvacuationHeld")));
        assert!(!last.contains_key(&("Node//node-0".to_owned(), "EvacuationHeld")));
    }
}
