//! Moves no node's loss forces: a planned hand-over (the old server stopped, DRBD demoted, a
//! peer promoted) and a drain that asks drbd-reactor for one.

use std::future::ready;
use std::time::{Duration, Instant};

use super::super::drbd::{healthy, slice_addresses};
use super::super::eventually_every;
use super::{Stage, Timeline, until};

/// How soon after a cordon a node's agent asks drbd-reactor for the hand-over (its rounds come
/// every second here, and on every Node change).
const HAND_OVER_ASKED_WITHIN: Duration = Duration::from_secs(10);

impl Stage<'_> {
    /// A planned move from node `from` to node `to`, as a drain makes drbd-reactor do it: the
    /// promoter stops the NFS server (SIGTERM) and DRBD demotes `from`; then
    /// [`Stage::promoted_elsewhere`].
    pub(super) async fn hand_over(&mut self, from: usize, to: usize, say: &dyn Fn(String)) -> Timeline {
        self.path.stop_server(from);
        let failed = Instant::now();
        let how = format!(
            "planned move: node {}'s NFS server stopped and DRBD demoted there",
            self.path.nodes[from].name
        );
        self.promoted_elsewhere(to, failed, &how, say).await
    }

    /// Once the old primary has given the volume up (`how`, at `failed`): DRBD promotes `to`,
    /// whose promoter starts its server; the agents move the slice, kube-proxy its rule.
    pub(super) async fn promoted_elsewhere(
        &mut self,
        to: usize,
        failed: Instant,
        how: &str,
        say: &dyn Fn(String),
    ) -> Timeline {
        let (env, pv) = (self.env, self.pv.clone());
        let new_ip = self.path.nodes[to].ip.clone();
        healthy(&self.path.nodes, &[&pv], to);
        self.path.promoted(to);
        let promoted = Instant::now();
        say(format!(
            "{how}; DRBD promoted node {} and its promoter started the NFS server",
            self.path.nodes[to].name
        ));
        until("the EndpointSlice at the new primary", || async {
            slice_addresses(env, &pv).await == [new_ip.clone()]
        })
        .await;
        let rewritten = Instant::now();
        until("kube-proxy's rule to the new primary", || {
            ready(self.path.programmed(&env.ns, &pv, &new_ip))
        })
        .await;
        Timeline {
            failed,
            failed_over: failed,
            promoted,
            rewritten,
            programmed: Instant::now(),
        }
    }

    /// A drain of node `from`: it is cordoned, its agent asks drbd-reactor to hand the volume
    /// over (within [`HAND_OVER_ASKED_WITHIN`]), and what the host's path unit and
    /// `drbd-reactorctl evict --keep-masked` then do is [`Stage::hand_over`] (the target's units
    /// stopped in reverse order, the resource demoted; a peer's promoter promotes it). The request
    /// stays while the node is cordoned and goes once it is not (within the same bound).
    pub(super) async fn drain(&mut self, from: usize, to: usize, say: &dyn Fn(String)) -> Timeline {
        let env = self.env;
        let node = self.path.nodes[from].name.clone();
        let request = self.path.snippets_dir(from).join(".shared-volume-evict").join(&self.pv);
        env.cordon(&node, true).await;
        let cordoned = Instant::now();
        eventually_every(
            "the hand-over asked of drbd-reactor",
            HAND_OVER_ASKED_WITHIN,
            Duration::from_millis(20),
            || ready(request.exists().then_some(())),
        )
        .await;
        say(format!(
            "node {node} cordoned: its agent asked drbd-reactor to hand the volume over {} ms later",
            cordoned.elapsed().as_millis()
        ));
        let at = self.hand_over(from, to, say).await;
        assert!(request.exists(), "the request stays while the node is cordoned");
        env.cordon(&node, false).await;
        eventually_every(
            "the request withdrawn",
            HAND_OVER_ASKED_WITHIN,
            Duration::from_millis(20),
            || ready((!request.exists()).then_some(())),
        )
        .await;
        at
    }
}
