//! drbd-reactor promoter snippets for the shared volumes replicated on this node: one file per
//! volume in drbd-reactor's snippets directory, so that nothing is written by hand per volume on
//! the nodes. drbd-reactor (with its `drbd-reactor-reload.path` unit) picks up a new or removed
//! file, promotes the resource where it can and starts the units that serve it.
//!
//! Which files there should be is decided here (pure); [`PromoterSnippets::sync`] makes the
//! directory say so, touching only the files it names itself.
//!
//! The reload path unit drops what changes while its reload runs (`PathChanged=` is
//! edge-triggered, and a change while the triggered unit is active starts nothing: systemd#5770),
//! so the tail of a burst of snippets could stay unread. Once a burst has settled, the agent changes
//! the directory once more ([`RELOAD_NUDGE`], which drbd-reactor does not read), and that reload
//! reads them all.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::drbd::{DrbdState, PRIMARY};
use super::view::VolumeView;

/// Snippets this agent writes are named `<PREFIX><resource>.toml`; no other file is touched.
const PREFIX: &str = "shared-volume-";
const SUFFIX: &str = ".toml";
/// The placeholders in `--promoter-start` units: the DRBD resource, its NFS server's port.
const RESOURCE_PLACEHOLDER: &str = "{resource}";
const PORT_PLACEHOLDER: &str = "{port}";

/// What a snippet asks of drbd-reactor for one resource.
#[derive(Clone, Debug)]
pub struct PromoterSettings {
    pub dir: PathBuf,
    /// Systemd units started in order after the promotion, `{resource}` and `{port}` replaced.
    pub start: Vec<String>,
    /// The port of a volume that names none of its own (`--nfs-port`).
    pub nfs_port: u16,
    /// drbd-reactor's `dependencies-as`: how each unit depends on the one before.
    pub dependencies_as: String,
    /// drbd-reactor's `target-as`: how the resource's target depends on each unit.
    pub target_as: String,
    /// drbd-reactor's `on-drbd-demote-failure`: what systemd does when a demotion fails.
    pub demote_failure: String,
    /// drbd-reactor's `adjust-resource-on-start`.
    pub adjust_on_start: bool,
}

/// The snippet for `resource`: promote it here when possible, then start the units in order,
/// each bound to the one before as the settings say; what a failed demotion does, and whether
/// drbd-reactor adjusts the resource when it starts, as the settings say.
pub fn snippet(resource: &str, port: u16, pv: &str, settings: &PromoterSettings) -> String {
    let units: Vec<String> = settings
        .start
        .iter()
        .map(|unit| {
            let unit = unit
                .replace(RESOURCE_PLACEHOLDER, resource)
                .replace(PORT_PLACEHOLDER, &port.to_string());
            toml_string(&unit)
        })
        .collect();
    format!(
        "# Written by the shared-volume agent for PV {pv}; removed when the volume leaves this node.\n\
         [[promoter]]\n\
         [promoter.resources.{}]\n\
         start = [{}]\n\
         dependencies-as = {}\n\
         target-as = {}\n\
         on-drbd-demote-failure = {}\n\
         adjust-resource-on-start = {}\n",
        toml_string(resource),
        units.join(", "),
        toml_string(&settings.dependencies_as),
        toml_string(&settings.target_as),
        toml_string(&settings.demote_failure),
        settings.adjust_on_start,
    )
}

/// The snippets this node should hold, by resource: one for each local resource with a disk that
/// backs a shared claim (a diskless tie-breaker never serves the data).
pub fn wanted(
    volumes: &HashMap<String, VolumeView>,
    drbd: &DrbdState,
    settings: &PromoterSettings,
) -> BTreeMap<String, String> {
    drbd.resources
        .iter()
        .filter(|r| !r.devices.iter().any(|d| d.disk_state == DISKLESS))
        .filter_map(|r| {
            let volume = volumes.get(&r.name)?;
            volume.shared_claim.as_ref()?;
            let port = volume.nfs_port.unwrap_or(settings.nfs_port);
            Some((r.name.clone(), snippet(&r.name, port, &volume.pv, settings)))
        })
        .collect()
}

const DISKLESS: &str = "Diskless";

