//! DRBD state as `drbdsetup status --json` and `drbdsetup show --json` print it, parsed into only
//! the fields the agent uses. Unknown fields are ignored and counters are never parsed, so values
//! such as `"ap-in-flight": 18446744073709551608` cannot break it.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde::Deserialize;

/// One reading of the local DRBD state.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DrbdState {
    pub resources: Vec<Resource>,
    /// Resources with quorum enabled (`majority`, `all` or a number); only these take part in
    /// fail-over and taints.
    pub quorum_enabled: HashSet<String>,
    /// How long DRBD may take to notice that the link to a peer dropped silently, by (resource,
    /// peer), from the connection's net options; connections not listed have DRBD's defaults.
    pub detection_windows: BTreeMap<(String, String), Duration>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Resource {
    pub name: String,
    #[serde(default)]
    pub role: String,
    /// IO is suspended, for any reason.
    #[serde(default)]
    pub suspended: bool,
    /// Why, as drbd-utils states it (`None`: an older drbd-utils that does not say).
    /// `user`: suspended on request, as LINSTOR does on every replica while it takes a snapshot.
    #[serde(rename = "suspended-user", default)]
    pub suspended_user: Option<bool>,
    #[serde(rename = "suspended-no-data", default)]
    pub suspended_no_data: Option<bool>,
    #[serde(rename = "suspended-fencing", default)]
    pub suspended_fencing: Option<bool>,
    #[serde(rename = "suspended-quorum", default)]
    pub suspended_quorum: Option<bool>,
    #[serde(rename = "force-io-failures", default)]
    pub force_io_failures: bool,
    #[serde(default)]
    pub devices: Vec<Device>,
    #[serde(default)]
    pub connections: Vec<Connection>,
    /// DRBD's own word on whether this node may be promoted (`may_promote`), and its ranking of
    /// this node among the candidates (`promotion_score`): printed by `drbdsetup events2` from
    /// drbd-utils 9.x on, never by `status --json` (`None`: not said).
    #[serde(skip)]
    pub drbd_says: Option<PromotionWord>,
}

/// What DRBD itself says about promoting a resource here, as events2 prints it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PromotionWord {
    pub may_promote: bool,
    pub promotion_score: i64,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Device {
    #[serde(default)]
    pub quorum: bool,
    /// The local replica's disk: `UpToDate`, `Diskless` (a tie-breaker)…
    #[serde(rename = "disk-state", default)]
    pub disk_state: String,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct Connection {
    /// The peer's LINSTOR node name.
    pub name: String,
    #[serde(rename = "connection-state", default)]
    pub connection_state: String,
    #[serde(rename = "peer-role", default)]
    pub peer_role: String,
    /// The peer's replicas of the resource's volumes.
    #[serde(default)]
    pub peer_devices: Vec<PeerDevice>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct PeerDevice {
    #[serde(rename = "peer-disk-state", default)]
    pub peer_disk_state: String,
}

pub const PRIMARY: &str = "Primary";
pub const CONNECTED: &str = "Connected";
pub const UP_TO_DATE: &str = "UpToDate";
pub const DISKLESS: &str = "Diskless";

/// Whether this node's DRBD could take a resource's data over from a peer it lost: the evidence
/// every destructive step of a fail-over needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeOver {
    /// This node is the Primary, with quorum and every disk UpToDate: it holds the data.
    Holds,
    /// DRBD would promote this node: every disk UpToDate and DRBD's own `may_promote` (events2),
    /// or, where DRBD does not say, its equivalent (quorum, no Primary peer, nothing suspended).
    MayPromote(Option<PromotionWord>),
}

/// Why this node's DRBD could not take a resource's data over.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CannotTakeOver {
    /// A diskless replica (a tie-breaker, a client) holds no data of its own.
    #[error("this node's replica is diskless")]
    Diskless,
    /// Outdated, Inconsistent…: DRBD refuses to promote a disk without all the data.
    #[error("this node's disk is {0}, not UpToDate: DRBD would refuse to promote it")]
    Disk(String),
    #[error("this node's DRBD has no quorum")]
    NoQuorum,
    #[error("a peer is Primary")]
    PrimaryPeer,
    #[error("this node's IO is suspended or forced to fail")]
    Suspended,
    /// DRBD itself says no (a Primary it can reach through another peer, among other reasons).
    #[error("DRBD says may_promote:no (promotion_score {0})")]
    DrbdSaysNo(i64),
}

