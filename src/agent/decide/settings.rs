//! What the rules are told by the agent's flags.

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct DecisionSettings {
    /// How long a peer may stay disconnected before it is failed over; also the hold-off before
    /// a suspended primary is demoted.
    pub fail_over_timeout: Duration,
    pub fail_over_unsafe_pods: bool,
    pub disable_node_taints: bool,
    /// Largest share of the storage nodes that may carry the lost-quorum taint after we add one.
    pub max_tainted_fraction: f64,
    pub nfs_port: u16,
    /// `--node-drain-policy=evacuate`: the taint key that asks for evacuation, if enabled.
    pub evacuate_taint: Option<String>,
    /// How long the API server must have answered this agent before a Ready peer's silence or
    /// stated loss of quorum counts: time for the peers to restate after an outage
    /// (`--fail-over-timeout` + `--reconcile-interval`).
    pub peers_restate_within: Duration,
    /// How soon a peer's agent states a change of its DRBD view (`--reconcile-interval`).
    pub report_interval: Duration,
    /// How long this agent must have seen a Node NotReady, without a Ready read between, before
    /// that counts as evidence: time for the kubelets to speak again after a control-plane outage.
    pub not_ready_counts_after: Duration,
}

#[cfg(test)]
impl DecisionSettings {
    /// The defaults of the flags, with a 5 s fail-over timeout.
    pub(crate) fn for_tests() -> Self {
        Self {
            fail_over_timeout: Duration::from_secs(5),
            fail_over_unsafe_pods: false,
            disable_node_taints: false,
            max_tainted_fraction: 0.5,
            nfs_port: 2049,
            evacuate_taint: None,
            peers_restate_within: Duration::ZERO,
            report_interval: Duration::from_secs(5),
            not_ready_counts_after: Duration::ZERO,
        }
    }
}
