//! Posts events.k8s.io/v1 Events the way Kubernetes' own recorders do: the same event (object,
//! type, reason, action) again within six minutes bumps the first one's `series` instead of
//! creating another. What it remembers of each Event is a digest and the Event's name, not the
//! Event: kube's `Recorder` keeps every Event whole for those six minutes, which at a cold start
//! of 10,000 claims (one `MountEndpointPublished` each) held tens of MiB, and scanned all of them
//! on every post.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Client};
use serde_json::json;

/// How long a repeat counts as the same event (client-go's event series window).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// Who reports the events.
pub struct Reporter {
    pub controller: String,
    pub instance: String,
}

/// One Event posted within the window: where it is and how often it was seen.
struct Posted {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

pub struct SeriesPoster {
    client: Client,
    reporter: Reporter,
    posted: Mutex<HashMap<u64, Posted>>,
    /// When the remembered events were last pruned: at most once a minute, not on every post.
    pruned: Mutex<Timestamp>,
}

/// What one post says.
pub struct Told<'a> {
    pub type_: EventType,
    pub reason: &'a str,
    pub action: &'a str,
    pub note: String,
}

impl SeriesPoster {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            posted: Mutex::default(),
            pruned: Mutex::new(Timestamp::now()),
        }
    }

    /// Creates the Event, or bumps the series of the same one posted within the window.
    pub async fn publish(&self, told: Told<'_>, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        self.prune(now);
        let key = digest(&told, regarding);
        let repeat = {
            let mut posted = self.posted.lock().expect("event series poisoned");
            posted.get_mut(&key).filter(|p| p.last + SERIES_WINDOW > now).map(|p| {
                p.count += 1;
                p.last = now;
                (p.namespace.clone(), p.name.clone(), p.count)
            })
        };
        if let Some((namespace, name, count)) = repeat {
            let series = EventSeries {
                count,
                last_observed_time: MicroTime(now),
            };
            let patch = json!({ "series": series });
            let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            return events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ());
        }
        let event = self.new_event(told, regarding, now);
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let name = event.metadata.name.clone().unwrap_or_default();
        let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        events.create(&PostParams::default(), &event).await?;
        self.posted.lock().expect("event series poisoned").insert(
            key,
            Posted {
                namespace,
                name,
                count: 1,
                last: now,
            },
        );
        Ok(())
    }

    fn new_event(&self, told: Told<'_>, regarding: &ObjectReference, now: Timestamp) -> Event {
        let object = regarding.name.as_deref().unwrap_or(&self.reporter.controller);
        Event {
            metadata: ObjectMeta {
                // Cluster-scoped objects' events live in `default`, as kube's and client-go's do.
                namespace: Some(regarding.namespace.clone().unwrap_or_else(|| "default".into())),
                name: Some(format!("{object}.{:x}", now.as_nanosecond())),
                ..Default::default()
            },
            action: Some(told.action.into()),
            reason: Some(told.reason.into()),
            note: Some(told.note),
            type_: Some(type_name(told.type_).into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(self.reporter.instance.clone()),
            ..Default::default()
        }
    }

    fn prune(&self, now: Timestamp) {
        {
            let mut pruned = self.pruned.lock().expect("event series poisoned");
            if *pruned + SignedDuration::from_mins(1) > now {
                return;
            }
            *pruned = now;
        }
        self.posted
            .lock()
            .expect("event series poisoned")
            .retain(|_, p| p.last + SERIES_WINDOW > now);
    }
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// What makes two posts the same event: the object, the type, the reason and the action (the
/// note may differ, as with client-go's series).
fn digest(told: &Told<'_>, regarding: &ObjectReference) -> u64 {
    let mut hasher = DefaultHasher::new();
    (
        type_name(told.type_),
        told.reason,
        told.action,
        &regarding.kind,
        &regarding.namespace,
        &regarding.name,
        &regarding.uid,
    )
        .hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::scripted_api;

    fn pod(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Pod".into()),
            namespace: Some("apps".into()),
            name: Some(name.into()),
            ..Default::default()
        }
    }

    fn told(reason: &str) -> Told<'_> {
        Told {
            type_: EventType::Warning,
            reason,
            action: "Evict",
            note: "why".into(),
        }
    }

    #[tokio::test]
    async fn a_repeat_bumps_the_series_and_another_event_is_created() {
        let seen = Arc::new(Mutex::new(Vec::<(String, String, serde_json::Value)>::new()));
        let log = seen.clone();
        let client = scripted_api::client(move |request| {
            log.lock()
                .unwrap()
                .push((request.method.to_string(), request.path.clone(), request.body.clone()));
            (201, json!({"metadata": {"name": "x"}}).to_string())
        });
        let poster = SeriesPoster::new(
            client,
            Reporter {
                controller: "c".into(),
                instance: "i".into(),
            },
        );
        poster.publish(told("Blocked"), &pod("web")).await.unwrap();
        poster.publish(told("Blocked"), &pod("web")).await.unwrap();
        poster.publish(told("Blocked"), &pod("db")).await.unwrap();
        poster.publish(told("Other"), &pod("web")).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        let methods: Vec<&str> = seen.iter().map(|(m, _, _)| m.as_str()).collect();
        assert_eq!(methods, ["POST", "PATCH", "POST", "POST"]);
        let (_, path, patch) = &seen[1];
        let created = seen[0].2["metadata"]["name"].as_str().unwrap();
        assert!(path.ends_with(&format!("/namespaces/apps/events/{created}")), "{path}");
        assert_eq!(patch["series"]["count"], 2);
        assert_eq!(seen[0].2["reportingController"], "c");
        assert_eq!(seen[0].2["regarding"]["name"], "web");
    }
}
