//! What done actions leave behind for later ones: the attachments not to delete again, the nodes
//! this agent failed over (their volumes' fail-over durations are its to report), the fail-over
//! count and the endpoint-rewrite latency.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use crate::agent::action::{Action, Cause};
use crate::agent::view::FailOverDone;
use crate::metrics::AgentMetrics;

pub struct Ledger {
    metrics: AgentMetrics,
    /// UIDs of the VolumeAttachments deleted: none is deleted twice.
    deleted_attachments: Mutex<HashSet<String>>,
    /// The nodes this agent failed over (it put the fail-over taint). At most one entry per node.
    failed_over: Mutex<HashSet<String>>,
}

impl Ledger {
    pub fn new(metrics: AgentMetrics) -> Self {
        Self {
            metrics,
            deleted_attachments: Mutex::default(),
            failed_over: Mutex::default(),
        }
    }

    /// Records a done action; `followed`: the endpoints were rewritten too (only then is the
    /// rewrite latency observed, from `drbd_read_at`).
    pub fn done(&self, action: &Action, followed: bool, drbd_read_at: Instant) {
        match action {
            Action::DeleteAttachment { attachment, .. } => {
                lock(&self.deleted_attachments).insert(attachment.uid.clone());
            }
            // The taint is the step that starts a peer's fail-over: count each once.
            Action::Taint {
                node,
                cause: Cause::FailOver,
                ..
            } => {
                self.metrics.fail_overs.with_label_values(&[node]).inc();
                lock(&self.failed_over).insert(node.clone());
            }
            Action::PublishServiceEndpoint { .. } if followed => self
                .metrics
                .endpoint_rewrite
                .observe(drbd_read_at.elapsed().as_secs_f64()),
            _ => {}
        }
    }

    pub fn attachment_deleted(&self, uid: &str) -> bool {
        lock(&self.deleted_attachments).contains(uid)
    }

    /// Records the fail-overs finished since the last round, those of nodes this agent failed
    /// over (every agent that saw the loss sees them finish; the one that tainted reports them).
    pub fn fail_overs_done(&self, done: impl IntoIterator<Item = FailOverDone>) {
        let failed_over = lock(&self.failed_over);
        for done in done.into_iter().filter(|d| failed_over.contains(&d.node)) {
            tracing::info!(resource = %done.resource, node = %done.node, took = ?done.took, "fail-over done");
            self.metrics.fail_over_duration.observe(done.took.as_secs_f64());
        }
    }
}

fn lock(set: &Mutex<HashSet<String>>) -> std::sync::MutexGuard<'_, HashSet<String>> {
    set.lock().unwrap_or_else(PoisonError::into_inner)
}
