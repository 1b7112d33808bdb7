//! The DRBD state as `drbdsetup events2 --full` describes it, kept line by line: `exists` lines
//! dump the state, `exists -` ends the dump, then `create`, `change` and `destroy` lines keep it
//! current. Only the fields the decisions read are kept (role, suspension, forced IO failures,
//! each device's quorum, each connection's peer, state and role, each peer's disk states); unknown keys, objects and
//! verbs (`call helper`, `path`…) are passed over. Pure: the shell feeds it lines.

use std::collections::BTreeMap;

use super::drbd::{Connection, Device, PeerDevice, PromotionWord, Resource};

/// What one line did to the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Applied {
    /// Nothing the decisions read.
    Nothing,
    /// A field the decisions read changed.
    Changed,
    /// A resource, device or connection came or went: the quorum settings (which events2 never
    /// prints) must be read again.
    Created,
}

/// A line that is not events2: the state can no longer be trusted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not an events2 line ({why}): {line:?}")]
pub(crate) struct Garbled {
    why: &'static str,
    line: String,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Events2State {
    resources: BTreeMap<String, Kept>,
    /// The initial dump has ended (`exists -`): before that the state is incomplete.
    complete: bool,
}

#[derive(Clone, Debug, Default)]
struct Kept {
    role: String,
    /// Why IO is suspended, as events2 prints it: `no`, or reasons joined by commas (`user`,
    /// `no-data`, `fencing`, `quorum`). Empty until a line says.
    suspended: String,
    force_io_failures: bool,
    /// `may_promote` and `promotion_score`, once a line said both (drbd-utils 9.x).
    drbd_says: Option<PromotionWord>,
    /// Quorum and disk state by volume number.
    devices: BTreeMap<u32, Device>,
    /// By peer node id (a `change` line may not repeat the connection's name).
    connections: BTreeMap<u32, Connection>,
    /// The peers' disk states, by (peer node id, volume number).
    peer_disks: BTreeMap<(u32, u32), String>,
}

impl Events2State {
    /// Whether the initial dump has ended, so that the state is whole.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// The resources as `drbdsetup status --json` would list them.
    pub fn resources(&self) -> Vec<Resource> {
        self.resources
            .iter()
            .map(|(name, kept)| Resource {
                name: name.clone(),
                role: kept.role.clone(),
                force_io_failures: kept.force_io_failures,
                drbd_says: kept.drbd_says,
                devices: kept.devices.values().cloned().collect(),
                connections: kept
                    .connections
                    .iter()
                    .map(|(peer, connection)| Connection {
                        peer_devices: kept
                            .peer_disks
                            .range((*peer, 0)..=(*peer, u32::MAX))
                            .map(|(_, disk)| PeerDevice {
                                peer_disk_state: disk.clone(),
                            })
                            .collect(),
                        ..connection.clone()
                    })
                    .collect(),
                ..suspension(&kept.suspended)
            })
            .collect()
    }

