//! The clients of a fail-over that the Linux kernel's NFS client serves ([`KernelGuest`]): each
//! operation is one request to the guest's probe, given [`ANSWER_WITHIN`]; on a hard mount a call
//! the server does not answer blocks in the kernel, so a request unanswered in time stays pending
//! and the next operation waits for it rather than sending another.

use std::sync::Arc;
use std::time::Duration;

use super::super::kernel_client::KernelGuest;
use super::super::stateful::Tally;
use super::clients::Operating;

const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// One tag's requests, one at a time.
struct Requests {
    guest: Arc<KernelGuest>,
    tag: &'static str,
    /// The index of the answer a request still waits for.
    pending: Option<usize>,
    /// What failed, as the probe said it (an errno, never expected).
    errors: Vec<String>,
}

impl Requests {
    fn new(guest: Arc<KernelGuest>, tag: &'static str) -> Self {
        Self {
            guest,
            tag,
            pending: None,
            errors: Vec::new(),
        }
    }

    /// Whether the pending request, or else `line` sent now, was answered with success in time.
    fn operate(&mut self, line: impl FnOnce() -> String) -> Option<bool> {
        let index = match self.pending {
            Some(index) => index,
            None => {
                let index = self.guest.count(self.tag);
                self.guest.send(&line());
                index
            }
        };
        self.pending = Some(index);
        let answer = self.guest.wait(self.tag, index, ANSWER_WITHIN)?;
        self.pending = None;
        match answer {
            Ok(_) => Some(true),
            Err(error) => {
                self.errors.push(error);
                Some(false)
            }
        }
    }

    fn finish_pending(&mut self) {
        if let Some(index) = self.pending.take()
            && let Some(Err(error)) = self.guest.wait(self.tag, index, Duration::from_secs(20))
        {
            self.errors.push(error);
        }
    }
}

/// A process holding a file open and locked (POSIX or flock), writing numbered records with fsync.
pub(super) struct KernelWriter {
    requests: Requests,
    /// The next record's number, and how many from 0 were acknowledged.
    next: usize,
    acknowledged: usize,
    /// Whether this one reads the console's complaints into its tally (one client does).
    reads_console: bool,
}

impl KernelWriter {
    pub(super) fn start(guest: Arc<KernelGuest>, tag: &'static str, lock: &str, reads_console: bool) -> Self {
        let hold = format!("hold {tag} /mnt/kernel-{tag} {lock}");
        match guest.ask(tag, &hold, Duration::from_secs(60)) {
            Some(Ok(_)) => {}
            other => panic!("the kernel client's {lock} holder could not lock its file: {other:?}"),
        }
        Self {
            requests: Requests::new(guest, tag),
            next: 0,
            acknowledged: 0,
            reads_console,
        }
    }
}

impl Operating for KernelWriter {
    fn operate(&mut self, _tick: usize) -> bool {
        let (tag, seq) = (self.requests.tag, self.next);
        let sent = self.requests.pending.is_none();
        let answered = self.requests.operate(|| format!("write {tag} {seq}"));
        if sent {
            self.next += 1;
        }
        if answered == Some(true) {
            self.acknowledged = self.next;
        }
        answered == Some(true)
    }

    fn verify(mut self: Box<Self>) -> Tally {
        self.requests.finish_pending();
        let (guest, tag) = (self.requests.guest.clone(), self.requests.tag);
        let mut tally = Tally {
            locks: 1,
            acknowledged: self.acknowledged,
            ..Tally::default()
        };
        let held = guest.ask(tag, &format!("held {tag}"), Duration::from_secs(20));
        if held != Some(Ok("held yes".into())) {
            tally.lost_locks += 1;
            tally.wrong.push(format!(
                "kernel {tag}: another process was not refused the lock: {held:?}"
            ));
        }
        let verify = format!("verify {tag} {}", self.acknowledged);
        match guest.ask(tag, &verify, Duration::from_secs(20)) {
            Some(Ok(answer)) if answer.ends_with("missing 0") => {}
            other => {
                tally.lost_writes += 1;
                tally
                    .wrong
                    .push(format!("kernel {tag}: acknowledged records read back: {other:?}"));
            }
        }
        tally.stale_handles += self.requests.errors.iter().filter(|e| e.contains("ESTALE")).count();
        tally
            .wrong
            .extend(counted(&self.requests.errors, &format!("kernel {tag}")));
        if self.reads_console {
            for complaint in guest.complaints() {
                tally.lost_locks += usize::from(complaint.contains("lock"));
                tally.wrong.push(format!("the kernel said: {complaint}"));
            }
        }
        tally
    }
}

/// A process opening (creating) a new file at each operation: what a new OPEN waits for.
pub(super) struct KernelNewOpen {
    requests: Requests,
}

impl KernelNewOpen {
    pub(super) fn start(guest: Arc<KernelGuest>) -> Self {
        Self {
            requests: Requests::new(guest, "n"),
        }
    }
}

impl Operating for KernelNewOpen {
    fn operate(&mut self, tick: usize) -> bool {
        self.requests.operate(|| format!("create n /mnt/kernel-new-{tick}")) == Some(true)
    }

    fn verify(mut self: Box<Self>) -> Tally {
        self.requests.finish_pending();
        let mut tally = Tally::default();
        tally.wrong.extend(counted(&self.requests.errors, "kernel new open"));
        tally
    }
}

/// Each distinct error once, with how often it came.
fn counted(errors: &[String], who: &str) -> Vec<String> {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for error in errors {
        match counts.iter_mut().find(|(seen, _)| seen == error) {
            Some((_, n)) => *n += 1,
            None => counts.push((error, 1)),
        }
    }
    counts
        .into_iter()
        .map(|(error, n)| format!("{who}: {error} ({n}×)"))
        .collect()
}
