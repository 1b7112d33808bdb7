//! An upgrade, as users do it: the chart and the binaries of an earlier commit (`UPGRADE_FROM` in
//! hack/versions.env, built by hack/upgrade-from.sh) serve live claims and fail a node over; then
//! the working tree's packaged chart is upgraded onto the release with the upgrade page's own
//! command, and the controller's replicas and the agents roll over to this tree's binary one
//! at a time, as the Deployment and the DaemonSet roll them. Every ClusterIP, Service and mount
//! endpoint stays; the new version writes only what the upgrade page's migration table lists; and
//! it fails a node over afterwards.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::audit::{Write, every_write};
use common::drbd::{
    FAKE_DRBDSETUP, LOST_QUORUM, NODE_LABEL, SimNode, TEST_AGENT_TIMINGS, WAIT, healthy, lost, no_labels, pod_state,
    wait_for_slice_at, wait_for_taint,
};
use common::helm::{packaged_chart, run};
use common::process::Process;
use common::release_pods::ReleasePods;
use common::{MOUNT_ENDPOINT, SERVICE_ENDPOINT, TestEnv, eventually, serving, tool};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use serde_json::json;

const CLAIMS: [&str; 2] = ["data", "logs"];
const UPGRADE_PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/how-to/upgrade.md");

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn an_upgrade_keeps_every_address_and_fails_over_after() {
    let old = EarlierCommit::built();
    let env = common::setup("upgrade").await;
    let nodes = env.sim_nodes(&["a", "b", "c"]).await;
    let pvs = claims_served_from(&env, &nodes, 0).await;
    let release = env.release();
    if !installed(&env, &release, &old.chart) {
        run(tool("helm").args(["uninstall", &release, "--namespace", &env.ns, "--wait"]));
        env.cleanup().await;
        return;
    }
    let old_pods = ReleasePods::of(&env, &release, &old.binary);
    let mut controllers = vec![
        old_pods.controller("controller-1").await,
        old_pods.controller("controller-2").await,
    ];
    let mut agents = Vec::new();
    for node in &nodes {
        agents.push(Some(old_pods.agent(node).await));
    }
    for pv in &pvs {
        env.published_mount_endpoint(pv).await;
        wait_for_slice_at(&env, pv, &nodes[0]).await;
    }
    fail_over(&env, &nodes, &pvs, (0, 1), &mut agents).await;
    agents[0] = Some(node_comes_back(&env, &nodes, &pvs, (0, 1), &old_pods).await);
    let before = Addresses::read(&env, &pvs).await;

    let since = SystemTime::now();
    upgrade_as_the_page_says(&env, &release);
    let new_pods = ReleasePods::of(&env, &release, env!("CARGO_BIN_EXE_shared-volume-controller").as_ref());
    roll_the_controller(&new_pods, &mut controllers).await;
    for (agent, node) in agents.iter_mut().zip(&nodes) {
        let old_agent = agent.replace(new_pods.agent(node).await);
        old_agent.expect("every node's agent runs").stop().await;
    }
    settled(&env, &pvs).await;
    let until = SystemTime::now();

    assert_eq!(
        Addresses::read(&env, &pvs).await,
        before,
        "the upgrade keeps every address"
    );
    only_the_documented_migrations(&env, &release, &pvs, since, until);
    fail_over(&env, &nodes, &pvs, (1, 2), &mut agents).await;
    let moved = Addresses::read(&env, &pvs).await;
    assert_eq!(moved.published(), before.published(), "the move keeps every ClusterIP");
    for process in controllers.into_iter().chain(agents.into_iter().flatten()) {
        process.stop().await;
    }
    run(tool("helm").args(["uninstall", &release, "--namespace", &env.ns, "--wait"]));
    env.cleanup().await;
}

/// The earlier commit's binary and source, as hack/upgrade-from.sh leaves them.
struct EarlierCommit {
    binary: PathBuf,
    chart: PathBuf,
}

impl EarlierCommit {
    fn built() -> Self {
        let versions = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/hack/versions.env")).unwrap();
        let commit = versions
            .lines()
            .find_map(|line| line.strip_prefix("UPGRADE_FROM="))
            .expect("UPGRADE_FROM in hack/versions.env");
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap();
        let dir = target.join("upgrade-from").join(commit);
        let binary = dir.join("shared-volume-controller");
        assert!(
            binary.exists(),
            "{} is missing: run hack/upgrade-from.sh (make test does)",
            binary.display()
        );
        Self {
            binary,
            chart: dir.join("src/charts/shared-volume-controller"),
        }
    }
}

/// The test's values, the same for both versions (the upgrade keeps them): this namespace's
/// claims and nodes alone, the simulated DRBD, and the short timings the other tests use.
fn test_values(env: &TestEnv) -> Vec<String> {
    let mut values = vec![
        format!("controller.flags.watch-namespace={}", env.ns),
        format!("agent.flags.node-selector={NODE_LABEL}={}", env.id),
        format!("agent.flags.drbdsetup-path={FAKE_DRBDSETUP}"),
    ];
    let timings = TEST_AGENT_TIMINGS.iter();
    values.extend(timings.map(|(flag, value)| format!("agent.flags.{}={value}", flag.trim_start_matches("--"))));
    values
}

