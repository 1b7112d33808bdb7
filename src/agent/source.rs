//! Where DRBD state comes from: the `drbdsetup` binary, behind [`DrbdSource`] so the agent's
//! logic can be tested with mocks.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::BoxStream;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::drbd::{self, DrbdState};
use crate::deadline::within;
use crate::producer;

#[derive(Debug, thiserror::Error)]
pub enum DrbdError {
    #[error("cannot run {command}: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error(transparent)]
    Parse(#[from] drbd::ParseError),
}

#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait DrbdSource: Send + Sync {
    /// Reads the state of every local resource.
    async fn read(&self) -> Result<DrbdState, DrbdError>;
    /// `drbdsetup secondary --force <resource>`.
    async fn force_secondary(&self, resource: &str) -> Result<(), DrbdError>;
    /// Fires whenever DRBD reports a change (the `events2` stream), so state is read at once.
    fn changes(&self) -> BoxStream<'static, ()>;
}

pub struct DrbdSetup {
    pub binary: PathBuf,
    /// DRBD's proc file: when it is missing the module is not loaded and there are no resources.
    pub proc_path: PathBuf,
    pub timeout: Duration,
}

impl DrbdSetup {
    async fn run(&self, args: &[&str]) -> Result<String, DrbdError> {
        let command = format!("{} {}", self.binary.display(), args.join(" "));
        let output = within(
            self.timeout,
            Command::new(&self.binary).args(args).kill_on_drop(true).output(),
        )
        .await
        .map_err(|timed_out| DrbdError::Failed {
            command: command.clone(),
            status: timed_out.to_string(),
            stderr: String::new(),
        })?
        .map_err(|source| DrbdError::Spawn {
            command: command.clone(),
            source,
        })?;
        if !output.status.success() {
            return Err(DrbdError::Failed {
                command,
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

#[async_trait]
impl DrbdSource for DrbdSetup {
    async fn read(&self) -> Result<DrbdState, DrbdError> {
        if !self.proc_path.exists() {
            return Ok(DrbdState::default());
        }
        // Both at once: a fail-over waits for this read.
        let (status, shown) =
            futures::future::try_join(self.run(&["status", "--json"]), self.run(&["show", "--json"])).await?;
        let resources = drbd::parse_status(&status)?;
        let quorum_enabled = drbd::parse_quorum_enabled(&shown)?;
        Ok(DrbdState {
            resources,
            quorum_enabled,
        })
    }

    async fn force_secondary(&self, resource: &str) -> Result<(), DrbdError> {
        self.run(&["secondary", "--force", resource]).await.map(|_| ())
    }

    fn changes(&self) -> BoxStream<'static, ()> {
        let binary = self.binary.clone();
        producer::spawn(16, |sender| async move {
            let mut backoff = Duration::from_millis(500);
            loop {
                let spawned = Command::new(&binary)
                    .args(["events2", "all"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .kill_on_drop(true)
                    .spawn();
                match spawned {
                    Ok(mut child) => {
                        let stdout = child.stdout.take().expect("piped stdout");
                        let forwarded = forward_changes(stdout, &sender).await;
                        // We stopped reading: kill before waiting, so a child that still writes
                        // (or hangs) cannot block us on a full pipe.
                        let _ = child.kill().await;
                        match forwarded {
                            None => return,
                            Some(true) => backoff = Duration::from_millis(500),
                            Some(false) => {}
                        }
                        tracing::info!("drbdsetup events2 ended; restarting in {backoff:?}");
                    }
                    Err(err) => tracing::warn!(error = %err, "cannot run drbdsetup events2; retrying in {backoff:?}"),
                }
                if !producer::pause(&sender, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        })
    }
}

/// Signals a change for every chunk of `events2` output that ends a line, until the output ends
/// or fails: `Some(whether any line came)`, or `None` once the consumer is gone. Lines are never
/// kept: their content does not matter (a change means "read again"), so neither their length
/// nor their encoding does.
async fn forward_changes(
    stdout: impl tokio::io::AsyncRead + Unpin,
    sender: &tokio::sync::mpsc::Sender<()>,
) -> Option<bool> {
    let mut reader = BufReader::new(stdout);
    let mut any_line = false;
    loop {
        let chunk = match reader.fill_buf().await {
            Ok([]) | Err(_) => return Some(any_line),
            Ok(chunk) => chunk,
        };
        let (len, ends_a_line) = (chunk.len(), chunk.contains(&b'\n'));
        reader.consume(len);
        if sender.is_closed() {
            return None;
        }
        if ends_a_line {
            any_line = true;
            // A full channel already holds a pending re-read: dropping is fine.
            let _ = sender.try_send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A `drbdsetup` stand-in that prints canned JSON and records its arguments.
    fn fake_drbdsetup(dir: &std::path::Path) -> PathBuf {
        let script = dir.join("drbdsetup");
        let body = r#"#!/bin/sh
echo "$@" >> "$(dirname "$0")/calls"
case "$1" in
  status) echo '[{"name":"pvc-1","role":"Primary","devices":[{"volume":0,"quorum":true}],"connections":[]}]' ;;
  show) echo '[{"resource":"pvc-1","options":{"quorum":"majority"}}]' ;;
  secondary) exit 0 ;;
  *) echo "unknown command $1" >&2; exit 20 ;;
esac
"#;
        std::fs::write(&script, body).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script
    }

    fn source(dir: &std::path::Path, proc_path: PathBuf) -> DrbdSetup {
        DrbdSetup {
            binary: fake_drbdsetup(dir),
            proc_path,
            timeout: Duration::from_secs(5),
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("svc-drbd-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn reads_state_and_runs_commands_through_drbdsetup() {
        let dir = temp_dir("read");
        let proc_path = dir.join("proc-drbd");
        std::fs::write(&proc_path, "version: 9.2.0\n").unwrap();
        let source = source(&dir, proc_path);
        let state = source.read().await.unwrap();
        assert_eq!(state.resources[0].name, "pvc-1");
        assert!(state.quorum_enabled.contains("pvc-1"));
        source.force_secondary("pvc-1").await.unwrap();
        let calls = std::fs::read_to_string(dir.join("calls")).unwrap();
        let mut calls: Vec<&str> = calls.lines().collect();
        calls[..2].sort();
        assert_eq!(calls, ["show --json", "status --json", "secondary --force pvc-1"]);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn without_the_drbd_module_there_are_no_resources() {
        let dir = temp_dir("noproc");
        let source = source(&dir, dir.join("missing"));
        assert_eq!(source.read().await.unwrap(), DrbdState::default());
        assert!(!dir.join("calls").exists(), "drbdsetup must not run");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn failures_name_the_command_and_its_error() {
        let dir = temp_dir("fail");
        let source = source(&dir, dir.clone());
        let err = source.run(&["bogus"]).await.unwrap_err().to_string();
        assert!(err.contains("bogus") && err.contains("unknown command"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn events2_output_of_any_length_or_encoding_is_a_change() {
        let mut output = b"\xff\xfe not UTF-8\n".to_vec();
        output.extend(std::iter::repeat_n(b'x', 1 << 20));
        output.extend(b"\nchange resource name:pvc-1\n");
        let (sender, mut receiver) = tokio::sync::mpsc::channel(16);
        assert_eq!(forward_changes(output.as_slice(), &sender).await, Some(true));
        assert!(receiver.try_recv().is_ok(), "a change was signalled");
        assert_eq!(forward_changes(&b""[..], &sender).await, Some(false));
        let corpus = include_bytes!("../../tests/corpus/drbd/events2-garbage.txt");
        assert_eq!(forward_changes(&corpus[..], &sender).await, Some(true));
        assert!(
            receiver.try_recv().is_ok(),
            "garbage lines are changes too: read the state again"
        );
        drop(receiver);
        assert_eq!(
            forward_changes(&b"line\n"[..], &sender).await,
            None,
            "the consumer is gone"
        );
    }
}
