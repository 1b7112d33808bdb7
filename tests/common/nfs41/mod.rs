//! A stateful NFSv4.1 client that behaves like the Linux kernel's where a server move matters
//! (no crate here speaks 4.1 sessions and locks; this one is the tests' own):
//!
//! - a stable client owner and boot verifier; EXCHANGE_ID, CREATE_SESSION (one slot, replies
//!   cached), RECLAIM_COMPLETE; every COMPOUND after it starts with SEQUENCE, which renews the
//!   lease; an idle client renews with a SEQUENCE alone, at the kernel's pace if its caller keeps
//!   it ([`renewal_period`]);
//! - one connection from a fixed reserved source port, reopened from it after a timeout;
//! - an OPEN with a share reservation (read and write, no delegation wanted), a byte-range write
//!   LOCK over the whole file, and FILE_SYNC WRITEs under the lock's stateid;
//! - when the server no longer knows its session or client ID, the kernel's recovery: EXCHANGE_ID
//!   again with the same owner, the server scope compared with the one it had; a different scope
//!   means no reclaim (the kernel's `nfs4_check_server_scope`), so its locks are lost and the open
//!   file answers EIO (`nfs.recover_lost_locks` is off by default); the same scope, a new session,
//!   the open reclaimed (CLAIM_PREVIOUS) and the lock reclaimed (`reclaim = true`) within the grace
//!   period, then RECLAIM_COMPLETE. A server that refuses the reclaim loses the locks too.
//!
//! What it leaves out: delegations, the callback channel, trunking (the server owner is not
//! compared), several slots, UNSTABLE writes and COMMIT, Kerberos, and the kernel's timers other
//! than the idle renewal's period: its retry pace is the caller's, each call given 2 s.

mod wire;
mod xdr;

use std::net::SocketAddr;
use std::time::Duration;

use wire::{
    Connection, Failure, NFS4_OK, NFS4ERR_BADSESSION, NFS4ERR_COMPLETE_ALREADY, NFS4ERR_DEADSESSION, NFS4ERR_DENIED,
    NFS4ERR_GRACE, NFS4ERR_NO_GRACE, NFS4ERR_RECLAIM_BAD, NFS4ERR_STALE, NFS4ERR_STALE_CLIENTID, OpCode, Results,
    StateId,
};
use xdr::{Decoder, Encoder, Malformed};

const TIMEOUT: Duration = Duration::from_secs(2);
const WRITE_LT: u32 = 2;
const FILE_SYNC4: u32 = 2;
/// OPEN4_SHARE_ACCESS_BOTH | OPEN4_SHARE_ACCESS_WANT_NO_DELEG.
const SHARE_BOTH_NO_DELEG: u32 = 3 | 0x0400;
/// The whole file, as `fcntl(F_SETLK)` with length 0 asks.
const WHOLE_FILE: u64 = u64::MAX;

struct Session {
    clientid: u64,
    id: [u8; 16],
    slot_seqid: u32,
}

/// The file the client holds open and locked.
struct Held {
    fh: Vec<u8>,
    open: StateId,
    lock: StateId,
}

/// What one write of the application came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// The server acknowledged it, on stable storage.
    Acknowledged,
    /// Not this time (no answer, or the server is in its grace period): the application retries.
    NotYet,
    /// The open file is gone for the application.
    Lost(Loss),
}

/// How the application lost its open file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Loss {
    /// The server no longer knows the file handle (`NFS4ERR_STALE`, ESTALE to the application).
    StaleHandle(String),
    /// Its locks (and open) are gone: EIO on the file from then on.
    Locks(String),
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::StaleHandle(why) => write!(f, "a stale file handle: {why}"),
            Self::Locks(why) => f.write_str(why),
        }
    }
}

/// How often the Linux client renews an idle lease: every two thirds of it, at least every 5 s
/// (`nfs4_renew_state`).
pub fn renewal_period(lease: Duration) -> Duration {
    (lease * 2 / 3).max(Duration::from_secs(5))
}

pub struct StatefulClient {
    server: SocketAddr,
    source_port: Option<u16>,
    owner: String,
    verifier: [u8; 8],
    connection: Option<Connection>,
    session: Option<Session>,
    held: Option<Held>,
    /// The server lost this client's session or ID, and the client has not recovered its state
    /// yet: the next operation recovers first.
    needs_recovery: bool,
    /// The server scope of the last EXCHANGE_ID.
    server_scope: Vec<u8>,
    /// How the held file was lost, once it was.
    pub lost: Option<Loss>,
    /// How many times the client recovered its state on a new server.
    pub recoveries: usize,
}

