//! The agent's probes of the NFS servers it publishes (`--nfs-probe`): the server of each new
//! publication before it goes out, and each published one's every `--nfs-probe-interval`. What
//! is held or warned is decided in [`decide`]; this asks the servers and keeps the gauge.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::StreamExt;
use prometheus::IntGauge;

use super::action::Action;
use super::decide::{self, DecisionSettings, Unanswered};
use super::nfs_probe::probe;
use super::view::{Observed, Timers};
use crate::cli::AgentArgs;
use crate::volume::NfsEndpoint;

/// How soon a publication held for its server is tried again: a server just started by the
/// promoter answers within a second or so, and every moment unpublished is an outage.
const RETRY: Duration = Duration::from_millis(250);
/// Servers probed at once.
const AT_ONCE: usize = 32;

pub struct ServerProbes {
    enabled: bool,
    timeout: Duration,
    interval: Duration,
    next_watch: Instant,
    /// The warnings of the last watch, told again every round until the next one, so that
    /// each is posted once while its server does not answer.
    warnings: Vec<Action>,
    gauge: IntGauge,
}

impl ServerProbes {
    pub fn new(args: &AgentArgs, gauge: IntGauge) -> Self {
        Self {
            enabled: args.nfs_probe,
            timeout: *args.nfs_probe_timeout,
            interval: *args.nfs_probe_interval,
            next_watch: Instant::now(),
            warnings: Vec::new(),
            gauge,
        }
    }

    /// `publications` with each new one whose server does not answer held, and, every interval,
    /// a warning for each published volume whose server does not answer.
    pub async fn gate(
        &mut self,
        observed: &Observed,
        settings: &DecisionSettings,
        timers: &mut Timers,
        publications: Vec<Action>,
        now: Instant,
    ) -> Vec<Action> {
        timers.server_retry = None;
        if !self.enabled {
            return publications;
        }
        let watching = now >= self.next_watch;
        let published: Vec<Action> = if watching {
            self.next_watch = now + self.interval;
            decide::republish(observed, settings, timers, now)
                .into_iter()
                .filter(|a| {
                    matches!(
                        a,
                        Action::PublishServiceEndpoint {
                            confirm_first: true,
                            ..
                        }
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        let mut endpoints = decide::endpoints_to_probe(&publications);
        endpoints.extend(
            published
                .iter()
                .filter_map(|a| a.published_endpoint().map(str::to_owned)),
        );
        let unanswered = self.ask(endpoints).await;
        let mut actions = decide::held_until_answered(observed, publications, &unanswered);
        let held = decide::not_answering(&actions, false);
        if watching {
            self.warnings = decide::served_but_not_answering(observed, &published, &unanswered);
            actions.extend(decide::answering_again(observed, &published, &unanswered));
        }
        actions.extend(self.warnings.iter().cloned());
        for resource in &held {
            // Not published: the next round decides it afresh, not as a publication of its own.
            timers.published.remove(resource);
        }
        if !held.is_empty() {
            timers.server_retry = Some(now + RETRY);
        }
        let count = held.union(&decide::not_answering(&self.warnings, true)).count();
        self.gauge.set(i64::try_from(count).unwrap_or(i64::MAX));
        actions
    }

    async fn ask(&self, endpoints: BTreeSet<String>) -> Unanswered {
        let timeout = self.timeout;
        futures::stream::iter(endpoints)
            .map(|endpoint| async move {
                let answer = match endpoint.parse::<NfsEndpoint>() {
                    Ok(at) => probe(SocketAddr::new(at.ip, at.port), timeout).await,
                    Err(err) => Err(err.to_string()),
                };
                if let Err(why) = &answer {
                    tracing::debug!(%endpoint, %why, "the NFS server does not answer");
                }
                (endpoint, answer)
            })
            .buffer_unordered(AT_ONCE)
            .filter_map(|(endpoint, answer)| async move { answer.err().map(|why| (endpoint, why)) })
            .collect()
            .await
    }
}
