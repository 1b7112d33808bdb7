//! The kernel's connection-tracking table through ctnetlink: list the TCP flows to a port in one
//! read, delete listed entries, make entries (tests and the benchmark). Each call opens its own
//! socket on a blocking thread, bounded by a timeout; the messages are [`super::flow`]'s.

use std::io;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_NETFILTER};

use super::flow::{self, Flow, Reply};

/// Requests sent in one datagram when deleting or making many entries: their answers fit the
/// socket's default receive buffer.
const BATCH: usize = 256;
/// Room for one datagram of a dump (the kernel fills at most a few pages per read).
const DATAGRAM: usize = 64 * 1024;

/// A conntrack table: the host's, or a network namespace's.
#[derive(Clone, Debug)]
pub struct Table {
    /// `/run/netns/<name>` to open the socket in; `None`: this process's namespace.
    pub netns: Option<PathBuf>,
    /// Bound of one call.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("cannot open a ctnetlink socket: {0} (the pod needs NET_ADMIN in the host's network namespace)")]
    Open(io::Error),
    #[error("ctnetlink {what} failed: {source}")]
    Io { what: &'static str, source: io::Error },
    #[error("ctnetlink {what} took longer than {timeout:?}")]
    Timeout { what: &'static str, timeout: Duration },
    #[error("ctnetlink {what}: the kernel answered {}", io::Error::from_raw_os_error(-code))]
    Refused { what: &'static str, code: i32 },
    #[error("ctnetlink {what}: an answer does not parse: {why}")]
    Garbled { what: &'static str, why: String },
}

impl Table {
    /// This process's table (the host's, for the repair's DaemonSet), calls bounded by `timeout`.
    pub fn host(timeout: Duration) -> Self {
        Self { netns: None, timeout }
    }

    /// The TCP flows whose original destination port is `port`, in one address family: one dump.
    pub async fn list(&self, ipv6: bool, port: u16) -> Result<Vec<Flow>, TableError> {
        self.blocking(move |call| call.list(ipv6, port)).await
    }

    /// Deletes the entries `flows` were listed as; for each, how many went (0: gone already), or
    /// why it could not.
    pub async fn delete(&self, flows: Vec<Flow>) -> Result<Vec<Result<u64, TableError>>, TableError> {
        self.blocking(move |call| call.delete(&flows)).await
    }

    /// Makes an ESTABLISHED entry for each of `flows` that lives `timeout_secs`.
    pub async fn insert(&self, flows: Vec<Flow>, timeout_secs: u32) -> Result<(), TableError> {
        self.blocking(move |call| call.insert(&flows, timeout_secs)).await
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Call) -> Result<T, TableError> + Send + 'static,
    ) -> Result<T, TableError> {
        let (netns, timeout) = (self.netns.clone(), self.timeout);
        let done = tokio::task::spawn_blocking(move || work(&mut Call::open(netns, timeout)?)).await;
        done.map_err(|err| TableError::Io {
            what: "call",
            source: io::Error::other(err),
        })?
    }
}

/// One socket and the deadline of the call it serves.
struct Call {
    socket: Socket,
    deadline: Instant,
    timeout: Duration,
    sequence: u32,
}

impl Call {
    fn open(netns: Option<PathBuf>, timeout: Duration) -> Result<Self, TableError> {
        let socket = match netns {
            None => open_socket(),
            Some(path) => std::thread::spawn(move || {
                let namespace = std::fs::File::open(&path)?;
                // SAFETY: setns on this short-lived thread alone; the fd is open for the call.
                #[allow(unsafe_code)]
                if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                open_socket()
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked"))),
        }
        .map_err(TableError::Open)?;
        socket2::SockRef::from(&socket)
            .set_read_timeout(Some(timeout))
            .map_err(TableError::Open)?;
        Ok(Self {
            socket,
            deadline: Instant::now() + timeout,
            timeout,
            sequence: 0,
        })
    }

    fn list(&mut self, ipv6: bool, port: u16) -> Result<Vec<Flow>, TableError> {
        const WHAT: &str = "dump";
        let request = flow::dump_request(ipv6, port, self.next());
        self.send(WHAT, &request)?;
        let mut flows = Vec::new();
        loop {
            for reply in self.receive(WHAT)? {
                match reply {
                    // The kernel's filter, again: an older kernel ignores it.
                    Reply::Flow(Some(flow)) if flow.orig_dst.port() == port && flow.orig_dst.is_ipv6() == ipv6 => {
                        flows.push(flow)
                    }
                    Reply::Flow(_) => {}
                    Reply::Done => return Ok(flows),
                    Reply::Ack { code: 0, .. } => {}
                    Reply::Ack { code, .. } => return Err(TableError::Refused { what: WHAT, code }),
                }
            }
        }
    }

    fn delete(&mut self, flows: &[Flow]) -> Result<Vec<Result<u64, TableError>>, TableError> {
        let answers = self.batch("delete", flows, flow::delete_request)?;
        Ok(answers
            .into_iter()
            .map(|code| match code {
                0 => Ok(1),
                code if code == -libc::ENOENT => Ok(0),
                code => Err(TableError::Refused { what: "delete", code }),
            })
            .collect())
    }

    fn insert(&mut self, flows: &[Flow], timeout_secs: u32) -> Result<(), TableError> {
        let answers = self.batch("insert", flows, |flow, sequence| {
            flow::new_request(flow, timeout_secs, sequence)
        })?;
        match answers.into_iter().find(|code| *code != 0) {
            Some(code) => Err(TableError::Refused { what: "insert", code }),
            None => Ok(()),
        }
    }

    /// Sends one acknowledged request per flow, [`BATCH`] to a datagram; each one's answer code.
    fn batch(
        &mut self,
        what: &'static str,
        flows: &[Flow],
        request: impl Fn(&Flow, u32) -> Vec<u8>,
    ) -> Result<Vec<i32>, TableError> {
        let mut answers = Vec::with_capacity(flows.len());
        for chunk in flows.chunks(BATCH) {
            let first = self.sequence + 1;
            let datagram: Vec<u8> = chunk.iter().flat_map(|f| request(f, self.next())).collect();
            self.send(what, &datagram)?;
            let mut codes = vec![None; chunk.len()];
            while codes.iter().any(Option::is_none) {
                for reply in self.receive(what)? {
                    if let Reply::Ack { sequence, code } = reply
                        && let Some(slot) = codes.get_mut(sequence.wrapping_sub(first) as usize)
                    {
                        *slot = Some(code);
                    }
                }
            }
            answers.extend(codes.into_iter().flatten());
        }
        Ok(answers)
    }

    fn next(&mut self) -> u32 {
        self.sequence += 1;
        self.sequence
    }

    fn send(&self, what: &'static str, datagram: &[u8]) -> Result<(), TableError> {
        self.socket
            .send(datagram, 0)
            .map(drop)
            .map_err(|source| TableError::Io { what, source })
    }

    fn receive(&self, what: &'static str) -> Result<Vec<Reply>, TableError> {
        if Instant::now() > self.deadline {
            return Err(TableError::Timeout {
                what,
                timeout: self.timeout,
            });
        }
        let mut datagram = Vec::with_capacity(DATAGRAM);
        match self.socket.recv(&mut datagram, 0) {
            Ok(_) => flow::replies(&datagram).map_err(|why| TableError::Garbled { what, why }),
            Err(err) if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Err(TableError::Timeout {
                    what,
                    timeout: self.timeout,
                })
            }
            Err(source) => Err(TableError::Io { what, source }),
        }
    }
}

fn open_socket() -> io::Result<Socket> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    socket.set_cap_ack(true)?;
    Ok(socket)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> std::net::SocketAddr {
        text.parse().unwrap()
    }

    fn bound(client: &str, backend: &str) -> Flow {
        Flow {
            orig_src: at(client),
            orig_dst: at("10.96.0.10:2049"),
            reply_src: at(backend),
            reply_dst: at(client),
            state: "ESTABLISHED",
        }
    }

    /// A network namespace of the test's own, so that its conntrack table is the test's alone;
    /// removed on drop.
    struct OwnTable {
        netns: String,
        table: Table,
    }

    impl OwnTable {
        fn new(name: &str) -> Self {
            let netns = format!("svcct-{name}-{}", std::process::id());
            let made = std::process::Command::new("ip").args(["netns", "add", &netns]).status();
            assert!(made.is_ok_and(|s| s.success()), "ip netns add {netns} (needs root)");
            let table = Table {
                netns: Some(PathBuf::from("/run/netns").join(&netns)),
                timeout: Duration::from_secs(5),
            };
            Self { netns, table }
        }

        async fn listed(&self) -> Vec<Flow> {
            self.table.list(false, 2049).await.unwrap()
        }
    }

    impl Drop for OwnTable {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.netns])
                .status();
        }
    }

