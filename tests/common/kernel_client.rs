//! The Linux kernel's own NFS client on the data path: Debian's cloud kernel booted under qemu
//! (software emulation) as a pod behind the kube-proxy node, its network card a tap device on the
//! host, so that its packets to the claim's ClusterIP pass the host's kube-proxy rules and
//! conntrack table as a pod's do. The guest runs `probe` (`kernel_client/probe.c`), which does
//! what the host asks on the guest's second serial line through the kernel's NFS client and
//! answers each request with one line; the first serial line is the kernel's console, kept in a
//! file, where the client's own complaints (lost locks, a server scope mismatch) are read.
//!
//! The image (`hack/kernel-client.sh`, run by `hack/tools.sh`) is in the tools folder as
//! `kernel-client/`. What the guest leaves out: a real init system and `mount.nfs` (the probe
//! calls mount(2) with the options `mount.nfs` would pass, the address given), and more than
//! one CPU.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::datapath::must;

/// The guest's address and its tap's on the host: inside the fenced node range, on a link whose
/// name the fence lets through.
pub const GUEST_IP: &str = "10.211.250.2";
const TAP_IP: &str = "10.211.250.1";
/// How long the guest may take to boot and answer under software emulation on a busy machine.
const BOOT_TIMEOUT: Duration = Duration::from_secs(90);

/// What the kernel prints when it gives up state across a server change: any of these on the
/// console is a loss.
const KERNEL_COMPLAINTS: [&str; 4] = ["lost", "server scope", "unhandled error", "reclaim failed"];

/// Answers received, per tag, in order.
#[derive(Default)]
struct Answers {
    by_tag: HashMap<String, Vec<String>>,
}

pub struct KernelGuest {
    qemu: Child,
    input: Mutex<ChildStdin>,
    answers: Arc<(Mutex<Answers>, Condvar)>,
    console: PathBuf,
    tap: String,
}