/// Installs the earlier commit's chart. Where it cannot install, no user runs it, and there is no
/// upgrade from it to test: said, and false. So on Kubernetes 1.33, which lacks the CEL function
/// flatten() that commit's nfs-endpoints policy used (`make test-matrix`).
fn installed(env: &TestEnv, release: &str, chart: &Path) -> bool {
    let mut helm = tool("helm");
    helm.args(["install", release])
        .arg(chart)
        .args(["--namespace", &env.ns]);
    for value in test_values(env) {
        helm.args(["--set", &value]);
    }
    let output = helm.output().expect("run helm");
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() && stderr.contains("undeclared reference to 'flatten'") {
        eprintln!("no upgrade to test here: the chart of UPGRADE_FROM does not install on this Kubernetes ({stderr})");
        return false;
    }
    assert!(output.status.success(), "{helm:?} failed: {stderr}");
    true
}

/// The upgrade page's `helm upgrade` command, run as written (through bash, as a user pastes it)
/// with this test's release and namespace, and the chart `hack/release-check.sh` packages in
/// place of the release's OCI artefact of the same version (`tests/docs.rs` holds the page to it).
fn upgrade_as_the_page_says(env: &TestEnv, release: &str) {
    let command = common::docs::sh_commands(UPGRADE_PAGE)
        .into_iter()
        .find(|line| line.starts_with("helm upgrade "))
        .expect("the upgrade page gives a helm upgrade command");
    let released = format!(
        "{}/shared-volume-controller",
        common::docs::release_setting("CHART_REPOSITORY")
    );
    assert!(
        command.contains(&released),
        "the page upgrades to the release's chart: {command}"
    );
    let command = command
        .replacen("helm upgrade shared-volume ", &format!("helm upgrade {release} "), 1)
        .replace(&released, packaged_chart())
        .replace("-n storage-system", &format!("-n {}", env.ns));
    assert!(command.contains(release) && command.contains(&env.ns), "{command}");
    run(&mut common::pasted(&command));
}

/// Each claim bound to a PV (also its DRBD resource) that node `primary` serves, with a pod
/// there: the PVs.
async fn claims_served_from(env: &TestEnv, nodes: &[SimNode], primary: usize) -> Vec<String> {
    let mut pvs = Vec::new();
    for claim in CLAIMS {
        let (_, pv) = env.bound_rwx_claim(claim, serving(&nodes[primary].endpoint())).await;
        pvs.push(pv.metadata.name.unwrap());
    }
    let resources: Vec<&str> = pvs.iter().map(String::as_str).collect();
    healthy(nodes, &resources, primary);
    pods_on(env, &nodes[primary]).await;
    pvs
}

/// A pod on `node` for each claim, named after the node.
async fn pods_on(env: &TestEnv, node: &SimNode) {
    for claim in CLAIMS {
        let pod = format!("{claim}-on-{}", env.short_name(node));
        env.running_pod(&pod, &node.name, claim, json!({}), no_labels()).await;
    }
}

/// Node `from` crashes (its agent and kubelet with it); the agents fail it over; DRBD promotes
/// node `to`, whose agent publishes itself.
async fn fail_over(
    env: &TestEnv,
    nodes: &[SimNode],
    pvs: &[String],
    (from, to): (usize, usize),
    agents: &mut [Option<Process>],
) {
    let resources: Vec<&str> = pvs.iter().map(String::as_str).collect();
    agents[from].take().expect("the node's agent runs").kill().await;
    nodes[from].kubelet.stop();
    lost(nodes, &resources, from, None);
    wait_for_taint(env, &nodes[from].name, LOST_QUORUM, true).await;
    for claim in CLAIMS {
        let pod = format!("{claim}-on-{}", env.short_name(&nodes[from]));
        eventually(&format!("pod {pod} force-deleted"), WAIT, || async {
            pod_state(env, &pod).await.is_none().then_some(())
        })
        .await;
    }
    lost(nodes, &resources, from, Some(to));
    for pv in pvs {
        wait_for_slice_at(env, pv, &nodes[to]).await;
        assert_eq!(
            env.pv_annotation(pv, SERVICE_ENDPOINT).await,
            Some(nodes[to].endpoint())
        );
    }
    pods_on(env, &nodes[to]).await;
}

/// Node `back` restarts after a fail-over: its kubelet posts it Ready, its DRBD reconnects as a
/// Secondary of node `primary`, and its agent starts; the fail-over taint goes.
async fn node_comes_back(
    env: &TestEnv,
    nodes: &[SimNode],
    pvs: &[String],
    (back, primary): (usize, usize),
    pods: &ReleasePods<'_>,
) -> Process {
    let node = &nodes[back];
    node.kubelet.resume();
    eventually(&format!("{} Ready", node.name), WAIT, || async {
        env.node_ready(&node.name).await.then_some(())
    })
    .await;
    let resources: Vec<&str> = pvs.iter().map(String::as_str).collect();
    healthy(nodes, &resources, primary);
    let agent = pods.agent(node).await;
    wait_for_taint(env, &node.name, LOST_QUORUM, false).await;
    agent
}

