//! The kernel's connection-tracking table, through the `conntrack` tool (conntrack-tools): list
//! the TCP flows to a port, delete one flow by its original tuple and its backend. Parsing is pure; the tool is
//! run with a timeout.

use std::net::{IpAddr, SocketAddr};
use std::process::Stdio;
use std::time::Duration;

/// One tracked TCP flow: the tuple the client sent (`orig_*`) and the tuple the kernel expects
/// back, which after kube-proxy's DNAT names the backend the flow is bound to (`reply_src`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flow {
    pub orig_src: SocketAddr,
    pub orig_dst: SocketAddr,
    pub reply_src: SocketAddr,
    /// The TCP state as conntrack names it (`ESTABLISHED`, `FIN_WAIT`, `SYN_SENT`, ...).
    pub state: String,
}

impl Flow {
    /// Whether the kernel rewrote the destination: the flow was load-balanced to `reply_src`.
    pub fn is_translated(&self) -> bool {
        self.reply_src != self.orig_dst
    }
}

/// The flows in `conntrack -L` output, one per line; lines that do not read as a TCP flow with
/// both tuples are passed over.
pub fn parse_flows(text: &str) -> Vec<Flow> {
    text.lines().filter_map(parse_flow).collect()
}

fn parse_flow(line: &str) -> Option<Flow> {
    let mut words = line.split_whitespace();
    // `tcp 6 <timeout> <state> src=...`, or with `-o extended` a family first.
    let mut word = words.next()?;
    if word == "ipv4" || word == "ipv6" {
        words.next()?;
        word = words.next()?;
    }
    if word != "tcp" {
        return None;
    }
    let state = words.clone().nth(2).filter(|w| !w.contains('='))?.to_owned();
    let mut fields = words.filter_map(|w| w.split_once('='));
    let mut tuple = || -> Option<(SocketAddr, SocketAddr)> {
        let mut take = |key: &str| fields.find(|(k, _)| *k == key).map(|(_, v)| v);
        let (src, dst) = (
            take("src")?.parse::<IpAddr>().ok()?,
            take("dst")?.parse::<IpAddr>().ok()?,
        );
        let (sport, dport) = (take("sport")?.parse().ok()?, take("dport")?.parse().ok()?);
        Some((SocketAddr::new(src, sport), SocketAddr::new(dst, dport)))
    };
    let (orig_src, orig_dst) = tuple()?;
    let (reply_src, _) = tuple()?;
    Some(Flow {
        orig_src,
        orig_dst,
        reply_src,
        state,
    })
}

/// How many flows a `conntrack -D` reported deleted ("N flow entries have been deleted").
pub fn parse_deleted(stderr: &str) -> Option<u64> {
    stderr
        .lines()
        .find(|line| line.contains("flow entries have been deleted") || line.contains("flow entry has been deleted"))
        .and_then(|line| line.split_whitespace().rev().find_map(|w| w.parse().ok()))
}

/// The `conntrack` tool.
#[derive(Clone, Debug)]
pub struct Conntrack {
    pub binary: String,
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TableError {
    #[error("cannot run {binary}: {source} (the image carries conntrack-tools; the pod needs NET_ADMIN)")]
    Spawn { binary: String, source: std::io::Error },
    #[error("{binary} {args} took longer than {timeout:?}")]
    Timeout {
        binary: String,
        args: String,
        timeout: Duration,
    },
    #[error("{binary} {args} failed: {stderr}")]
    Failed {
        binary: String,
        args: String,
        stderr: String,
    },
}

fn family(ipv6: bool) -> &'static str {
    if ipv6 { "ipv6" } else { "ipv4" }
}

impl Conntrack {
    /// The TCP flows whose original destination port is `port`, in one address family.
    pub async fn list(&self, ipv6: bool, port: u16) -> Result<Vec<Flow>, TableError> {
        let port = port.to_string();
        let (_, stdout) = self
            .run(
                &["-L", "-f", family(ipv6), "-p", "tcp", "--orig-port-dst", &port],
                false,
            )
            .await?;
        Ok(parse_flows(&stdout))
    }

