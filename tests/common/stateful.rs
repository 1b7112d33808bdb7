//! The applications of the data path's NFSv4.1 clients ([`super::nfs41`]), each on a client of
//! its own (another owner, another reserved port):
//!
//! - [`LockedWriter`] holds a file of the volume open and write-locked and writes numbered
//!   records to it with FILE_SYNC; after each recovery on a new server it reads back every record
//!   the server acknowledged;
//! - [`IdleHolder`] holds another file open and locked and does nothing but renew its lease at
//!   the kernel's pace: it learns of a move only at its next renewal;
//! - [`LockTester`] asks, again and again, for a lock conflicting with theirs: the server must
//!   never grant it, during a move or after;
//! - [`NewFiles`] opens a new file at each operation: what a grace period holds back.
//!
//! Once stopped, each tallies what the moves took ([`Tally`]).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::nfs41::{Loss, StatefulClient, Written, renewal_period};

/// The export's pseudo path (`/export`) as a LOOKUP from the root, and the held files in it.
const DIR: &str = "export";
pub const WRITER_FILE: &str = "locked-records";
pub const IDLE_FILE: &str = "locked-idle";
const RECORD_LEN: usize = 32;
/// How long a client may take to mount and lock at the start, and a check at the end to get
/// past a grace period (whose LOCKT answers `NFS4ERR_GRACE`).
const PATIENCE: Duration = Duration::from_secs(30);

/// What the moves took from the stateful clients, out of what they held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Locks held, and those lost (a holder told so, or another client granted a conflicting one).
    pub locks: usize,
    pub lost_locks: usize,
    /// Writes the server acknowledged, and those that did not read back.
    pub acknowledged: usize,
    pub lost_writes: usize,
    pub stale_handles: usize,
    /// What each loss was.
    pub wrong: Vec<String>,
}

impl Tally {
    pub fn lost_nothing(&self) -> bool {
        self.lost_locks == 0 && self.lost_writes == 0 && self.stale_handles == 0 && self.wrong.is_empty()
    }

    pub fn add(&mut self, other: &Tally) {
        self.locks += other.locks;
        self.lost_locks += other.lost_locks;
        self.acknowledged += other.acknowledged;
        self.lost_writes += other.lost_writes;
        self.stale_handles += other.stale_handles;
        self.wrong.extend(other.wrong.iter().cloned());
    }

    /// One lock `client` holds on `file`: lost if the client says so, or if another client finds
    /// the file unlocked.
    fn still_held(&mut self, client: &StatefulClient, server: SocketAddr, file: &str) {
        self.locks += 1;
        let wrong = match &client.lost {
            Some(loss) => {
                match loss {
                    Loss::StaleHandle(_) => self.stale_handles += 1,
                    Loss::Locks(_) => self.lost_locks += 1,
                }
                format!("its locked file was lost: {loss}")
            }
            None => match locked_for_others(server, file) {
                Ok(()) => return,
                Err(wrong) => {
                    self.lost_locks += 1;
                    wrong
                }
            },
        };
        self.wrong.push(wrong);
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} of {} locks lost, {} of {} acknowledged writes lost, {} stale handles",
            self.lost_locks, self.locks, self.lost_writes, self.acknowledged, self.stale_handles
        )?;
        for wrong in &self.wrong {
            write!(f, "; {wrong}")?;
        }
        Ok(())
    }
}

/// A client of `server` from reserved port `port`, mounted, with `file` open and locked if given.
fn holder(server: SocketAddr, port: u16, owner: &str, file: Option<&str>) -> StatefulClient {
    let owner = format!("svc-e2e-{owner}-{}", std::process::id());
    let mut client = StatefulClient::new(server, Some(port), &owner);
    until_it_works("mount", || {
        client
            .mount()
            .and_then(|()| file.map_or(Ok(()), |file| client.open_and_lock(DIR, file)))
    });
    client
}

pub struct LockedWriter {
    server: SocketAddr,
    client: StatefulClient,
    acknowledged: Vec<usize>,
    /// The client's recoveries after which the acknowledged records were read back.
    read_back_after: usize,
    tally: Tally,
}

impl LockedWriter {
    /// Mounts `server` from reserved port `port`, opens and locks its file.
    pub fn start(server: SocketAddr, port: u16) -> Self {
        Self {
            server,
            client: holder(server, port, "writer", Some(WRITER_FILE)),
            acknowledged: Vec::new(),
            read_back_after: 0,
            tally: Tally::default(),
        }
    }

    /// Writes record `tick`; whether the server acknowledged it. The first write on a new server
    /// is followed by a read of every record acknowledged before.
    pub fn operate(&mut self, tick: usize) -> bool {
        let acknowledged = self.client.write(offset(tick), &record(tick)) == Written::Acknowledged;
        if acknowledged {
            self.acknowledged.push(tick);
            if self.client.recoveries != self.read_back_after {
                self.read_back_after = self.client.recoveries;
                self.read_back();
            }
        }
        acknowledged
    }

