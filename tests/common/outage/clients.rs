//! The clients of a fail-over: one thread per client model doing its operations through the
//! ClusterIP at its pace, logging when each started, ended and whether it worked, and what each
//! model saw of a move.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::super::datapath::nfs_write;
use super::super::held::{Close, HeldClient};
use super::super::kernel_client::KernelGuest;
use super::super::stateful::{IdleHolder, LockTester, LockedWriter, NewFiles, Tally};
use super::Scenario;
use super::kernel_clients::{KernelNewOpen, KernelWriter};

/// Where the clients reach the volume: its ClusterIP, a scratch folder, the kernel client's guest
/// if one was booted.
#[derive(Clone)]
pub(super) struct Reach {
    pub(super) cluster_ip: String,
    pub(super) scratch: std::path::PathBuf,
    pub(super) kernel: Option<Arc<KernelGuest>>,
}

/// The client's pace, and its bounds (the network rule: client loops are bounded).
pub(super) const CLIENT_PERIOD: Duration = Duration::from_millis(100);
const CLIENT_MAX_OPERATIONS: usize = 6_000;
const CLIENT_MAX_TIME: Duration = Duration::from_secs(600);

/// One client operation: when it started and ended, and whether it worked.
#[derive(Clone, Copy)]
pub(super) struct Operation {
    pub(super) started: Instant,
    pub(super) ended: Instant,
    pub(super) ok: bool,
    pub(super) tick: usize,
}

/// How a client reaches the volume: the models whose outages differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientModel {
    /// A new TCP connection for every write: libnfs's `nfs-cp`, one process per write.
    NewConnection,
    /// One connection held from a fixed port; a late reply closes it normally (FIN) and the client
    /// reconnects from the same port: the kernel's NFS client without `noresvport`.
    HeldNormalClose,
    /// The same, closing with an RST before reconnecting from the same port.
    HeldAbortiveClose,
    /// An NFSv4.1 client holding a file open and write-locked, writing numbered records with
    /// FILE_SYNC and recovering its state after a move as the Linux kernel does
    /// ([`super::nfs41`]), from its own reserved port.
    Stateful,
    /// An NFSv4.1 client that opens (creates) and closes a new file at each operation: what a new
    /// OPEN waits for after a move (a grace period holds it).
    NewOpen,
    /// An NFSv4.1 client holding another file open and locked, idle: it renews its lease at the
    /// kernel's pace only, and so learns of a move late.
    IdleHolder,
    /// An NFSv4.1 client asking at each operation for a lock conflicting with the holders'
    /// (LOCKT): what a new LOCK waits for, and the proof that no holder's lock was lost.
    LockTester,
    /// The Linux kernel's NFS client ([`super::super::kernel_client`]): a process holding a file
    /// open with a POSIX lock, writing numbered records with fsync.
    KernelPosixWriter,
    /// The same with a flock lock.
    KernelFlockWriter,
    /// The kernel's client creating a new file at each operation.
    KernelNewOpen,
}

impl ClientModel {
    pub const ALL: [Self; 3] = [Self::NewConnection, Self::HeldNormalClose, Self::HeldAbortiveClose];

    /// Whether the Linux kernel's client serves it ([`super::super::kernel_client`]).
    pub fn is_kernel(self) -> bool {
        matches!(
            self,
            Self::KernelPosixWriter | Self::KernelFlockWriter | Self::KernelNewOpen
        )
    }

    /// The reserved source port a held client keeps.
    fn port(self) -> u16 {
        match self {
            Self::NewConnection => 0,
            Self::HeldNormalClose => 700,
            Self::HeldAbortiveClose => 701,
            Self::Stateful => 702,
            Self::NewOpen => 703,
            Self::IdleHolder => 704,
            Self::LockTester => 705,
            // The kernel picks its own reserved port.
            Self::KernelPosixWriter | Self::KernelFlockWriter | Self::KernelNewOpen => 0,
        }
    }
}

impl std::fmt::Display for ClientModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::NewConnection => "new connection per write (libnfs nfs-cp)",
            Self::HeldNormalClose => "held connection, normal close, same source port (kernel-style)",
            Self::HeldAbortiveClose => "held connection, abortive close (RST), same source port",
            Self::Stateful => "NFSv4.1 with an open file and a lock, FILE_SYNC writes, kernel-style recovery",
            Self::NewOpen => "NFSv4.1 opening a new file each time, kernel-style recovery",
            Self::IdleHolder => "NFSv4.1 with an open file and a lock, idle, renewing its lease at the kernel's pace",
            Self::LockTester => "NFSv4.1 asking for a lock conflicting with the holders' each time",
            Self::KernelPosixWriter => "Linux kernel client, a POSIX-locked file, fsync'd records",
            Self::KernelFlockWriter => "Linux kernel client, a flock-locked file, fsync'd records",
            Self::KernelNewOpen => "Linux kernel client creating a new file each time",
        })
    }
}

/// A client doing one operation every [`CLIENT_PERIOD`] (or at its own pace) until stopped: for
/// [`ClientModel::NewConnection`], writing `tick-<n>` files; for the held models, a NULL call; for
/// the stateful ones, what [`super::stateful`] says. Its thread ends with what it found taken.
pub(super) struct Client {
    pub(super) model: ClientModel,
    stop: Arc<AtomicBool>,
    pub(super) log: Arc<Mutex<Vec<Operation>>>,
    thread: std::thread::JoinHandle<Tally>,
}

/// How one client model does its operations, and what it checks once stopped.
pub(super) trait Operating: Send {
    fn operate(&mut self, tick: usize) -> bool;
    /// How long until the next operation.
    fn pause(&self) -> Duration {
        CLIENT_PERIOD
    }
    fn verify(self: Box<Self>) -> Tally {
        Tally::default()
    }
}