impl StatefulClient {
    /// A client named `owner` (its co_ownerid, as the kernel's is made of its hostname) of `server`.
    pub fn new(server: SocketAddr, source_port: Option<u16>, owner: &str) -> Self {
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Self {
            server,
            source_port,
            owner: owner.to_owned(),
            verifier: boot.to_be_bytes(),
            connection: None,
            session: None,
            held: None,
            needs_recovery: false,
            server_scope: Vec::new(),
            lost: None,
            recoveries: 0,
        }
    }

    /// EXCHANGE_ID, CREATE_SESSION and RECLAIM_COMPLETE: what a mount does (again from the
    /// start when tried again).
    pub fn mount(&mut self) -> Result<(), Failure> {
        self.destroy_session()?;
        self.exchange_id()?;
        self.create_session()?;
        self.reclaim_complete()
    }

    /// Opens (creating) `dir/name` for reading and writing and write-locks all of it.
    pub fn open_and_lock(&mut self, dir: &str, name: &str) -> Result<(), Failure> {
        let (fh, open) = self.open_by_name(dir, name)?;
        let lock = self.lock(&fh, open, false)?;
        self.held = Some(Held { fh, open, lock });
        Ok(())
    }

    /// Opens (creating) and closes `dir/name`, as an application's `open` + `close`: what a new
    /// OPEN comes to, recovering from a server change as the kernel does.
    pub fn open_new(&mut self, dir: &str, name: &str) -> Written {
        self.as_the_kernel(|client| client.open_and_close(dir, name))
    }

    /// DESTROY_SESSION and DESTROY_CLIENTID, as the kernel's last unmount of a server does: the
    /// server forgets the client, and its recovery record with it.
    pub fn unmount(&mut self) -> Result<(), Failure> {
        let clientid = self.clientid();
        self.destroy_session()?;
        let mut args = Encoder::default();
        args.u64(clientid);
        let reply = self.call(vec![(OpCode::DestroyClientid, args)])?;
        Results::new(&reply)?.next(OpCode::DestroyClientid)?;
        Ok(())
    }

    /// DESTROY_SESSION of the session there is, if any: a client ID with a session left is busy.
    fn destroy_session(&mut self) -> Result<(), Failure> {
        let Some(session) = self.session.take().filter(|s| s.id != [0; 16]) else {
            return Ok(());
        };
        let mut id = Encoder::default();
        id.fixed(&session.id);
        let reply = self.call(vec![(OpCode::DestroySession, id)])?;
        Results::new(&reply)?.next(OpCode::DestroySession)?;
        Ok(())
    }

    /// Writes `record` at `offset` of the held file, as an application's `pwrite` + `fsync`,
    /// recovering from a server change as the kernel does.
    pub fn write(&mut self, offset: u64, record: &[u8]) -> Written {
        self.as_the_kernel(|client| client.write_once(offset, record))
    }

    /// Renews the lease with a SEQUENCE alone, as the kernel's lease renewal of an idle mount
    /// does, recovering from a server change as the kernel does.
    pub fn renew(&mut self) -> Written {
        self.as_the_kernel(|client| client.call(Vec::new()).map(drop))
    }

    /// One operation of the application: refused once the held file is lost, after a recovery
    /// when the server lost the client's state, and its failure taken as the kernel takes it.
    fn as_the_kernel(&mut self, operation: impl FnOnce(&mut Self) -> Result<(), Failure>) -> Written {
        if let Some(loss) = &self.lost {
            return Written::Lost(loss.clone());
        }
        match self.in_session().and_then(|()| operation(self)) {
            Ok(()) => Written::Acknowledged,
            Err(failure) => self.after(failure),
        }
    }

    /// Reads `count` bytes at `offset` of the held file.
    pub fn read(&mut self, offset: u64, count: u32) -> Result<Vec<u8>, Failure> {
        let held = self.held.as_ref().expect("a held file");
        let mut read = Encoder::default();
        held.open.encode(&mut read);
        read.u64(offset).u32(count);
        let reply = self.call(vec![(OpCode::Putfh, opaque(&held.fh)), (OpCode::Read, read)])?;
        let mut results = Results::sequenced(&reply)?;
        results.next(OpCode::Putfh)?;
        let d = results.next(OpCode::Read)?;
        let _eof = d.bool()?;
        Ok(d.opaque()?)
    }

