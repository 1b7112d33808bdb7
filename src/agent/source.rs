//! Where DRBD state comes from: the `drbdsetup` binary, behind [`DrbdSource`] so the agent's
//! logic can be tested with mocks.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::stream::BoxStream;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

use super::drbd::{self, DrbdState, Shown};
use super::events2::{Applied, Events2State};
use super::read_bound::ReadBound;
use crate::deadline::within;
use crate::producer::{self, Latest};

#[derive(Debug, thiserror::Error)]
pub enum DrbdError {
    #[error("cannot run {command}: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
        /// It ran out of its time, rather than failing on its own.
        timed_out: bool,
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
    /// Reads only the settings (`drbdsetup show`: quorum, net options): events2 never prints them.
    async fn shown(&self) -> Result<Shown, DrbdError>;
    /// What DRBD reports as it happens (the `events2` stream), as state.
    fn changes(&self) -> BoxStream<'static, DrbdChange>;
}

pub struct DrbdSetup {
    pub binary: PathBuf,
    /// DRBD's proc file: when it is missing the module is not loaded and there are no resources.
    pub proc_path: PathBuf,
    /// Bound of a command that changes something (`secondary --force`).
    pub timeout: Duration,
    /// Bound of a read (`status`, `show`): milliseconds when DRBD is well, longer on a node
    /// with many resources.
    pub read_bound: ReadBound,
}

impl DrbdSetup {
    /// A command that only reads, within the read bound, which learns from how it went.
    async fn run_read(&self, args: &[&str]) -> Result<String, DrbdError> {
        let started = std::time::Instant::now();
        let read = self.run(args, self.read_bound.get()).await;
        match &read {
            Err(DrbdError::Failed { timed_out: true, .. }) => self.read_bound.ran_out(),
            Ok(_) => self.read_bound.finished(started.elapsed()),
            Err(_) => {}
        }
        read
    }

