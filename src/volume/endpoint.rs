//! NFS endpoints: `IP:port`, with IPv6 in brackets (`[fd00::1]:2049`). Hostnames are refused: the
//! endpoint goes into Endpoints and EndpointSlices, which only take IP addresses.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NfsEndpoint {
    pub ip: IpAddr,
    pub port: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error("{0:?} is not an NFS endpoint: expected IP:port, e.g. 10.0.0.5:2049 or [fd00::5]:2049")]
    Malformed(String),
    #[error("{0:?} names a host, not an IP address: expected IP:port, e.g. 10.0.0.5:2049")]
    Hostname(String),
    #[error("{0:?} has no usable port: expected a port from 1 to 65535 after the last ':'")]
    BadPort(String),
    #[error("{0:?} is IPv6 without brackets: write it as [address]:port, e.g. [fd00::5]:2049")]
    UnbracketedIpv6(String),
    #[error(
        "{0:?} is not an address NFS clients on other nodes can reach (loopback, link-local, unspecified, multicast or broadcast): publish the NFS server's node or pod IP"
    )]
    Unusable(String),
}

impl NfsEndpoint {
    pub fn new(ip: IpAddr, port: u16) -> Self {
        Self { ip, port }
    }

    pub fn is_ipv6(&self) -> bool {
        self.ip.is_ipv6()
    }
}

impl FromStr for NfsEndpoint {
    type Err = EndpointError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let text = raw.trim();
        let owned = || raw.to_owned();
        if text.is_empty() {
            return Err(EndpointError::Malformed(owned()));
        }
        if let Ok(addr) = text.parse::<SocketAddr>() {
            if addr.port() == 0 {
                return Err(EndpointError::BadPort(owned()));
            }
            let ip = addr.ip();
            if !reachable_by_clients(ip) {
                return Err(EndpointError::Unusable(owned()));
            }
            return Ok(Self::new(ip, addr.port()));
        }
        if text.parse::<IpAddr>().is_ok_and(|ip| ip.is_ipv6()) {
            return Err(EndpointError::UnbracketedIpv6(owned()));
        }
        if text.parse::<IpAddr>().is_ok() {
            return Err(EndpointError::BadPort(owned()));
        }
        if text.starts_with('[') {
            return Err(bracketed_error(text, owned()));
        }
        let (host, port) = match text.rsplit_once(':') {
            Some(parts) => parts,
            None => return Err(EndpointError::Malformed(owned())),
        };
        if host.contains(':') {
            return Err(if host.parse::<Ipv6Addr>().is_ok() {
                EndpointError::UnbracketedIpv6(owned())
            } else {
                EndpointError::Malformed(owned())
            });
        }
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.parse::<IpAddr>().is_ok() || port.parse::<u32>().is_err() {
            return Err(EndpointError::BadPort(owned()));
        }
        if host.is_empty() || host.chars().all(|c| c.is_ascii_digit() || c == '.') {
            return Err(EndpointError::Malformed(owned()));
        }
        Err(EndpointError::Hostname(owned()))
    }
}

/// Why `[…]…` is not a usable endpoint (it did not parse as `[IPv6]:port`): a zone (`%eth0`)
/// makes it link-local, a valid address without a usable port lacks the port, anything else is
/// not an address at all.
fn bracketed_error(text: &str, raw: String) -> EndpointError {
    let Some(inside) = text
        .strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
        .map(|(inside, _)| inside)
    else {
        return EndpointError::Malformed(raw);
    };
    if inside.contains('%') {
        return EndpointError::Unusable(raw);
    }
    match inside.parse::<Ipv6Addr>() {
        Ok(_) => EndpointError::BadPort(raw),
        Err(_) => EndpointError::Malformed(raw),
    }
}

/// Whether NFS clients on other nodes could reach a server at `ip`: not loopback or link-local
/// (each node has its own), not unspecified, multicast or broadcast. An IPv4 address written as
/// IPv6 (`::ffff:127.0.0.1`) is judged as the IPv4 address it is.
fn reachable_by_clients(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            !(v4.is_loopback() || v4.is_link_local() || v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast())
        }
        IpAddr::V6(v6) => !(v6.is_loopback() || v6.is_unicast_link_local() || v6.is_unspecified() || v6.is_multicast()),
    }
}

impl fmt::Display for NfsEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip {
            IpAddr::V4(ip) => write!(f, "{ip}:{}", self.port),
            IpAddr::V6(ip) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_addresses() {
        let cases = [
            ("10.0.0.5:2049", "10.0.0.5:2049"),
            (" 192.168.1.7:30000 ", "192.168.1.7:30000"),
            ("[fd00::5]:2049", "[fd00::5]:2049"),
            ("[FD00:0::5]:1", "[fd00::5]:1"),
        ];
        for (input, printed) in cases {
            let endpoint: NfsEndpoint = input.parse().unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(endpoint.to_string(), printed, "{input}");
        }
    }

    #[test]
    fn refuses_what_is_not_ip_and_port() {
        use EndpointError::*;
        type Expected = fn(String) -> EndpointError;
        let cases: [(&str, Expected); 20] = [
            ("", Malformed),
            ("nfs.example.com:2049", Hostname),
            ("nfs-server:2049", Hostname),
            ("10.0.0.5", BadPort),
            ("10.0.0.5:", BadPort),
            ("10.0.0.5:0", BadPort),
            ("10.0.0.5:65536", BadPort),
            ("10.0.0.5:nfs", BadPort),
            ("fd00::5", UnbracketedIpv6),
            ("fd00::5:2049", UnbracketedIpv6),
            ("0.0.0.0:2049", Unusable),
            ("[::]:2049", Unusable),
            ("255.255.255.255:2049", Unusable),
            ("127.0.0.1:2049", Unusable),
            ("[::1]:2049", Unusable),
            ("[::ffff:127.0.0.1]:2049", Unusable),
            ("169.254.10.1:2049", Unusable),
            ("[fe80::1]:2049", Unusable),
            ("224.0.0.251:2049", Unusable),
            ("just words", Malformed),
        ];
        for (input, expected) in cases {
            assert_eq!(
                input.parse::<NfsEndpoint>(),
                Err(expected(input.to_owned())),
                "{input:?}"
            );
        }
    }

    #[test]
    fn error_messages_say_what_is_expected() {
        let err = "nfs.example.com:2049".parse::<NfsEndpoint>().unwrap_err().to_string();
        assert!(err.contains("nfs.example.com:2049") && err.contains("IP:port"), "{err}");
    }
}