    /// Counts the acknowledged records that do not read back (READ on reclaimed state passes a
    /// grace period).
    fn read_back(&mut self) {
        let Some(&last) = self.acknowledged.last() else {
            return;
        };
        let read = match self.client.read(0, offset(last + 1) as u32) {
            Ok(read) => read,
            Err(failure) => {
                self.tally
                    .wrong
                    .push(format!("the records cannot be read back: {failure:?}"));
                return;
            }
        };
        for &tick in &self.acknowledged {
            let at = offset(tick) as usize;
            if read.get(at..at + RECORD_LEN) != Some(record(tick).as_slice()) {
                self.tally.lost_writes += 1;
                self.tally
                    .wrong
                    .push(format!("acknowledged record {tick} did not read back"));
            }
        }
    }

    /// What the moves took: checked once more at the end, and another client must find the file
    /// locked.
    pub fn verify(mut self) -> Tally {
        self.read_back();
        let mut tally = std::mem::take(&mut self.tally);
        tally.acknowledged = self.acknowledged.len();
        tally.still_held(&self.client, self.server, WRITER_FILE);
        tally
    }
}

/// An application holding its file open and locked without using it: its client renews the
/// lease alone, every [`renewal_period`]; after a renewal that got no answer it tries again at
/// once, as the kernel retransmits on a new connection.
pub struct IdleHolder {
    server: SocketAddr,
    client: StatefulClient,
    lease: Duration,
    answered: bool,
}

impl IdleHolder {
    pub fn start(server: SocketAddr, port: u16, lease: Duration) -> Self {
        Self {
            server,
            client: holder(server, port, "idle", Some(IDLE_FILE)),
            lease,
            answered: true,
        }
    }

    /// Renews the lease; whether the server answered.
    pub fn operate(&mut self) -> bool {
        self.answered = self.client.renew() == Written::Acknowledged;
        self.answered
    }

    /// How long until the next renewal.
    pub fn pause(&self, retry: Duration) -> Duration {
        if self.answered {
            renewal_period(self.lease)
        } else {
            retry
        }
    }

    pub fn verify(self) -> Tally {
        let mut tally = Tally::default();
        tally.still_held(&self.client, self.server, IDLE_FILE);
        tally
    }
}

/// Another application, asking at each operation for a lock conflicting with each holder's.
pub struct LockTester {
    client: StatefulClient,
    files: Vec<&'static str>,
    /// The files another client could lock: each a lost lock, counted once.
    granted: std::collections::BTreeSet<&'static str>,
    tally: Tally,
}

impl LockTester {
    /// Mounts `server` from reserved port `port`; it tests `files`' locks.
    pub fn start(server: SocketAddr, port: u16, files: Vec<&'static str>) -> Self {
        Self {
            client: holder(server, port, "lock-tester", None),
            files,
            granted: Default::default(),
            tally: Tally::default(),
        }
    }

    /// Tests each file's lock; whether the server refused every conflicting lock (a lock granted
    /// is a lost lock; no answer, as in a grace period, is neither).
    pub fn operate(&mut self, tick: usize) -> bool {
        let mut refused = true;
        for &file in &self.files {
            match self.client.lock_test(DIR, file) {
                Some(true) => {}
                Some(false) => {
                    refused = false;
                    if self.granted.insert(file) {
                        self.tally.lost_locks += 1;
                        let wrong = format!("another client could take the lock on {file} (first at test {tick})");
                        self.tally.wrong.push(wrong);
                    }
                }
                None => refused = false,
            }
        }
        refused
    }

    pub fn verify(self) -> Tally {
        self.tally
    }
}

/// A second client (another owner, any port) asks for a lock conflicting with the holder's of
/// `file`: DENIED, once the server is out of its grace period. It unmounts after, as the
/// kernel's last unmount does.
pub fn locked_for_others(server: SocketAddr, file: &str) -> Result<(), String> {
    let mut probe = StatefulClient::new(server, None, "svc-e2e-lock-probe");
    until_it_works("mount the lock probe", || probe.mount());
    let deadline = Instant::now() + PATIENCE;
    let locked = loop {
        match probe.sees_locked(DIR, file) {
            Ok(locked) => break locked,
            Err(failure) if Instant::now() > deadline => {
                return Err(format!("another client cannot test the lock on {file}: {failure:?}"));
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
        Err(format!("another client finds {file} unlocked: the lock was lost"))
    }
}

/// An application that opens (creates) and closes a new file at each operation.
pub struct NewFiles {
    client: StatefulClient,
}

impl NewFiles {
    /// Mounts `server` from reserved port `port`.
    pub fn start(server: SocketAddr, port: u16) -> Self {
        Self {
            client: holder(server, port, "opener", None),
        }
    }

    /// Opens file `tick`; whether the server let it.
    pub fn operate(&mut self, tick: usize) -> bool {
        let name = format!("opened-{}-{tick}", std::process::id());
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