/// One change to the snippets directory.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Write {
        resource: String,
        contents: String,
    },
    Remove {
        resource: String,
    },
    /// Not wanted any more, but the resource is Primary here: without its snippet drbd-reactor
    /// would leave the NFS server of a volume in use running unmanaged (`stop-services-on-exit`
    /// is off by default), never stopped or demoted on a quorum loss. Removed once it is not
    /// Primary.
    KeepWhilePrimary {
        resource: String,
    },
}

/// From what the directory holds to what it should hold.
pub fn plan(wanted: &BTreeMap<String, String>, present: &BTreeMap<String, String>, drbd: &DrbdState) -> Vec<Change> {
    let primaries: BTreeSet<&str> = drbd
        .resources
        .iter()
        .filter(|r| r.role == PRIMARY)
        .map(|r| r.name.as_str())
        .collect();
    let writes = wanted
        .iter()
        .filter(|(resource, contents)| present.get(*resource) != Some(contents))
        .map(|(resource, contents)| Change::Write {
            resource: resource.clone(),
            contents: contents.clone(),
        });
    let removals = present.keys().filter(|r| !wanted.contains_key(*r)).map(|resource| {
        let resource = resource.clone();
        if primaries.contains(resource.as_str()) {
            Change::KeepWhilePrimary { resource }
        } else {
            Change::Remove { resource }
        }
    });
    writes.chain(removals).collect()
}

/// The resource a file of ours is for, from its name.
fn resource_of(file_name: &str) -> Option<&str> {
    file_name
        .strip_prefix(PREFIX)?
        .strip_suffix(SUFFIX)
        .filter(|r| !r.is_empty())
}

/// A file renamed into the directory once a burst of changes has settled, only to start one more
/// reload; drbd-reactor reads `*.toml` files alone.
const RELOAD_NUDGE: &str = ".shared-volume-reload";
/// How long after the last change the nudge comes: longer than the reload service is active (a
/// oneshot `systemctl reload drbd-reactor`, which sends a SIGHUP: well under a second).
const RELOAD_SETTLE: Duration = Duration::from_secs(2);

/// Where snippets are written whole before they are renamed into the directory: a folder inside
/// it (the same filesystem), which drbd-reactor's reload path unit does not watch, so that each
/// snippet is one change to the directory.
const STAGING: &str = ".shared-volume-staging";

/// Where the file `name` is written before it is renamed into `dir`.
fn staged(dir: &std::path::Path, name: &str) -> PathBuf {
    dir.join(STAGING).join(name)
}