    /// LOCKT as an application's `fcntl(F_GETLK)` sends it, recovering from a server change as
    /// the kernel does: `Some(true)` when another owner holds a conflicting lock, `None` when the
    /// server gave no answer yet (unreachable, or in its grace period).
    pub fn lock_test(&mut self, dir: &str, name: &str) -> Option<bool> {
        let mut locked = false;
        let tested = self.as_the_kernel(|client| client.sees_locked(dir, name).map(|l| locked = l));
        (tested == Written::Acknowledged).then_some(locked)
    }

    /// Whether another owner holds a lock conflicting with a write lock on all of `dir/name`
    /// (LOCKT, as `fcntl(F_GETLK)`): `Ok(true)` when the server says DENIED.
    pub fn sees_locked(&mut self, dir: &str, name: &str) -> Result<bool, Failure> {
        let mut lockt = Encoder::default();
        lockt.u32(WRITE_LT).u64(0).u64(WHOLE_FILE);
        lockt
            .u64(self.clientid())
            .opaque(format!("{}-probe", self.owner).as_bytes());
        let reply = self.call(vec![
            (OpCode::Putrootfh, Encoder::default()),
            (OpCode::Lookup, string(dir)),
            (OpCode::Lookup, string(name)),
            (OpCode::Lockt, lockt),
        ])?;
        let mut results = Results::sequenced(&reply)?;
        results.next(OpCode::Putrootfh)?;
        results.next(OpCode::Lookup)?;
        results.next(OpCode::Lookup)?;
        match results.next_status(OpCode::Lockt)? {
            NFS4_OK => Ok(false),
            NFS4ERR_DENIED => Ok(true),
            status => Err(Failure::Status {
                op: OpCode::Lockt,
                status,
            }),
        }
    }

    fn write_once(&mut self, offset: u64, record: &[u8]) -> Result<(), Failure> {
        let held = self.held.as_ref().expect("a held file");
        let mut write = Encoder::default();
        held.lock.encode(&mut write);
        write.u64(offset).u32(FILE_SYNC4).opaque(record);
        let reply = self.call(vec![(OpCode::Putfh, opaque(&held.fh)), (OpCode::Write, write)])?;
        let mut results = Results::sequenced(&reply)?;
        results.next(OpCode::Putfh)?;
        let d = results.next(OpCode::Write)?;
        let (count, committed) = (d.u32()?, d.u32()?);
        if count as usize != record.len() || committed != FILE_SYNC4 {
            return Err(Failure::Malformed("a write not all on stable storage"));
        }
        Ok(())
    }

    /// What the kernel makes of a failed operation.
    fn after(&mut self, failure: Failure) -> Written {
        match failure {
            Failure::Io(_) => {
                self.connection = None;
                Written::NotYet
            }
            Failure::Status { status, .. } if status == NFS4ERR_GRACE => Written::NotYet,
            Failure::Status { status, .. }
                if [NFS4ERR_BADSESSION, NFS4ERR_DEADSESSION, NFS4ERR_STALE_CLIENTID].contains(&status) =>
            {
                self.needs_recovery = true;
                Written::NotYet
            }
            Failure::Lost(why) => self.lose(Loss::Locks(why)),
            failure if failure.status() == Some(NFS4ERR_STALE) => self.lose(Loss::StaleHandle(format!("{failure:?}"))),
            failure => self.lose(Loss::Locks(format!("{failure:?}"))),
        }
    }

    /// Recovers the client's state first if the server lost it.
    fn in_session(&mut self) -> Result<(), Failure> {
        if self.needs_recovery { self.recover() } else { Ok(()) }
    }

    fn lose(&mut self, loss: Loss) -> Written {
        self.lost = Some(loss.clone());
        Written::Lost(loss)
    }

    /// The kernel's state recovery after the server lost the client's session or ID. Each step
    /// may be tried again from the start: it ends only once all of it went through.
    fn recover(&mut self) -> Result<(), Failure> {
        let before = self.server_scope.clone();
        self.session = None;
        self.exchange_id()?;
        if self.server_scope != before {
            let why = format!(
                "locks lost: the server scope changed from {:?} to {:?}, so nothing was reclaimed",
                String::from_utf8_lossy(&before),
                String::from_utf8_lossy(&self.server_scope)
            );
            return Err(Failure::Lost(why));
        }
        self.create_session()?;
        if let Some(fh) = self.held.as_ref().map(|held| held.fh.clone()) {
            let open = self.reclaim_open(&fh)?;
            let lock = self.lock(&fh, open, true)?;
            self.held = Some(Held { fh, open, lock });
        }
        self.reclaim_complete()?;
        self.needs_recovery = false;
        self.recoveries += 1;
        Ok(())
    }

