//! A control plane of a test's own (hack/cluster.sh in a folder of its own), for faults that
//! would disturb the other tests: restarting kube-apiserver or etcd. Stopped and removed on drop.

use std::path::PathBuf;
use std::process::Command;

use super::accounts::config_from;

const CLUSTER_SH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../hack/cluster.sh");

pub struct PrivateCluster {
    pub dir: PathBuf,
}

impl PrivateCluster {
    pub fn up(name: &str) -> Self {
        Self::up_with(name, &[])
    }

    /// A control plane with extra environment for hack/cluster.sh (`SVC_SERVICE_CIDR`).
    pub fn up_with(name: &str, env: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("svc-cluster-{name}-{}", std::process::id()));
        let cluster = Self { dir };
        cluster.run_with(&["up"], env);
        cluster
    }

    pub fn kubeconfig(&self) -> String {
        self.dir.join("kubeconfig").to_string_lossy().into_owned()
    }

    pub async fn config(&self) -> kube::Config {
        config_from(&self.kubeconfig()).await
    }

    /// Stops `component` (etcd, kube-apiserver, kube-controller-manager) and starts it again.
    pub fn restart(&self, component: &str) {
        self.run(&["restart", component]);
    }

    /// Kills `component` with SIGKILL and leaves it down (`restart` starts it again).
    pub fn kill(&self, component: &str) {
        let pid = std::fs::read_to_string(self.dir.join(format!("{component}.pid"))).unwrap();
        let status = Command::new("kill").args(["-9", pid.trim()]).status().unwrap();
        assert!(status.success(), "kill -9 {component}");
    }

    fn run(&self, args: &[&str]) {
        self.run_with(args, &[]);
    }

    fn run_with(&self, args: &[&str], env: &[(&str, &str)]) {
        let mut command = Command::new(CLUSTER_SH);
        command.args(args).arg(&self.dir).envs(env.iter().copied());
        let status = command.status().unwrap_or_else(|err| panic!("{command:?}: {err}"));
        assert!(status.success(), "{command:?} failed");
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = Command::new(CLUSTER_SH).arg("down").arg(&self.dir).status();
    }
}
