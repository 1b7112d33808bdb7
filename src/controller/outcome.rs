//! What one reconcile of a claim ends with: an [`Outcome`], or a [`ReconcileError`]. Below both the
//! reconcile and the pieces it calls (the condition, the Service), so that they share these types
//! without importing the shell that runs them.

use std::time::Duration;

use crate::deadline::TimedOut;
use crate::kube_client::Refusal;
use crate::sharedvolume::classify::{Invalid, Skip};
use crate::sharedvolume::linstor::{LinstorExport, LinstorServer};
use crate::sharedvolume::silence::SilentServer;
use crate::sharedvolume::stamp::MoveStamp;
use crate::volume::VolumeError;

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("volume backend: {0}")]
    Volume(#[from] VolumeError),
    #[error("Service {0} has no ClusterIP after {1:?}")]
    NoClusterIp(String, Duration),
    #[error("Service {0} was there when created and gone when read; retrying")]
    Gone(String),
    #[error("the reconcile was dropped: {0}")]
    Timeout(#[from] TimedOut),
}

impl ReconcileError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kube(_) => "KubernetesApi",
            Self::Volume(_) => "VolumeBackend",
            Self::NoClusterIp(..) => "NoClusterIP",
            Self::Gone(..) => "ServiceGone",
            Self::Timeout(..) => "Timeout",
        }
    }

    /// The API server's answer, when it is one that no retry of the same write can change.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Self::Kube(err) => Refusal::of(err),
            _ => None,
        }
    }
}

/// What one reconcile ended with (for metrics and tests).
#[derive(Debug, PartialEq)]
pub enum Outcome {
    Skipped(Skip),
    Invalid(Invalid),
    Shared {
        mount_endpoint: String,
        published: bool,
        /// The NFS server behind it, `IP:port`.
        server: String,
        /// The last agent's move of it, as stamped on the PV.
        moved: Option<MoveStamp>,
        /// What the agent on its primary says on the PV: the server does not answer.
        silent: Option<SilentServer>,
    },
    /// Served, but something keeps changing its objects: the repair waits this long.
    RepairDeferred(Duration),
    /// Served, and an agent's move of its endpoints is in flight: looked at again after this.
    MoveHeld(Duration),
    /// LINSTOR CSI serves it over NFS itself: nothing is written for it but its condition, which
    /// says what LINSTOR advertises (no server while its nfs-helper advertises none).
    ServedByLinstor {
        export: LinstorExport,
        server: Option<LinstorServer>,
    },
}

/// What a reconcile has to tell on its claim, as Events: collected while it runs and posted in one
/// place once it ends (`reconcile::tell`), in the order they were found.
#[derive(Debug, Default, PartialEq)]
pub struct Tells(pub Vec<Tell>);

pub use crate::tell::{Level, Tell};

impl Tells {
    pub fn add(&mut self, level: Level, reason: &'static str, action: &'static str, note: String) {
        self.0.push(Tell::new(level, reason, action, note));
    }

    /// A write the API server refused for good, in words that say what to fix.
    pub fn refusal(&mut self, err: &ReconcileError) {
        if let Some(refusal) = err.refusal() {
            let note = refusal.explain("the controller");
            self.add(Level::StandingWarning, "WriteRefused", "Reconcile", note);
        }
    }
}
