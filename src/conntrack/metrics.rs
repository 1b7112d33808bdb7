//! The conntrack repair's metrics.

use anyhow::Result;
use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge, Registry};

use crate::metrics::{counter, counter_vec, histogram_of, int_gauge};

pub const CONNTRACK_DELETED: &str = "storageos_shared_volume_conntrack_entries_deleted_total";
pub const CONNTRACK_REPAIR_DURATION: &str = "storageos_shared_volume_conntrack_repair_duration_seconds";
pub const CONNTRACK_FAILURES: &str = "storageos_shared_volume_conntrack_failures_total";
pub const CONNTRACK_SWEEPS: &str = "storageos_shared_volume_conntrack_sweeps_total";
pub const CONNTRACK_SWEEPING: &str = "storageos_shared_volume_conntrack_volumes_sweeping";
pub const CONNTRACK_TCP_LOOSE: &str = "storageos_shared_volume_conntrack_tcp_loose";
pub const CONNTRACK_SWEEPS_ENDED: &str = "storageos_shared_volume_conntrack_sweeps_ended_total";

/// Metrics of the conntrack repair.
#[derive(Clone)]
pub struct ConntrackMetrics {
    /// Conntrack entries deleted because they bound a volume's ClusterIP to a server it left.
    pub deleted: IntCounter,
    /// From a move (its trigger time on the slice, else when this node saw it) to the sweep that
    /// first deleted stranded entries of it on this node.
    pub repair_duration: Histogram,
    /// Reads and deletes of the conntrack table that failed.
    pub failures: IntCounter,
    /// Listings of the table.
    pub sweeps: IntCounter,
    /// Volumes swept now (their endpoint moved within the sweep window).
    pub sweeping: IntGauge,
    /// Sweeps of a moved volume that ended, by why: `kube-proxy`, `flow` or `window`.
    pub sweeps_ended: IntCounterVec,
    /// The node's `nf_conntrack_tcp_loose`: 1 on, 0 off, -1 unreadable.
    pub tcp_loose: IntGauge,
}

impl ConntrackMetrics {
    pub fn register(registry: &Registry) -> Result<Self> {
        Ok(Self {
            deleted: counter(
                registry,
                CONNTRACK_DELETED,
                "Conntrack entries deleted because they bound a volume's ClusterIP to an NFS server it moved from.",
            )?,
            repair_duration: histogram_of(
                registry,
                CONNTRACK_REPAIR_DURATION,
                "From a volume's endpoint move to the sweep that deleted its stranded conntrack entries on this node.",
                REPAIR_BUCKETS,
            )?,
            failures: counter(
                registry,
                CONNTRACK_FAILURES,
                "Reads and deletes of the conntrack table that failed.",
            )?,
            sweeps: counter(
                registry,
                CONNTRACK_SWEEPS,
                "Listings of the conntrack table by the repair.",
            )?,
            sweeping: int_gauge(
                registry,
                CONNTRACK_SWEEPING,
                "Volumes whose endpoint moved within the sweep window, swept now.",
            )?,
            sweeps_ended: counter_vec(
                registry,
                CONNTRACK_SWEEPS_ENDED,
                "Sweeps of a moved volume that ended: kube-proxy said its rules hold the move, a flow reached the new server, or the window ended.",
                &["reason"],
            )?,
            tcp_loose: int_gauge(
                registry,
                CONNTRACK_TCP_LOOSE,
                "The node's nf_conntrack_tcp_loose: 1 on (a deleted flow's next segment is tracked anew), 0 off, -1 unreadable.",
            )?,
        })
    }
}

/// Conntrack repair buckets, 10 ms to 60 s.
const REPAIR_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];
