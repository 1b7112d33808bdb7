//! The userspace NFS client of the data path's simplest clients: libnfs's `nfs-cp` and
//! `nfs-cat`, one process (one TCP connection, one NFSv4.0 client) per call.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::datapath::EXPORT;

/// The longest one client operation may take.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs a libnfs command, killed after [`CLIENT_TIMEOUT`].
fn client(command: &mut Command) -> Result<String, String> {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("cannot start the NFS client (Debian package libnfs-utils): {err}"))?;
    let deadline = Instant::now() + CLIENT_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().map_err(|err| err.to_string())? {
            let output = child.wait_with_output().map_err(|err| err.to_string())?;
            return if status.success() {
                Ok(String::from_utf8_lossy(&output.stdout).into_owned())
            } else {
                Err(String::from_utf8_lossy(&output.stderr).trim().to_owned())
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("no answer within {CLIENT_TIMEOUT:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn url(server: &str, file: &str) -> String {
    format!("nfs://{server}{EXPORT}/{file}?version=4")
}

/// Writes `contents` to `file` on the NFS server at `server` (an IPv4 address, here a ClusterIP).
pub fn nfs_write(server: &str, file: &str, contents: &str, scratch: &Path) -> Result<(), String> {
    let local = scratch.join(format!("nfs-write-{file}"));
    std::fs::write(&local, contents).map_err(|err| err.to_string())?;
    let result = client(Command::new("nfs-cp").arg(&local).arg(url(server, file)));
    let _ = std::fs::remove_file(local);
    result.map(drop)
}

/// Reads `file` from the NFS server at `server`.
pub fn nfs_read(server: &str, file: &str) -> Result<String, String> {
    client(Command::new("nfs-cat").arg(url(server, file)))
}