impl std::fmt::Display for TakeOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Holds => write!(f, "this node is Primary with quorum and its disk UpToDate"),
            Self::MayPromote(Some(word)) => write!(
                f,
                "this node's disk is UpToDate and DRBD says may_promote:yes (promotion_score {})",
                word.promotion_score
            ),
            Self::MayPromote(None) => write!(
                f,
                "this node's disk is UpToDate, it has quorum and no peer is Primary (DRBD's may_promote, as drbdsetup status shows it)"
            ),
        }
    }
}

impl Resource {
    pub fn is_primary(&self) -> bool {
        self.role == PRIMARY
    }

    /// Every local device has quorum; a resource with no devices has none.
    pub fn has_quorum(&self) -> bool {
        !self.devices.is_empty() && self.devices.iter().all(|d| d.quorum)
    }

    /// IO is suspended because quorum was lost. An older drbd-utils that gives no reason at all
    /// leaves any suspension possibly a quorum one.
    pub fn suspended_for_quorum(&self) -> bool {
        let reasons = [
            self.suspended_user,
            self.suspended_no_data,
            self.suspended_fencing,
            self.suspended_quorum,
        ];
        match self.suspended_quorum {
            Some(quorum) => quorum,
            None => self.suspended && reasons.iter().all(Option::is_none),
        }
    }

    /// IO is suspended for a reason that only a demotion ends: quorum lost (and not back), or no
    /// up-to-date data accessible (`on-no-data-accessible suspend-io`). A snapshot's (`user`) or
    /// a fence handler's suspension ends by itself.
    pub fn suspended_for_good(&self) -> bool {
        let no_data = self.suspended && self.suspended_no_data == Some(true);
        no_data || self.suspended_for_quorum() && !self.has_quorum()
    }

    /// Every peer connection is `Connected`.
    pub fn fully_connected(&self) -> bool {
        self.connections.iter().all(Connection::is_connected)
    }

    /// Every local device has quorum and no connected peer is Primary: nobody else serves the
    /// resource as far as this node sees. Not DRBD's verdict on the data: see [`Self::take_over`].
    pub fn quorum_without_primary_peer(&self) -> bool {
        self.has_quorum() && !self.primary_peer()
    }

    fn primary_peer(&self) -> bool {
        self.connections.iter().any(|c| c.peer_role == PRIMARY)
    }

    /// Whether this node's DRBD could take the resource's data over: every local disk UpToDate,
    /// and DRBD's own `may_promote` where events2 said it. Without DRBD's word, its equivalent:
    /// quorum, no Primary peer, IO neither suspended nor forced to fail. A Primary holds the data
    /// when it has quorum (DRBD never says may_promote of a Primary).
    pub fn take_over(&self) -> Result<TakeOver, CannotTakeOver> {
        if self.devices.iter().any(|d| d.disk_state == DISKLESS) {
            return Err(CannotTakeOver::Diskless);
        }
        if let Some(d) = self.devices.iter().find(|d| d.disk_state != UP_TO_DATE) {
            return Err(CannotTakeOver::Disk(match d.disk_state.as_str() {
                "" => "not stated".into(),
                state => state.into(),
            }));
        }
        if !self.has_quorum() {
            return Err(CannotTakeOver::NoQuorum);
        }
        if self.suspended || self.force_io_failures {
            return Err(CannotTakeOver::Suspended);
        }
        if self.is_primary() {
            return Ok(TakeOver::Holds);
        }
        if self.primary_peer() {
            return Err(CannotTakeOver::PrimaryPeer);
        }
        match self.drbd_says {
            Some(word) if !word.may_promote => Err(CannotTakeOver::DrbdSaysNo(word.promotion_score)),
            word => Ok(TakeOver::MayPromote(word)),
        }
    }
}

impl Connection {
    pub fn is_connected(&self) -> bool {
        self.connection_state == CONNECTED
    }

    /// Connected, with an UpToDate replica of every volume: the peer could take the primary role
    /// over with all the data.
    pub fn could_take_over(&self) -> bool {
        self.is_connected()
            && !self.peer_devices.is_empty()
            && self.peer_devices.iter().all(|d| d.peer_disk_state == UP_TO_DATE)
    }
}