    async fn run(&self, args: &[&str], timeout: Duration) -> Result<String, DrbdError> {
        let command = format!("{} {}", self.binary.display(), args.join(" "));
        let output = within(
            timeout,
            Command::new(&self.binary).args(args).kill_on_drop(true).output(),
        )
        .await
        .map_err(|timed_out| DrbdError::Failed {
            command: command.clone(),
            status: timed_out.to_string(),
            stderr: String::new(),
            timed_out: true,
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
                timed_out: false,
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
            futures::future::try_join(self.run_read(&["status", "--json"]), self.run_read(&["show", "--json"])).await?;
        let resources = drbd::parse_status(&status)?;
        Ok(DrbdState::new(resources, drbd::parse_shown(&shown)?))
    }

    async fn shown(&self) -> Result<Shown, DrbdError> {
        if !self.proc_path.exists() {
            return Ok(Shown::default());
        }
        Ok(drbd::parse_shown(&self.run_read(&["show", "--json"]).await?)?)
    }

    async fn force_secondary(&self, resource: &str) -> Result<(), DrbdError> {
        self.run(&["secondary", "--force", resource], self.timeout)
            .await
            .map(|_| ())
    }

    fn changes(&self) -> BoxStream<'static, DrbdChange> {
        let binary = self.binary.clone();
        producer::spawn_latest(DrbdChange::merged, |latest| async move {
            let mut backoff = Duration::from_millis(500);
            loop {
                let spawned = Command::new(&binary)
                    .args(["events2", "--full", "all"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .kill_on_drop(true)
                    .spawn();
                match spawned {
                    Ok(mut child) => {
                        let stdout = child.stdout.take().expect("piped stdout");
                        let followed = follow_events2(stdout, &latest).await;
                        // We stopped reading: kill before waiting, so a child that still writes
                        // (or hangs) cannot block us on a full pipe.
                        let _ = child.kill().await;
                        match followed {
                            None => return,
                            Some(true) => backoff = Duration::from_millis(500),
                            Some(false) => {}
                        }
                        // The state it described is gone with it: read everything.
                        if !latest.send(DrbdChange::Unknown) {
                            return;
                        }
                        tracing::info!("drbdsetup events2 ended; restarting in {backoff:?}");
                    }
                    Err(err) => tracing::warn!(error = %err, "cannot run drbdsetup events2; retrying in {backoff:?}"),
                }
                if !latest.pause(backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        })
    }
}

/// What the `events2` stream says happened.
#[derive(Clone, Debug, PartialEq)]
pub enum DrbdChange {
    /// The resources as the stream describes them now, once a burst of lines (one kernel
    /// transaction) has been read whole. `created`: a resource, device or connection came or
    /// went since the last one, so the quorum settings must be read again.
    State {
        resources: Vec<drbd::Resource>,
        created: bool,
        /// When the burst was read whole: a full read started after it is newer.
        at: std::time::Instant,
    },
    /// The stream said something that does not parse, or ended: read everything.
    Unknown,
}

impl DrbdChange {
    /// Two changes the loop has not taken yet, as one: the newer state, asking for the settings
    /// when either did; a call for a full read stands.
    fn merged(waiting: Self, next: Self) -> Self {
        match (waiting, next) {
            (DrbdChange::Unknown, _) | (_, DrbdChange::Unknown) => DrbdChange::Unknown,
            (DrbdChange::State { created: before, .. }, DrbdChange::State { resources, created, at }) => {
                DrbdChange::State {
                    resources,
                    created: before || created,
                    at,
                }
            }
        }
    }
}

/// The longest events2 line kept; a longer one is garbage.
const MAX_LINE: u64 = 64 * 1024;

/// Keeps the state `events2` describes and sends it whenever a burst of lines is read whole,
/// until the output ends or fails: `Some(whether the state was ever whole)`, or `None` once the
/// consumer is gone. After a line that does not parse, the state cannot be trusted until the
/// stream restarts: every burst then asks for a full read instead.
async fn follow_events2(stdout: impl tokio::io::AsyncRead + Unpin, sender: &Latest<DrbdChange>) -> Option<bool> {
    let mut reader = BufReader::new(stdout);
    let mut state = Events2State::default();
    let (mut created, mut changed, mut trusted) = (true, false, true);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return Some(state.complete()),
            Ok(_) => {}
        }
        let applied =
            std::str::from_utf8(&line)
                .map_err(|_| "not UTF-8")
                .and_then(|text| match text.strip_suffix('\n') {
                    Some(text) => state.apply(text).map_err(|_| "not an events2 line"),
                    None => Err("longer than a line may be"),
                });
        match applied {
            Ok(Applied::Created) => (created, changed) = (true, true),
            Ok(Applied::Changed) => changed = true,
            Ok(Applied::Nothing) => {}
            Err(why) => {
                if trusted {
                    tracing::warn!(
                        "drbdsetup events2 printed a line that is {why}; reading the DRBD state in full on every change"
                    );
                }
                trusted = false;
            }
        }
        // Untrusted, every line is a reason to read everything.
        changed |= !trusted;
        if !drained(&mut reader) {
            continue;
        }
        let change = match (trusted, state.complete() && (changed || created)) {
            (false, _) if changed => DrbdChange::Unknown,
            (true, true) => DrbdChange::State {
                resources: state.resources(),
                created,
                at: std::time::Instant::now(),
            },
            _ => continue,
        };
        (created, changed) = (created && !trusted, false);
        if !sender.send(change) {
            return None;
        }
    }
}

/// Whether everything drbdsetup has printed so far is read: it prints one kernel transaction as
/// one burst, and decisions wait for the whole of it.
fn drained<R: tokio::io::AsyncRead + Unpin>(reader: &mut BufReader<R>) -> bool {
    if !reader.buffer().is_empty() {
        return false;
    }
    !matches!(reader.fill_buf().now_or_never(), Some(Ok(more)) if !more.is_empty())
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
            read_bound: ReadBound::between(Duration::from_secs(5), Duration::from_secs(5)),
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("svc-drbd-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn a_hanging_read_gives_up_long_before_the_operations_timeout() {
        // A stuck drbdsetup must not hold the agent's loop for --operations-timeout (1m by
        // default): a read that normally takes milliseconds is given up after the read timeout
        // and tried again at the next status interval.
        let dir = temp_dir("hang");
        let proc_path = dir.join("proc-drbd");
        std::fs::write(&proc_path, "version: 9.2.0\n").unwrap();
        let source = DrbdSetup {
            read_bound: ReadBound::between(Duration::from_millis(300), Duration::from_secs(5)),
            ..source(&dir, proc_path)
        };
        let hanging = dir.join("drbdsetup-hanging");
        std::fs::write(&hanging, "#!/bin/sh\nexec sleep 30\n").unwrap();
        std::fs::set_permissions(&hanging, std::fs::Permissions::from_mode(0o755)).unwrap();
        let source = DrbdSetup {
            binary: hanging,
            ..source
        };
        let started = std::time::Instant::now();
        assert!(source.read().await.is_err());
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A node whose reads take longer than the first bound (thousands of resources) gets a state
    /// at the next read, not never.
    #[tokio::test]
    async fn reads_slower_than_the_bound_get_through_at_the_next_attempt() {
        let dir = temp_dir("slow");
        let proc_path = dir.join("proc-drbd");
        std::fs::write(&proc_path, "version: 9.2.0\n").unwrap();
        let real = fake_drbdsetup(&dir);
        let slow = dir.join("drbdsetup-slow");
        let script = format!("#!/bin/sh\nsleep 0.5\nexec {} \"$@\"\n", real.display());
        std::fs::write(&slow, script).unwrap();
        std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
        let source = DrbdSetup {
            binary: slow,
            read_bound: ReadBound::between(Duration::from_millis(300), Duration::from_secs(5)),
            ..source(&dir, proc_path)
        };
        assert!(source.read().await.is_err(), "the first read runs out");
        let state = source.read().await.expect("the second read is given longer");
        assert_eq!(state.resources[0].name, "pvc-1");
        std::fs::remove_dir_all(dir).unwrap();
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
        let err = source.run_read(&["bogus"]).await.unwrap_err().to_string();
        assert!(err.contains("bogus") && err.contains("unknown command"), "{err}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// What `follow_events2` sent for `output`, and how it ended.
    async fn followed(output: &[u8]) -> (Option<bool>, Vec<DrbdChange>) {
        let (latest, changes) = producer::latest(DrbdChange::merged);
        let ended = follow_events2(output, &latest).await;
        drop(latest);
        (ended, changes.collect().await)
    }

    const DUMP: &[u8] = b"exists resource name:pvc-1 role:Secondary suspended:no force-io-failures:no\n\
        exists device name:pvc-1 volume:0 minor:1000 disk:UpToDate quorum:yes\n\
        exists -\n";

    use futures::StreamExt;

    /// The changes `follow_events2` describes from `reader`, as the agent's loop takes them.
    fn described(reader: impl tokio::io::AsyncRead + Unpin + Send + 'static) -> BoxStream<'static, DrbdChange> {
        producer::spawn_latest(DrbdChange::merged, |latest| async move {
            follow_events2(reader, &latest).await;
        })
    }

    /// A burst is stamped when DRBD printed it (as near as the agent can tell: when it was read
    /// off the pipe), not when the loop got round to it: a backlog from before a full read that
    /// the loop takes in after it would otherwise count as newer than the read.
    #[tokio::test]
    async fn a_burst_is_stamped_when_printed_also_while_the_loop_is_busy() {
        use tokio::io::AsyncWriteExt;
        let (mut writer, reader) = tokio::io::duplex(1 << 20);
        let mut changes = described(reader);
        writer.write_all(DUMP).await.unwrap();
        for i in 0..40 {
            let role = if i % 2 == 0 { "Primary" } else { "Secondary" };
            let line = format!("change resource name:pvc-1 role:{role}\n");
            writer.write_all(line.as_bytes()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let busy_until = std::time::Instant::now();
        let mut newest = None;
        while let Ok(Some(change)) = tokio::time::timeout(Duration::from_millis(200), changes.next()).await {
            newest = Some(change);
        }
        let Some(DrbdChange::State { resources, at, .. }) = newest else {
            panic!("a state: {newest:?}")
        };
        assert_eq!(resources[0].role, "Secondary", "the newest state comes through");
        assert!(
            at < busy_until,
            "stamped {:?} after the loop was free again",
            at.duration_since(busy_until)
        );
    }

    #[tokio::test]
    async fn events2_is_followed_as_state_once_its_dump_ends() {
        let (ended, sent) = followed(DUMP).await;
        assert_eq!(ended, Some(true), "the state was whole");
        let [
            DrbdChange::State {
                resources,
                created: true,
                ..
            },
        ] = sent.as_slice()
        else {
            panic!("one state, whose quorum settings are to be read: {sent:?}")
        };
        assert_eq!(resources[0].name, "pvc-1");
        assert_eq!(followed(b"").await, (Some(false), vec![]));
        let first_line = &DUMP[..=DUMP.iter().position(|b| *b == b'\n').unwrap()];
        assert_eq!(followed(first_line).await.1, vec![], "nothing before the dump ends");
    }

    #[tokio::test]
    async fn events2_output_of_any_length_or_encoding_asks_for_a_full_read() {
        use tokio::io::AsyncWriteExt;
        let (mut writer, reader) = tokio::io::duplex(1 << 21);
        let (latest, mut receiver) = producer::latest(DrbdChange::merged);
        let follower = tokio::spawn(async move { follow_events2(reader, &latest).await });
        writer.write_all(DUMP).await.unwrap();
        assert!(matches!(receiver.next().await, Some(DrbdChange::State { .. })));
        let mut garbage = b"\xff\xfe not UTF-8\n".to_vec();
        garbage.extend(std::iter::repeat_n(b'x', 1 << 20));
        garbage.extend(b"\nchange resource name:pvc-1 role:Primary\n");
        writer.write_all(&garbage).await.unwrap();
        assert_eq!(
            receiver.next().await,
            Some(DrbdChange::Unknown),
            "garbage: read the state again"
        );
        writer
            .write_all(b"change resource name:pvc-1 role:Secondary\n")
            .await
            .unwrap();
        assert_eq!(
            receiver.next().await,
            Some(DrbdChange::Unknown),
            "and on every change after it"
        );
        drop(writer);
        assert_eq!(follower.await.unwrap(), Some(true));
        let corpus = include_bytes!("../../tests/corpus/drbd/events2-garbage.txt");
        let (_, sent) = followed(&corpus[..]).await;
        assert!(
            sent.iter().all(|c| *c == DrbdChange::Unknown) && !sent.is_empty(),
            "{sent:?}"
        );
        let (latest, receiver) = producer::latest(DrbdChange::merged);
        drop(receiver);
        assert_eq!(follow_events2(DUMP, &latest).await, None, "the consumer is gone");
    }
}
