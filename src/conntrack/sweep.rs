//! Which tracked flows a move strands, and for how long to keep looking (pure).
//!
//! A client that keeps its TCP connection, or reconnects from the same source port, keeps the
//! conntrack entry kube-proxy's DNAT made when it first connected: its packets go on to the old
//! backend however the Service's rules change. Such an entry is stranded once the volume's
//! EndpointSlice no longer names its backend, and deleting it sends the client's next packet
//! through the rules as they are. Until this node's kube-proxy has rewritten those rules, though,
//! the next packet is translated to the old backend again and a new entry made: so a volume whose
//! endpoint moved is swept again and again, until a flow to its new backend proves the rules here
//! are new (deleting what that sweep listed then leaves nothing to come back), or the window ends.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use super::table::Flow;

/// What a volume's EndpointSlice says: what clients mount and where the NFS server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    /// `<ClusterIP>:2049`: the original destination of every client flow of the volume.
    pub mount: SocketAddr,
    /// The ready backends the slice names now.
    pub backends: Vec<SocketAddr>,
}

impl Served {
    /// Whether `flow` is the volume's and bound to a backend the slice no longer names.
    pub fn strands(&self, flow: &Flow) -> bool {
        flow.orig_dst == self.mount && flow.is_translated() && !self.backends.contains(&flow.reply_src)
    }

    /// Whether `flow` is the volume's and bound to a backend the slice names: only rules written
    /// after the change can have made it.
    fn reaches_a_backend(&self, flow: &Flow) -> bool {
        flow.orig_dst == self.mount && self.backends.contains(&flow.reply_src)
    }
}

/// One volume being swept after its endpoints changed.
#[derive(Clone, Debug)]
struct Sweeping {
    served: Served,
    /// When this node saw the change, and when the change was triggered if the slice says so
    /// (`endpoints.kubernetes.io/last-change-trigger-time`).
    seen: Instant,
    triggered: Option<SystemTime>,
    until: Instant,
    /// Whether a sweep deleted a flow of this change already (its repair time is measured once).
    repaired: bool,
}

/// A volume's sweep that deleted flows for the first time since its change.
#[derive(Clone, Debug, PartialEq)]
pub struct Repaired {
    pub volume: String,
    pub mount: SocketAddr,
    /// From the change (its trigger time when known, else when this node saw it) to this sweep.
    pub after: Duration,
}

/// The volumes being swept, by `namespace/name` of their EndpointSlice.
#[derive(Debug, Default)]
pub struct Sweeps {
    sweeping: BTreeMap<String, Sweeping>,
}

impl Sweeps {
    /// `volume`'s endpoints changed to `served`: sweep it for `window` from `now`.
    pub fn changed(
        &mut self,
        volume: &str,
        served: Served,
        triggered: Option<SystemTime>,
        now: Instant,
        window: Duration,
    ) {
        self.sweeping.insert(
            volume.to_owned(),
            Sweeping {
                served,
                seen: now,
                triggered,
                until: now + window,
                repaired: false,
            },
        );
    }

    /// The slice is gone: nothing of it is swept any more.
    pub fn forget(&mut self, volume: &str) {
        self.sweeping.remove(volume);
    }

    pub fn len(&self) -> usize {
        self.sweeping.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sweeping.is_empty()
    }

    /// Whether any volume of this address family is being swept.
    pub fn any_of_family(&self, ipv6: bool) -> bool {
        self.sweeping.values().any(|s| s.served.mount.is_ipv6() == ipv6)
    }

    /// The flows of `listed` that a volume being swept strands, each with that volume.
    pub fn stranded(&self, listed: &[Flow]) -> Vec<(String, Flow)> {
        listed
            .iter()
            .filter_map(|flow| {
                let (volume, _) = self.sweeping.iter().find(|(_, s)| s.served.strands(flow))?;
                Some((volume.clone(), flow.clone()))
            })
            .collect()
    }