#[derive(Debug, Deserialize)]
struct ShownResource {
    resource: String,
    #[serde(default)]
    options: ShownOptions,
    #[serde(default)]
    connections: Vec<ShownConnection>,
}

#[derive(Debug, Default, Deserialize)]
struct ShownOptions {
    #[serde(default)]
    quorum: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ShownConnection {
    #[serde(default)]
    net: BTreeMap<String, serde_json::Value>,
}

/// What `drbdsetup show --json` says that the decisions use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Shown {
    pub quorum_enabled: HashSet<String>,
    pub detection_windows: BTreeMap<(String, String), Duration>,
}

/// The net options that bound how long DRBD takes to notice a silent link drop, in DRBD's units.
/// `drbdsetup show` prints only the options set away from their defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NetOptions {
    /// `ping-int`, seconds (default 10): an idle link is pinged this often.
    pub ping_int_s: u64,
    /// `ping-timeout`, tenths of a second (default 5): a ping unanswered this long drops the link.
    pub ping_timeout_ds: u64,
    /// `timeout`, tenths of a second (default 60): a packet unanswered this long drops the link
    /// while writes are in flight.
    pub timeout_ds: u64,
    /// `ko-count` (default 7): a peer that keeps answering but leaves one write unfinished for
    /// `ko-count` × `timeout` is expelled. It bounds a slow peer, not a silent link.
    pub ko_count: u64,
}

impl Default for NetOptions {
    fn default() -> Self {
        Self {
            ping_int_s: 10,
            ping_timeout_ds: 5,
            timeout_ds: 60,
            ko_count: 7,
        }
    }
}

impl NetOptions {
    /// The defaults, overridden by what `net` sets (values as strings or numbers).
    fn from_shown(net: &BTreeMap<String, serde_json::Value>) -> Self {
        let read = |key: &str, default: u64| {
            net.get(key)
                .and_then(|v| v.as_u64().or_else(|| v.as_str()?.trim().parse().ok()))
                .unwrap_or(default)
        };
        let defaults = Self::default();
        Self {
            ping_int_s: read("ping-int", defaults.ping_int_s),
            ping_timeout_ds: read("ping-timeout", defaults.ping_timeout_ds),
            timeout_ds: read("timeout", defaults.timeout_ds),
            ko_count: read("ko-count", defaults.ko_count),
        }
    }

    /// The longest DRBD may take to notice a silent drop of this link: an idle link at the next
    /// ping plus its timeout, a busy one at `timeout`; each end on its own clock.
    pub fn detection_window(&self) -> Duration {
        let idle = Duration::from_secs(self.ping_int_s) + Duration::from_millis(self.ping_timeout_ds * 100);
        let busy = Duration::from_millis(self.timeout_ds * 100);
        idle.max(busy)
    }
}

impl DrbdState {
    pub fn new(resources: Vec<Resource>, shown: Shown) -> Self {
        Self {
            resources,
            quorum_enabled: shown.quorum_enabled,
            detection_windows: shown.detection_windows,
        }
    }

    /// The settings `drbdsetup show` gave this state.
    pub fn shown(&self) -> Shown {
        Shown {
            quorum_enabled: self.quorum_enabled.clone(),
            detection_windows: self.detection_windows.clone(),
        }
    }