    /// Applies one line (without its newline; an optional leading timestamp is passed over).
    pub fn apply(&mut self, line: &str) -> Result<Applied, Garbled> {
        let garbled = |why| Garbled {
            why,
            line: line.chars().take(200).collect(),
        };
        let mut words = line.split_whitespace().peekable();
        if words.peek().is_some_and(|w| looks_like_timestamp(w)) {
            words.next();
        }
        let (Some(verb), Some(object)) = (words.next(), words.next()) else {
            return if line.trim().is_empty() {
                Ok(Applied::Nothing)
            } else {
                Err(garbled("no verb and object"))
            };
        };
        if (verb, object) == ("exists", "-") {
            self.complete = true;
            return Ok(Applied::Nothing);
        }
        let mut fields = BTreeMap::new();
        for word in words {
            let (key, value) = word.split_once(':').ok_or_else(|| garbled("a field without a colon"))?;
            fields.insert(key, value);
        }
        let verb = match verb {
            "exists" | "create" => Verb::Exists {
                created: verb == "create",
            },
            "change" => Verb::Change,
            "destroy" => Verb::Destroy,
            "rename" if object == "resource" => {
                let name = fields.get("name").ok_or_else(|| garbled("no resource name"))?;
                let new_name = fields
                    .get("new_name")
                    .or_else(|| fields.get("new-name"))
                    .ok_or_else(|| garbled("a rename without a new name"))?;
                return self
                    .rename(name, new_name)
                    .ok_or_else(|| garbled("a rename of an unknown resource"));
            }
            // `call helper`, `response helper`, and whatever a newer drbdsetup adds.
            _ => return Ok(Applied::Nothing),
        };
        let name = *fields.get("name").ok_or_else(|| garbled("no resource name"))?;
        match object {
            "resource" => self.resource(verb, name, &fields),
            "device" => {
                let volume = number(&fields, "volume").ok_or_else(|| garbled("no volume number"))?;
                let resource = self
                    .existing(verb, name)
                    .ok_or_else(|| garbled("a device of an unknown resource"))?;
                Ok(apply_device(resource, verb, volume, &fields))
            }
            "connection" => {
                let peer = number(&fields, "peer-node-id").ok_or_else(|| garbled("no peer node id"))?;
                let resource = self
                    .existing(verb, name)
                    .ok_or_else(|| garbled("a connection of an unknown resource"))?;
                Ok(apply_connection(resource, verb, peer, &fields))
            }
            "peer-device" => {
                let peer = number(&fields, "peer-node-id").ok_or_else(|| garbled("no peer node id"))?;
                let volume = number(&fields, "volume").ok_or_else(|| garbled("no volume number"))?;
                let resource = self
                    .existing(verb, name)
                    .ok_or_else(|| garbled("a peer device of an unknown resource"))?;
                Ok(apply_peer_device(resource, verb, (peer, volume), &fields))
            }
            // Paths…: nothing the decisions read.
            _ => Ok(Applied::Nothing),
        }
    }

    fn resource(&mut self, verb: Verb, name: &str, fields: &BTreeMap<&str, &str>) -> Result<Applied, Garbled> {
        match verb {
            Verb::Destroy => Ok(match self.resources.remove(name) {
                Some(_) => Applied::Created,
                None => Applied::Nothing,
            }),
            Verb::Change if !self.resources.contains_key(name) => Err(Garbled {
                why: "a change of an unknown resource",
                line: name.to_owned(),
            }),
            _ => {
                let created = !self.resources.contains_key(name);
                let kept = self.resources.entry(name.to_owned()).or_default();
                let before = (
                    kept.role.clone(),
                    kept.suspended.clone(),
                    kept.force_io_failures,
                    kept.drbd_says,
                );
                if let Some(role) = fields.get("role") {
                    kept.role = (*role).to_owned();
                }
                if let Some(suspended) = fields.get("suspended") {
                    kept.suspended = (*suspended).to_owned();
                }
                if let Some(forcing) = fields.get("force-io-failures") {
                    kept.force_io_failures = *forcing == "yes";
                }
                kept.drbd_says = promotion_word(fields, kept.drbd_says);
                let after = (
                    kept.role.clone(),
                    kept.suspended.clone(),
                    kept.force_io_failures,
                    kept.drbd_says,
                );
                Ok(if created {
                    Applied::Created
                } else if before != after {
                    Applied::Changed
                } else {
                    Applied::Nothing
                })
            }
        }
    }

    /// The resource keeps its devices and connections under its new name; its settings are
    /// read again under that name (`Created`).
    fn rename(&mut self, name: &str, new_name: &str) -> Option<Applied> {
        let kept = self.resources.remove(name)?;
        self.resources.insert(new_name.to_owned(), kept);
        Some(Applied::Created)
    }

