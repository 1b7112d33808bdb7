//! What the agent knows of its node's DRBD state between rounds: the last state read
//! (`drbdsetup status` and `show`) or described by `drbdsetup events2`, what events2 said that is
//! not taken in yet, and when DRBD is read next. The periodic read is the safety net under
//! events2, and where the two disagree the read wins. Every state taken tells the cache's
//! [`Locality`] which resources are on the node.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::drbd::{DrbdState, Resource, Shown};
use super::freshness::Freshness;
use super::locality::Locality;
use super::source::{DrbdChange, DrbdSource};
use crate::metrics::{AgentMetrics, set_to_now};

pub struct DrbdBook {
    source: Arc<dyn DrbdSource>,
    metrics: AgentMetrics,
    freshness: Freshness,
    status_interval: Duration,
    locality: Locality,
    /// The last DRBD state read or described by events2, and when; none after a failed read.
    state: Option<(DrbdState, Instant)>,
    /// The newest state events2 described that is not taken in yet; `true`: something was
    /// created or destroyed, so the quorum settings must be read again.
    pending: Option<(Vec<Resource>, bool)>,
    /// The last state events2 described, to check the periodic read against.
    described: Option<Vec<Resource>>,
    /// The quorum settings were read in this round: a destructive step needs no fresh read.
    quorum_read: bool,
    /// A full read is due before the next round (events2 could not be followed).
    due: bool,
    /// When the last full read started and ended: what events2 described before it is older.
    last_read: Option<(Instant, Instant)>,
    /// Scheduled from the last attempt, not the last success: a failing drbdsetup is retried at
    /// the status interval, not in a tight loop.
    next_read: Instant,
}

impl DrbdBook {
    pub fn new(
        source: Arc<dyn DrbdSource>,
        metrics: AgentMetrics,
        freshness: Freshness,
        status_interval: Duration,
        locality: Locality,
    ) -> Self {
        Self {
            source,
            metrics,
            freshness,
            status_interval,
            locality,
            state: None,
            pending: None,
            described: None,
            quorum_read: false,
            due: true,
            last_read: None,
            next_read: Instant::now(),
        }
    }

    /// Before a round: a full read when one is due, else what events2 described since.
    pub async fn bring_up_to_date(&mut self) {
        self.quorum_read = false;
        if self.due || Instant::now() >= self.next_read {
            self.read().await;
        } else if let Some((resources, created)) = self.pending.take() {
            self.take_described(resources, created).await;
        }
    }

    /// The state, when it was taken within `usable_for`.
    pub fn fresh(&self, usable_for: Duration) -> Option<(DrbdState, Instant)> {
        self.state
            .clone()
            .filter(|(_, read_at)| read_at.elapsed() <= usable_for)
    }

    /// When the state kept now was taken; `None` after a failed read.
    pub fn taken_at(&self) -> Option<Instant> {
        self.state.as_ref().map(|(_, at)| *at)
    }

    /// The DRBD source, for the steps that run `drbdsetup`.
    pub fn source(&self) -> Arc<dyn DrbdSource> {
        self.source.clone()
    }

    /// Whether the cache holds every PV and attachment of the resources last taken: a resource
    /// new here may have them still on their way.
    pub fn volumes_listed(&self) -> bool {
        self.locality.current()
    }

    pub fn next_read(&self) -> Instant {
        self.next_read
    }

    /// Whether this round's state carries settings read in this round.
    pub fn quorum_read(&self) -> bool {
        self.quorum_read
    }

    /// Reads the settings again for a destructive step, and keeps them with the state.
    pub async fn read_settings_again(&mut self) -> Option<Shown> {
        let shown = self.read_shown().await?;
        if let Some((state, _)) = self.state.as_mut() {
            *state = DrbdState::new(std::mem::take(&mut state.resources), shown.clone());
        }
        Some(shown)
    }

    /// Keeps what events2 said for the next round: only the newest state counts.
    pub fn heard(&mut self, change: DrbdChange) {
        match change {
            DrbdChange::Unknown => self.due = true,
            DrbdChange::State { resources, created, at } => match against_read(at, self.last_read) {
                AgainstRead::Older => {
                    tracing::debug!("events2 described a state older than the last read; passed over")
                }
                AgainstRead::During => self.due = true,
                AgainstRead::Newer => {
                    let created = created || self.pending.as_ref().is_some_and(|(_, created)| *created);
                    self.pending = Some((resources, created));
                }
            },
        }
    }

    /// Takes the state events2 described: no `drbdsetup status` on a change's path. The settings
    /// (quorum, net options), which events2 never prints, are read when something was created or
    /// destroyed.
    async fn take_described(&mut self, resources: Vec<Resource>, created: bool) {
        self.described = Some(resources.clone());
        let known = self.state.as_ref().map(|(state, _)| state.shown());
        let shown = match known.filter(|_| !created) {
            Some(known) => known,
            None => match self.read_shown().await {
                Some(read) => read,
                None => return,
            },
        };
        self.take(DrbdState::new(resources, shown));
    }

