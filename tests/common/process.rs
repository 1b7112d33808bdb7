//! Runs the real binary (`controller` or `agent`) as a child process, the way a Pod would, and
//! reads its admin endpoints.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use super::eventually;

pub struct Process {
    child: Child,
    pub admin: SocketAddr,
    pub log: PathBuf,
}

/// A loopback address with a port that was free a moment ago.
pub fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().unwrap()
}

impl Process {
    /// Starts `shared-volume-controller <args>` with the test's KUBECONFIG, logging to a file named
    /// after `name` under the system temp dir (printed, so a failing test shows where to look).
    pub fn start(name: &str, args: &[&str]) -> Self {
        Self::start_with_env(name, args, &[])
    }

    /// Like [`Process::start`], with extra environment variables.
    pub fn start_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_program(&product_binary(), name, args, env)
    }

    /// Like [`Process::start_with_env`], running `program` instead of this tree's binary (another
    /// version's, for the upgrade test).
    pub fn start_program(program: &std::path::Path, name: &str, args: &[&str], env: &[(&str, &str)]) -> Self {
        let admin = free_addr();
        let log = std::env::temp_dir().join(format!("svc-e2e-{name}.log"));
        // Appended to: a process started again under the same name (the soak restarts them)
        // keeps the log of its earlier lives.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open log file");
        if std::env::var_os("SVC_DEMO").is_none() {
            eprintln!("{name}: logs in {}", log.display());
        }
        let child = Command::new(program)
            .args(args)
            .arg("--admin-addr")
            .arg(admin.to_string())
            .env("LOG_LEVEL", "info,shared_volume_controller=debug")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("start the binary");
        Self { child, admin, log }
    }

    /// How it exited, if it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("poll the process")
    }

    /// The process id (for /proc figures such as its peak memory).
    pub fn pid(&self) -> u32 {
        self.child.id().expect("process already gone")
    }

    /// Talks to the admin server at `admin` instead: for a process told to serve elsewhere (a
    /// compatibility flag such as `--health-bind-address`).
    pub fn serving_at(mut self, admin: SocketAddr) -> Self {
        self.admin = admin;
        self
    }

    /// GETs `path` from the admin server: `(status code, body)`, or `None` when not serving.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.admin, path).await
    }

    pub async fn wait_ready(&self) {
        eventually("the process to report ready", Duration::from_secs(30), || async {
            matches!(self.get("/readyz").await, Some((200, _))).then_some(())
        })
        .await;
    }

    /// The value of one sample, e.g. `metric("foo_total{reason=\"x\"}")`; 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        let (_, body) = self.get("/metrics").await.expect("metrics endpoint not serving");
        sample_value(&body, sample).unwrap_or(0.0)
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`…) to the process.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid();
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {pid} failed");
    }

    /// `kill -9`: no chance to finish anything or release its Lease.
    pub async fn kill(mut self) {
        self.child.start_kill().expect("SIGKILL");
        self.child.wait().await.expect("wait for the killed process");
    }

    /// Sends SIGTERM and waits for a clean exit.
    pub async fn stop(mut self) {
        self.signal("TERM");
        let exit = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .expect("process did not stop within 20s of SIGTERM")
            .expect("wait for process");
        assert!(exit.success(), "process exited with {exit}; see {}", self.log.display());
    }
}

/// GETs `path` from a plain HTTP server at `at`: `(status code, body)`, or `None` when not serving.
pub async fn http_get(at: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(at).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {at}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Finds `sample` (name plus optional `{labels}`, as printed) in a Prometheus text exposition.
pub fn sample_value(exposition: &str, sample: &str) -> Option<f64> {
    exposition
        .lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Cargo's folder of the profile this test or benchmark binary was built in (`target/debug`,
/// `target/release`): it runs from `deps` in there.
pub fn profile_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the running binary's path");
    let deps = exe.parent().expect("the binary's folder");
    deps.parent().expect("the profile's folder").to_path_buf()
}

/// This tree's `shared-volume-controller`, built beside the tests (Cargo builds a package's
/// binaries before its integration tests and benchmarks).
pub fn product_binary() -> std::path::PathBuf {
    profile_dir().join("shared-volume-controller")
}
