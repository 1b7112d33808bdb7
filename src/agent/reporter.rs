//! States this node's DRBD view on its report Lease whenever the view changes, from a task of its
//! own. Peers read the report as evidence before failing this node over; written from the round,
//! it waited for the round, and a round that waits on the API server (publication retries, the
//! guard, a forced demotion) could leave a live node looking silent past the peers' hold. The loop
//! hands over each view it learns, the state a round starts from and every state events2
//! describes while a round runs; the task writes the newest one that differs from what it stated.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;

use super::drbd::Resource;
use super::heartbeat::Heartbeat;
use super::report::Report;

/// A failed write is tried again after this pause while the view it states is still wanted.
const RETRY: Duration = Duration::from_secs(1);

/// The handle the loop states views through; cloning shares the task.
#[derive(Clone)]
pub(crate) struct Reporter {
    wanted: watch::Sender<Option<Report>>,
}

impl Reporter {
    /// Starts the task that writes the reports through `heartbeat`, until every handle is gone.
    pub fn spawn(heartbeat: Heartbeat) -> Self {
        let (wanted, receiver) = watch::channel(None);
        tokio::spawn(write_reports(heartbeat, receiver));
        Self { wanted }
    }

    /// The node's DRBD resources as now known: stated unless the same view is stated or on its way.
    pub fn state(&self, resources: &[Resource]) {
        let report = Report::of_resources(resources);
        self.wanted.send_if_modified(|wanted| {
            let same = wanted.as_ref().is_some_and(|w| w.same_view(&report));
            if !same {
                *wanted = Some(report);
            }
            !same
        });
    }
}

/// Writes the newest wanted report that differs from the last one written; a failed write is
/// tried again after [`RETRY`] unless a newer view replaced it meanwhile.
async fn write_reports(heartbeat: Heartbeat, mut wanted: watch::Receiver<Option<Report>>) {
    let mut stated: Option<Report> = None;
    let mut retry = false;
    loop {
        let gone = if retry {
            wanted.has_changed().is_err()
        } else {
            wanted.changed().await.is_err()
        };
        if gone {
            return;
        }
        let Some(mut report) = wanted.borrow_and_update().clone() else {
            retry = false;
            continue;
        };
        if stated.as_ref().is_some_and(|s| s.same_view(&report)) {
            retry = false;
            continue;
        }
        report.at = Timestamp::now().to_string();
        match heartbeat.publish(&report).await {
            Ok(()) => {
                stated = Some(report);
                retry = false;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot state this node's DRBD view on its report Lease; trying again");
                retry = true;
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::agent::drbd::{Connection, Device};
    use crate::scripted_api;

    fn resource(quorum: bool) -> Resource {
        Resource {
            name: "pvc-1".into(),
            role: "Primary".into(),
            devices: vec![Device {
                quorum,
                ..Default::default()
            }],
            connections: vec![Connection {
                name: "node-a".into(),
                connection_state: "Connected".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// A report Lease served by a scripted API server that refuses the first `refusals` writes;
    /// every write's quorum as stated is recorded.
    fn lease_server(refusals: usize) -> (Heartbeat, Arc<Mutex<Vec<Option<bool>>>>) {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let seen = writes.clone();
        let client = scripted_api::client(move |request| {
            let mut seen = seen.lock().unwrap();
            let text = request.body["metadata"]["annotations"][crate::names::DRBD_REPORT_ANNOTATION]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let quorum = Report::parse(&text).map(|r| r.resources["pvc-1"].quorum);
            seen.push(quorum);
            if seen.len() <= refusals {
                return (
                    503,
                    r#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":503}"#.into(),
                );
            }
            (200, "{}".into())
        });
        let heartbeat = Heartbeat::new(
            client,
            "default",
            "node-b",
            (30, Duration::from_secs(10)),
            Duration::from_secs(5),
        );
        (heartbeat, writes)
    }

    async fn settle() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    #[tokio::test]
    async fn each_new_view_is_stated_once_and_a_failed_write_is_tried_again() {
        let (heartbeat, writes) = lease_server(1);
        let reporter = Reporter::spawn(heartbeat);
        reporter.state(&[resource(true)]);
        settle().await;
        assert_eq!(*writes.lock().unwrap(), [Some(true)], "refused once");
        tokio::time::sleep(RETRY + Duration::from_millis(200)).await;
        assert_eq!(*writes.lock().unwrap(), [Some(true), Some(true)], "tried again");
        reporter.state(&[resource(true)]);
        settle().await;
        assert_eq!(writes.lock().unwrap().len(), 2, "the same view is not written again");
        reporter.state(&[resource(false)]);
        settle().await;
        assert_eq!(
            writes.lock().unwrap().last(),
            Some(&Some(false)),
            "the quorum lost, stated"
        );
    }
}