    /// The resource a device or connection line is about: it must be known, except that an
    /// `exists` line of the dump may come before its resource's own in no documented order.
    fn existing(&mut self, verb: Verb, name: &str) -> Option<&mut Kept> {
        if matches!(verb, Verb::Exists { .. }) {
            return Some(self.resources.entry(name.to_owned()).or_default());
        }
        self.resources.get_mut(name)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    Exists { created: bool },
    Change,
    Destroy,
}

/// DRBD's word on promotion after a resource line: `may_promote:yes|no` and
/// `promotion_score:N`, either of which a `change` line may print alone (the other is kept). A
/// drbd-utils that prints no `may_promote` gives no word.
fn promotion_word(fields: &BTreeMap<&str, &str>, before: Option<PromotionWord>) -> Option<PromotionWord> {
    let may_promote = fields.get("may_promote").map(|v| *v == "yes");
    let mut word = before.or(may_promote.map(|_| PromotionWord::default()))?;
    if let Some(may_promote) = may_promote {
        word.may_promote = may_promote;
    }
    if let Some(score) = fields.get("promotion_score").and_then(|v| v.parse().ok()) {
        word.promotion_score = score;
    }
    Some(word)
}

/// The resource's suspension fields from what events2 printed (`no`, or `user,quorum`…).
fn suspension(printed: &str) -> Resource {
    let reasons: Vec<&str> = printed.split(',').filter(|r| !r.is_empty() && *r != "no").collect();
    let has = |reason: &str| Some(reasons.contains(&reason));
    Resource {
        suspended: !reasons.is_empty(),
        suspended_user: has("user"),
        suspended_no_data: has("no-data"),
        suspended_fencing: has("fencing"),
        suspended_quorum: has("quorum"),
        ..Default::default()
    }
}

fn apply_device(resource: &mut Kept, verb: Verb, volume: u32, fields: &BTreeMap<&str, &str>) -> Applied {
    if verb == Verb::Destroy {
        return removed(resource.devices.remove(&volume).is_some());
    }
    let created = !resource.devices.contains_key(&volume);
    let device = resource.devices.entry(volume).or_default();
    let before = device.clone();
    if let Some(value) = fields.get("quorum") {
        device.quorum = *value == "yes";
    }
    if let Some(disk) = fields.get("disk") {
        device.disk_state = (*disk).to_owned();
    }
    settled(created, before != *device)
}

fn apply_connection(resource: &mut Kept, verb: Verb, peer: u32, fields: &BTreeMap<&str, &str>) -> Applied {
    if verb == Verb::Destroy {
        resource.peer_disks.retain(|(of, _), _| *of != peer);
        return removed(resource.connections.remove(&peer).is_some());
    }
    let created = !resource.connections.contains_key(&peer);
    let connection = resource.connections.entry(peer).or_default();
    let before = connection.clone();
    for (key, field) in [
        ("conn-name", &mut connection.name),
        ("connection", &mut connection.connection_state),
        ("role", &mut connection.peer_role),
    ] {
        if let Some(value) = fields.get(key) {
            *field = (*value).to_owned();
        }
    }
    settled(created, before != *connection)
}

fn apply_peer_device(resource: &mut Kept, verb: Verb, key: (u32, u32), fields: &BTreeMap<&str, &str>) -> Applied {
    if verb == Verb::Destroy {
        return removed(resource.peer_disks.remove(&key).is_some());
    }
    let created = !resource.peer_disks.contains_key(&key);
    let disk = resource.peer_disks.entry(key).or_default();
    let before = disk.clone();
    if let Some(value) = fields.get("peer-disk") {
        *disk = (*value).to_owned();
    }
    settled(created, before != *disk)
}

fn removed(was_there: bool) -> Applied {
    if was_there { Applied::Created } else { Applied::Nothing }
}

fn settled(created: bool, changed: bool) -> Applied {
    match (created, changed) {
        (true, _) => Applied::Created,
        (false, true) => Applied::Changed,
        (false, false) => Applied::Nothing,
    }
}

fn number(fields: &BTreeMap<&str, &str>, key: &str) -> Option<u32> {
    fields.get(key)?.parse().ok()
}

/// `2026-11-24T17:22:08.123456+00:00`, as `--timestamps` prints before each line.
fn looks_like_timestamp(word: &str) -> bool {
    word.len() > 10
        && word.as_bytes()[4] == b'-'
        && word.contains('T')
        && word.starts_with(|c: char| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(lines: &[&str]) -> Events2State {
        let mut state = Events2State::default();
        for line in lines {
            state.apply(line).unwrap();
        }
        state
    }

    const DUMP: [&str; 7] = [
        "exists resource name:pvc-1 role:Primary suspended:no force-io-failures:no may_promote:no promotion_score:10102",
        "exists connection name:pvc-1 peer-node-id:1 conn-name:node-b connection:Connected role:Secondary congested:no ap-in-flight:18446744073709551608",
        "exists connection name:pvc-1 peer-node-id:2 conn-name:node-c connection:Connected role:Secondary",
        "exists device name:pvc-1 volume:0 minor:1000 backing_dev:/dev/vg/pvc-1 disk:UpToDate client:no quorum:yes size:1048576",
        "exists peer-device name:pvc-1 peer-node-id:1 conn-name:node-b volume:0 replication:Established peer-disk:UpToDate peer-client:no resync-suspended:no",
        "exists peer-device name:pvc-1 peer-node-id:2 conn-name:node-c volume:0 replication:Established peer-disk:UpToDate peer-client:no resync-suspended:no",
        "exists -",
    ];

    #[test]
    fn the_dump_reads_as_status_does() {
        let state = fed(&DUMP[..6]);
        assert!(!state.complete(), "no state before `exists -`");
        let state = fed(&DUMP);
        assert!(state.complete());
        let resources = state.resources();
        assert_eq!(resources.len(), 1);
        let r = &resources[0];
        assert!(r.is_primary() && r.has_quorum() && r.quorum_without_primary_peer() && r.fully_connected());
        let peers: Vec<&str> = r.connections.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(peers, ["node-b", "node-c"]);
    }

    #[test]
    fn one_transaction_of_many_lines_and_changes_without_the_peers_name() {
        let mut state = fed(&DUMP);
        let transaction = [
            "2026-11-24T17:22:08.123456+00:00 change connection name:pvc-1 peer-node-id:1 connection:Connecting role:Unknown",
            "change peer-device name:pvc-1 peer-node-id:1 volume:0 replication:Off peer-disk:DUnknown",
            "change resource name:pvc-1 role:Primary may_promote:no",
        ];
        let applied: Vec<Applied> = transaction.iter().map(|l| state.apply(l).unwrap()).collect();
        assert_eq!(applied, [Applied::Changed, Applied::Changed, Applied::Nothing]);
        let r = &state.resources()[0];
        assert_eq!(r.connections[0].name, "node-b", "the name is kept from the dump");
        assert_eq!(r.connections[0].connection_state, "Connecting");
        assert!(!r.fully_connected());
        assert_eq!(r.connections[0].peer_devices[0].peer_disk_state, "DUnknown");
        assert!(!r.connections[0].could_take_over() && r.connections[1].could_take_over());
        state.apply("change device name:pvc-1 volume:0 quorum:no").unwrap();
        assert!(!state.resources()[0].has_quorum());
        state
            .apply("change resource name:pvc-1 suspended:quorum force-io-failures:yes")
            .unwrap();
        let r = &state.resources()[0];
        assert!(r.suspended && r.force_io_failures);
    }

    #[test]
    fn drbds_word_on_promotion_is_kept_and_changed_field_by_field() {
        let mut state = fed(&DUMP);
        let word = |state: &Events2State| state.resources()[0].drbd_says.unwrap();
        assert_eq!((word(&state).may_promote, word(&state).promotion_score), (false, 10102));
        let applied = state.apply("change resource name:pvc-1 role:Secondary may_promote:yes");
        assert_eq!(applied, Ok(Applied::Changed));
        assert_eq!((word(&state).may_promote, word(&state).promotion_score), (true, 10102));
        state.apply("change resource name:pvc-1 promotion_score:2").unwrap();
        assert_eq!((word(&state).may_promote, word(&state).promotion_score), (true, 2));
        let older = fed(&["exists resource name:pvc-1 role:Secondary suspended:no", "exists -"]);
        assert_eq!(older.resources()[0].drbd_says, None, "an older drbd-utils says nothing");
    }

    #[test]
    fn a_suspension_says_why() {
        let mut state = fed(&DUMP);
        let r = &state.resources()[0];
        assert!(!r.suspended && r.suspended_quorum == Some(false) && r.suspended_user == Some(false));
        state.apply("change resource name:pvc-1 suspended:user").unwrap();
        let r = &state.resources()[0];
        assert!(r.suspended && r.suspended_user == Some(true) && !r.suspended_for_quorum());
        assert_eq!(
            state.apply("change resource name:pvc-1 suspended:user,quorum"),
            Ok(Applied::Changed),
            "a new reason is a change"
        );
        let r = &state.resources()[0];
        assert!(r.suspended_user == Some(true) && r.suspended_for_quorum());
        assert_eq!(r.suspended_no_data, Some(false));
        state
            .apply("change resource name:pvc-1 suspended:no-data,fencing")
            .unwrap();
        let r = &state.resources()[0];
        assert!(r.suspended_no_data == Some(true) && r.suspended_fencing == Some(true) && !r.suspended_for_quorum());
    }

    #[test]
    fn a_renamed_resource_goes_on_under_its_new_name() {
        let mut state = fed(&DUMP);
        assert_eq!(
            state.apply("rename resource name:pvc-1 new_name:pvc-9"),
            Ok(Applied::Created),
            "its settings are read again under the new name"
        );
        assert_eq!(
            state.apply("change resource name:pvc-9 role:Secondary"),
            Ok(Applied::Changed)
        );
        let names: Vec<String> = state.resources().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["pvc-9"]);
        assert_eq!(state.resources()[0].connections.len(), 2, "kept whole");
        assert!(
            state.apply("change resource name:pvc-1 role:Primary").is_err(),
            "the old name is gone"
        );
        assert!(
            state.apply("rename resource name:pvc-9").is_err(),
            "a rename without a new name"
        );
    }

    #[test]
    fn resources_and_connections_come_and_go() {
        let mut state = fed(&DUMP);
        assert_eq!(
            state.apply("create resource name:pvc-2 role:Secondary suspended:no"),
            Ok(Applied::Created)
        );
        assert_eq!(
            state.apply("create device name:pvc-2 volume:0 minor:1001 quorum:yes"),
            Ok(Applied::Created)
        );
        assert_eq!(
            state.apply("destroy connection name:pvc-1 peer-node-id:2 conn-name:node-c"),
            Ok(Applied::Created)
        );
        assert_eq!(state.resources()[0].connections.len(), 1);
        assert_eq!(state.apply("destroy resource name:pvc-1"), Ok(Applied::Created));
        let names: Vec<String> = state.resources().into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["pvc-2"]);
    }

