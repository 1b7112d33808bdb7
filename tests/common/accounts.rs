//! The chart's own permissions for the processes a test starts: the roles, bindings and admission
//! policies that `helm template` renders for a release of the test's own in its namespace,
//! installed in the control plane, and a kubeconfig per component that impersonates the
//! component's ServiceAccount. A permission the code needs and the chart lacks fails the test.

use std::path::PathBuf;

use k8s_openapi::api::rbac::v1::Role;
use serde_json::{Value, json};

use super::cluster::PrivateCluster;
use super::controller::ControllerArgs;
use super::helm::{CHART, run};
use super::process::Process;
use super::{TestEnv, tool};

/// The chart's templates that grant or narrow what its accounts may do.
const PERMISSION_TEMPLATES: [&str; 4] = [
    "templates/controller-rbac.yaml",
    "templates/agent-rbac.yaml",
    "templates/conntrack-rbac.yaml",
    "templates/admission-policies.yaml",
];

/// The kubeconfig of the control plane the tests run on (`KUBECONFIG`, set by `make test`).
pub fn admin_kubeconfig() -> String {
    std::env::var("KUBECONFIG").expect("KUBECONFIG")
}

/// A client configuration from the kubeconfig file at `path`.
pub async fn config_from(path: &str) -> kube::Config {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).unwrap();
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap()
}

/// How a kubeconfig made from the admin's signs in.
pub enum SignIn {
    /// As the admin, acting as this user.
    Impersonating(String),
    /// With this bearer token instead of the admin's certificate.
    Token(String),
}

impl TestEnv {
    /// The release whose accounts this test's processes act as.
    pub fn release(&self) -> String {
        format!("e2e-{}", self.id)
    }

    /// Where the rendered permissions are kept, to remove them with the test.
    fn permissions_file(&self) -> PathBuf {
        std::env::temp_dir().join(format!("svc-e2e-{}-chart-permissions.yaml", self.ns))
    }

    /// A kubeconfig, beside `admin_kubeconfig`, whose user acts as `component`'s (`controller`
    /// or `agent`) chart ServiceAccount in this namespace. The chart's permissions, rendered with
    /// `sets`, are installed in that cluster first (again on every call: `kubectl apply`).
    pub fn chart_kubeconfig(&self, admin_kubeconfig: &str, component: &str, sets: &[&str]) -> String {
        self.install_chart_templates(admin_kubeconfig, &PERMISSION_TEMPLATES, sets);
        let account = format!("system:serviceaccount:{}:{}", self.ns, self.chart_account(component));
        self.kubeconfig_as(admin_kubeconfig, component, SignIn::Impersonating(account))
    }

    /// Like [`TestEnv::chart_kubeconfig`], but signed in with a token of the ServiceAccount
    /// instead of impersonating it: API Priority and Fairness classifies a request by who signed
    /// in, not by whom it impersonates. `extra` templates are installed beside the permissions.
    pub fn chart_token_kubeconfig(
        &self,
        admin_kubeconfig: &str,
        component: &str,
        sets: &[&str],
        extra: &[&str],
    ) -> String {
        let templates: Vec<&str> = PERMISSION_TEMPLATES.iter().chain(extra).copied().collect();
        self.install_chart_templates(admin_kubeconfig, &templates, sets);
        let token = self.token_of(admin_kubeconfig, &self.chart_account(component));
        self.kubeconfig_as(admin_kubeconfig, component, SignIn::Token(token))
    }

    /// A token of ServiceAccount `account` in this namespace, for two hours.
    pub fn token_of(&self, admin_kubeconfig: &str, account: &str) -> String {
        let output = run(tool("kubectl").args([
            "--kubeconfig",
            admin_kubeconfig,
            "-n",
            &self.ns,
            "create",
            "token",
            account,
            "--duration",
            "2h",
        ]));
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }

    /// Takes `get` on Leases from the chart's agents of this test's release, or gives it back:
    /// they still list and watch Leases and read the guard's, but every fresh read of a peer's
    /// heartbeat is refused (403), as an RBAC mistake or an overloaded API server answers.
    pub async fn agents_may_read_leases(&self, allowed: bool) {
        let roles: kube::Api<Role> = self.api();
        let name = format!("{}-agent", self.release_prefix());
        let mut role = roles.get(&name).await.unwrap();
        for rule in role.rules.iter_mut().flatten() {
            let general = rule.resource_names.is_none();
            rule.verbs.retain(|verb| verb != "get");
            if allowed || !general {
                rule.verbs.push("get".into());
            }
        }
        roles.replace(&name, &Default::default(), &role).await.unwrap();
    }

    /// What the chart's objects of this test's release are named after.
    fn release_prefix(&self) -> String {
        format!("{}-shared-volume-controller", self.release())
    }

    /// The chart's ServiceAccount of `component` for this test's release.
    fn chart_account(&self, component: &str) -> String {
        format!("{}-{component}", self.release_prefix())
    }

    /// Renders `templates` of the chart for this test's release with `sets` and applies them.
    fn install_chart_templates(&self, admin_kubeconfig: &str, templates: &[&str], sets: &[&str]) {
        let mut helm = tool("helm");
        helm.args(["template", &self.release(), CHART, "--namespace", &self.ns]);
        for template in templates {
            helm.args(["--show-only", template]);
        }
        for set in sets {
            helm.args(["--set", set]);
        }
        let rendered = run(&mut helm).stdout;
        std::fs::write(self.permissions_file(), &rendered).unwrap();
        run(tool("kubectl")
            .args(["--kubeconfig", admin_kubeconfig, "apply", "-f"])
            .arg(self.permissions_file()));
    }