impl KernelGuest {
    /// Boots the guest behind tap `tap` (made here; the host links named in `forwarding` forward
    /// its packets) and waits for its probe.
    pub fn boot(tap: &str, forwarding: &[&str], dir: &Path) -> Self {
        let image = image_dir();
        assert!(
            image.join("initrd.gz").exists(),
            "no kernel client image in {}: run hack/tools.sh",
            image.display()
        );
        must("ip", &["tuntap", "add", "dev", tap, "mode", "tap"]);
        must("ip", &["addr", "add", &format!("{TAP_IP}/24"), "dev", tap]);
        must("ip", &["link", "set", tap, "up"]);
        // Forwarding on these links alone: the machine's own setting stays as it is.
        for link in forwarding.iter().chain([&tap]) {
            must("sysctl", &["-q", "-w", &format!("net.ipv4.conf.{link}.forwarding=1")]);
        }
        let console = dir.join("kernel-console.log");
        let append = format!(
            "console=ttyS0 panic=-1 svc.ip={GUEST_IP}/24 svc.gw={TAP_IP} svc.host=kernel-client nfs.nfs4_unique_id={tap}-{}",
            std::process::id()
        );
        let mut qemu = Command::new("qemu-system-x86_64")
            .args([
                "-accel",
                "tcg",
                "-m",
                "512",
                "-display",
                "none",
                "-monitor",
                "none",
                "-no-reboot",
            ])
            .arg("-kernel")
            .arg(image.join("vmlinuz"))
            .arg("-initrd")
            .arg(image.join("initrd.gz"))
            .args(["-append", &append])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .args(["-chardev", "stdio,id=ctl,signal=off", "-serial", "chardev:ctl"])
            .args(["-netdev", &format!("tap,id=n0,ifname={tap},script=no,downscript=no")])
            .args(["-device", "virtio-net-pci,netdev=n0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start qemu-system-x86_64 (Debian package qemu-system-x86, installed by hack/tools.sh)");
        let input = qemu.stdin.take().unwrap();
        let answers = Arc::new((Mutex::new(Answers::default()), Condvar::new()));
        read_answers(qemu.stdout.take().unwrap(), answers.clone());
        let guest = Self {
            qemu,
            input: Mutex::new(input),
            answers,
            console,
            tap: tap.to_owned(),
        };
        let started = Instant::now();
        let ready = guest.wait("probe", 0, BOOT_TIMEOUT);
        assert!(
            ready.is_some(),
            "the kernel client did not boot within {} s; its console: {}",
            BOOT_TIMEOUT.as_secs(),
            guest.console.display()
        );
        eprintln!(
            "kernel client ({}) booted in {} ms",
            std::fs::read_to_string(image.join("kernel")).unwrap_or_default().trim(),
            started.elapsed().as_millis()
        );
        guest
    }

    /// Mounts `server`'s export at /mnt with `options` (besides the address and TCP).
    pub fn mount(&self, server: &str, port: u16, options: &str) -> Result<(), String> {
        let all = format!("{options},addr={server},port={port},proto=tcp");
        let line = format!("mount m {server}:{} /mnt {all}", super::datapath::EXPORT);
        self.ask("m", &line, Duration::from_secs(60))
            .unwrap_or_else(|| Err("no answer".into()))?;
        eprintln!("kernel client mounted {server}:{} with {all}", super::datapath::EXPORT);
        Ok(())
    }

    /// Sends `line` and waits up to `within` for `tag`'s next answer: `Ok(rest)` or
    /// `Err(what failed)`; `None` if none came in time (it may still come: see [`Self::wait`]).
    pub fn ask(&self, tag: &str, line: &str, within: Duration) -> Option<Result<String, String>> {
        let seen = self.count(tag);
        self.send(line);
        self.wait(tag, seen, within)
    }

    pub fn send(&self, line: &str) {
        let mut input = self.input.lock().unwrap();
        writeln!(input, "{line}").expect("the kernel client's control line");
        input.flush().unwrap();
    }

    /// How many answers `tag` has had.
    pub fn count(&self, tag: &str) -> usize {
        let answers = self.answers.0.lock().unwrap();
        answers.by_tag.get(tag).map_or(0, Vec::len)
    }

    /// Waits up to `within` for `tag`'s answer number `index` (0-based).
    pub fn wait(&self, tag: &str, index: usize, within: Duration) -> Option<Result<String, String>> {
        let (lock, arrived) = &*self.answers;
        let deadline = Instant::now() + within;
        let mut answers = lock.lock().unwrap();
        loop {
            if let Some(line) = answers.by_tag.get(tag).and_then(|all| all.get(index)) {
                return Some(match line.strip_prefix("ok ") {
                    Some(rest) => Ok(rest.to_owned()),
                    None => Err(line.clone()),
                });
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            answers = arrived.wait_timeout(answers, left).unwrap().0;
        }
    }

    /// The kernel's console lines that say it gave state up.
    pub fn complaints(&self) -> Vec<String> {
        let console = std::fs::read_to_string(&self.console).unwrap_or_default();
        console
            .lines()
            .filter(|line| line.contains("NFS") || line.contains("nfs") || line.contains("lockd"))
            .filter(|line| KERNEL_COMPLAINTS.iter().any(|c| line.contains(c)))
            .map(str::to_owned)
            .collect()
    }

    pub fn console(&self) -> &Path {
        &self.console
    }
}

impl Drop for KernelGuest {
    fn drop(&mut self) {
        let _ = self.qemu.kill();
        let _ = self.qemu.wait();
        let _ = Command::new("ip").args(["link", "del", &self.tap]).status();
    }
}

/// Sorts the probe's answers by tag as they arrive.
fn read_answers(output: std::process::ChildStdout, answers: Arc<(Mutex<Answers>, Condvar)>) {
    std::thread::spawn(move || {
        for line in BufReader::new(output).lines() {
            let Ok(line) = line else { break };
            let line = line.trim_end_matches('\r');
            let Some((tag, rest)) = line.split_once(' ') else {
                continue;
            };
            let (lock, arrived) = &*answers;
            let mut all = lock.lock().unwrap();
            all.by_tag.entry(tag.to_owned()).or_default().push(rest.to_owned());
            arrived.notify_all();
        }
    });
}

fn image_dir() -> PathBuf {
    let bin = std::env::var("SVC_TOOLS_BIN").expect("SVC_TOOLS_BIN (hack/with-cluster.sh sets it)");
    Path::new(&bin).join("kernel-client")
}
