//! NFSv4.1 COMPOUNDs over ONC RPC on one TCP connection (RFC 5531 record marking, AUTH_SYS as
//! root): the operations the stateful client uses, encoded and decoded.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::xdr::{Decoder, Encoder, Malformed};

const NFS_PROGRAM: u32 = 100_003;
const NFS_V4: u32 = 4;
const COMPOUND: u32 = 1;
const AUTH_SYS: u32 = 1;

pub const NFS4_OK: u32 = 0;
pub const NFS4ERR_STALE: u32 = 70;
pub const NFS4ERR_DENIED: u32 = 10010;
pub const NFS4ERR_GRACE: u32 = 10013;
pub const NFS4ERR_STALE_CLIENTID: u32 = 10022;
pub const NFS4ERR_NO_GRACE: u32 = 10033;
pub const NFS4ERR_RECLAIM_BAD: u32 = 10034;
pub const NFS4ERR_BADSESSION: u32 = 10052;
pub const NFS4ERR_COMPLETE_ALREADY: u32 = 10054;
pub const NFS4ERR_DEADSESSION: u32 = 10078;

/// Operation numbers (RFC 8881, section 16.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum OpCode {
    Close = 4,
    Getfh = 10,
    Lock = 12,
    Lockt = 13,
    Lookup = 15,
    Open = 18,
    Putfh = 22,
    Putrootfh = 24,
    Read = 25,
    Write = 38,
    ExchangeId = 42,
    CreateSession = 43,
    DestroySession = 44,
    Sequence = 53,
    DestroyClientid = 57,
    ReclaimComplete = 58,
}

/// Why a COMPOUND failed: the connection, a reply out of protocol, or an operation's status.
#[derive(Debug)]
pub enum Failure {
    Io(std::io::Error),
    Malformed(&'static str),
    Status {
        op: OpCode,
        status: u32,
    },
    /// The client's state is gone for good: why.
    Lost(String),
}

impl Failure {
    /// The operation's NFS status, if an operation failed.
    pub fn status(&self) -> Option<u32> {
        match self {
            Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Failure {
    fn from(err: std::io::Error) -> Self {
        Self::Io(err)
    }
}

impl From<Malformed> for Failure {
    fn from(err: Malformed) -> Self {
        Self::Malformed(err.0)
    }
}

/// A stateid4: its sequence number and the server's 12 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateId {
    pub seqid: u32,
    pub other: [u8; 12],
}

impl StateId {
    pub fn encode(&self, e: &mut Encoder) {
        e.u32(self.seqid).fixed(&self.other);
    }

    pub fn decode(d: &mut Decoder) -> Result<Self, Malformed> {
        let seqid = d.u32()?;
        let other = d.fixed(12)?.try_into().unwrap();
        Ok(Self { seqid, other })
    }
}

/// One connection from a fixed source port when given one (the kernel client keeps its
/// reserved port), closed abortively.
pub struct Connection {
    stream: TcpStream,
    xid: u32,
}

impl Connection {
    pub fn open(server: SocketAddr, source_port: Option<u16>, timeout: Duration) -> std::io::Result<Self> {
        let socket = Socket::new(Domain::for_address(server), Type::STREAM, Some(Protocol::TCP))?;
        if let Some(port) = source_port {
            socket.set_reuse_address(true)?;
            let local: SocketAddr = ([0, 0, 0, 0], port).into();
            socket.bind(&SockAddr::from(local))?;
        }
        socket.connect_timeout(&SockAddr::from(server), timeout)?;
        socket.set_read_timeout(Some(timeout))?;
        socket.set_write_timeout(Some(timeout))?;
        socket.set_linger(Some(Duration::ZERO))?;
        let xid = u32::from(source_port.unwrap_or(0)) << 16 | std::process::id() & 0xffff;
        Ok(Self {
            stream: socket.into(),
            xid,
        })
    }

    /// Sends one COMPOUND of `ops` (each its opcode and encoded arguments) and returns the reply's
    /// results from its first operation on, positioned for [`Results::next`].
    pub fn compound(&mut self, ops: &[(OpCode, Encoder)]) -> Result<Vec<u8>, Failure> {
        self.xid = self.xid.wrapping_add(1);
        let mut call = Encoder::default();
        call.u32(self.xid)
            .u32(0)
            .u32(2)
            .u32(NFS_PROGRAM)
            .u32(NFS_V4)
            .u32(COMPOUND);
        let mut cred = Encoder::default();
        cred.u32(0).opaque(b"svc-e2e").u32(0).u32(0).u32(0);
        call.u32(AUTH_SYS).opaque(&cred.0).u32(0).u32(0);
        call.opaque(b"").u32(1).u32(ops.len() as u32);
        for (op, args) in ops {
            call.u32(*op as u32).fixed(&args.0);
        }
        let mut record = ((call.0.len() as u32) | 0x8000_0000).to_be_bytes().to_vec();
        record.extend_from_slice(&call.0);
        self.stream.write_all(&record)?;
        let reply = self.read_record()?;
        let mut d = Decoder::new(&reply);
        let (xid, kind, accepted) = (d.u32()?, d.u32()?, d.u32()?);
        if xid != self.xid || kind != 1 || accepted != 0 {
            return Err(Failure::Malformed("not an accepted reply to this call"));
        }
        let (_flavor, _verifier, accept) = (d.u32()?, d.opaque()?, d.u32()?);
        if accept != 0 {
            return Err(Failure::Malformed("the RPC call was not executed"));
        }
        Ok(reply[reply.len() - d.remaining()..].to_vec())
    }

    fn read_record(&mut self) -> std::io::Result<Vec<u8>> {
        let mut reply = Vec::new();
        loop {
            let mut mark = [0u8; 4];
            self.stream.read_exact(&mut mark)?;
            let mark = u32::from_be_bytes(mark);
            let start = reply.len();
            reply.resize(start + (mark & 0x7fff_ffff) as usize, 0);
            self.stream.read_exact(&mut reply[start..])?;
            if mark & 0x8000_0000 != 0 {
                return Ok(reply);
            }
        }
    }
}

/// A COMPOUND reply's results, read one operation at a time.
pub struct Results<'a> {
    d: Decoder<'a>,
}

impl<'a> Results<'a> {
    pub fn new(reply: &'a [u8]) -> Result<Self, Failure> {
        let mut d = Decoder::new(reply);
        let (_status, _tag, _count) = (d.u32()?, d.opaque()?, d.u32()?);
        Ok(Self { d })
    }

    /// The results of a COMPOUND that began with a SEQUENCE, from the operation after it.
    pub fn sequenced(reply: &'a [u8]) -> Result<Self, Failure> {
        let mut results = Self::new(reply)?;
        // sessionid, sequenceid, slotid, highest and target highest slotid, status flags.
        results.next(OpCode::Sequence)?.fixed(16 + 5 * 4)?;
        Ok(results)
    }

    /// The next result, which must be `op`'s and succeed: its decoder, at its result body.
    pub fn next(&mut self, op: OpCode) -> Result<&mut Decoder<'a>, Failure> {
        let status = self.next_status(op)?;
        if status != NFS4_OK {
            return Err(Failure::Status { op, status });
        }
        Ok(&mut self.d)
    }

    /// The next result's status, which must be `op`'s; the decoder then is at its body.
    pub fn next_status(&mut self, op: OpCode) -> Result<u32, Failure> {
        let (code, status) = (self.d.u32()?, self.d.u32()?);
        if code != op as u32 {
            return Err(Failure::Malformed("results out of the COMPOUND's order"));
        }
        Ok(status)
    }
}
