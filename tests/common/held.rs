//! A client that holds its connection, as the Linux kernel's NFS client does: one TCP connection
//! to the ClusterIP from a fixed reserved source port, an ONC RPC NULL call to the NFS program
//! on it at each operation, and when a reply is late, the connection closed and opened again from
//! the same source port (the kernel keeps its port unless mounted with `noresvport`, so that the
//! server's duplicate-request cache keeps recognising it).
//!
//! Two ways to close, as the network sees them:
//! - [`Close::Normal`]: a FIN, then the next SYN from the same port. The kernel's client closes
//!   this way and its old socket lingers; here the old socket is aborted at once (so that the
//!   port can be bound again) and a raw-table rule drops its RST before connection tracking sees
//!   it: on the wire and in the conntrack table, exactly FIN then SYN.
//! - [`Close::Abortive`]: an RST, then the SYN.
//!
//! What it leaves out: the RPC is NULL (no NFS state, no grace period), and the kernel's own
//! timers (`timeo`, `retrans`, its reconnect back-off) are replaced by a 2 s reply timeout and the
//! client's pace.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// The NFS program, version 4, procedure 0 (NULL).
const NFS_PROGRAM: u32 = 100_003;
const NFS_V4: u32 = 4;
/// How long a connect or a reply may take before the client gives up on the connection.
const TIMEOUT: Duration = Duration::from_secs(2);
/// Comment on the rule that hides a normal-close client's RST from connection tracking.
pub const RST_RULE_COMMENT: &str = "svcdp-held";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Close {
    Normal,
    Abortive,
}

pub struct HeldClient {
    server: SocketAddr,
    port: u16,
    close: Close,
    stream: Option<Socket>,
    xid: u32,
}

impl HeldClient {
    /// A client of `server` from source port `port`; a normal-close client adds its RST rule.
    pub fn new(server: SocketAddr, port: u16, close: Close) -> Self {
        if close == Close::Normal {
            rst_rule("-I", port);
        }
        Self {
            server,
            port,
            close,
            stream: None,
            xid: u32::from(port) << 16,
        }
    }

    /// One NULL call over the held connection (connecting first if there is none); on a late
    /// or failed reply the connection is closed, and the next call reconnects from the same port.
    pub fn call(&mut self) -> bool {
        if self.stream.is_none() {
            match self.connect() {
                Ok(stream) => self.stream = Some(stream),
                Err(_) => return false,
            }
        }
        self.xid = self.xid.wrapping_add(1);
        let ok = self.null_call().unwrap_or(false);
        if !ok {
            self.drop_connection();
        }
        ok
    }

    fn connect(&self) -> std::io::Result<Socket> {
        let socket = Socket::new(Domain::for_address(self.server), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_reuse_address(true)?;
        let local: SocketAddr = if self.server.is_ipv4() {
            ([0, 0, 0, 0], self.port).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, self.port).into()
        };
        socket.bind(&SockAddr::from(local))?;
        // A connect that times out leaves nothing on the wire behind it (SYN_SENT closes
        // silently), whichever way this client closes.
        socket.connect_timeout(&SockAddr::from(self.server), TIMEOUT)?;
        socket.set_read_timeout(Some(TIMEOUT))?;
        socket.set_write_timeout(Some(TIMEOUT))?;
        Ok(socket)
    }

    fn null_call(&mut self) -> std::io::Result<bool> {
        let stream = self.stream.as_ref().expect("connected");
        let mut stream: TcpStream = stream.try_clone()?.into();
        stream.write_all(&null_call(self.xid))?;
        let mut mark = [0u8; 4];
        stream.read_exact(&mut mark)?;
        let length = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
        let mut reply = vec![0u8; length.min(1 << 16)];
        stream.read_exact(&mut reply)?;
        Ok(is_success(&reply, self.xid))
    }

    fn drop_connection(&mut self) {
        let Some(socket) = self.stream.take() else { return };
        if self.close == Close::Normal {
            let _ = socket.shutdown(std::net::Shutdown::Write);
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = socket.set_linger(Some(Duration::ZERO));
        drop(socket);
    }
}

impl Drop for HeldClient {
    fn drop(&mut self) {
        self.drop_connection();
        if self.close == Close::Normal {
            rst_rule("-D", self.port);
        }
    }
}

/// Adds (`-I`) or removes (`-D`) the raw-table rule dropping RSTs from `port`.
fn rst_rule(action: &str, port: u16) {
    let port = port.to_string();
    let status = Command::new("iptables")
        .args(["-t", "raw", action, "OUTPUT", "-p", "tcp", "--sport", &port])
        .args([
            "--tcp-flags",
            "RST",
            "RST",
            "-m",
            "comment",
            "--comment",
            RST_RULE_COMMENT,
            "-j",
            "DROP",
        ])
        .status()
        .expect("run iptables");
    assert!(
        status.success() || action == "-D",
        "iptables {action} the held client's RST rule"
    );
}

/// Removes every RST rule a killed run left behind.
pub fn remove_rst_rules() {
    let rules = Command::new("iptables-save").args(["-t", "raw"]).output().unwrap();
    for line in String::from_utf8_lossy(&rules.stdout).lines() {
        if let Some(rule) = line.strip_prefix("-A ")
            && line.contains(RST_RULE_COMMENT)
        {
            let mut args = vec!["-t", "raw", "-D"];
            args.extend(rule.split_whitespace().map(|w| w.trim_matches('"')));
            let _ = Command::new("iptables").args(&args).status();
        }
    }
}

/// A NULL call to NFSv4 with AUTH_NONE, framed with its TCP record mark.
fn null_call(xid: u32) -> Vec<u8> {
    let words = [xid, 0, 2, NFS_PROGRAM, NFS_V4, 0, 0, 0, 0, 0];
    let body: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    let mark = 0x8000_0000 | body.len() as u32;
    mark.to_be_bytes().into_iter().chain(body).collect()
}

/// Whether `reply` answers `xid`: a REPLY, accepted, its verifier, and SUCCESS.
fn is_success(reply: &[u8], xid: u32) -> bool {
    let word = |i: usize| {
        reply
            .get(i * 4..i * 4 + 4)
            .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
    };
    let Some(verifier_length) = word(4) else { return false };
    let accept_stat = 5 + (verifier_length as usize).div_ceil(4);
    word(0) == Some(xid) && word(1) == Some(1) && word(2) == Some(0) && word(accept_stat) == Some(0)
}
