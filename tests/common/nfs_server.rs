//! One simulated node's NFS server as the install guide runs it: nfs-ganesha with the guide's
//! template in the node's network namespace, on the drbd-reactor path under the guide's
//! `shared-volume-serve` (the server unit's own bounded restarts), and the rule by which
//! drbd-reactor's promoter gives a resource up when that unit fails.

use std::ffi::OsString;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const INSTALL_GUIDE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/how-to/install.md");
/// The guide's bounded-restart script, as the server unit's `ExecStart=` names it.
const SERVE: &str = "/usr/local/sbin/shared-volume-serve";

/// One node's NFS server, ready to start: in the node's network namespace, with its configuration.
pub struct NfsServer {
    pub netns: String,
    /// The node's hostname, in a UTS namespace of the server's own (with the node's own
    /// /etc/hosts): ganesha derives its default server scope from it.
    pub hostname: String,
    pub config: PathBuf,
    pub state: PathBuf,
    pub address: SocketAddr,
    /// Run under the install guide's `shared-volume-serve`, as its server unit runs nfs-ganesha
    /// (the drbd-reactor path); otherwise nfs-ganesha is the unit's process itself.
    pub under_serve: bool,
}

impl NfsServer {
    /// Starts the server's unit and waits until nfs-ganesha accepts connections.
    pub fn start(self) -> ServerUnit {
        let process = self
            .unit_command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start ganesha.nfsd (Debian package nfs-ganesha)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !answers(self.address) {
            assert!(
                Instant::now() < deadline,
                "NFS server of {} not listening after 20 s; see {}",
                self.netns,
                self.state.join("ganesha.log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        ServerUnit {
            process,
            pid_file: self.pid_file(),
        }
    }

    /// What the unit runs: nfs-ganesha on the node, under `shared-volume-serve` if it is.
    fn unit_command(&self) -> Command {
        let ganesha = self.ganesha_command();
        if !self.under_serve {
            let mut command = Command::new(&ganesha[0]);
            command.args(&ganesha[1..]).stderr(Stdio::null());
            return command;
        }
        let script = self.state.join("shared-volume-serve");
        std::fs::write(&script, serve_script()).unwrap();
        let (restarts, window) = serve_limits();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.serve_log())
            .unwrap();
        let mut command = Command::new("sh");
        command
            .arg(script)
            .args([restarts.to_string(), window.to_string()])
            .args(&ganesha)
            .stderr(log);
        command
    }

    /// nfs-ganesha in the foreground in the node's namespace, with the node's hostname.
    fn ganesha_command(&self) -> Vec<OsString> {
        // A node names itself in its own /etc/hosts: ganesha's ID mapper looks its hostname up
        // at start (an unresolvable one costs it a 10 s DNS timeout).
        let hosts = self.state.join("hosts");
        let ip = self.address.ip();
        std::fs::write(&hosts, format!("127.0.0.1 localhost\n{ip} {}\n", self.hostname)).unwrap();
        let on_the_node = "hostname \"$0\" && mount --bind \"$1\" /etc/hosts && shift && exec ganesha.nfsd \"$@\"";
        let words = ["ip", "netns", "exec", &self.netns]
            .into_iter()
            .chain(["unshare", "--uts", "--mount", "--propagation", "private", "--"])
            .chain(["sh", "-c", on_the_node, &self.hostname])
            .map(OsString::from);
        let mut command: Vec<OsString> = words.collect();
        command.push(hosts.into());
        command.extend(["-F", "-N", "NIV_EVENT"].map(OsString::from));
        let paths = [
            ("-f", self.config.clone()),
            ("-L", self.state.join("ganesha.log")),
            ("-p", self.pid_file()),
        ];
        for (flag, path) in paths {
            command.extend([OsString::from(flag), path.into_os_string()]);
        }
        command
    }

    fn pid_file(&self) -> PathBuf {
        self.state.join("ganesha.pid")
    }

    /// What `shared-volume-serve` says when it starts the server again or gives it up.
    pub fn serve_log(&self) -> PathBuf {
        self.state.join("serve.log")
    }
}

/// A node's NFS server unit while it runs: its process (nfs-ganesha, or `shared-volume-serve`
/// running it) and the pid file nfs-ganesha writes.
pub struct ServerUnit {
    process: Child,
    pid_file: PathBuf,
}

impl ServerUnit {
    /// nfs-ganesha dies (SIGKILL) and the unit's process is left alone, as a server that
    /// crashes; whether one was running.
    pub fn crash(&self) -> bool {
        running_ganesha(&self.pid_file).is_some_and(|pid| signal("-KILL", pid))
    }

