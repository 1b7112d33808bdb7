//! The chart as helm renders it, and running tools whose failure should fail the test.

use std::process::{Command, Output};

use serde::Deserialize;
use serde_json::{Value, json};

use super::tool;

pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../charts/shared-volume-controller");

/// The chart as a release ships it: packaged by `helm package` once per test process (into
/// cargo's scratch folder for tests), which is what users install. Returns the package's path.
pub fn packaged_chart() -> &'static str {
    static PACKAGED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PACKAGED.get_or_init(|| {
        // One folder, made again by each run: only the chart tests install the package.
        let dir = super::process::profile_dir().join("../tmp/packaged-chart");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        run(tool("helm").args(["package", CHART, "-d"]).arg(&dir));
        let package = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .find(|path| path.extension().is_some_and(|e| e == "tgz"))
            .expect("helm package made no .tgz");
        package.to_string_lossy().into_owned()
    })
}

/// Runs `command` and fails the test with its output unless it succeeds.
pub fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("cannot run {command:?}: {err}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `helm template` with `--set` values, as JSON objects.
pub fn template(sets: &[&str]) -> Vec<Value> {
    let mut helm = tool("helm");
    helm.args(["template", "demo", CHART, "--namespace", "storage"]);
    for set in sets {
        helm.args(["--set", set]);
    }
    objects(&run(&mut helm).stdout)
}

/// The objects of a YAML stream as helm prints it (`template`, `get manifest`), as JSON values.
pub fn objects(yaml: &[u8]) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(&String::from_utf8_lossy(yaml))
        .map(|doc| Value::deserialize(doc).expect("rendered YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// Every alert of a rendered PrometheusRule, across its groups.
pub fn alerts(rule: &Value) -> Vec<&Value> {
    rule["spec"]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .flat_map(|group| group["rules"].as_array().expect("rules"))
        .collect()
}

pub fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

/// A pod built from a rendered pod template, created with `--dry-run=server` in `namespace`:
/// the admission verdict without a scheduler or kubelet. `Err` holds the refusal.
pub fn admitted(template: &Value, namespace: &str, name: &str) -> Result<(), String> {
    admitted_on(None, template, namespace, name)
}

/// [`admitted`] on the control plane of `kubeconfig` (`None`: the tests' own).
pub fn admitted_on(kubeconfig: Option<&str>, template: &Value, namespace: &str, name: &str) -> Result<(), String> {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    });
    let file = std::env::temp_dir().join(format!("svc-psa-{namespace}-{name}.json"));
    std::fs::write(&file, pod.to_string()).unwrap();
    let mut kubectl = tool("kubectl");
    if let Some(kubeconfig) = kubeconfig {
        kubectl.args(["--kubeconfig", kubeconfig]);
    }
    let output = kubectl
        .args(["create", "--dry-run=server", "-o", "name", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_file(&file).unwrap();
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}
