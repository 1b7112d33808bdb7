//! drbd-reactor promoter snippets for the shared volumes replicated on this node: one file per
//! volume in drbd-reactor's snippets directory, so that nothing is written by hand per volume on
//! the nodes. drbd-reactor (with its `drbd-reactor-reload.path` unit) picks up a new or removed
//! file, promotes the resource where it can and starts the units that serve it.
//!
//! Which files there should be is decided here (pure); [`PromoterSnippets::sync`] makes the
//! directory say so, touching only the files it names itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

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
         on-drbd-demote-failure = {}\n\
         adjust-resource-on-start = {}\n",
        toml_string(resource),
        units.join(", "),
        toml_string(&settings.dependencies_as),
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

/// Where snippets are written whole before they are renamed into the directory: a folder inside
/// it (the same filesystem), which drbd-reactor's reload path unit does not watch, so that each
/// snippet is one change to the directory.
const STAGING: &str = ".shared-volume-staging";

/// Where `resource`'s snippet is written before it is renamed into `dir`.
fn staged(dir: &std::path::Path, resource: &str) -> PathBuf {
    dir.join(STAGING).join(file_name(resource))
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
}

impl PromoterSnippets {
    pub fn new(settings: PromoterSettings) -> Self {
        Self {
            settings,
            kept: BTreeSet::new(),
        }
    }

    /// Makes the directory hold the wanted snippets; returns how many of ours it holds after.
    pub async fn sync(&mut self, volumes: &HashMap<String, VolumeView>, drbd: &DrbdState) -> std::io::Result<usize> {
        let wanted = wanted(volumes, drbd, &self.settings);
        let present = self.read_present().await?;
        let mut held = present.len();
        let mut kept = BTreeSet::new();
        let changes = plan(&wanted, &present, drbd);
        if changes.iter().any(|c| matches!(c, Change::Write { .. })) {
            tokio::fs::create_dir_all(self.settings.dir.join(STAGING)).await?;
        }
        for change in changes {
            match change {
                Change::Write { resource, contents } => {
                    let path = self.settings.dir.join(file_name(&resource));
                    // Written whole elsewhere and renamed in, so that drbd-reactor never reads
                    // half a file.
                    let partial = staged(&self.settings.dir, &resource);
                    tokio::fs::write(&partial, &contents).await?;
                    tokio::fs::rename(&partial, &path).await?;
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
    /// (`example/drbd-reactor.toml`, v1.11): a unit that dies stops the chain and so demotes the
    /// resource (`dependencies-as`, `BindsTo` as LINSTOR CSI sets it), and drbd-reactor leaves
    /// `drbdadm adjust` to LINSTOR, whose satellite keeps the resource files the host does not have.
    #[test]
    fn a_snippet_binds_its_units_and_leaves_the_adjust_to_linstor() {
        let text = snippet("pvc-1", 20491, "pvc-1", &settings());
        let parsed: toml::Value = toml::from_str(&text).expect("valid TOML");
        let resource = &parsed["promoter"][0]["resources"]["pvc-1"];
        assert_eq!(resource["dependencies-as"].as_str(), Some("BindsTo"));
        assert_eq!(resource["adjust-resource-on-start"].as_bool(), Some(false));
    }

    /// A snippet is written in a folder of its own inside the snippets directory, which
    /// drbd-reactor's reload path unit does not watch, and renamed in whole: one change per snippet.
    #[test]
    fn a_snippet_is_staged_outside_the_watched_directory() {
        let dir = PathBuf::from("/etc/drbd-reactor.d");
        let staged = staged(&dir, "pvc-1");
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
}