    #[tokio::test]
    #[ignore = "needs root (a network namespace and its conntrack table): run `make test`"]
    async fn a_listing_is_the_tcp_flows_to_the_port_with_both_tuples_and_their_state() {
        let own = OwnTable::new("list");
        let nfs = bound("10.211.0.1:790", "10.211.1.2:2049");
        let masqueraded = Flow {
            reply_dst: at("10.211.0.254:61000"),
            ..bound("10.244.0.7:791", "10.211.1.2:2049")
        };
        let elsewhere = Flow {
            orig_dst: at("10.96.0.11:80"),
            ..bound("10.211.0.1:792", "10.211.1.3:8080")
        };
        own.table
            .insert(vec![nfs.clone(), masqueraded.clone(), elsewhere], 120)
            .await
            .unwrap();
        let mut listed = own.listed().await;
        listed.sort_by_key(|f| f.orig_src);
        assert_eq!(listed.len(), 2, "only the flows to 2049: {listed:?}");
        assert_eq!(listed, [nfs, masqueraded]);
        assert!(own.table.list(true, 2049).await.unwrap().is_empty(), "another family");
    }

    /// A client that reconnected from its port between the sweep's listing and its delete has a
    /// fresh entry with the same original tuple, bound to the new backend: the delete must spare
    /// it (only the entry bound to the old backend is stranded), and still take a stranded one.
    #[tokio::test]
    #[ignore = "needs root (a network namespace and its conntrack table): run `make test`"]
    async fn a_delete_spares_the_fresh_entry_of_a_client_that_reconnected_from_its_port() {
        let own = OwnTable::new("fresh");
        let listed = bound("10.211.0.1:790", "10.211.1.2:2049");
        let fresh = bound("10.211.0.1:790", "10.211.2.2:2049");
        own.table.insert(vec![fresh.clone()], 120).await.unwrap();
        let deleted = own.table.delete(vec![listed.clone()]).await.unwrap();
        assert_eq!(deleted[0].as_ref().unwrap(), &0, "the fresh entry is not stranded");
        let left = own.listed().await;
        assert_eq!(left.iter().map(|f| f.reply_src).collect::<Vec<_>>(), [fresh.reply_src]);

        let stranded = bound("10.211.0.1:791", "10.211.1.2:2049");
        own.table.insert(vec![stranded.clone()], 120).await.unwrap();
        let stranded = own.listed().await.into_iter().find(|f| f.orig_src == stranded.orig_src);
        let deleted = own.table.delete(vec![stranded.unwrap()]).await.unwrap();
        assert_eq!(deleted[0].as_ref().unwrap(), &1, "a stranded entry goes");
    }
}
