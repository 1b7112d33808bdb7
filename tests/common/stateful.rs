//! The application of the data path's stateful client: it holds one file of the volume open and
//! write-locked over NFSv4.1 ([`super::nfs41`]), writes numbered records to it with FILE_SYNC,
//! and once stopped checks what a move must not take: every acknowledged record reads back, its
//! file was never lost (EIO, a stale handle, its locks), and another client still finds the
//! file locked.

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
        let deadline = Instant::now() + PATIENCE;
        while let Err(failure) = client.mount().and_then(|()| client.open_and_lock(DIR, FILE)) {
            assert!(
                Instant::now() < deadline,
                "the stateful client cannot mount and lock: {failure:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
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

    /// A second client (another owner, any port) asks for a conflicting lock: DENIED, once the
    /// server is out of its grace period.
    fn another_client_finds_it_locked(&self) -> Result<(), String> {
        let mut probe = StatefulClient::new(self.server, None, "svc-e2e-lock-probe");
        let deadline = Instant::now() + PATIENCE;
        loop {
            match probe.mount().and_then(|()| probe.sees_locked(DIR, FILE)) {
                Ok(true) => return Ok(()),
                Ok(false) => return Err("another client finds the file unlocked: the lock was lost".into()),
                Err(failure) if Instant::now() > deadline => {
                    return Err(format!("another client cannot test the lock: {failure:?}"));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }
}

fn offset(tick: usize) -> u64 {
    (tick * RECORD_LEN) as u64
}

/// Record `tick`: its number, padded to [`RECORD_LEN`] bytes.
fn record(tick: usize) -> Vec<u8> {
    format!("{:<width$}\n", format!("record {tick}"), width = RECORD_LEN - 1).into_bytes()
}
