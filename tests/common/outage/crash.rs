//! A crashed NFS server on the drbd-reactor path: started again in place by the install guide's
//! `shared-volume-serve` while its restarts last (the primary and the endpoint stay), given up
//! past them (its unit fails, drbd-reactor stops the resource's target and demotes it, a peer
//! promotes it).

use std::future::ready;
use std::time::{Duration, Instant};

use super::super::drbd::slice_addresses;
use super::super::eventually_every;
use super::super::nfs_server::serve_limits;
use super::{Stage, Timeline};

/// How soon a crashed server answers again in place: `shared-volume-serve` waits a second, and
/// nfs-ganesha starts within about one more here.
pub const RESTARTED_WITHIN: Duration = Duration::from_secs(8);
/// How soon the server's unit ends once its last restart is spent: at once.
pub const GIVEN_UP_WITHIN: Duration = Duration::from_secs(3);
const EVERY: Duration = Duration::from_millis(20);

impl Stage<'_> {
    /// Node `from`'s nfs-ganesha crashes (SIGKILL) and `shared-volume-serve` starts it again, as
    /// often as the guide's unit allows; meanwhile the endpoint stays on `from`. The next crash
    /// ends the unit, and drbd-reactor on `from` gives the resource up only if the agent's
    /// snippet makes the target stop with a failed unit; then [`Stage::promoted_elsewhere`].
    pub(super) async fn crash(&mut self, from: usize, to: usize, say: &dyn Fn(String)) -> Timeline {
        let (restarts, window) = serve_limits();
        let node = self.path.nodes[from].name.clone();
        let here = [self.path.nodes[from].ip.clone()];
        for restart in 1..=restarts {
            let crashed = Instant::now();
            self.crash_once(from).await;
            eventually_every(
                "the crashed server started again in place",
                RESTARTED_WITHIN,
                EVERY,
                || ready(self.path.answers(from).then_some(())),
            )
            .await;
            say(format!(
                "node {node}'s NFS server crashed; shared-volume-serve started it again in place {} ms later (restart {restart} of {restarts} within {window} s)",
                crashed.elapsed().as_millis()
            ));
            assert_eq!(
                slice_addresses(self.env, &self.pv).await,
                here,
                "the endpoint stays while the server restarts in place"
            );
            assert!(self.path.server_unit_ended(from).is_none(), "the unit runs on");
        }
        let failed = Instant::now();
        self.crash_once(from).await;
        let ended = eventually_every(
            "the server's unit ended past its restarts",
            GIVEN_UP_WITHIN,
            EVERY,
            || ready(self.path.server_unit_ended(from)),
        )
        .await;
        assert!(!ended.success(), "a unit that gives up fails: {ended}");
        assert!(
            self.path.gives_up_on_a_failed_unit(from, &self.pv),
            "node {node}'s server unit failed, but its snippet does not make the target stop with it (target-as): drbd-reactor keeps the resource Primary behind a dead server"
        );
        let how = format!(
            "node {node}'s NFS server crashed again past its restarts: its unit failed ({ended}) {} ms later, the target stopped and DRBD demoted it there",
            failed.elapsed().as_millis()
        );
        self.promoted_elsewhere(to, failed, &how, say).await
    }

    /// nfs-ganesha on node `from` killed, and seen gone.
    async fn crash_once(&mut self, from: usize) {
        self.path.crash_server(from);
        eventually_every("the crashed server gone", GIVEN_UP_WITHIN, EVERY, || {
            ready((!self.path.answers(from)).then_some(()))
        })
        .await;
    }
}
