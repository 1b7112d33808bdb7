//! A Helm release's controller and agents run as a kubelet would run their pods, without
//! containers: each container's arguments and environment are read from the release's manifest
//! (`helm get manifest`), its `fieldRef`s and `$(VAR)` references resolved for the pod's node, and
//! the binary of the release's version is started as a process acting as the pod's
//! ServiceAccount. So a chart and a binary of one version are run together, as users run them.
//!
//! What a node gives its pods that differs here is set on top, the same for every version: the
//! admin address (a free loopback port), and the simulated DRBD the agent reads on its node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::accounts::{SignIn, admin_kubeconfig};
use super::drbd::SimNode;
use super::helm::{objects, run};
use super::process::Process;
use super::{TestEnv, tool};

/// A release's workloads, as `helm get manifest` shows them now, and the binary that runs them.
pub struct ReleasePods<'a> {
    env: &'a TestEnv,
    binary: PathBuf,
    manifest: Vec<Value>,
}

impl<'a> ReleasePods<'a> {
    /// The workloads of `release` in the test's namespace as installed now, run by `binary`.
    pub fn of(env: &'a TestEnv, release: &str, binary: &Path) -> Self {
        let output = run(tool("helm").args(["get", "manifest", release, "--namespace", &env.ns]));
        Self {
            env,
            binary: binary.to_owned(),
            manifest: objects(&output.stdout),
        }
    }

    /// The controller Deployment's pod `pod`, once it is ready.
    pub async fn controller(&self, pod: &str) -> Process {
        let spec = self.pod_spec("Deployment", "controller");
        let fields = self.fields(pod, None);
        let process = self.start(spec, &fields, pod, &[]);
        process.wait_ready().await;
        process
    }

    /// The agent DaemonSet's pod on `node`, once it is ready.
    pub async fn agent(&self, node: &SimNode) -> Process {
        let spec = self.pod_spec("DaemonSet", "agent");
        let pod = format!("agent-{}", node.name);
        let fields = self.fields(&pod, Some(node));
        let proc_path = node.dir.join("proc").display().to_string();
        let (drbd_var, drbd_dir) = node.fake_drbd_env();
        // The simulated node runs no NFS server for the agent to probe.
        let on_this_node = [
            ("DRBD_PROC_PATH", proc_path.as_str()),
            (drbd_var, drbd_dir),
            ("NFS_PROBE", "false"),
        ];
        let process = self.start(spec, &fields, &pod, &on_this_node);
        process.wait_ready().await;
        process
    }

    /// The pod template's spec of the release's `kind` whose component label is `component`.
    fn pod_spec(&self, kind: &str, component: &str) -> &Value {
        let workload = self
            .manifest
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["labels"]["app.kubernetes.io/component"] == component)
            .unwrap_or_else(|| panic!("the release renders no {kind} of component {component}"));
        &workload["spec"]["template"]["spec"]
    }

    /// The pod fields the chart's environment refers to, as the kubelet fills them in.
    fn fields(&self, pod: &str, node: Option<&SimNode>) -> BTreeMap<&'static str, String> {
        let mut fields = BTreeMap::from([
            ("metadata.name", pod.to_owned()),
            ("metadata.namespace", self.env.ns.clone()),
        ]);
        if let Some(node) = node {
            fields.insert("spec.nodeName", node.name.clone());
            fields.insert("status.hostIP", node.ip.clone());
        }
        fields
    }

    fn start(&self, spec: &Value, fields: &BTreeMap<&str, String>, pod: &str, node_env: &[(&str, &str)]) -> Process {
        let container = &spec["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let account = format!(
            "system:serviceaccount:{}:{}",
            self.env.ns,
            spec["serviceAccountName"]
                .as_str()
                .expect("the pod names its ServiceAccount")
        );
        let kubeconfig = self
            .env
            .kubeconfig_as(&admin_kubeconfig(), pod, SignIn::Impersonating(account));
        let mut env = container_env(container, fields);
        env.extend(
            node_env
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string())),
        );
        env.push(("KUBECONFIG".into(), kubeconfig));
        let env: Vec<(&str, &str)> = env.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let version = self.binary.parent().and_then(Path::file_name).unwrap_or_default();
        let name = format!("{}-{pod}-{}", self.env.ns, version.to_string_lossy());
        Process::start_program(&self.binary, &name, &args, &env)
    }
}

/// The container's environment as the kubelet gives it: plain values with `$(NAME)` references
/// to the variables before them expanded, and `fieldRef`s filled in from `fields`.
fn container_env(container: &Value, fields: &BTreeMap<&str, String>) -> Vec<(String, String)> {
    let mut resolved: Vec<(String, String)> = Vec::new();
    for var in container["env"].as_array().into_iter().flatten() {
        let name = var["name"].as_str().unwrap().to_owned();
        let value = if let Some(value) = var["value"].as_str() {
            expand(value, &resolved)
        } else if let Some(path) = var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            fields
                .get(path)
                .unwrap_or_else(|| panic!("{name}: field {path} is not simulated"))
                .clone()
        } else {
            panic!("{name}: only values and fieldRefs are simulated: {var}")
        };
        resolved.push((name, value));
    }
    resolved
}

/// `value` with each `$(NAME)` of a variable in `earlier` replaced by its value, as Kubernetes
/// expands them (an unknown reference stays as written).
fn expand(value: &str, earlier: &[(String, String)]) -> String {
    earlier.iter().fold(value.to_owned(), |value, (name, resolved)| {
        value.replace(&format!("$({name})"), resolved)
    })
}