    fn reclaim_open(&mut self, fh: &[u8]) -> Result<StateId, Failure> {
        let mut open = self.open_args();
        // OPEN4_NOCREATE; CLAIM_PREVIOUS, no delegation held.
        open.u32(0).u32(1).u32(0);
        let reply = self.call(vec![(OpCode::Putfh, opaque(fh)), (OpCode::Open, open)])?;
        let mut results = Results::sequenced(&reply)?;
        results.next(OpCode::Putfh)?;
        reclaimed(results.next(OpCode::Open).and_then(open_result), OpCode::Open)
    }

    fn open_by_name(&mut self, dir: &str, name: &str) -> Result<(Vec<u8>, StateId), Failure> {
        let mut open = self.open_args();
        // OPEN4_CREATE, UNCHECKED4, mode 0644; CLAIM_NULL by name.
        open.u32(1).u32(0).u32(2).u32(0).u32(2).opaque(&0o644u32.to_be_bytes());
        open.u32(0).opaque(name.as_bytes());
        let reply = self.call(vec![
            (OpCode::Putrootfh, Encoder::default()),
            (OpCode::Lookup, string(dir)),
            (OpCode::Open, open),
            (OpCode::Getfh, Encoder::default()),
        ])?;
        let mut results = Results::sequenced(&reply)?;
        results.next(OpCode::Putrootfh)?;
        results.next(OpCode::Lookup)?;
        let open = open_result(results.next(OpCode::Open)?)?;
        let fh = results.next(OpCode::Getfh)?.opaque()?;
        Ok((fh, open))
    }

    fn open_and_close(&mut self, dir: &str, name: &str) -> Result<(), Failure> {
        let (fh, open) = self.open_by_name(dir, name)?;
        let mut close = Encoder::default();
        close.u32(0);
        open.encode(&mut close);
        let reply = self.call(vec![(OpCode::Putfh, opaque(&fh)), (OpCode::Close, close)])?;
        let mut results = Results::sequenced(&reply)?;
        results.next(OpCode::Putfh)?;
        results.next(OpCode::Close)?;
        Ok(())
    }

    /// OPEN's arguments up to how it opens: read and write, no delegation wanted, this client's
    /// open owner.
    fn open_args(&self) -> Encoder {
        let mut open = Encoder::default();
        open.u32(0).u32(SHARE_BOTH_NO_DELEG).u32(0);
        open.u64(self.clientid())
            .opaque(format!("{}-open", self.owner).as_bytes());
        open
    }

    /// A write lock on all of the file, by a new lock owner of the open `open`.
    fn lock(&mut self, fh: &[u8], open: StateId, reclaim: bool) -> Result<StateId, Failure> {
        let mut lock = Encoder::default();
        lock.u32(WRITE_LT).bool(reclaim).u64(0).u64(WHOLE_FILE);
        lock.bool(true).u32(0);
        open.encode(&mut lock);
        lock.u32(0)
            .u64(self.clientid())
            .opaque(format!("{}-lock", self.owner).as_bytes());
        let reply = self.call(vec![(OpCode::Putfh, opaque(fh)), (OpCode::Lock, lock)])?;
        let mut results = Results::sequenced(&reply)?;
        results.next(OpCode::Putfh)?;
        let lock = results
            .next(OpCode::Lock)
            .and_then(|d| StateId::decode(d).map_err(Failure::from));
        if reclaim { reclaimed(lock, OpCode::Lock) } else { lock }
    }

    fn clientid(&self) -> u64 {
        self.session.as_ref().map_or(0, |s| s.clientid)
    }

    fn exchange_id(&mut self) -> Result<(), Failure> {
        let mut args = Encoder::default();
        args.fixed(&self.verifier).opaque(self.owner.as_bytes());
        // No flags asked, SP4_NONE, no implementation id.
        args.u32(0).u32(0).u32(0);
        let reply = self.call(vec![(OpCode::ExchangeId, args)])?;
        let mut results = Results::new(&reply)?;
        let d = results.next(OpCode::ExchangeId)?;
        let (clientid, sequence, _flags, _protect) = (d.u64()?, d.u32()?, d.u32()?, d.u32()?);
        let (_minor, _major) = (d.u64()?, d.opaque()?);
        self.server_scope = d.opaque()?;
        self.session = Some(Session {
            clientid,
            id: [0; 16],
            slot_seqid: sequence,
        });
        Ok(())
    }

