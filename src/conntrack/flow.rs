//! One tracked TCP flow, and the ctnetlink messages that list, delete and make flows (pure).
//!
//! A listing is one dump of one address family that the kernel itself filters down to TCP flows to
//! one port (`CTA_FILTER`, Linux 5.8 and later; an older kernel ignores the filter and the flows
//! are filtered here as well). A delete names the entry by its reply tuple, which carries the
//! backend the flow is bound to: an entry the client made since through the new rules has another
//! reply tuple and is left alone.

use std::net::{IpAddr, SocketAddr};

use netlink_packet_core::{
    NLA_F_NESTED, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, Protocol, Tuple,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily};

/// `CTA_FILTER` and its `CTA_FILTER_ORIG_FLAGS`: which fields of the original tuple a dump matches.
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_F_CTA_PROTO_NUM: u32 = 1 << 3;
const CTA_FILTER_F_CTA_PROTO_DST_PORT: u32 = 1 << 5;
/// The kernel's TCP conntrack states, by number (`enum tcp_conntrack`).
const TCP_STATES: [&str; 10] = [
    "NONE",
    "SYN_SENT",
    "SYN_RECV",
    "ESTABLISHED",
    "FIN_WAIT",
    "CLOSE_WAIT",
    "LAST_ACK",
    "TIME_WAIT",
    "CLOSE",
    "SYN_SENT2",
];
const TCP_ESTABLISHED: u8 = 3;

/// One tracked TCP flow: the tuple the client sent (`orig_*`) and the tuple the kernel expects
/// back, which after kube-proxy's DNAT names the backend the flow is bound to (`reply_src`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    pub orig_src: SocketAddr,
    pub orig_dst: SocketAddr,
    pub reply_src: SocketAddr,
    /// Where replies go: the client, or the node's address when kube-proxy masqueraded the flow.
    pub reply_dst: SocketAddr,
    /// The TCP state as conntrack names it (`ESTABLISHED`, `FIN_WAIT`, `SYN_SENT`, ...).
    pub state: &'static str,
}

impl Flow {
    /// Whether the kernel rewrote the destination: the flow was load-balanced to `reply_src`.
    pub fn is_translated(&self) -> bool {
        self.reply_src != self.orig_dst
    }
}

/// What one message from the kernel says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A tracked flow of a dump (`None`: not a TCP flow with both tuples).
    Flow(Option<Flow>),
    /// The end of a dump.
    Done,
    /// A request's answer: 0 when it succeeded, else the negative errno.
    Ack { sequence: u32, code: i32 },
}

/// A request to dump the TCP flows of one address family whose original destination port is
/// `port`.
pub fn dump_request(ipv6: bool, port: u16, sequence: u32) -> Vec<u8> {
    let attributes = vec![ConntrackAttribute::CtaTupleOrig(vec![Tuple::Proto(vec![
        ProtoTuple::Protocol(Protocol::Tcp),
        ProtoTuple::DestinationPort(port),
    ])])];
    let mut request = request(
        ipv6,
        ConntrackMessage::Get(attributes),
        NLM_F_REQUEST | NLM_F_DUMP,
        sequence,
    );
    // The crate marks only its own attributes nested, and the kernel requires the mark on this one.
    let flags = CTA_FILTER_F_CTA_PROTO_NUM | CTA_FILTER_F_CTA_PROTO_DST_PORT;
    let filter = nla(
        CTA_FILTER | NLA_F_NESTED,
        &nla(CTA_FILTER_ORIG_FLAGS, &flags.to_ne_bytes()),
    );
    request.extend_from_slice(&filter);
    let length = request.len() as u32;
    request[..4].copy_from_slice(&length.to_ne_bytes());
    request
}

/// A request to delete the entry `flow` was listed as, by its reply tuple.
pub fn delete_request(flow: &Flow, sequence: u32) -> Vec<u8> {
    let attributes = vec![ConntrackAttribute::CtaTupleReply(tuple(flow.reply_src, flow.reply_dst))];
    request(
        flow.orig_src.is_ipv6(),
        ConntrackMessage::Delete(attributes),
        NLM_F_REQUEST | NLM_F_ACK,
        sequence,
    )
}

/// A request to make an ESTABLISHED entry for `flow`, as the kernel has after a DNAT, that lives
/// `timeout_secs`: how the tests and the benchmark fill a table of their own.
pub fn new_request(flow: &Flow, timeout_secs: u32, sequence: u32) -> Vec<u8> {
    let attributes = vec![
        ConntrackAttribute::CtaTupleOrig(tuple(flow.orig_src, flow.orig_dst)),
        ConntrackAttribute::CtaTupleReply(tuple(flow.reply_src, flow.reply_dst)),
        ConntrackAttribute::CtaTimeout(timeout_secs),
        ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(vec![ProtoInfoTCP::State(TCP_ESTABLISHED)])]),
    ];
    request(
        flow.orig_src.is_ipv6(),
        ConntrackMessage::New(attributes),
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
        sequence,
    )
}

/// The messages in one datagram from the kernel.
pub fn replies(mut datagram: &[u8]) -> Result<Vec<Reply>, String> {
    let mut replies = Vec::new();
    while !datagram.is_empty() {
        let message = NetlinkMessage::<NetfilterMessage>::deserialize(datagram).map_err(|e| e.to_string())?;
        let length = (message.header.length as usize).next_multiple_of(4);
        if length == 0 {
            return Err("a netlink message of length 0".into());
        }
        replies.push(match message.payload {
            NetlinkPayload::Done(_) => Reply::Done,
            NetlinkPayload::Error(error) => Reply::Ack {
                sequence: message.header.sequence_number,
                code: error.code.map_or(0, |code| code.get()),
            },
            NetlinkPayload::InnerMessage(NetfilterMessage {
                inner: NetfilterMessageInner::Conntrack(ConntrackMessage::New(attributes)),
                ..
            }) => Reply::Flow(flow(&attributes)),
            _ => Reply::Flow(None),
        });
        datagram = datagram.get(length..).unwrap_or_default();
    }
    Ok(replies)
}