    /// How the unit's process ended, once it has.
    pub fn ended(&mut self) -> Option<ExitStatus> {
        self.process.try_wait().ok().flatten()
    }

    /// The unit's process and nfs-ganesha die at once (SIGKILL), as on a node powered off: no
    /// shutdown runs, no restart either.
    pub fn kill(mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        if let Some(pid) = running_ganesha(&self.pid_file) {
            signal("-KILL", pid);
        }
    }

    /// Stopped as systemd stops the unit: SIGTERM to its process (which `shared-volume-serve`
    /// passes on), nfs-ganesha shuts down in order, keeping its clients' records; SIGKILL after
    /// `patience`. Whether it ended by itself.
    pub fn stop_within(mut self, patience: Duration) -> bool {
        let ended = stop_within(&mut self.process, patience);
        if !ended {
            self.kill();
        }
        ended
    }
}

/// Sends SIGTERM, and SIGKILL after `patience`; whether it had ended by itself.
pub fn stop_within(child: &mut Child, patience: Duration) -> bool {
    signal("-TERM", child.id());
    let deadline = Instant::now() + patience;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// Whether something accepts connections at `address`.
pub fn answers(address: SocketAddr) -> bool {
    TcpStream::connect_timeout(&address, Duration::from_millis(200)).is_ok()
}

/// The nfs-ganesha whose pid `pid_file` holds, while it runs.
fn running_ganesha(pid_file: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state …`; a zombie has ended.
    let (comm, rest) = stat.split_once(") ")?;
    (comm.ends_with("(ganesha.nfsd") && !rest.starts_with('Z')).then_some(pid)
}

/// Sends `kill <which> <pid>`; whether it was delivered.
pub fn signal(which: &str, pid: u32) -> bool {
    Command::new("kill")
        .args([which, &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The code block that follows `marker` in the install guide, read once per marker and test
/// process: the tests run what users install.
fn guide_block(marker: &'static str) -> &'static str {
    static BLOCKS: std::sync::Mutex<Vec<(&str, &str)>> = std::sync::Mutex::new(Vec::new());
    let mut blocks = BLOCKS.lock().unwrap();
    if let Some((_, block)) = blocks.iter().find(|(m, _)| *m == marker) {
        return block;
    }
    let guide = std::fs::read_to_string(INSTALL_GUIDE).expect("the install guide");
    let block = guide
        .split(marker)
        .nth(1)
        .and_then(|after| after.split("```").nth(1))
        .and_then(|fenced| fenced.split_once('\n'))
        .unwrap_or_else(|| panic!("the install guide gives {marker} in a code block"))
        .1
        .trim()
        .to_owned();
    let block: &'static str = Box::leak(block.into_boxed_str());
    blocks.push((marker, block));
    block
}

/// The install guide's `shared-volume-serve`.
pub fn serve_script() -> &'static str {
    guide_block("`/usr/local/sbin/shared-volume-serve`")
}

/// The restarts the guide's server unit allows `shared-volume-serve` and within how many
/// seconds (its `ExecStart=`).
pub fn serve_limits() -> (u32, u32) {
    let unit = guide_block("`/etc/systemd/system/shared-volume-nfs@.service`");
    let exec = format!("ExecStart={SERVE} ");
    let line = unit
        .lines()
        .find_map(|line| line.strip_prefix(exec.as_str()))
        .unwrap_or_else(|| panic!("the guide's server unit runs {SERVE}"));
    let mut words = line
        .split_whitespace()
        .map(|w| w.parse().expect("RESTARTS and WINDOW are numbers"));
    (words.next().unwrap(), words.next().unwrap())
}

/// Whether drbd-reactor's promoter gives the resource of `snippet` up when one of its units
/// fails, by the rules drbd-reactor documents (`doc/promoter.md`, "Service failure" and "Service
/// dependencies"): the promoter watches no service itself; the resource's `drbd-services@`
/// target depends on each unit as `target-as` says, and only a failure systemd carries to the
/// target stops it, which stops its units (`PartOf=`) and `drbd-promote@`, whose stop demotes
/// the resource. systemd stops a unit when a unit it is bound to (`BindsTo=`) enters the failed
/// state; `Requires=`, `Requisite=` and `Wants=` act on starts and on stops asked for, never on
/// a unit that fails (systemd.unit(5)). drbd-reactor's default is `Requires`.
pub fn target_stops_when_a_unit_fails(snippet: &str) -> bool {
    snippet.lines().any(|line| line.trim() == r#"target-as = "BindsTo""#)
}

/// How the NFS servers treat a restart: NFSv4's grace period, in which a new server lets clients
/// reclaim the state they held and refuses new state (a client's OPEN: `NFS4ERR_GRACE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NfsGrace {
    /// `Graceless = true`: no grace period; clients' locks and open state are not protected
    /// across a server move. The lease is 10 s.
    Off,
    /// Grace on, with its recovery records on the replicated volume (they move with it).
    On { lease_seconds: u32, grace_seconds: u32 },
}

impl NfsGrace {
    /// The servers' lease.
    pub fn lease(self) -> Duration {
        match self {
            Self::Off => Duration::from_secs(10),
            Self::On { lease_seconds, .. } => Duration::from_secs(lease_seconds.into()),
        }
    }

