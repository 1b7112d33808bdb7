//! Which tracked flows a move strands, and for how long to keep looking (pure).
//!
//! A client that keeps its TCP connection, or reconnects from the same source port, keeps the
//! conntrack entry kube-proxy's DNAT made when it first connected: its packets go on to the old
//! backend however the Service's rules change. Such an entry is stranded once the volume's
//! EndpointSlice no longer names its backend, and deleting it sends the client's next packet
//! through the rules as they are. Until this node's kube-proxy has rewritten those rules, though,
//! the next packet is translated to the old backend again and a new entry made: so a volume whose
//! endpoint moved is swept again and again (a node with no client of it: at the move and once more
//! when kube-proxy can have taken it), until kube-proxy says its rules include the move (read
//! before the sweep's listing, so that listing holds every entry the old rules made), or a flow to
//! its new backend proves the rules here are new (deleting what that sweep listed then leaves
//! nothing to come back), or the window ends.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use super::flow::Flow;
use super::proxy_sync::ProxySync;

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
    seen: Moment,
    triggered: Option<SystemTime>,
    until: Instant,
    /// When it is swept next (at the first tick from then).
    next: Instant,
    /// Whether a sweep deleted a flow of this change already (its repair time is measured once).
    repaired: bool,
}

/// A point in time on both clocks: the monotonic one for windows, the wall one to compare with
/// the times other processes report.
#[derive(Clone, Copy, Debug)]
pub struct Moment {
    pub now: Instant,
    pub wall: SystemTime,
}