    fn create_session(&mut self) -> Result<(), Failure> {
        let session = self.session.as_ref().expect("an EXCHANGE_ID first");
        let mut args = Encoder::default();
        args.u64(session.clientid).u32(session.slot_seqid).u32(0);
        for _channel in 0..2 {
            // header padding, max request and response, max cached response, max ops, one slot.
            args.u32(0)
                .u32(1 << 20)
                .u32(1 << 20)
                .u32(64 << 10)
                .u32(16)
                .u32(1)
                .u32(0);
        }
        // Callback program, one AUTH_NONE security parameter.
        args.u32(0x4000_0000).u32(1).u32(0);
        let reply = self.call(vec![(OpCode::CreateSession, args)])?;
        let mut results = Results::new(&reply)?;
        let d = results.next(OpCode::CreateSession)?;
        let id: [u8; 16] = d.fixed(16)?.try_into().unwrap();
        let session = self.session.as_mut().unwrap();
        (session.id, session.slot_seqid) = (id, 1);
        Ok(())
    }

    /// RECLAIM_COMPLETE; one the server already has (a mount tried again) is done, as the kernel
    /// takes it.
    fn reclaim_complete(&mut self) -> Result<(), Failure> {
        let mut args = Encoder::default();
        args.bool(false);
        let reply = self.call(vec![(OpCode::ReclaimComplete, args)])?;
        match Results::sequenced(&reply)?.next_status(OpCode::ReclaimComplete)? {
            NFS4_OK | NFS4ERR_COMPLETE_ALREADY => Ok(()),
            status => Err(Failure::Status {
                op: OpCode::ReclaimComplete,
                status,
            }),
        }
    }

    /// One COMPOUND, after a SEQUENCE once there is a session; connects first if need be.
    fn call(&mut self, mut ops: Vec<(OpCode, Encoder)>) -> Result<Vec<u8>, Failure> {
        let sequenced = self.session.as_ref().filter(|s| s.id != [0; 16]);
        if let Some(session) = sequenced {
            let mut sequence = Encoder::default();
            sequence
                .fixed(&session.id)
                .u32(session.slot_seqid)
                .u32(0)
                .u32(0)
                .bool(true);
            ops.insert(0, (OpCode::Sequence, sequence));
        }
        if self.connection.is_none() {
            self.connection = Some(Connection::open(self.server, self.source_port, TIMEOUT)?);
        }
        let reply = self.connection.as_mut().unwrap().compound(&ops);
        let reply = reply.inspect_err(|failure| {
            if matches!(failure, Failure::Io(_)) {
                self.connection = None;
            }
        })?;
        if ops[0].0 == OpCode::Sequence {
            Results::new(&reply)?.next(OpCode::Sequence)?;
            self.session.as_mut().unwrap().slot_seqid += 1;
        }
        Ok(reply)
    }
}

/// A reclaim the server refused because it is not in grace or has no record of the client: the
/// state is lost, as the kernel reports it.
fn reclaimed(result: Result<StateId, Failure>, op: OpCode) -> Result<StateId, Failure> {
    result.map_err(|failure| match failure.status() {
        Some(NFS4ERR_NO_GRACE | NFS4ERR_RECLAIM_BAD) => Failure::Lost(format!(
            "locks lost: the server refused the {op:?} reclaim ({failure:?})"
        )),
        _ => failure,
    })
}

fn open_result(d: &mut Decoder) -> Result<StateId, Failure> {
    let stateid = StateId::decode(d)?;
    let (_atomic, _before, _after, _rflags) = (d.bool()?, d.u64()?, d.u64()?, d.u32()?);
    d.bitmap()?;
    match d.u32()? {
        // OPEN_DELEGATE_NONE
        0 => Ok(stateid),
        // OPEN_DELEGATE_NONE_EXT: why none; for contention or resources, a flag.
        3 => {
            if matches!(d.u32()?, 1 | 2) {
                d.bool()?;
            }
            Ok(stateid)
        }
        _ => Err(Malformed("a delegation granted; this client wants none").into()),
    }
}

fn string(text: &str) -> Encoder {
    opaque(text.as_bytes())
}

fn opaque(bytes: &[u8]) -> Encoder {
    let mut e = Encoder::default();
    e.opaque(bytes);
    e
}