    /// After a sweep over `listed` deleted `deleted` (volume names of the flows that went): the
    /// volumes repaired for the first time, and the end of every volume whose window is over or
    /// whose new backend `listed` shows reached through this node's rules.
    pub fn swept(&mut self, listed: &[Flow], deleted: &[String], now: Instant, wall: SystemTime) -> Vec<Repaired> {
        let mut repaired = Vec::new();
        for (volume, sweeping) in &mut self.sweeping {
            if !sweeping.repaired && deleted.contains(volume) {
                sweeping.repaired = true;
                let after = match sweeping.triggered {
                    Some(triggered) => wall.duration_since(triggered).unwrap_or_default(),
                    None => now.saturating_duration_since(sweeping.seen),
                };
                repaired.push(Repaired {
                    volume: volume.clone(),
                    mount: sweeping.served.mount,
                    after,
                });
            }
        }
        self.sweeping.retain(|_, sweeping| {
            let rules_are_new = listed.iter().any(|flow| sweeping.served.reaches_a_backend(flow));
            now < sweeping.until && !rules_are_new
        });
        repaired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNT: &str = "10.96.0.10:2049";
    const OLD: &str = "10.211.1.2:2049";
    const NEW: &str = "10.211.2.2:2049";

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    fn flow(sport: u16, dst: &str, backend: &str) -> Flow {
        Flow {
            orig_src: SocketAddr::new("10.211.0.1".parse().unwrap(), sport),
            orig_dst: at(dst),
            reply_src: at(backend),
            state: "ESTABLISHED".into(),
        }
    }

    fn moved_to(backend: &str) -> Served {
        Served {
            mount: at(MOUNT),
            backends: vec![at(backend)],
        }
    }

    #[test]
    fn only_the_volumes_flows_to_a_backend_it_left_are_stranded() {
        let served = moved_to(NEW);
        assert!(served.strands(&flow(790, MOUNT, OLD)));
        assert!(!served.strands(&flow(791, MOUNT, NEW)), "already at the new backend");
        assert!(
            !served.strands(&flow(792, "10.96.0.11:2049", OLD)),
            "another Service's flow to the same node is not this volume's"
        );
        assert!(
            !served.strands(&flow(793, OLD, OLD)),
            "a client of the node's own address, not translated"
        );
        assert!(
            !served.strands(&flow(794, MOUNT, MOUNT)),
            "never translated: nothing to re-route"
        );
    }

    #[test]
    fn a_volume_is_swept_until_its_window_ends_while_the_old_rules_may_still_answer() {
        let (mut sweeps, start, wall) = (Sweeps::default(), Instant::now(), SystemTime::now());
        sweeps.changed("apps/pvc-1", moved_to(NEW), None, start, Duration::from_secs(30));
        let listed = [flow(790, MOUNT, OLD), flow(795, MOUNT, "10.211.3.2:2049")];
        assert_eq!(sweeps.stranded(&listed).len(), 2);

        let deleted = vec!["apps/pvc-1".to_owned(); 2];
        let repaired = sweeps.swept(&listed, &deleted, start + Duration::from_millis(400), wall);
        assert_eq!(repaired.len(), 1, "one repair per change");
        assert_eq!(repaired[0].after, Duration::from_millis(400));
        // The old rules re-created the flow: it is deleted again, and not counted as a repair again.
        let again = [flow(790, MOUNT, OLD)];
        assert_eq!(sweeps.stranded(&again).len(), 1);
        let deleted = vec!["apps/pvc-1".to_owned()];
        assert!(
            sweeps
                .swept(&again, &deleted, start + Duration::from_secs(1), wall)
                .is_empty()
        );
        assert_eq!(sweeps.len(), 1, "still swept: nothing proves the rules here changed");
        sweeps.swept(&[], &[], start + Duration::from_secs(30), wall);
        assert!(sweeps.is_empty(), "the window is over");
    }

    #[test]
    fn a_flow_to_the_new_backend_proves_the_rules_changed_and_ends_the_sweep() {
        let (mut sweeps, start, wall) = (Sweeps::default(), Instant::now(), SystemTime::now());
        sweeps.changed("apps/pvc-1", moved_to(NEW), None, start, Duration::from_secs(30));
        let listed = [flow(790, MOUNT, OLD), flow(791, MOUNT, NEW)];
        assert_eq!(
            sweeps.stranded(&listed),
            vec![("apps/pvc-1".to_owned(), flow(790, MOUNT, OLD))],
            "what this sweep listed is still deleted"
        );
        sweeps.swept(
            &listed,
            &["apps/pvc-1".to_owned()],
            start + Duration::from_millis(200),
            wall,
        );
        assert!(sweeps.is_empty());
    }

    #[test]
    fn the_repair_is_timed_from_the_moves_trigger_when_the_slice_names_it() {
        let (mut sweeps, start, wall) = (Sweeps::default(), Instant::now(), SystemTime::now());
        let triggered = wall - Duration::from_millis(900);
        sweeps.changed(
            "apps/pvc-1",
            moved_to(NEW),
            Some(triggered),
            start,
            Duration::from_secs(30),
        );
        let repaired = sweeps.swept(&[], &["apps/pvc-1".to_owned()], start, wall);
        assert_eq!(repaired[0].after, Duration::from_millis(900));
    }
}