    /// The install guide's template with this grace setting in its `NFSv4` block.
    pub fn applied_to(self, template: &str) -> String {
        match self {
            Self::Off => set_param(&set_param(template, "Graceless", "true"), "Lease_Lifetime", "10"),
            Self::On {
                lease_seconds,
                grace_seconds,
            } => {
                let template = set_param(template, "Graceless", "false");
                let template = set_param(&template, "Lease_Lifetime", &lease_seconds.to_string());
                set_param(&template, "Grace_Period", &grace_seconds.to_string())
            }
        }
    }
}

/// `template` without its one `key = …;` parameter.
pub fn without_param(template: &str, key: &str) -> String {
    let start = template
        .find(&format!(" {key} = "))
        .unwrap_or_else(|| panic!("the install guide's ganesha template sets {key}"));
    let end = start + template[start..].find(';').expect("a parameter ends with ;") + 1;
    format!("{}{}", &template[..start], &template[end..])
}

/// `template` with the value of its one `key = …;` parameter replaced by `value`.
fn set_param(template: &str, key: &str, value: &str) -> String {
    let start = template
        .find(&format!("{key} = "))
        .unwrap_or_else(|| panic!("the install guide's ganesha template sets {key}"))
        + key.len()
        + 3;
    let end = start + template[start..].find(';').expect("a parameter ends with ;");
    format!("{}{value}{}", &template[..start], &template[end..])
}

/// The install guide's `/etc/shared-volume/ganesha.conf.in`: the tests' servers run what users
/// run.
pub fn ganesha_template() -> &'static str {
    guide_block("`/etc/shared-volume/ganesha.conf.in`")
}

impl std::fmt::Display for NfsGrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off => write!(f, "nfs-ganesha with grace off (Graceless = true, lease 10 s)"),
            Self::On {
                lease_seconds,
                grace_seconds,
            } => write!(
                f,
                "nfs-ganesha with grace on (lease {lease_seconds} s, grace {grace_seconds} s, recovery records on the replicated volume)"
            ),
        }
    }
}