/// The controller's two replicas replaced as the Deployment rolls them (one surge pod, none
/// unavailable): a new one up, an old one down, again.
async fn roll_the_controller(pods: &ReleasePods<'_>, controllers: &mut [Process]) {
    for (i, controller) in controllers.iter_mut().enumerate().rev() {
        let new = pods.controller(&format!("controller-new-{}", i + 1)).await;
        std::mem::replace(controller, new).stop().await;
    }
}

/// The new version has done its first rounds: the migration it makes (the old core/v1 Endpoints
/// deleted) is done, and a few of the agents' rounds have run since.
async fn settled(env: &TestEnv, pvs: &[String]) {
    let endpoints = env.api::<Endpoints>();
    for pv in pvs {
        eventually(&format!("{pv}'s old Endpoints deleted"), WAIT, || async {
            endpoints.get_opt(pv).await.unwrap().is_none().then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
}

/// What a client of each claim holds on to, and where the claim is served from.
#[derive(Debug, PartialEq)]
struct Addresses(Vec<(Published, Option<String>)>);

/// What must never change for a claim: its Service (by UID), ClusterIP and mount endpoint.
#[derive(Clone, Debug, PartialEq)]
struct Published {
    service_uid: Option<String>,
    cluster_ip: Option<String>,
    mount_endpoint: Option<String>,
}

impl Addresses {
    async fn read(env: &TestEnv, pvs: &[String]) -> Self {
        let services = env.api::<Service>();
        let mut claims = Vec::new();
        for pv in pvs {
            let service = services.get(pv).await.expect("the claim's Service");
            let published = Published {
                service_uid: service.metadata.uid,
                cluster_ip: service.spec.and_then(|spec| spec.cluster_ip),
                mount_endpoint: env.pv_annotation(pv, MOUNT_ENDPOINT).await,
            };
            claims.push((published, env.pv_annotation(pv, SERVICE_ENDPOINT).await));
        }
        Self(claims)
    }

    fn published(&self) -> Vec<Published> {
        self.0.iter().map(|(published, _)| published.clone()).collect()
    }
}

/// Every write the release's accounts made to this test's claims, Services, endpoints, PVs and
/// Nodes between `since` and `until` is one the upgrade page's migration table lists.
fn only_the_documented_migrations(env: &TestEnv, release: &str, pvs: &[String], since: SystemTime, until: SystemTime) {
    let accounts = format!("system:serviceaccount:{}:{release}-shared-volume-controller-", env.ns);
    let documented = documented_migrations();
    let ours = |write: &Write| {
        write.namespace == env.ns
            || (write.resource == "persistentvolumes" && pvs.contains(&write.name))
            || (write.resource == "nodes" && write.name.starts_with(&env.id))
    };
    let written: Vec<(Migration, Write)> = every_write(since)
        .into_iter()
        .filter(|write| write.at <= until && ours(write))
        .filter_map(|write| {
            let by = write.user.strip_prefix(&accounts)?.to_owned();
            let object = match write.subresource.as_str() {
                "" => write.resource.clone(),
                sub => format!("{}/{sub}", write.resource),
            };
            Some((
                Migration {
                    object,
                    verb: write.verb.clone(),
                    by,
                },
                write,
            ))
        })
        .collect();
    let undocumented: Vec<&Write> = written
        .iter()
        .filter(|(migration, _)| !documented.contains(migration))
        .map(|(_, write)| write)
        .collect();
    assert!(
        undocumented.is_empty(),
        "writes of the upgrade the upgrade page's migration table does not list: {undocumented:#?}"
    );
    for migration in &documented {
        assert!(
            written.iter().any(|(done, _)| done == migration),
            "the upgrade page lists a migration this upgrade did not make: {migration:?}"
        );
    }
}

/// One row of the upgrade page's migration table.
#[derive(Debug, PartialEq)]
struct Migration {
    /// The API resource, `/status` for an object's status.
    object: String,
    verb: String,
    /// `controller` or `agent`.
    by: String,
}

/// The rows of the table under the upgrade page's "What an upgrade writes" heading.
fn documented_migrations() -> Vec<Migration> {
    let page = std::fs::read_to_string(UPGRADE_PAGE).unwrap();
    let section = page
        .split("\n## ")
        .find(|section| section.starts_with("What an upgrade writes"))
        .expect("the upgrade page has a section \"What an upgrade writes\"");
    section
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            Migration {
                object: cells[1].trim_matches('`').to_owned(),
                verb: cells[2].to_owned(),
                by: cells[3].to_owned(),
            }
        })
        .collect()
}