fn file_name(resource: &str) -> String {
    format!("{PREFIX}{resource}{SUFFIX}")
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c if c.is_control() => quoted.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// The snippets directory on this node.
pub struct PromoterSnippets {
    settings: PromoterSettings,
    /// Resources kept while Primary, already said: said again only once they change.
    kept: BTreeSet<String>,
    /// When the directory is changed once more for a reload that reads the last changes.
    nudge_at: Option<Instant>,
}

impl PromoterSnippets {
    pub fn new(settings: PromoterSettings) -> Self {
        Self {
            settings,
            kept: BTreeSet::new(),
            nudge_at: None,
        }
    }

    /// When the next round should come for the reload nudge, if one is due.
    pub fn nudge_at(&self) -> Option<Instant> {
        self.nudge_at
    }

    /// Makes the directory hold the wanted snippets; returns how many of ours it holds after.
    pub async fn sync(
        &mut self,
        volumes: &HashMap<String, VolumeView>,
        drbd: &DrbdState,
        now: Instant,
    ) -> std::io::Result<usize> {
        let wanted = wanted(volumes, drbd, &self.settings);
        let present = self.read_present().await?;
        let mut held = present.len();
        let mut kept = BTreeSet::new();
        let changes = plan(&wanted, &present, drbd);
        let changes_files = changes.iter().any(|c| !matches!(c, Change::KeepWhilePrimary { .. }));
        if changes_files {
            tokio::fs::create_dir_all(self.settings.dir.join(STAGING)).await?;
            self.nudge_at = Some(now + RELOAD_SETTLE);
        } else if self.nudge_at.is_some_and(|at| at <= now) {
            self.nudge_reload().await?;
            self.nudge_at = None;
        }
        for change in changes {
            match change {
                Change::Write { resource, contents } => {
                    let path = self.rename_in(&file_name(&resource), &contents).await?;
                    held += usize::from(!present.contains_key(&resource));
                    tracing::info!(%resource, path = %path.display(), "wrote the drbd-reactor promoter snippet");
                }
                Change::Remove { resource } => {
                    let path = self.settings.dir.join(file_name(&resource));
                    tokio::fs::remove_file(&path).await?;
                    held -= 1;
                    tracing::info!(%resource, path = %path.display(), "removed the drbd-reactor promoter snippet: the volume is no longer a shared volume on this node");
                }
                Change::KeepWhilePrimary { resource } => {
                    if !self.kept.contains(&resource) {
                        tracing::warn!(%resource, "kept the drbd-reactor promoter snippet of a volume no longer shared here: the resource is Primary on this node, and without the snippet drbd-reactor would leave its NFS server running unmanaged; it goes once the resource is Secondary");
                    }
                    kept.insert(resource);
                }
            }
        }
        self.kept = kept;
        Ok(held)
    }

    /// Writes `contents` whole in the staging folder and renames it into the directory as `name`,
    /// so that drbd-reactor never reads half a file and each file is one change. Returns its path.
    async fn rename_in(&self, name: &str, contents: &str) -> std::io::Result<PathBuf> {
        let partial = staged(&self.settings.dir, name);
        let path = self.settings.dir.join(name);
        tokio::fs::write(&partial, contents).await?;
        tokio::fs::rename(&partial, &path).await?;
        Ok(path)
    }

    /// One more change to the directory, renamed in whole like a snippet: the reload it starts
    /// reads every snippet written before.
    async fn nudge_reload(&self) -> std::io::Result<()> {
        tokio::fs::create_dir_all(self.settings.dir.join(STAGING)).await?;
        let text =
            "Renamed in by the shared-volume agent to have drbd-reactor reload once a burst of snippets settled.\n";
        self.rename_in(RELOAD_NUDGE, text).await?;
        tracing::debug!("changed the snippets directory once more, so that drbd-reactor reloads after the last change");
        Ok(())
    }

    /// Our snippets in the directory, by resource.
    async fn read_present(&self) -> std::io::Result<BTreeMap<String, String>> {
        let mut present = BTreeMap::new();
        let mut entries = tokio::fs::read_dir(&self.settings.dir).await?;
        while let Some(entry) = entries.next_entry().await? {
            let name = entry.file_name();
            let Some(resource) = name.to_str().and_then(resource_of) else {
                continue;
            };
            let contents = tokio::fs::read_to_string(entry.path()).await.unwrap_or_default();
            present.insert(resource.to_owned(), contents);
        }
        Ok(present)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::drbd::{Device, Resource};
    use crate::volume::ClaimKey;

    fn settings() -> PromoterSettings {
        PromoterSettings {
            dir: PathBuf::new(),
            start: vec!["fs@{resource}.service".into(), "nfs@{resource}:{port}.service".into()],
            nfs_port: 2049,
            dependencies_as: "BindsTo".into(),
            target_as: "BindsTo".into(),
            demote_failure: "reboot-immediate".into(),
            adjust_on_start: false,
        }
    }

    fn resource(name: &str, role: &str, disk: &str) -> Resource {
        Resource {
            name: name.into(),
            role: role.into(),
            devices: vec![Device {
                disk_state: disk.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn volume(pv: &str, shared: bool) -> VolumeView {
        VolumeView {
            pv: pv.into(),
            shared_claim: shared.then(|| ClaimKey {
                namespace: "apps".into(),
                name: "data".into(),
            }),
            ..Default::default()
        }
    }

    fn state(resources: Vec<Resource>) -> DrbdState {
        DrbdState {
            resources,
            ..Default::default()
        }
    }

    #[test]
    fn a_snippet_is_a_promoter_of_the_resource_starting_the_units_in_order() {
        let text = snippet("pvc-1", 20491, "pvc-1", &settings());
        let parsed: toml::Value = toml::from_str(&text).expect("valid TOML");
        let resource = &parsed["promoter"][0]["resources"]["pvc-1"];
        let start: Vec<&str> = resource["start"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u.as_str().unwrap())
            .collect();
        assert_eq!(start, ["fs@pvc-1.service", "nfs@pvc-1:20491.service"]);
        assert_eq!(resource["on-drbd-demote-failure"].as_str(), Some("reboot-immediate"));
    }

    /// drbd-reactor's promoter options as its example configuration names them
    /// (`example/drbd-reactor.toml`, v1.11): a unit that dies stops the units after it
    /// (`dependencies-as`) and the resource's target (`target-as`), which stops every unit of the
    /// target and demotes the resource (`BindsTo` for both, as LINSTOR CSI and linstor-gateway
    /// set them for NFS), and drbd-reactor leaves `drbdadm adjust` to LINSTOR, whose satellite
    /// keeps the resource files the host does not have.
    #[test]
    fn a_snippet_binds_its_units_and_leaves_the_adjust_to_linstor() {
        let text = snippet("pvc-1", 20491, "pvc-1", &settings());
        let parsed: toml::Value = toml::from_str(&text).expect("valid TOML");
        let resource = &parsed["promoter"][0]["resources"]["pvc-1"];
        assert_eq!(resource["dependencies-as"].as_str(), Some("BindsTo"));
        assert_eq!(resource["target-as"].as_str(), Some("BindsTo"));
        assert_eq!(resource["adjust-resource-on-start"].as_bool(), Some(false));
    }

    /// A snippet is written in a folder of its own inside the snippets directory, which
    /// drbd-reactor's reload path unit does not watch, and renamed in whole: one change per snippet.
    #[test]
    fn a_snippet_is_staged_outside_the_watched_directory() {
        let dir = PathBuf::from("/etc/drbd-reactor.d");
        let staged = staged(&dir, &file_name("pvc-1"));
        assert_ne!(staged.parent(), Some(dir.as_path()));
        assert!(staged.starts_with(&dir), "on the same filesystem, for the rename");
    }

    #[test]
    fn only_shared_volumes_with_a_disk_here_get_a_snippet() {
        let volumes = HashMap::from([
            ("shared".to_owned(), volume("shared", true)),
            ("block".to_owned(), volume("block", false)),
            ("tie".to_owned(), volume("tie", true)),
        ]);
        let drbd = state(vec![
            resource("shared", "Secondary", "UpToDate"),
            resource("block", "Primary", "UpToDate"),
            resource("tie", "Secondary", "Diskless"),
            resource("no-pv", "Secondary", "UpToDate"),
        ]);
        let wanted = wanted(&volumes, &drbd, &settings());
        assert_eq!(wanted.keys().collect::<Vec<_>>(), ["shared"]);
        assert!(
            wanted["shared"].contains("nfs@shared:2049.service"),
            "the agent's port when the PV names none"
        );
    }

    #[test]
    fn a_snippet_no_longer_wanted_is_kept_while_the_resource_is_primary_here() {
        let wanted = BTreeMap::from([("a".to_owned(), "new".to_owned()), ("b".to_owned(), "same".to_owned())]);
        let present = BTreeMap::from([
            ("a".to_owned(), "old".to_owned()),
            ("b".to_owned(), "same".to_owned()),
            ("gone".to_owned(), "x".to_owned()),
            ("serving".to_owned(), "x".to_owned()),
        ]);
        let drbd = state(vec![resource("serving", PRIMARY, "UpToDate")]);
        assert_eq!(
            plan(&wanted, &present, &drbd),
            [
                Change::Write {
                    resource: "a".into(),
                    contents: "new".into()
                },
                Change::Remove {
                    resource: "gone".into()
                },
                Change::KeepWhilePrimary {
                    resource: "serving".into()
                },
            ]
        );
    }

    #[test]
    fn only_files_named_as_ours_are_ours() {
        assert_eq!(resource_of("shared-volume-pvc-1.toml"), Some("pvc-1"));
        assert_eq!(resource_of("linstor-gateway.toml"), None);
        assert_eq!(resource_of("shared-volume-.toml"), None);
        assert_eq!(resource_of(".shared-volume-pvc-1.toml.partial"), None);
    }

    #[test]
    fn names_are_quoted_as_toml_strings() {
        assert_eq!(toml_string(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    /// systemd's path unit as drbd-reactor's `drbd-reactor-reload.path` runs it: a change to the
    /// directory starts `drbd-reactor-reload.service`, a oneshot `systemctl reload` after which
    /// drbd-reactor reads every `*.toml` there; a change while that service is active starts
    /// nothing, neither then nor once it ends (`PathChanged=` is edge-triggered: systemd#5770,
    /// systemd#37667). Changes are told apart by the files' names and inodes.
    struct ReloadPathUnit {
        dir: PathBuf,
        listing: BTreeMap<String, u64>,
        active_until: Option<Instant>,
        /// The snippets drbd-reactor read at its last reload.
        loaded: BTreeSet<String>,
        reloads: usize,
    }

    /// How long the reload service is active: `systemctl reload`, generously.
    const RELOAD_RUNS: std::time::Duration = std::time::Duration::from_secs(1);

    impl ReloadPathUnit {
        fn new(dir: &std::path::Path) -> Self {
            let mut unit = Self {
                dir: dir.to_owned(),
                listing: BTreeMap::new(),
                active_until: None,
                loaded: BTreeSet::new(),
                reloads: 0,
            };
            unit.listing = unit.list();
            unit
        }

        fn list(&self) -> BTreeMap<String, u64> {
            use std::os::unix::fs::MetadataExt;
            std::fs::read_dir(&self.dir)
                .unwrap()
                .map(|e| e.unwrap())
                .filter(|e| e.file_type().unwrap().is_file())
                .map(|e| (e.file_name().into_string().unwrap(), e.metadata().unwrap().ino()))
                .collect()
        }

        /// What inotify tells systemd by `now`.
        fn look(&mut self, now: Instant) {
            let listing = self.list();
            if listing == self.listing {
                return;
            }
            self.listing = listing;
            if self.active_until.is_some_and(|until| now < until) {
                return;
            }
            self.active_until = Some(now + RELOAD_RUNS);
            self.reloads += 1;
            self.loaded = self.listing.keys().filter(|n| n.ends_with(".toml")).cloned().collect();
        }
    }

    /// A directory of this test process, removed when dropped.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("svc-promoter-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn shared(names: &[&str]) -> (HashMap<String, VolumeView>, DrbdState) {
        let volumes = names.iter().map(|n| (n.to_string(), volume(n, true))).collect();
        let drbd = state(names.iter().map(|n| resource(n, "Secondary", "UpToDate")).collect());
        (volumes, drbd)
    }

    /// A burst of snippets whose tail arrives while the reload its head started is running: a
    /// reload after the burst's end reads every one of them, within the settle time.
    #[tokio::test]
    async fn every_snippet_of_a_burst_reaches_drbd_reactor() {
        let dir = TempDir::new("burst");
        let mut promoter = PromoterSnippets::new(PromoterSettings {
            dir: dir.0.clone(),
            ..settings()
        });
        let mut unit = ReloadPathUnit::new(&dir.0);
        let t0 = Instant::now();
        let (volumes, drbd) = shared(&["pvc-1"]);
        promoter.sync(&volumes, &drbd, t0).await.unwrap();
        unit.look(t0);
        assert_eq!(unit.loaded, BTreeSet::from(["shared-volume-pvc-1.toml".to_owned()]));

        let burst_end = t0 + std::time::Duration::from_millis(500);
        let (volumes, drbd) = shared(&["pvc-1", "pvc-2"]);
        promoter.sync(&volumes, &drbd, burst_end).await.unwrap();
        unit.look(burst_end);
        assert_eq!(unit.loaded.len(), 1, "the reload path unit was still active");

        // Rounds every 100 ms, as the agent's wake brings them around the nudge.
        let mut now = burst_end;
        while unit.loaded.len() < 2 && now < burst_end + std::time::Duration::from_secs(10) {
            now += std::time::Duration::from_millis(100);
            promoter.sync(&volumes, &drbd, now).await.unwrap();
            unit.look(now);
        }
        assert_eq!(
            unit.loaded,
            BTreeSet::from([
                "shared-volume-pvc-1.toml".to_owned(),
                "shared-volume-pvc-2.toml".to_owned()
            ]),
            "drbd-reactor never read the burst's tail"
        );
        let read_after = now - burst_end;
        assert!(
            read_after <= RELOAD_SETTLE + std::time::Duration::from_millis(100),
            "read {read_after:?} after the burst"
        );
        let reloads = unit.reloads;
        for _ in 0..50 {
            now += std::time::Duration::from_millis(100);
            promoter.sync(&volumes, &drbd, now).await.unwrap();
            unit.look(now);
        }
        assert_eq!(unit.reloads, reloads, "no reload without a change");
    }
}
