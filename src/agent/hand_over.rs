//! The agent's requests that drbd-reactor hand a resource over from this node while it drains:
//! one file per resource in [`REQUESTS`] inside the snippets directory, there while the request
//! holds. drbd-reactor has no API of its own for this; its supported way is
//! `drbd-reactorctl evict`, which masks the resource's `drbd-services@` target, stops it (the NFS
//! server, the filesystem, then the demotion) and waits for a peer to take over. The install
//! guide's path unit on the host runs it for each new request (`--keep-masked`: the node does not
//! take the resource back while it drains) and `drbd-reactorctl evict --unmask` for each request
//! gone. The agent itself stays unprivileged: it writes files, as it does for the snippets.
//!
//! Which requests there should be is decided by the evacuation rule
//! (`decide::promoter_hand_overs`); here the directory is made to say so.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The folder of requests, inside the snippets directory (the one folder the agent is given on
/// the host); drbd-reactor reads only `*.toml` files there, and its reload path unit does not
/// watch what changes inside a folder.
pub const REQUESTS: &str = ".shared-volume-evict";

/// The requests folder on this node.
pub struct HandOverRequests {
    dir: PathBuf,
}

/// From the requests present to those wanted: (to make, to remove).
fn plan(wanted: &BTreeSet<String>, present: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let make = wanted.difference(present).cloned().collect();
    let remove = present.difference(wanted).cloned().collect();
    (make, remove)
}

impl HandOverRequests {
    pub fn new(snippets_dir: &Path) -> Self {
        Self {
            dir: snippets_dir.join(REQUESTS),
        }
    }

    /// Makes the folder hold a request for each resource of `wanted` and no other; returns how
    /// many it holds after.
    pub async fn sync(&self, wanted: &BTreeSet<String>) -> std::io::Result<usize> {
        let present = self.read_present().await?;
        let (make, remove) = plan(wanted, &present);
        for resource in &make {
            let text = "The shared-volume agent asks drbd-reactor to hand this resource over: its node is draining.\n";
            tokio::fs::write(self.dir.join(resource), text).await?;
            tracing::info!(%resource, dir = %self.dir.display(), "asked drbd-reactor to hand the resource over to a peer with all of its data: this node is draining (drbd-reactorctl evict --keep-masked, run by the host's path unit)");
        }
        for resource in &remove {
            tokio::fs::remove_file(self.dir.join(resource)).await?;
            tracing::info!(%resource, dir = %self.dir.display(), "withdrew the hand-over request: this node no longer drains, or no peer serves the resource (drbd-reactorctl evict --unmask, run by the host's path unit)");
        }
        Ok(present.len() + make.len() - remove.len())
    }

    /// The resources asked for, by file name; the folder made if it is not there.
    async fn read_present(&self) -> std::io::Result<BTreeSet<String>> {
        tokio::fs::create_dir_all(&self.dir).await?;
        let mut present = BTreeSet::new();
        let mut entries = tokio::fs::read_dir(&self.dir).await?;
        while let Some(entry) = entries.next_entry().await? {
            if let Some(name) = entry.file_name().to_str().filter(|n| !n.starts_with('.')) {
                present.insert(name.to_owned());
            }
        }
        Ok(present)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn requests_are_made_and_withdrawn_to_match_the_wanted_ones() {
        let (make, remove) = plan(&set(&["a", "b"]), &set(&["b", "c"]));
        assert_eq!((make, remove), (vec!["a".to_owned()], vec!["c".to_owned()]));
        let (make, remove) = plan(&set(&["a"]), &set(&["a"]));
        assert!(make.is_empty() && remove.is_empty(), "nothing to change");
    }

    #[tokio::test]
    async fn the_folder_holds_one_file_per_request() {
        let dir = std::env::temp_dir().join(format!("svc-hand-over-{}", std::process::id()));
        let requests = HandOverRequests::new(&dir);
        assert_eq!(requests.sync(&set(&["pvc-1", "pvc-2"])).await.unwrap(), 2);
        assert!(dir.join(REQUESTS).join("pvc-1").exists());
        assert_eq!(requests.sync(&set(&["pvc-2"])).await.unwrap(), 1);
        assert!(!dir.join(REQUESTS).join("pvc-1").exists(), "withdrawn");
        assert_eq!(requests.sync(&set(&[])).await.unwrap(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