fn request(ipv6: bool, message: ConntrackMessage, flags: u16, sequence: u32) -> Vec<u8> {
    let family = if ipv6 {
        NetfilterProtoFamily::IPv6
    } else {
        NetfilterProtoFamily::IPv4
    };
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = sequence;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), message)),
    );
    packet.finalize();
    let mut buffer = vec![0; packet.buffer_len()];
    packet.serialize(&mut buffer);
    buffer
}

/// One attribute, header and padding included, as the kernel lays it out.
fn nla(kind: u16, value: &[u8]) -> Vec<u8> {
    let length = 4 + value.len();
    let mut bytes = Vec::with_capacity(length.next_multiple_of(4));
    bytes.extend_from_slice(&(length as u16).to_ne_bytes());
    bytes.extend_from_slice(&kind.to_ne_bytes());
    bytes.extend_from_slice(value);
    bytes.resize(length.next_multiple_of(4), 0);
    bytes
}

fn tuple(src: SocketAddr, dst: SocketAddr) -> Vec<Tuple> {
    vec![
        Tuple::Ip(vec![
            IPTuple::SourceAddress(src.ip()),
            IPTuple::DestinationAddress(dst.ip()),
        ]),
        Tuple::Proto(vec![
            ProtoTuple::Protocol(Protocol::Tcp),
            ProtoTuple::SourcePort(src.port()),
            ProtoTuple::DestinationPort(dst.port()),
        ]),
    ]
}

/// The flow a dump's message describes, if it is a TCP flow with both tuples.
fn flow(attributes: &[ConntrackAttribute]) -> Option<Flow> {
    let (mut orig, mut reply, mut state) = (None, None, "NONE");
    for attribute in attributes {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(t) => orig = tcp_endpoints(t),
            ConntrackAttribute::CtaTupleReply(t) => reply = tcp_endpoints(t),
            ConntrackAttribute::CtaProtoInfo(info) => state = tcp_state(info).unwrap_or(state),
            _ => {}
        }
    }
    let ((orig_src, orig_dst), (reply_src, reply_dst)) = (orig?, reply?);
    Some(Flow {
        orig_src,
        orig_dst,
        reply_src,
        reply_dst,
        state,
    })
}

/// A tuple's source and destination, if it is a TCP one.
fn tcp_endpoints(tuple: &[Tuple]) -> Option<(SocketAddr, SocketAddr)> {
    let (mut src, mut dst, mut sport, mut dport, mut tcp) = (None::<IpAddr>, None, None, None, false);
    for part in tuple {
        match part {
            Tuple::Ip(ips) => {
                for ip in ips {
                    match ip {
                        IPTuple::SourceAddress(a) => src = Some(*a),
                        IPTuple::DestinationAddress(a) => dst = Some(*a),
                        _ => {}
                    }
                }
            }
            Tuple::Proto(protos) => {
                for proto in protos {
                    match proto {
                        ProtoTuple::Protocol(p) => tcp = *p == Protocol::Tcp,
                        ProtoTuple::SourcePort(p) => sport = Some(*p),
                        ProtoTuple::DestinationPort(p) => dport = Some(*p),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    tcp.then_some(())?;
    Some((SocketAddr::new(src?, sport?), SocketAddr::new(dst?, dport?)))
}

fn tcp_state(info: &[ProtoInfo]) -> Option<&'static str> {
    info.iter().find_map(|info| match info {
        ProtoInfo::TCP(tcp) => tcp.iter().find_map(|t| match t {
            ProtoInfoTCP::State(state) => TCP_STATES.get(usize::from(*state)).copied(),
            _ => None,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_dump_asks_the_kernel_to_filter_on_the_protocol_and_port() {
        let request = dump_request(false, 2049, 7);
        let length = u32::from_ne_bytes(request[..4].try_into().unwrap());
        assert_eq!(length as usize, request.len(), "the header counts the filter");
        let filter = &request[request.len() - 12..];
        assert_eq!(
            u16::from_ne_bytes([filter[2], filter[3]]),
            CTA_FILTER | NLA_F_NESTED,
            "the kernel refuses a filter not marked nested"
        );
        let flags = u32::from_ne_bytes(filter[8..].try_into().unwrap());
        assert_eq!(flags, CTA_FILTER_F_CTA_PROTO_NUM | CTA_FILTER_F_CTA_PROTO_DST_PORT);
    }

    /// The kernel answers a dump with `IPCTNL_MSG_CT_NEW` messages: one made as the kernel makes
    /// it reads back as the flow, and the end of the dump as such.
    #[test]
    fn a_dumped_flow_reads_back_with_both_tuples_and_its_state() {
        let flow = Flow {
            orig_src: at("[fd00::1]:800"),
            orig_dst: at("[fd00:96::a]:2049"),
            reply_src: at("[fd00:211::2]:2049"),
            reply_dst: at("[fd00::1]:800"),
            state: "ESTABLISHED",
        };
        let mut datagram = new_request(&flow, 120, 1);
        let mut done =
            NetlinkMessage::<NetfilterMessage>::new(NetlinkHeader::default(), NetlinkPayload::Done(Default::default()));
        done.finalize();
        let start = datagram.len();
        datagram.resize(start + done.buffer_len(), 0);
        done.serialize(&mut datagram[start..]);
        assert_eq!(replies(&datagram).unwrap(), [Reply::Flow(Some(flow)), Reply::Done]);
    }
}