struct NewConnections {
    cluster_ip: String,
    scratch: std::path::PathBuf,
}

impl Operating for NewConnections {
    fn operate(&mut self, tick: usize) -> bool {
        nfs_write(
            &self.cluster_ip,
            &format!("tick-{tick}"),
            &tick.to_string(),
            &self.scratch,
        )
        .is_ok()
    }
}

impl Operating for HeldClient {
    fn operate(&mut self, _tick: usize) -> bool {
        self.call()
    }
}

impl Operating for NewFiles {
    fn operate(&mut self, tick: usize) -> bool {
        NewFiles::operate(self, tick)
    }
}

impl Operating for LockedWriter {
    fn operate(&mut self, tick: usize) -> bool {
        LockedWriter::operate(self, tick)
    }

    fn verify(self: Box<Self>) -> Tally {
        LockedWriter::verify(*self)
    }
}

impl Operating for IdleHolder {
    fn operate(&mut self, _tick: usize) -> bool {
        IdleHolder::operate(self)
    }

    fn pause(&self) -> Duration {
        IdleHolder::pause(self, CLIENT_PERIOD)
    }

    fn verify(self: Box<Self>) -> Tally {
        IdleHolder::verify(*self)
    }
}

impl Operating for LockTester {
    fn operate(&mut self, tick: usize) -> bool {
        LockTester::operate(self, tick)
    }

    fn verify(self: Box<Self>) -> Tally {
        LockTester::verify(*self)
    }
}

fn operating(model: ClientModel, scenario: &Scenario, reach: Reach) -> Box<dyn Operating> {
    let Reach {
        cluster_ip,
        scratch,
        kernel,
    } = reach;
    let kernel = || kernel.clone().expect("a kernel client booted for the kernel's models");
    let server = format!("{cluster_ip}:2049").parse().unwrap();
    match model {
        ClientModel::NewConnection => Box::new(NewConnections { cluster_ip, scratch }),
        ClientModel::HeldNormalClose => Box::new(HeldClient::new(server, model.port(), Close::Normal)),
        ClientModel::HeldAbortiveClose => Box::new(HeldClient::new(server, model.port(), Close::Abortive)),
        ClientModel::Stateful => Box::new(LockedWriter::start(server, model.port())),
        ClientModel::NewOpen => Box::new(NewFiles::start(server, model.port())),
        ClientModel::IdleHolder => Box::new(IdleHolder::start(server, model.port(), scenario.grace.lease())),
        ClientModel::LockTester => Box::new(LockTester::start(server, model.port(), scenario.held_files())),
        ClientModel::KernelPosixWriter => Box::new(KernelWriter::start(kernel(), "p", "posix", true)),
        ClientModel::KernelFlockWriter => Box::new(KernelWriter::start(kernel(), "f", "flock", false)),
        ClientModel::KernelNewOpen => Box::new(KernelNewOpen::start(kernel())),
    }
}

impl Client {
    pub(super) fn start(model: ClientModel, scenario: Scenario, reach: Reach) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, log) = (stop.clone(), log.clone());
            std::thread::spawn(move || {
                let mut client = operating(model, &scenario, reach);
                let started = Instant::now();
                let stopped = || stop.load(Ordering::Relaxed) || started.elapsed() > CLIENT_MAX_TIME;
                for tick in 0..CLIENT_MAX_OPERATIONS {
                    if stopped() {
                        break;
                    }
                    let started = Instant::now();
                    let ok = client.operate(tick);
                    log.lock().unwrap().push(Operation {
                        started,
                        ended: Instant::now(),
                        ok,
                        tick,
                    });
                    let next = Instant::now() + client.pause();
                    while Instant::now() < next && !stopped() {
                        std::thread::sleep(CLIENT_PERIOD);
                    }
                }
                client.verify()
            })
        };
        Self {
            model,
            stop,
            log,
            thread,
        }
    }

    /// When the first operation started after `since` succeeded.
    pub(super) fn first_success_after(&self, since: Instant) -> Option<Instant> {
        let log = self.log.lock().unwrap();
        log.iter().find(|op| op.ok && op.started > since).map(|op| op.ended)
    }

    /// Stops it: its operations, and what it found taken.
    pub(super) fn finish(self) -> Finished {
        self.stop.store(true, Ordering::Relaxed);
        let tally = self.thread.join().expect("client thread");
        Finished {
            model: self.model,
            operations: Arc::try_unwrap(self.log).ok().unwrap().into_inner().unwrap(),
            tally,
        }
    }
}

pub(super) struct Finished {
    pub(super) model: ClientModel,
    pub(super) operations: Vec<Operation>,
    pub(super) tally: Tally,
}

impl Finished {
    /// What the client found taken from it, if anything.
    pub(super) fn taken(&self) -> Option<(ClientModel, Tally)> {
        (!self.tally.lost_nothing()).then(|| (self.model, self.tally.clone()))
    }
}

/// What one client model saw: from its last success before the loss to its first after it,
/// `None` if it had none within the scenario's patience.
#[derive(Clone, Copy, Debug)]
pub struct ClientOutage {
    pub model: ClientModel,
    pub total: Option<Duration>,
}

impl ClientOutage {
    pub(super) fn of(model: ClientModel, operations: &[Operation], failed: Instant) -> Self {
        let last_before = operations
            .iter()
            .filter(|op| op.ok && op.started < failed)
            .map(|op| op.ended)
            .next_back()
            .unwrap_or_else(|| panic!("the {model} client worked before the failure"));
        let first_after = operations
            .iter()
            .find(|op| op.ok && op.started > failed)
            .map(|op| op.ended);
        Self {
            model,
            total: first_after.map(|at| at - last_before),
        }
    }
}