    /// How long DRBD may take to notice a silent drop of `resource`'s link to `peer`.
    pub fn detection_window(&self, resource: &str, peer: &str) -> Duration {
        self.detection_windows
            .get(&(resource.to_owned(), peer.to_owned()))
            .copied()
            .unwrap_or_else(|| NetOptions::default().detection_window())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot parse `drbdsetup {command} --json`: {source}")]
pub struct ParseError {
    command: &'static str,
    source: serde_json::Error,
}

pub fn parse_status(json: &str) -> Result<Vec<Resource>, ParseError> {
    if json.trim().is_empty() {
        return Ok(Vec::new());
    }
    serde_json::from_str(json).map_err(|source| ParseError {
        command: "status",
        source,
    })
}

/// Names of the resources with quorum enabled: `majority`, `all` or a number of votes (`off`,
/// or no setting, leaves it disabled).
pub fn parse_quorum_enabled(json: &str) -> Result<HashSet<String>, ParseError> {
    Ok(parse_shown(json)?.quorum_enabled)
}

/// The quorum settings and each connection's detection window (its `net` options, `_name` the
/// peer).
pub fn parse_shown(json: &str) -> Result<Shown, ParseError> {
    if json.trim().is_empty() {
        return Ok(Shown::default());
    }
    let shown: Vec<ShownResource> = serde_json::from_str(json).map_err(|source| ParseError {
        command: "show",
        source,
    })?;
    let mut parsed = Shown::default();
    for resource in shown {
        for connection in &resource.connections {
            let Some(peer) = connection.net.get("_name").and_then(|n| n.as_str()) else {
                continue;
            };
            let window = NetOptions::from_shown(&connection.net).detection_window();
            parsed
                .detection_windows
                .insert((resource.resource.clone(), peer.to_owned()), window);
        }
        if resource.options.quorum.as_deref().is_some_and(enables_quorum) {
            parsed.quorum_enabled.insert(resource.resource);
        }
    }
    Ok(parsed)
}

fn enables_quorum(setting: &str) -> bool {
    matches!(setting, "majority" | "all") || setting.parse::<u32>().is_ok_and(|votes| votes > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = r#"[
      {"name": "pvc-1", "node-id": 0, "role": "Primary", "suspended": false, "force-io-failures": false,
       "write-ordering": "flush",
       "devices": [{"volume": 0, "minor": 1000, "disk-state": "UpToDate", "client": false, "quorum": true,
                    "size": 1048576, "read": 1, "written": 2, "al-writes": 3, "bm-writes": 4,
                    "upper-pending": 0, "lower-pending": 0}],
       "connections": [
         {"peer-node-id": 1, "name": "node-b", "connection-state": "Connected", "congested": false,
          "peer-role": "Secondary", "ap-in-flight": 18446744073709551608, "rs-in-flight": 0,
          "peer_devices": [{"volume": 0, "replication-state": "Established", "peer-disk-state": "UpToDate",
                            "resync-suspended": "no", "received": 0, "sent": 0, "out-of-sync": 0,
                            "pending": 0, "unacked": 0, "has-sync-details": false, "has-online-verify-details": false,
                            "percent-in-sync": 100.00}]},
         {"peer-node-id": 2, "name": "node-c", "connection-state": "Connecting", "congested": false,
          "peer-role": "Unknown", "ap-in-flight": 0, "rs-in-flight": 0, "peer_devices": []}
       ]},
      {"name": "pvc-2", "role": "Secondary", "suspended": true, "force-io-failures": true,
       "devices": [{"volume": 0, "quorum": false}],
       "connections": [{"name": "node-b", "connection-state": "Connected", "peer-role": "Primary"}]}
    ]"#;

    #[test]
    fn parses_status_ignoring_counters() {
        let resources = parse_status(STATUS).unwrap();
        assert_eq!(resources.len(), 2);
        let first = &resources[0];
        assert!(first.is_primary() && first.has_quorum() && first.quorum_without_primary_peer());
        let connected: Vec<(&str, bool)> = first
            .connections
            .iter()
            .map(|c| (c.name.as_str(), c.is_connected()))
            .collect();
        assert_eq!(connected, [("node-b", true), ("node-c", false)]);
        let second = &resources[1];
        assert!(second.suspended && second.force_io_failures);
        assert!(!second.has_quorum() && !second.quorum_without_primary_peer());
    }

    #[test]
    fn a_primary_peer_forbids_promotion_even_with_quorum() {
        let mut resource = parse_status(STATUS).unwrap().remove(1);
        resource.devices[0].quorum = true;
        resource.devices[0].disk_state = UP_TO_DATE.into();
        resource.suspended = false;
        resource.force_io_failures = false;
        assert!(!resource.quorum_without_primary_peer());
        assert_eq!(resource.take_over(), Err(CannotTakeOver::PrimaryPeer));
    }

    #[test]
    fn a_resource_without_devices_has_no_quorum() {
        let resource = Resource {
            name: "diskless".into(),
            ..Default::default()
        };
        assert!(!resource.has_quorum() && !resource.quorum_without_primary_peer());
    }

    #[test]
    fn no_drbd_means_no_resources() {
        assert_eq!(parse_status("").unwrap(), Vec::new());
        assert_eq!(parse_status("[]").unwrap(), Vec::new());
        assert!(parse_quorum_enabled("\n").unwrap().is_empty());
    }

    #[test]
    fn garbage_is_an_error_that_names_the_command() {
        let err = parse_status("{not json").unwrap_err();
        assert!(err.to_string().contains("drbdsetup status --json"), "{err}");
    }

    #[test]
    fn majority_all_and_numbers_enable_quorum() {
        let shown = r#"[
          {"resource": "pvc-1", "options": {"quorum": "majority", "on-no-quorum": "io-error"}, "connections": []},
          {"resource": "pvc-2", "options": {"quorum": "off"}},
          {"resource": "pvc-3", "options": {"quorum": "2"}},
          {"resource": "pvc-4"},
          {"resource": "pvc-5", "options": {"quorum": "all"}},
          {"resource": "pvc-6", "options": {"quorum": "0"}}
        ]"#;
        let enabled = parse_quorum_enabled(shown).unwrap();
        let expected = ["pvc-1", "pvc-3", "pvc-5"].map(String::from);
        assert_eq!(enabled, HashSet::from(expected));
    }

    /// A Secondary with quorum and one UpToDate disk, its only peer Secondary.
    fn secondary(disk: &str) -> Resource {
        Resource {
            name: "pvc-1".into(),
            role: "Secondary".into(),
            devices: vec![Device {
                quorum: true,
                disk_state: disk.into(),
            }],
            connections: vec![Connection {
                name: "node-c".into(),
                connection_state: CONNECTED.into(),
                peer_role: "Secondary".into(),
                peer_devices: vec![],
            }],
            ..Default::default()
        }
    }

    #[test]
    fn only_an_up_to_date_disk_that_drbd_would_promote_could_take_the_data_over() {
        let said = |may_promote| {
            let mut r = secondary(UP_TO_DATE);
            r.drbd_says = Some(PromotionWord {
                may_promote,
                promotion_score: 10102,
            });
            r
        };
        let without_quorum = {
            let mut r = secondary(UP_TO_DATE);
            r.devices[0].quorum = false;
            r
        };
        let primary = Resource {
            role: PRIMARY.into(),
            ..secondary(UP_TO_DATE)
        };
        let outdated_primary = Resource {
            role: PRIMARY.into(),
            ..secondary("Outdated")
        };
        let suspended = Resource {
            suspended: true,
            suspended_user: Some(true),
            ..secondary(UP_TO_DATE)
        };
        let mut primary_peer = secondary(UP_TO_DATE);
        primary_peer.connections[0].peer_role = PRIMARY.into();
        let word = PromotionWord {
            may_promote: true,
            promotion_score: 10102,
        };
        let cases: [(&str, Resource, Result<TakeOver, CannotTakeOver>); 11] = [
            (
                "no word from DRBD",
                secondary(UP_TO_DATE),
                Ok(TakeOver::MayPromote(None)),
            ),
            ("DRBD says yes", said(true), Ok(TakeOver::MayPromote(Some(word)))),
            ("DRBD says no", said(false), Err(CannotTakeOver::DrbdSaysNo(10102))),
            (
                "outdated",
                secondary("Outdated"),
                Err(CannotTakeOver::Disk("Outdated".into())),
            ),
            (
                "inconsistent",
                secondary("Inconsistent"),
                Err(CannotTakeOver::Disk("Inconsistent".into())),
            ),
            (
                "no disk state",
                secondary(""),
                Err(CannotTakeOver::Disk("not stated".into())),
            ),
            ("diskless", secondary(DISKLESS), Err(CannotTakeOver::Diskless)),
            ("no quorum", without_quorum, Err(CannotTakeOver::NoQuorum)),
            ("primary", primary, Ok(TakeOver::Holds)),
            (
                "outdated primary",
                outdated_primary,
                Err(CannotTakeOver::Disk("Outdated".into())),
            ),
            ("suspended", suspended, Err(CannotTakeOver::Suspended)),
        ];
        for (case, resource, expected) in cases {
            assert_eq!(resource.take_over(), expected, "{case}");
        }
        assert_eq!(primary_peer.take_over(), Err(CannotTakeOver::PrimaryPeer));
        let mut yes_but_outdated = said(true);
        yes_but_outdated.devices[0].disk_state = "Outdated".into();
        assert!(
            yes_but_outdated.take_over().is_err(),
            "this node's own disk counts even where DRBD would promote it (a diskless client may promote)"
        );
    }
}