    /// Keeps `state` as the node's, and says so to the metrics and the cache's locality.
    fn take(&mut self, state: DrbdState) {
        record_resources(&self.metrics, &state);
        self.locality
            .set_resources(state.resources.iter().map(|r| r.name.as_str()));
        self.state = Some((state, Instant::now()));
    }

    /// Reads the DRBD settings (`drbdsetup show`); a failed read leaves no state to act on.
    async fn read_shown(&mut self) -> Option<Shown> {
        let read = {
            let _timer = self.metrics.drbd_read.start_timer();
            self.source.shown().await
        };
        match read {
            Ok(read) => {
                self.quorum_read = true;
                Some(read)
            }
            Err(err) => {
                self.metrics.drbd_read_errors.inc();
                self.state = None;
                tracing::warn!(error = %err, "cannot read the DRBD settings (drbdsetup show); no action until a read succeeds");
                None
            }
        }
    }

    async fn read(&mut self) {
        let started = Instant::now();
        self.next_read = started + self.status_interval;
        self.due = false;
        // What events2 said before this read is older than it.
        self.pending = None;
        let read = {
            let _timer = self.metrics.drbd_read.start_timer();
            self.source.read().await
        };
        self.last_read = Some((started, Instant::now()));
        match read {
            Ok(mut state) => {
                self.quorum_read = true;
                self.check_described(&mut state);
                self.freshness.mark_read();
                set_to_now(&self.metrics.drbd_last_read);
                self.take(state);
            }
            Err(err) => {
                // A failed read leaves no state to act on: what was read before may be exactly
                // what changed.
                self.metrics.drbd_read_errors.inc();
                self.state = None;
                tracing::warn!(error = %err, "cannot read DRBD state; no action until a read succeeds");
            }
        }
    }

    /// The periodic read is the safety net under events2: where the two disagree, the read wins,
    /// and the disagreement is counted and said. Where they agree, the read keeps DRBD's word on
    /// promotion, which only events2 prints.
    fn check_described(&mut self, read: &mut DrbdState) {
        let Some(described) = self.described.take() else { return };
        if comparable(&described) != comparable(&read.resources) {
            self.metrics.events2_mismatches.inc();
            tracing::warn!("the DRBD state read differs from what drbdsetup events2 described; the read wins");
            return;
        }
        for resource in &mut read.resources {
            resource.drbd_says = described
                .iter()
                .find(|d| d.name == resource.name)
                .and_then(|d| d.drbd_says);
        }
        self.described = Some(described);
    }
}

/// Where a state events2 described stands against the last full read (`started`, `ended`).
#[derive(Debug, PartialEq, Eq)]
enum AgainstRead {
    /// Described before the read started: the read is newer, the description is passed over.
    Older,
    /// Described while the read ran: which is newer cannot be told, so DRBD is read again.
    During,
    /// Described after the read: taken in.
    Newer,
}

fn against_read(described_at: Instant, last_read: Option<(Instant, Instant)>) -> AgainstRead {
    match last_read {
        Some((started, _)) if described_at < started => AgainstRead::Older,
        Some((_, ended)) if described_at <= ended => AgainstRead::During,
        _ => AgainstRead::Newer,
    }
}

/// Resources in an order that does not depend on who listed them, without what only events2
/// prints.
fn comparable(resources: &[Resource]) -> Vec<Resource> {
    let mut resources = resources.to_vec();
    resources.sort_by(|a, b| a.name.cmp(&b.name));
    for resource in &mut resources {
        resource.drbd_says = None;
        resource.connections.sort_by(|a, b| a.name.cmp(&b.name));
    }
    resources
}