impl Moment {
    pub fn now() -> Self {
        Self {
            now: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// What one sweep of one address family saw and did.
#[derive(Clone, Copy, Debug)]
pub struct Sweep<'a> {
    pub ipv6: bool,
    pub listed: &'a [Flow],
    /// The volumes of the flows that went.
    pub deleted: &'a [String],
    /// kube-proxy's account of this family's rules, read before the listing.
    pub proxy: Option<ProxyWord>,
    pub at: Moment,
}

/// kube-proxy's account of one family's rules, and how to take it.
#[derive(Clone, Copy, Debug)]
pub struct ProxyWord {
    pub sync: ProxySync,
    /// How far kube-proxy's watch may be behind this one's (see [`super::proxy_sync`]).
    pub settle: Duration,
    /// How old a reading may be when a sweep takes it: one sweep period.
    pub lag: Duration,
}

/// Why a volume is swept no more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// kube-proxy's last sync includes the move.
    KubeProxy,
    /// A flow reached the new backend through this node's rules.
    Flow,
    /// The window is over.
    Window,
}

impl Ended {
    pub fn label(self) -> &'static str {
        match self {
            Ended::KubeProxy => "kube-proxy",
            Ended::Flow => "flow",
            Ended::Window => "window",
        }
    }
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
        at: Moment,
        window: Duration,
    ) {
        self.sweeping.insert(
            volume.to_owned(),
            Sweeping {
                served,
                seen: at,
                triggered,
                until: at.now + window,
                next: at.now,
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

    /// Whether a volume of this address family is due for a sweep at `now`.
    pub fn any_due(&self, ipv6: bool, now: Instant) -> bool {
        self.sweeping
            .values()
            .any(|s| s.served.mount.is_ipv6() == ipv6 && s.next <= now)
    }

    /// The ports clients of the volumes of this address family mount (2049 for this product's
    /// volumes; one per volume for LINSTOR CSI's): each is one listing of the table.
    pub fn mount_ports(&self, ipv6: bool) -> BTreeSet<u16> {
        self.sweeping
            .values()
            .filter(|s| s.served.mount.is_ipv6() == ipv6)
            .map(|s| s.served.mount.port())
            .collect()
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

    /// After `sweep`: the volumes repaired for the first time, and those swept no more, why.
    pub fn swept(&mut self, sweep: &Sweep) -> (Vec<Repaired>, Vec<(String, Ended)>) {
        let mut repaired = Vec::new();
        for (volume, sweeping) in &mut self.sweeping {
            if !sweeping.repaired && sweep.deleted.contains(volume) {
                sweeping.repaired = true;
                let after = match sweeping.triggered {
                    Some(triggered) => sweep.at.wall.duration_since(triggered).unwrap_or_default(),
                    None => sweep.at.now.saturating_duration_since(sweeping.seen.now),
                };
                repaired.push(Repaired {
                    volume: volume.clone(),
                    mount: sweeping.served.mount,
                    after,
                });
            }
        }
        let mut ended = Vec::new();
        self.sweeping.retain(|volume, sweeping| {
            let end = sweeping.ended(sweep);
            ended.extend(end.map(|why| (volume.clone(), why)));
            end.is_none()
        });
        for sweeping in self.sweeping.values_mut() {
            if sweeping.served.mount.is_ipv6() == sweep.ipv6 {
                sweeping.next = sweeping.next_sweep(sweep);
            }
        }
        (repaired, ended)
    }
}

impl Sweeping {
    /// At the next tick; but when kube-proxy is read and the listing held no flow of the volume
    /// (no client on this node), once kube-proxy has had `settle` to take the move: the one more
    /// sweep that its word makes the last. A client connecting through the old rules meanwhile
    /// waits for that sweep.
    fn next_sweep(&self, sweep: &Sweep) -> Instant {
        let client = sweep.listed.iter().any(|flow| flow.orig_dst == self.served.mount);
        match sweep.proxy {
            Some(word) if !client => (self.seen.now + word.settle + word.lag).max(sweep.at.now),
            _ => sweep.at.now,
        }
    }

    fn ended(&self, sweep: &Sweep) -> Option<Ended> {
        let ours = self.served.mount.is_ipv6() == sweep.ipv6;
        if ours
            && let Some(word) = sweep.proxy
            && word.sync.includes(self.seen.wall, word.settle)
        {
            Some(Ended::KubeProxy)
        } else if ours && sweep.listed.iter().any(|flow| self.served.reaches_a_backend(flow)) {
            Some(Ended::Flow)
        } else if sweep.at.now >= self.until {
            Some(Ended::Window)
        } else {
            None
        }
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
            reply_dst: SocketAddr::new("10.211.0.1".parse().unwrap(), sport),
            state: "ESTABLISHED",
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

    const WINDOW: Duration = Duration::from_secs(30);
    const SETTLE: Duration = Duration::from_secs(2);
    const VOLUME: &str = "apps/pvc-1";

    /// `start` moved on by `millis` on both clocks.
    fn later(start: Moment, millis: u64) -> Moment {
        let by = Duration::from_millis(millis);
        Moment {
            now: start.now + by,
            wall: start.wall + by,
        }
    }

    fn sweep<'a>(listed: &'a [Flow], deleted: &'a [String], at: Moment) -> Sweep<'a> {
        Sweep {
            ipv6: false,
            listed,
            deleted,
            proxy: None,
            at,
        }
    }

    fn moved() -> (Sweeps, Moment) {
        let (mut sweeps, start) = (Sweeps::default(), Moment::now());
        sweeps.changed(VOLUME, moved_to(NEW), None, start, WINDOW);
        (sweeps, start)
    }

    #[test]
    fn a_volume_is_swept_until_its_window_ends_while_the_old_rules_may_still_answer() {
        let (mut sweeps, start) = moved();
        let listed = [flow(790, MOUNT, OLD), flow(795, MOUNT, "10.211.3.2:2049")];
        assert_eq!(sweeps.stranded(&listed).len(), 2);

        let deleted = vec![VOLUME.to_owned(); 2];
        let (repaired, ended) = sweeps.swept(&sweep(&listed, &deleted, later(start, 400)));
        assert_eq!(repaired.len(), 1, "one repair per change");
        assert_eq!(repaired[0].after, Duration::from_millis(400));
        assert!(ended.is_empty());
        // The old rules re-created the flow: it is deleted again, and not counted as a repair again.
        let again = [flow(790, MOUNT, OLD)];
        assert_eq!(sweeps.stranded(&again).len(), 1);
        let deleted = vec![VOLUME.to_owned()];
        let (repaired, _) = sweeps.swept(&sweep(&again, &deleted, later(start, 1000)));
        assert!(repaired.is_empty());
        assert_eq!(sweeps.len(), 1, "still swept: nothing proves the rules here changed");
        let (_, ended) = sweeps.swept(&sweep(&[], &[], later(start, 30_000)));
        assert_eq!(ended, [(VOLUME.to_owned(), Ended::Window)]);
        assert!(sweeps.is_empty(), "the window is over");
    }

    #[test]
    fn a_flow_to_the_new_backend_proves_the_rules_changed_and_ends_the_sweep() {
        let (mut sweeps, start) = moved();
        let listed = [flow(790, MOUNT, OLD), flow(791, MOUNT, NEW)];
        assert_eq!(
            sweeps.stranded(&listed),
            vec![(VOLUME.to_owned(), flow(790, MOUNT, OLD))],
            "what this sweep listed is still deleted"
        );
        let deleted = [VOLUME.to_owned()];
        let (_, ended) = sweeps.swept(&sweep(&listed, &deleted, later(start, 200)));
        assert_eq!(ended, [(VOLUME.to_owned(), Ended::Flow)]);
    }

    fn proxy(start: Moment, read: u64, pending: u64) -> Option<ProxyWord> {
        let sync = ProxySync {
            queued: later(start, 50).wall,
            synced: later(start, 300).wall,
            pending,
            read: later(start, read).wall,
        };
        Some(ProxyWord {
            sync,
            settle: SETTLE,
            lag: Duration::from_millis(250),
        })
    }

    /// A node with no client of the volume never sees a flow to its new backend: kube-proxy's word
    /// that its rules include the move ends the sweep, not the window.
    #[test]
    fn kube_proxys_word_ends_the_sweep_once_its_watch_had_time_to_deliver_the_move() {
        let (mut sweeps, start) = moved();
        let (_, ended) = sweeps.swept(&Sweep {
            proxy: proxy(start, 250, 0),
            ..sweep(&[], &[], later(start, 260))
        });
        assert!(ended.is_empty(), "kube-proxy may not have received the move yet");
        let (_, ended) = sweeps.swept(&Sweep {
            proxy: proxy(start, 2250, 1),
            ..sweep(&[], &[], later(start, 2260))
        });
        assert!(ended.is_empty(), "a change waits for kube-proxy's next sync");
        let (_, ended) = sweeps.swept(&Sweep {
            proxy: proxy(start, 2500, 0),
            ipv6: true,
            ..sweep(&[], &[], later(start, 2510))
        });
        assert!(ended.is_empty(), "the other family's rules say nothing of this volume");
        let (_, ended) = sweeps.swept(&Sweep {
            proxy: proxy(start, 2500, 0),
            ..sweep(&[], &[], later(start, 2510))
        });
        assert_eq!(ended, [(VOLUME.to_owned(), Ended::KubeProxy)]);
    }

    /// Without a client of the volume on the node there is nothing to delete until kube-proxy can
    /// have taken the move: one sweep now, one then, and that one is the last.
    #[test]
    fn a_node_without_clients_sweeps_a_move_twice() {
        let (mut sweeps, start) = moved();
        assert!(sweeps.any_due(false, start.now), "the first sweep at once");
        let first = later(start, 10);
        sweeps.swept(&Sweep {
            proxy: proxy(start, 5, 0),
            ..sweep(&[], &[], first)
        });
        assert!(
            !sweeps.any_due(false, later(start, 2240).now),
            "nothing to sweep before a reading made after the settle"
        );
        let second = later(start, 2250);
        assert!(sweeps.any_due(false, second.now));
        let (_, ended) = sweeps.swept(&Sweep {
            proxy: proxy(start, 2000, 0),
            ..sweep(&[], &[], second)
        });
        assert_eq!(ended, [(VOLUME.to_owned(), Ended::KubeProxy)]);

        // With a client listed, or without kube-proxy's word, every tick sweeps.
        let (mut sweeps, start) = moved();
        let client = [flow(790, MOUNT, OLD)];
        sweeps.swept(&Sweep {
            proxy: proxy(start, 5, 0),
            ..sweep(&client, &[], later(start, 10))
        });
        assert!(sweeps.any_due(false, later(start, 10).now));
        let (mut sweeps, start) = moved();
        sweeps.swept(&sweep(&[], &[], later(start, 10)));
        assert!(sweeps.any_due(false, later(start, 10).now));
    }

    #[test]
    fn the_repair_is_timed_from_the_moves_trigger_when_the_slice_names_it() {
        let (mut sweeps, start) = (Sweeps::default(), Moment::now());
        let triggered = start.wall - Duration::from_millis(900);
        sweeps.changed(VOLUME, moved_to(NEW), Some(triggered), start, WINDOW);
        let (repaired, _) = sweeps.swept(&sweep(&[], &[VOLUME.to_owned()], start));
        assert_eq!(repaired[0].after, Duration::from_millis(900));
    }
}
