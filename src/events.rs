//! Kubernetes events (events.k8s.io/v1), each also logged. Warnings about bad input are posted
//! once per change of message, so an object that stays broken does not flood the event stream.
//! Every post is bounded by a timeout: a hanging API server cannot stall the caller.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::deadline::within;

pub struct EventSink {
    recorder: Recorder,
    /// Last warning note posted, by (object kind/namespace/name, reason): Nodes, PVs and
    /// attachments are told apart by name as well as pods and claims.
    last_warning: Mutex<HashMap<(String, &'static str), String>>,
    timeout: Duration,
}

/// How long one event post may take, unless [`EventSink::with_timeout`] says otherwise.
const DEFAULT_POST_TIMEOUT: Duration = Duration::from_secs(10);

impl EventSink {
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: controller.to_owned(),
            instance,
        };
        Self {
            recorder: Recorder::new(client, reporter),
            last_warning: Mutex::default(),
            timeout: DEFAULT_POST_TIMEOUT,
        }
    }

    /// Bounds every post by `timeout`.
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// Posts a Normal event.
    pub async fn normal(&self, regarding: &ObjectReference, reason: &str, action: &str, note: String) {
        tracing::info!(object = describe(regarding), reason, "{note}");
        self.post(regarding, EventType::Normal, reason, action, note).await;
    }

    /// Posts a Warning event every time it is called.
    pub async fn warning(&self, regarding: &ObjectReference, reason: &str, action: &str, note: String) {
        tracing::warn!(object = describe(regarding), reason, "{note}");
        self.post(regarding, EventType::Warning, reason, action, note).await;
    }

    /// Posts an event of `type_`: [`EventSink::normal`] or [`EventSink::warning`].
    pub async fn tell(&self, regarding: &ObjectReference, type_: EventType, reason: &str, action: &str, note: String) {
        match type_ {
            EventType::Normal => self.normal(regarding, reason, action, note).await,
            EventType::Warning => self.warning(regarding, reason, action, note).await,
        }
    }

    /// Posts a Warning event unless the same one was the last posted for this object and reason.
    pub async fn warning_once(&self, regarding: &ObjectReference, reason: &'static str, action: &str, note: String) {
        let key = (describe(regarding), reason);
        {
            let mut last = self.last_warning.lock().expect("event cache poisoned");
            if last.get(&key) == Some(&note) {
                tracing::debug!(object = describe(regarding), reason, "{note} (already reported)");
                return;
            }
            last.insert(key, note.clone());
        }
        self.warning(regarding, reason, action, note).await;
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
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        match within(self.timeout, self.recorder.publish(&event, regarding)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(object = describe(regarding), reason, error = %err, "cannot post event"),
            Err(timed_out) => tracing::warn!(object = describe(regarding), reason, "cannot post event: {timed_out}"),
        }
    }
}

fn describe(reference: &ObjectReference) -> String {
    format!(
        "{}/{}/{}",
        reference.kind.as_deref().unwrap_or(""),
        reference.namespace.as_deref().unwrap_or(""),
        reference.name.as_deref().unwrap_or("")
    )
}