fn record_resources(metrics: &AgentMetrics, state: &DrbdState) {
    metrics.drbd_resources.reset();
    for resource in &state.resources {
        let quorum = if resource.has_quorum() { "true" } else { "false" };
        let role = if resource.role.is_empty() {
            "Unknown"
        } else {
            &resource.role
        };
        metrics.drbd_resources.with_label_values(&[role, quorum]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::super::drbd::PromotionWord;
    use super::super::source::{DrbdError, MockDrbdSource};
    use super::*;

    const INTERVAL: Duration = Duration::from_secs(5);

    fn resource(name: &str, role: &str) -> Resource {
        Resource {
            name: name.into(),
            role: role.into(),
            ..Resource::default()
        }
    }

    fn shown(quorum: &[&str]) -> Shown {
        Shown {
            quorum_enabled: quorum.iter().map(|r| (*r).to_owned()).collect(),
            ..Shown::default()
        }
    }

    fn state(resources: &[Resource], quorum: &[&str]) -> DrbdState {
        DrbdState::new(resources.to_vec(), shown(quorum))
    }

    fn failed() -> DrbdError {
        DrbdError::Failed {
            command: "drbdsetup status".into(),
            status: "exit status: 10".into(),
            stderr: "no such resource".into(),
            timed_out: false,
        }
    }

    fn book(source: MockDrbdSource) -> (DrbdBook, AgentMetrics) {
        let metrics = AgentMetrics::register(&prometheus::Registry::new()).unwrap();
        let freshness = Freshness::new(INTERVAL, INTERVAL);
        let book = DrbdBook::new(
            Arc::new(source),
            metrics.clone(),
            freshness,
            INTERVAL,
            Locality::default(),
        );
        (book, metrics)
    }

    /// A drbdsetup read twice, finding `r1` (quorum on) in each role in turn.
    fn reads_of_r1(roles: [&'static str; 2]) -> MockDrbdSource {
        let mut source = MockDrbdSource::new();
        let mut reads = roles.into_iter();
        source
            .expect_read()
            .times(2)
            .returning(move || Ok(state(&[resource("r1", reads.next().unwrap())], &["r1"])));
        source
    }

    /// A drbdsetup read once, finding `read`, whose settings are then read once as `show` says.
    fn read_once_then_show(
        read: DrbdState,
        show: impl Fn() -> Result<Shown, DrbdError> + Send + 'static,
    ) -> MockDrbdSource {
        let mut source = MockDrbdSource::new();
        source.expect_read().times(1).returning(move || Ok(read.clone()));
        source.expect_shown().times(1).returning(show);
        source
    }

    fn described(resources: &[Resource], created: bool) -> DrbdChange {
        DrbdChange::State {
            resources: resources.to_vec(),
            created,
            at: Instant::now(),
        }
    }

    fn kept(book: &DrbdBook) -> Option<DrbdState> {
        book.fresh(Duration::from_secs(60)).map(|(state, _)| state)
    }

    /// Between reads, what events2 describes is taken without a status read, with the settings
    /// read before; once something was created or destroyed, the settings are read again.
    #[tokio::test]
    async fn between_reads_events2_is_taken_and_the_settings_read_again_only_after_a_creation() {
        let (mut book, _) = book(read_once_then_show(
            state(&[resource("r1", "Secondary")], &["r1"]),
            || Ok(shown(&["r1", "r2"])),
        ));
        book.bring_up_to_date().await;
        assert!(book.quorum_read(), "a full read carries its settings");

        book.heard(described(&[resource("r1", "Primary")], false));
        book.bring_up_to_date().await;
        assert!(!book.quorum_read(), "a described state keeps the settings read before");
        assert_eq!(kept(&book), Some(state(&[resource("r1", "Primary")], &["r1"])));

        let both = [resource("r1", "Primary"), resource("r2", "Secondary")];
        book.heard(described(&both, true));
        book.bring_up_to_date().await;
        assert!(book.quorum_read(), "a creation reads the settings again");
        assert_eq!(kept(&book), Some(state(&both, &["r1", "r2"])));
    }

    /// Only the newest description counts, and a creation in any of them is not forgotten.
    #[tokio::test]
    async fn only_the_newest_description_is_taken_and_a_creation_in_any_is_kept() {
        let (mut book, _) = book(read_once_then_show(state(&[], &[]), || Ok(shown(&["r1"]))));
        book.bring_up_to_date().await;
        book.heard(described(&[resource("r1", "Secondary")], true));
        book.heard(described(&[resource("r1", "Primary")], false));
        book.bring_up_to_date().await;
        assert_eq!(kept(&book), Some(state(&[resource("r1", "Primary")], &["r1"])));
    }

    /// What events2 described before the last read started is older than it: passed over. What it
    /// described while the read ran may be older or newer: DRBD is read again before the next round.
    #[tokio::test]
    async fn a_description_older_than_the_read_is_passed_over_and_one_during_it_reads_again() {
        let (mut book, _) = book(reads_of_r1(["Secondary", "Primary"]));
        let before = Instant::now();
        book.bring_up_to_date().await;
        book.heard(DrbdChange::State {
            resources: vec![resource("r1", "Primary")],
            created: false,
            at: before,
        });
        book.bring_up_to_date().await;
        assert_eq!(
            kept(&book),
            Some(state(&[resource("r1", "Secondary")], &["r1"])),
            "the older description passed over"
        );

        let (started, _) = book.last_read.unwrap();
        book.heard(DrbdChange::State {
            resources: vec![resource("r1", "Secondary")],
            created: false,
            at: started,
        });
        book.bring_up_to_date().await;
        assert_eq!(
            kept(&book),
            Some(state(&[resource("r1", "Primary")], &["r1"])),
            "read again, and the read taken"
        );
    }

    /// Where the periodic read and events2 disagree, the read wins, and the disagreement counts.
    #[tokio::test]
    async fn where_the_read_and_events2_disagree_the_read_wins_and_it_is_counted() {
        let (mut book, metrics) = book(reads_of_r1(["Primary", "Secondary"]));
        book.bring_up_to_date().await;
        book.heard(described(&[resource("r1", "Primary")], false));
        book.bring_up_to_date().await;
        book.heard(DrbdChange::Unknown);
        book.bring_up_to_date().await;
        assert_eq!(kept(&book), Some(state(&[resource("r1", "Secondary")], &["r1"])));
        assert_eq!(metrics.events2_mismatches.get(), 1);
    }

    /// `drbdsetup status` never prints DRBD's `may_promote`: a read that agrees with what events2
    /// described keeps events2's word, and it is no disagreement.
    #[tokio::test]
    async fn a_read_that_agrees_with_events2_keeps_drbds_word_on_promotion() {
        let (mut book, metrics) = book(reads_of_r1(["Secondary", "Secondary"]));
        book.bring_up_to_date().await;
        let word = PromotionWord {
            may_promote: false,
            promotion_score: 10101,
        };
        let said = Resource {
            drbd_says: Some(word),
            ..resource("r1", "Secondary")
        };
        book.heard(described(std::slice::from_ref(&said), false));
        book.bring_up_to_date().await;
        book.heard(DrbdChange::Unknown);
        book.bring_up_to_date().await;
        assert_eq!(kept(&book).unwrap().resources[0].drbd_says, Some(word));
        assert_eq!(metrics.events2_mismatches.get(), 0);
    }

    /// A failed read leaves nothing to act on (what was read before may be exactly what changed),
    /// and is tried again at the status interval, not at once.
    #[tokio::test]
    async fn a_failed_read_leaves_no_state_and_is_retried_at_the_interval() {
        let mut source = MockDrbdSource::new();
        let mut reads = 0;
        source.expect_read().times(2).returning(move || {
            reads += 1;
            if reads == 1 {
                Ok(state(&[resource("r1", "Primary")], &["r1"]))
            } else {
                Err(failed())
            }
        });
        let (mut book, metrics) = book(source);
        book.bring_up_to_date().await;
        book.heard(DrbdChange::Unknown);
        let attempt = Instant::now();
        book.bring_up_to_date().await;
        assert_eq!(kept(&book), None);
        assert_eq!(book.taken_at(), None);
        assert_eq!(metrics.drbd_read_errors.get(), 1);
        assert!(
            book.next_read() >= attempt + INTERVAL,
            "the next read waits the interval"
        );
        book.bring_up_to_date().await;
        assert_eq!(
            kept(&book),
            None,
            "no read before the interval, and still nothing to act on"
        );
    }

    /// A failed settings read leaves nothing to act on either: the settings decide what is safe.
    #[tokio::test]
    async fn a_failed_settings_read_leaves_no_state() {
        let (mut book, _) = book(read_once_then_show(
            state(&[resource("r1", "Primary")], &["r1"]),
            || Err(failed()),
        ));
        book.bring_up_to_date().await;
        book.heard(described(
            &[resource("r1", "Primary"), resource("r2", "Secondary")],
            true,
        ));
        book.bring_up_to_date().await;
        assert_eq!(kept(&book), None);
        assert!(!book.quorum_read());
    }

    /// Before a destructive step the settings are read again and kept with the state.
    #[tokio::test]
    async fn settings_read_again_before_a_destructive_step_are_kept_with_the_state() {
        let (mut book, _) = book(read_once_then_show(
            state(&[resource("r1", "Primary")], &["r1"]),
            || Ok(shown(&[])),
        ));
        book.bring_up_to_date().await;
        book.heard(described(&[resource("r1", "Primary")], false));
        book.bring_up_to_date().await;
        assert!(!book.quorum_read());
        assert_eq!(book.read_settings_again().await, Some(shown(&[])));
        assert!(book.quorum_read());
        assert_eq!(
            kept(&book),
            Some(state(&[resource("r1", "Primary")], &[])),
            "quorum no longer enabled"
        );
    }

    #[test]
    fn what_events2_described_while_or_before_a_read_ran_is_not_taken_as_newer() {
        let t0 = Instant::now();
        let read = Some((t0 + Duration::from_millis(100), t0 + Duration::from_millis(300)));
        let cases = [
            (0, None, AgainstRead::Newer),
            (50, read, AgainstRead::Older),
            (200, read, AgainstRead::During),
            (300, read, AgainstRead::During),
            (301, read, AgainstRead::Newer),
        ];
        for (millis, last_read, expected) in cases {
            assert_eq!(
                against_read(t0 + Duration::from_millis(millis), last_read),
                expected,
                "{millis} ms"
            );
        }
    }
}