    /// `admin_kubeconfig` signed in as `who` says, as `<name>.kubeconfig` in the temporary folder.
    pub fn kubeconfig_as(&self, admin_kubeconfig: &str, name: &str, who: SignIn) -> String {
        let mut config: Value = serde_yaml::from_str(&std::fs::read_to_string(admin_kubeconfig).unwrap()).unwrap();
        for entry in config["users"].as_array_mut().unwrap() {
            match &who {
                SignIn::Impersonating(account) => entry["user"]["as"] = json!(account),
                SignIn::Token(token) => entry["user"] = json!({"token": token}),
            }
        }
        let path = std::env::temp_dir().join(format!("svc-e2e-{}-{name}.kubeconfig", self.ns));
        std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
        path.display().to_string()
    }

    /// The controller for this test's namespace alone, leader-elected through its Lease in this
    /// namespace (as the chart runs it), as the chart's account; once it is ready.
    pub async fn start_leading_controller(&self) -> Process {
        let args = ControllerArgs::leading(&self.ns);
        let controller = self.start_as("controller", &format!("{}-controller", self.ns), &args.as_strs(), &[]);
        controller.wait_ready().await;
        controller
    }

    /// The agent running as `agent` seen as the chart's DaemonSet pod on `node`: the chart's
    /// selector labels (`instance` when given), Running and Ready at loopback (where the test's
    /// processes listen), its `admin` port.
    pub async fn agent_pod(&self, node: &str, agent: &Process, instance: Option<&str>) {
        self.component_pod("agent", node, agent, instance).await;
    }

    /// A Running pod of the chart's `component` on `node` (`<component>-<node>`, the chart's
    /// labels), whose `admin` port is `process`'s.
    pub async fn component_pod(&self, component: &str, node: &str, process: &Process, instance: Option<&str>) {
        use k8s_openapi::api::core::v1::Pod;
        let mut labels = json!({
            "app.kubernetes.io/name": "shared-volume-controller",
            "app.kubernetes.io/component": component,
        });
        if let Some(instance) = instance {
            labels["app.kubernetes.io/instance"] = json!(instance);
        }
        let name = format!("{component}-{node}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": component, "image": component,
                "ports": [{"name": "admin", "containerPort": process.admin.port()}]}]},
        }))
        .unwrap();
        let pods = self.api::<Pod>();
        pods.create(&Default::default(), &pod).await.unwrap();
        let status = json!({"status": {"phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
            "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(&name, &Default::default(), &kube::api::Patch::Merge(status))
            .await
            .unwrap();
    }

    /// The controller for this test's namespace alone, leader election off, as the chart's
    /// account; once it is ready.
    pub async fn start_namespace_controller(&self) -> Process {
        self.start_controller(&[]).await
    }

    /// [`TestEnv::start_namespace_controller`] with `extra` flags.
    pub async fn start_controller(&self, extra: &[&str]) -> Process {
        let args = ControllerArgs::alone(&self.ns).with(extra);
        let controller = self.start_as("controller", &format!("{}-controller", self.ns), &args.as_strs(), &[]);
        controller.wait_ready().await;
        controller
    }

    /// [`TestEnv::start_controller`] on a control plane of the test's own, as the chart's
    /// account there.
    pub async fn start_controller_on(&self, cluster: &PrivateCluster, extra: &[&str]) -> Process {
        let kubeconfig = self.chart_kubeconfig(&cluster.kubeconfig(), "controller", &[]);
        let args = ControllerArgs::alone(&self.ns).with(extra);
        let process = Process::start_with_env(
            &format!("{}-controller", self.ns),
            &args.as_strs(),
            &[("KUBECONFIG", kubeconfig.as_str())],
        );
        process.wait_ready().await;
        process
    }

    /// Starts `shared-volume-controller <args>` (`component`: `controller` or `agent`) as the
    /// chart's account of that component, on the tests' control plane, with extra `env`. A
    /// `--lease-name` among the args is the one the chart is rendered with.
    pub fn start_as(&self, component: &str, name: &str, args: &[&str], env: &[(&str, &str)]) -> Process {
        let lease = args
            .iter()
            .position(|arg| *arg == "--lease-name")
            .and_then(|at| args.get(at + 1))
            .map(|lease| format!("{component}.flags.lease-name={lease}"));
        let sets: Vec<&str> = lease.iter().map(String::as_str).collect();
        let kubeconfig = self.chart_kubeconfig(&admin_kubeconfig(), component, &sets);
        let mut env = env.to_vec();
        env.push(("KUBECONFIG", kubeconfig.as_str()));
        Process::start_with_env(name, args, &env)
    }

    /// Removes the chart's cluster-wide permissions this test installed, if any.
    pub fn remove_chart_permissions(&self, admin_kubeconfig: &str) {
        let file = self.permissions_file();
        if file.exists() {
            let _ = tool("kubectl")
                .args([
                    "--kubeconfig",
                    admin_kubeconfig,
                    "delete",
                    "--ignore-not-found",
                    "--wait=false",
                    "-f",
                ])
                .arg(&file)
                .output();
            let _ = std::fs::remove_file(file);
        }
    }
}