    /// Deletes the one flow with `flow`'s original tuple bound to `flow`'s backend (its reply
    /// source); how many entries went (0: gone already). A client that reconnected from the same
    /// port since the listing has a new entry with the same original tuple bound to another
    /// backend: the reply source spares it.
    pub async fn delete(&self, flow: &Flow) -> Result<u64, TableError> {
        let (src, dst, reply) = (flow.orig_src, flow.orig_dst, flow.reply_src);
        let [src_ip, dst_ip, reply_ip] = [src, dst, reply].map(|a| a.ip().to_string());
        let [sport, dport, reply_port] = [src, dst, reply].map(|a| a.port().to_string());
        let args = [
            "-D",
            "-f",
            family(src.is_ipv6()),
            "-p",
            "tcp",
            "--orig-src",
            &src_ip,
            "--orig-dst",
            &dst_ip,
            "--orig-port-src",
            &sport,
            "--orig-port-dst",
            &dport,
            "--reply-src",
            &reply_ip,
            "--reply-port-src",
            &reply_port,
        ];
        // conntrack exits 1 when nothing matched: the flow ended on its own meanwhile.
        let (stderr, _) = self.run(&args, true).await?;
        Ok(parse_deleted(&stderr).unwrap_or(0))
    }

    /// Runs the tool; its stderr and stdout. `nothing_is_fine`: an exit status of 1 with "0 flow
    /// entries" is a success.
    async fn run(&self, args: &[&str], nothing_is_fine: bool) -> Result<(String, String), TableError> {
        let joined = args.join(" ");
        let child = tokio::process::Command::new(&self.binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| TableError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
        let output = tokio::time::timeout(self.timeout, child.wait_with_output())
            .await
            .map_err(|_| TableError::Timeout {
                binary: self.binary.clone(),
                args: joined.clone(),
                timeout: self.timeout,
            })?
            .map_err(|source| TableError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        let matched_nothing = nothing_is_fine && output.status.code() == Some(1) && parse_deleted(&stderr) == Some(0);
        if !output.status.success() && !matched_nothing {
            return Err(TableError::Failed {
                binary: self.binary.clone(),
                args: joined,
                stderr: stderr.trim().to_owned(),
            });
        }
        Ok((stderr, String::from_utf8_lossy(&output.stdout).into_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTED: &str = "\
tcp      6 86390 ESTABLISHED src=10.211.0.1 dst=10.96.0.10 sport=790 dport=2049 src=10.211.1.2 dst=10.211.0.1 sport=2049 dport=790 [ASSURED] mark=0 use=1
tcp      6 110 FIN_WAIT src=10.211.0.1 dst=10.96.0.10 sport=791 dport=2049 src=10.211.1.2 dst=10.211.0.1 sport=2049 dport=791 [ASSURED] mark=0 use=1
tcp      6 118 SYN_SENT src=10.211.0.1 dst=10.96.0.10 sport=792 dport=2049 [UNREPLIED] src=10.211.2.2 dst=10.211.0.1 sport=2049 dport=792 mark=0 use=1
ipv6     10 tcp      6 299 ESTABLISHED src=fd00::1 dst=fd00:96::a sport=800 dport=2049 src=fd00:211::2 dst=fd00::1 sport=2049 dport=800 [ASSURED] mark=0 use=1
udp      17 29 src=10.0.0.1 dst=10.96.0.10 sport=53 dport=2049 [UNREPLIED] src=10.96.0.10 dst=10.0.0.1 sport=2049 dport=53 mark=0 use=1
not a flow
";

    fn at(text: &str) -> SocketAddr {
        text.parse().unwrap()
    }

    #[test]
    fn flows_are_read_with_both_tuples_and_their_state() {
        let flows = parse_flows(LISTED);
        assert_eq!(flows.len(), 4, "{flows:?}");
        assert_eq!(
            flows[0],
            Flow {
                orig_src: at("10.211.0.1:790"),
                orig_dst: at("10.96.0.10:2049"),
                reply_src: at("10.211.1.2:2049"),
                state: "ESTABLISHED".into(),
            }
        );
        assert_eq!(flows[1].state, "FIN_WAIT");
        assert_eq!(
            flows[2].reply_src,
            at("10.211.2.2:2049"),
            "an unreplied flow has its reply tuple too"
        );
        assert_eq!(flows[3].orig_dst, at("[fd00:96::a]:2049"));
        assert_eq!(flows[3].reply_src, at("[fd00:211::2]:2049"));
        assert!(flows.iter().all(Flow::is_translated));
    }

    /// A network namespace of the test's own, so that its conntrack table is the test's alone,
    /// and the `conntrack` tool run inside it; removed on drop.
    struct OwnTable {
        netns: String,
        tool: Conntrack,
    }

    impl OwnTable {
        fn new(name: &str) -> Self {
            let netns = format!("svcct-{name}-{}", std::process::id());
            let made = std::process::Command::new("ip").args(["netns", "add", &netns]).status();
            assert!(made.is_ok_and(|s| s.success()), "ip netns add {netns} (needs root)");
            let script = std::env::temp_dir().join(format!("{netns}.sh"));
            std::fs::write(
                &script,
                format!("#!/bin/sh\nexec ip netns exec {netns} conntrack \"$@\"\n"),
            )
            .unwrap();
            std::process::Command::new("chmod")
                .arg("+x")
                .arg(&script)
                .status()
                .unwrap();
            let tool = Conntrack {
                binary: script.display().to_string(),
                timeout: Duration::from_secs(5),
            };
            Self { netns, tool }
        }

        /// Makes an ESTABLISHED entry for `flow`, as the kernel would have after a DNAT.
        fn insert(&self, flow: &Flow) {
            let (src, dst, reply) = (flow.orig_src, flow.orig_dst, flow.reply_src);
            let args = [
                "-I",
                "-p",
                "tcp",
                "-s",
                &src.ip().to_string(),
                "-d",
                &dst.ip().to_string(),
                "--sport",
                &src.port().to_string(),
                "--dport",
                &dst.port().to_string(),
                "-r",
                &reply.ip().to_string(),
                "-q",
                &src.ip().to_string(),
                "--reply-port-src",
                &reply.port().to_string(),
                "--reply-port-dst",
                &src.port().to_string(),
                "--state",
                "ESTABLISHED",
                "-t",
                "120",
                "-u",
                "ASSURED",
            ];
            let made = std::process::Command::new(&self.tool.binary)
                .args(args)
                .output()
                .unwrap();
            assert!(
                made.status.success(),
                "conntrack -I: {}",
                String::from_utf8_lossy(&made.stderr)
            );
        }
    }

    impl Drop for OwnTable {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.netns])
                .status();
            let _ = std::fs::remove_file(&self.tool.binary);
        }
    }

    /// A client that reconnected from its port between the sweep's listing and its delete has a
    /// fresh entry with the same original tuple, bound to the new backend: the delete must spare
    /// it (only the entry bound to the old backend is stranded), and still take a stranded one.
    #[tokio::test]
    #[ignore = "needs root (a network namespace and its conntrack table): run `make test`"]
    async fn a_delete_spares_the_fresh_entry_of_a_client_that_reconnected_from_its_port() {
        let table = OwnTable::new("fresh");
        let listed = Flow {
            orig_src: at("10.211.0.1:790"),
            orig_dst: at("10.96.0.10:2049"),
            reply_src: at("10.211.1.2:2049"),
            state: "CLOSE".into(),
        };
        let fresh = Flow {
            reply_src: at("10.211.2.2:2049"),
            state: "ESTABLISHED".into(),
            ..listed.clone()
        };
        table.insert(&fresh);
        assert_eq!(
            table.tool.delete(&listed).await.unwrap(),
            0,
            "the fresh entry is not stranded"
        );
        let left = table.tool.list(false, 2049).await.unwrap();
        assert_eq!(left.iter().map(|f| f.reply_src).collect::<Vec<_>>(), [fresh.reply_src]);

        let stranded = Flow {
            orig_src: at("10.211.0.1:791"),
            ..listed
        };
        table.insert(&stranded);
        assert_eq!(table.tool.delete(&stranded).await.unwrap(), 1, "a stranded entry goes");
    }

    #[test]
    fn the_deleted_count_is_read_from_the_summary() {
        assert_eq!(
            parse_deleted("conntrack v1.4.7 (conntrack-tools): 3 flow entries have been deleted.\n"),
            Some(3)
        );
        assert_eq!(
            parse_deleted("conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n"),
            Some(0)
        );
        assert_eq!(
            parse_deleted("conntrack v1.4.7 (conntrack-tools): operation failed\n"),
            None
        );
    }
}
