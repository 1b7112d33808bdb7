//! The applications of the data path's NFSv4.1 clients ([`super::nfs41`]). One holds a file of
//! the volume open and write-locked, writes numbered records to it with FILE_SYNC, and once
//! stopped checks what a move must not take: every acknowledged record reads back, its file was
//! never lost (EIO, a stale handle, its locks), and another client still finds the file locked.
//! The other opens a new file at each operation: what a grace period holds back.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::nfs41::{StatefulClient, Written};

/// The export's pseudo path (`/export`) as a LOOKUP from the root, and the held file in it.
const DIR: &str = "export";
const FILE: &str = "locked-records";
const RECORD_LEN: usize = 32;
/// How long the client may take to mount and lock at the start, and a check at the end to get
/// past a grace period (whose LOCKT answers `NFS4ERR_GRACE`).
const PATIENCE: Duration = Duration::from_secs(30);

pub struct LockedWriter {
    server: SocketAddr,
    client: StatefulClient,
    acknowledged: Vec<usize>,
}

impl LockedWriter {
    /// Mounts `server` from reserved port `port`, opens and locks the file, and checks that
    /// another client sees the lock.
    pub fn start(server: SocketAddr, port: u16) -> Self {
        let owner = format!("svc-e2e-client-{}", std::process::id());
        let mut client = StatefulClient::new(server, Some(port), &owner);
        until_it_works("mount and lock", || {
            client.mount().and_then(|()| client.open_and_lock(DIR, FILE))
        });
        let writer = Self {
            server,
            client,
            acknowledged: Vec::new(),
        };
        if let Err(wrong) = writer.another_client_finds_it_locked() {
            panic!("before any move: {wrong}");
        }
        writer
    }

    /// Writes record `tick`; whether the server acknowledged it.
    pub fn operate(&mut self, tick: usize) -> bool {
        let acknowledged = self.client.write(offset(tick), &record(tick)) == Written::Acknowledged;
        if acknowledged {
            self.acknowledged.push(tick);
        }
        acknowledged
    }

    /// What the move must not have taken.
    pub fn verify(mut self) -> Result<(), String> {
        if let Some(why) = &self.client.lost {
            return Err(format!("its locked file was lost: {why}"));
        }
        for &tick in &self.acknowledged {
            let read = self.client.read(offset(tick), RECORD_LEN as u32);
            if read.as_ref().ok() != Some(&record(tick)) {
                return Err(format!("acknowledged record {tick} reads back as {read:?}"));
            }
        }
        self.another_client_finds_it_locked()
    }

    fn another_client_finds_it_locked(&self) -> Result<(), String> {
        locked_for_others(self.server)
    }
}

/// A second client (another owner, any port) asks for a lock conflicting with the writer's:
/// DENIED, once the server is out of its grace period. It unmounts after, as the kernel's last
/// unmount does, so that no record of it holds a later grace period.
pub fn locked_for_others(server: SocketAddr) -> Result<(), String> {
    let mut probe = StatefulClient::new(server, None, "svc-e2e-lock-probe");
    until_it_works("mount the lock probe", || probe.mount());
    let deadline = Instant::now() + PATIENCE;
    let locked = loop {
        match probe.sees_locked(DIR, FILE) {
            Ok(locked) => break locked,
            Err(failure) if Instant::now() > deadline => {
                return Err(format!("another client cannot test the lock: {failure:?}"));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(500)),
        }
    };
    if let Err(failure) = probe.unmount() {
        return Err(format!("the lock probe cannot unmount: {failure:?}"));
    }
    if locked {
        Ok(())
    } else {
        Err("another client finds the file unlocked: the lock was lost".into())
    }
}

/// An application that opens (creates) and closes a new file at each operation.
pub struct NewFiles {
    client: StatefulClient,
    owner: String,
}

impl NewFiles {
    /// Mounts `server` from reserved port `port`.
    pub fn start(server: SocketAddr, port: u16) -> Self {
        let owner = format!("svc-e2e-opener-{}", std::process::id());
        let mut client = StatefulClient::new(server, Some(port), &owner);
        until_it_works("mount", || client.mount());
        Self { client, owner }
    }

    /// Opens file `tick`; whether the server let it.
    pub fn operate(&mut self, tick: usize) -> bool {
        let name = format!("{}-{tick}", self.owner);
        self.client.open_new(DIR, &name) == Written::Acknowledged
    }
}

/// Runs `attempt` until it works, for up to [`PATIENCE`].
fn until_it_works<E: std::fmt::Debug>(what: &str, mut attempt: impl FnMut() -> Result<(), E>) {
    let deadline = Instant::now() + PATIENCE;
    while let Err(failure) = attempt() {
        assert!(
            Instant::now() < deadline,
            "the NFSv4.1 client cannot {what}: {failure:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn offset(tick: usize) -> u64 {
    (tick * RECORD_LEN) as u64
}

/// Record `tick`: its number, padded to [`RECORD_LEN`] bytes.
fn record(tick: usize) -> Vec<u8> {
    format!("{:<width$}\n", format!("record {tick}"), width = RECORD_LEN - 1).into_bytes()
}