    #[test]
    fn unknown_keys_objects_and_verbs_are_passed_over() {
        let mut state = fed(&DUMP);
        let lines = [
            "change resource name:pvc-1 a-field-from-drbd-10:yes",
            "exists path name:pvc-1 peer-node-id:1 conn-name:node-b local:ipv4:10.0.0.1:7000 peer:ipv4:10.0.0.2:7000 established:yes",
            "call helper name:pvc-1 peer-node-id:1 conn-name:node-b volume:0 helper:before-resync-target",
            "response helper name:pvc-1 helper:before-resync-target status:0",
            "",
        ];
        for line in lines {
            assert_eq!(state.apply(line), Ok(Applied::Nothing), "{line}");
        }
        assert!(state.resources()[0].is_primary());
    }

    #[test]
    fn a_line_that_is_not_events2_is_garbled() {
        let mut state = fed(&DUMP);
        let garbage = [
            "\u{fffd}\u{fffd} not UTF-8 \u{fffd}",
            "change resource",
            "change resource name:pvc-9 role:Primary",
            "change device name:pvc-1 quorum:no",
            "change connection name:pvc-1 connection:Connected",
        ];
        for line in garbage {
            assert!(state.apply(line).is_err(), "{line}");
        }
    }

    #[test]
    fn a_restarted_stream_starts_from_nothing() {
        let old = fed(&DUMP);
        assert!(old.complete());
        let mut state = Events2State::default();
        assert!(!state.complete() && state.resources().is_empty());
        for line in DUMP {
            state.apply(line).unwrap();
        }
        assert_eq!(state.resources().len(), 1);
    }
}
