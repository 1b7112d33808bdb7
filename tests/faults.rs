//! The controller under faults, with the real binary against the real control plane: what it
//! promises must hold while things break around it. A claim's ClusterIP never changes, every
//! volume ends up published, nothing is duplicated or orphaned, and one replica writes at a time.
//!
//! Sizes are small in the test command; `SVC_FAULTS_LONG=1` runs the long version (see the
//! docs/explanation/guarantees.md).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::controller::ControllerArgs;
use common::process::Process;
use common::{MOUNT_ENDPOINT, TestEnv, audit, eventually, serving};
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);
const LEADER: &str = "storageos_shared_volume_controller_leader";
const SHARED: &str = "storageos_shared_volumes";
/// Lease timing of the replicas in these tests (seconds).
const LEASE: u64 = 4;
const GRACE: u64 = 2;

fn long_run() -> bool {
    std::env::var_os("SVC_FAULTS_LONG").is_some()
}

/// The arguments of a replica with leader election, watching only the test's namespace.
fn replica_args(env: &TestEnv, identity: &str) -> ControllerArgs {
    ControllerArgs::replica(&env.ns, identity, "svc-leader", LEASE, GRACE)
}

/// A replica with leader election, watching only the test's namespace.
fn replica(env: &TestEnv, identity: &str) -> Process {
    let args = replica_args(env, identity);
    env.start_as("controller", &format!("{}-{identity}", env.ns), &args.as_strs(), &[])
}

/// Starts replicas `a` and `b` and waits until one leads: (leader, standby, their identities).
async fn two_replicas(env: &TestEnv) -> ((Process, &'static str), (Process, &'static str)) {
    let (a, b) = (replica(env, "a"), replica(env, "b"));
    a.wait_ready().await;
    b.wait_ready().await;
    let leader = eventually("one leader", WAIT, || async {
        match (a.metric(LEADER).await, b.metric(LEADER).await) {
            (1.0, 0.0) => Some("a"),
            (0.0, 1.0) => Some("b"),
            _ => None,
        }
    })
    .await;
    if leader == "a" {
        ((a, "a"), (b, "b"))
    } else {
        ((b, "b"), (a, "a"))
    }
}

/// From the audit log: since `since`, the replica `new` wrote (it repaired what the test keeps
/// changing) and the replica `old` wrote nothing.
fn only_the_new_leader_wrote(env: &TestEnv, old: &str, new: &str, since: SystemTime, when: &str) {
    let by_old = audit::writes_by(&env.ns, old, since);
    let by_new = audit::writes_by(&env.ns, new, since);
    println!(
        "{when}: {} writes by the old leader, {} by the new one",
        by_old.len(),
        by_new.len()
    );
    assert!(
        !by_new.is_empty(),
        "the audit log attributes the new leader's repairs to it"
    );
    assert!(
        by_old.is_empty(),
        "{when}, the old leader must write nothing: {by_old:#?}"
    );
}

/// One controller without leader election, watching the test's namespace, ready.
async fn single_controller(env: &TestEnv) -> Process {
    env.start_namespace_controller().await
}

/// A replica started while the API server is down waits for it, as client-go's leader election
/// does, instead of exiting; then it leads and serves.
#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_replica_started_while_the_apiserver_is_down_waits_for_it() {
    let cluster = common::cluster::PrivateCluster::up("apiserver-down");
    let env = common::setup_on(cluster.config().await, "flt-down").await;
    let lease = "controller.flags.lease-name=svc-leader";
    let kubeconfig = env.chart_kubeconfig(&cluster.kubeconfig(), "controller", &[lease]);
    cluster.kill("kube-apiserver");
    let args = replica_args(&env, "a");
    let mut replica = Process::start_with_env(
        &format!("{}-a", env.ns),
        &args.as_strs(),
        &[("KUBECONFIG", kubeconfig.as_str())],
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        replica.exited(),
        None,
        "exited while the API server was down: see {}",
        replica.log.display()
    );
    cluster.restart("kube-apiserver");
    eventually("the replica to lead", WAIT, || async {
        (replica.metric(LEADER).await == 1.0).then_some(())
    })
    .await;
    env.shared_claim("data", "192.0.2.96:2049").await;
    replica.stop().await;
    env.remove_chart_permissions(&cluster.kubeconfig());
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_killed_leader_is_replaced_within_its_lease() {
    let env = common::setup("flt-kill-leader").await;
    let ((leader, _), (standby, standby_id)) = two_replicas(&env).await;
    env.shared_claim("before", "192.0.2.90:2049").await;

    let killed = Instant::now();
    leader.kill().await;
    eventually("the standby to lead", WAIT, || async {
        (standby.metric(LEADER).await == 1.0).then_some(())
    })
    .await;
    let takeover = killed.elapsed();
    let name = env.shared_claim("after", "192.0.2.91:2049").await.0;
    let took = killed.elapsed();
    println!(
        "leader killed with -9: standby leads after {:.1} s, a new claim published after {:.1} s (lease {LEASE} s)",
        takeover.as_secs_f64(),
        took.as_secs_f64()
    );
    assert!(
        takeover <= Duration::from_secs(LEASE + 5),
        "the standby must take over within the lease duration + 5 s, took {takeover:?}"
    );
    let writers: BTreeSet<String> = audit::writes(&env.ns, SystemTime::UNIX_EPOCH)
        .into_iter()
        .filter(|write| write.name == name)
        .map(|write| write.user_agent)
        .collect();
    assert!(
        writers.iter().all(|agent| agent.ends_with(&format!("({standby_id})"))),
        "the new claim was written by the new leader only: {writers:?}"
    );
    standby.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_paused_leader_writes_nothing_once_it_resumes() {
    let env = common::setup("flt-pause").await;
    let ((leader, leader_id), (standby, standby_id)) = two_replicas(&env).await;
    let tampered = env.shared_claim("tampered", "192.0.2.92:2049").await.0;

    // The leader freezes (SIGSTOP: a stalled VM, a long GC pause) past its lease.
    leader.signal("STOP");
    eventually("the standby to lead", WAIT, || async {
        (standby.metric(LEADER).await == 1.0).then_some(())
    })
    .await;
    for (claim, endpoint) in [("during-1", "192.0.2.93:2049"), ("during-2", "192.0.2.94:2049")] {
        env.shared_claim(claim, endpoint).await;
    }

    // Something keeps changing a field the controller manages, so that whoever leads has
    // something to write the moment it looks.
    let (stop_tampering, tamperer) = tamper(&env, &tampered);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let resumed = SystemTime::now();
    leader.signal("CONT");
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop_tampering.cancel();
    tamperer.await.unwrap();

    assert_eq!(standby.metric(LEADER).await, 1.0, "the new leader keeps leading");
    eventually("the old leader to stand by", WAIT, || async {
        (leader.metric(LEADER).await == 0.0).then_some(())
    })
    .await;
    only_the_new_leader_wrote(&env, leader_id, standby_id, resumed, "after the old leader resumed");
    leader.stop().await;
    standby.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn the_liveness_probe_goes_through_the_reconcile_loop() {
    let env = common::setup("flt-liveness").await;
    let controller = single_controller(&env).await;
    let turned = "storageos_shared_volume_loop_last_turn_timestamp_seconds";
    let first = eventually("a first probe through the loop", Duration::from_secs(15), || async {
        Some(controller.metric(turned).await).filter(|t| *t > 0.0)
    })
    .await;
    eventually("the next probe through the loop", Duration::from_secs(15), || async {
        (controller.metric(turned).await > first).then_some(())
    })
    .await;
    assert_eq!(controller.get("/healthz").await.map(|(status, _)| status), Some(200));
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_field_contested_by_an_outside_writer_is_repaired_with_bounded_writes() {
    let env = common::setup("flt-contested").await;
    let controller = single_controller(&env).await;
    let name = env.shared_claim("contested", "192.0.2.96:2049").await.0;
    let since = SystemTime::now();

    // 20 changes a second for 10 s: repairing each one is a write storm against the API server.
    let (stop_tampering, tamperer) = tamper(&env, &name);
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop_tampering.cancel();
    tamperer.await.unwrap();
    let (repair_writes, outside_writes): (Vec<_>, Vec<_>) = audit::writes(&env.ns, since)
        .into_iter()
        .partition(|write| write.user_agent.contains("shared-volume-controller"));
    let tampered = outside_writes.len();
    let repairs = repair_writes.iter().filter(|write| write.name == name).count();
    let deferred = controller
        .metric("storageos_shared_volume_repairs_deferred_total")
        .await;
    println!(
        "outside writer: {tampered} changes in 10 s; controller: {repairs} repair writes, {deferred} repairs deferred"
    );
    assert!(
        repairs <= 15,
        "repairs back off while the field is contested: {repairs} writes for {tampered} changes"
    );
    assert!(deferred > 0.0, "the back-off shows in the metrics");

    // Once left alone, the Service is repaired.
    eventually("the Service repaired", WAIT, || async {
        let service = env.api::<Service>().get(&name).await.ok()?;
        let labels = service.metadata.labels?;
        (!labels.get("storageos.com/volume-id")?.starts_with("tampered")).then_some(())
    })
    .await;
    let contested = env.wait_for_events("contested", "ManagedFieldsContested").await;
    assert_eq!(contested[0].type_.as_deref(), Some("Warning"));
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn only_the_claim_a_volume_is_bound_to_is_served_and_nothing_is_orphaned() {
    let env = common::setup("flt-claims").await;
    let controller = single_controller(&env).await;
    let served = env.shared_claim("owner", "192.0.2.97:2049").await.0;
    let owner_uid = |meta: &kube::api::ObjectMeta| meta.owner_references.as_ref().map(|o| o[0].uid.clone());
    let owner = env
        .api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .get("owner")
        .await
        .unwrap();

    // A second claim naming the same PV (its claimRef names the first): not served, and the
    // first claim's Service stays the first claim's.
    env.create_claim("intruder", &served, "ReadWriteMany", "replicated")
        .await;
    env.mark_bound("intruder").await;
    env.wait_for_events("intruder", "VolumeBoundElsewhere").await;

    // A claim whose PV has no claimRef at all, and one bound to a PV whose claimRef names
    // another claim: neither is served.
    let loose = env.pv_name("loose");
    env.create_claim("loose", &loose, "ReadWriteMany", "replicated").await;
    let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": loose, "annotations": {common::SERVICE_ENDPOINT: "192.0.2.98:2049"}},
        "spec": {"accessModes": ["ReadWriteMany"], "capacity": {"storage": "1Gi"}, "storageClassName": "replicated",
                 "csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": loose}},
    }))
    .unwrap();
    env.pvs().create(&Default::default(), &pv).await.unwrap();
    env.mark_bound("loose").await;
    env.wait_for_events("loose", "VolumeBoundElsewhere").await;

    // A claim deleted while it is being reconciled: whatever was made for it goes with it.
    let (_, gone_pv) = env.bound_rwx_claim("short-lived", serving("192.0.2.99:2049")).await;
    let gone = gone_pv.metadata.name.unwrap();
    env.api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
        .delete("short-lived", &Default::default())
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_secs(3)).await;
    eventually("the deleted claim's objects to be collected", WAIT, || async {
        let left = env.api::<Service>().get_opt(&gone).await.unwrap().is_some()
            || env.api::<Endpoints>().get_opt(&gone).await.unwrap().is_some()
            || env.api::<EndpointSlice>().get_opt(&gone).await.unwrap().is_some();
        (!left).then_some(())
    })
    .await;
    let services = env.all::<Service>().await;
    let names: Vec<String> = services.iter().filter_map(|s| s.metadata.name.clone()).collect();
    assert_eq!(names, std::slice::from_ref(&served), "only the bound claim is served");
    assert_eq!(
        owner_uid(&services[0].metadata),
        owner.metadata.uid,
        "still owned by the claim it is bound to"
    );
    let slices = env.all::<EndpointSlice>().await;
    assert_eq!(slices.len(), 1, "no orphaned EndpointSlice");
    assert_eq!(owner_uid(&slices[0].metadata), owner.metadata.uid);
    no_core_endpoints(&env).await;
    assert_eq!(
        controller.metric(SHARED).await,
        1.0,
        "the gauge counts the served claim only"
    );
    controller.stop().await;
    env.cleanup().await;
}

/// CPU seconds a process has used so far (user + system, from /proc).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn the_controller_rides_out_an_apiserver_and_then_an_etcd_restart() {
    let cluster = common::cluster::PrivateCluster::up("restart");
    let env = common::setup_on(cluster.config().await, "flt-restart").await;
    let controller = env.start_controller_on(&cluster, &[]).await;
    let since = SystemTime::now();
    let mut claims = 0;
    let mut more_claims = |count: usize| {
        let names: Vec<String> = (claims..claims + count).map(|i| format!("data-{i}")).collect();
        claims += count;
        names
    };
    let mut mounted = Vec::new();
    for claim in more_claims(5) {
        mounted.push(env.shared_claim(&claim, "192.0.2.120:2049").await);
    }
    let cpu_before = cpu_seconds(controller.pid());

    for component in ["kube-apiserver", "etcd"] {
        let restarted = Instant::now();
        cluster.restart(component);
        // The API comes back; what changed meanwhile and after is picked up by resumed watches.
        for claim in more_claims(5) {
            eventually("the API back", WAIT, || async {
                env.api::<Service>().list(&ListParams::default()).await.ok()
            })
            .await;
            mounted.push(env.shared_claim(&claim, "192.0.2.121:2049").await);
        }
        println!(
            "{component} restarted: 5 new claims published {:.1} s later",
            restarted.elapsed().as_secs_f64()
        );
    }
    let moved = &mounted[0].0;
    env.annotate_pv(moved, common::SERVICE_ENDPOINT, Some("192.0.2.122:2049"))
        .await;
    eventually("the endpoints to follow a move after both restarts", WAIT, || async {
        let slice = env.api::<EndpointSlice>().get(moved).await.ok()?;
        let ip = slice.endpoints.first()?.addresses.first()?.clone();
        (ip == "192.0.2.122").then_some(())
    })
    .await;

    for (pv, mount) in &mounted {
        let now = env.pv_annotation(pv, common::MOUNT_ENDPOINT).await;
        assert_eq!(now.as_ref(), Some(mount), "{pv}: clients keep the address they mount");
    }
    assert_eq!(
        controller.get("/healthz").await.map(|(status, _)| status),
        Some(200),
        "alive"
    );
    let cpu = cpu_seconds(controller.pid()) - cpu_before;
    let log = cluster.dir.join("audit.log");
    let writes = audit::writes_in(&log, &env.ns, since)
        .into_iter()
        .filter(|write| write.user_agent.contains("shared-volume-controller"))
        .count();
    println!("through both restarts: {claims} claims, {writes} writes, {cpu:.2} CPU seconds");
    assert!(cpu < 10.0, "no spinning while the API was away: {cpu:.2} CPU seconds");
    // Service, Endpoints, EndpointSlice and the PV's mount endpoint per claim, the move, and a
    // few retries of writes the restarts cut off.
    assert!(writes <= claims * 4 + 2 + 20, "{writes} writes for {claims} claims");
    controller.stop().await;
    env.remove_chart_permissions(&cluster.kubeconfig());
    env.cleanup().await;
}

/// Keeps patching a label the controller manages on Service `name`, so that whoever leads always
/// has something to write; stops when the token is cancelled.
fn tamper(env: &TestEnv, name: &str) -> (tokio_util::sync::CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn({
        let (services, name, stop) = (env.api::<Service>(), name.to_owned(), stop.clone());
        async move {
            let mut round = 0;
            while !stop.is_cancelled() {
                round += 1;
                let patch = json!({"metadata": {"labels": {"storageos.com/volume-id": format!("tampered-{round}")}}});
                let _ = services
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    (stop, task)
}

/// An admission policy that refuses every renewal of the leader Lease by `identity` in the
/// test's namespace (its holder may still change to someone else): a leader cut off from its
/// Lease while everything else it does still works.
struct RefusedRenewals {
    client: kube::Client,
    name: String,
}

impl RefusedRenewals {
    async fn install(env: &TestEnv, identity: &str) -> Self {
        let name = format!("svc-refuse-renewals-{}", env.ns);
        let expression = format!(
            "!(object.metadata.name == 'svc-leader' && has(oldObject.spec.holderIdentity) && oldObject.spec.holderIdentity == '{identity}' && has(object.spec.holderIdentity) && object.spec.holderIdentity == '{identity}')"
        );
        let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                    "operations": ["UPDATE"], "resources": ["leases"],
                }]},
                "validations": [{"expression": expression, "message": "renewals refused by the fault test"}],
            },
        }))
        .unwrap();
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": env.ns}}},
            },
        }))
        .unwrap();
        let client = env.client.clone();
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&Default::default(), &policy)
            .await
            .unwrap();
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&Default::default(), &binding)
            .await
            .unwrap();
        Self { client, name }
    }

    async fn remove(self) {
        let _ = Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
            .delete(&self.name, &Default::default())
            .await;
        let _ = Api::<ValidatingAdmissionPolicy>::all(self.client.clone())
            .delete(&self.name, &Default::default())
            .await;
    }
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_leader_that_cannot_renew_stops_writing_before_another_takes_over() {
    let env = common::setup("flt-renew").await;
    let ((leader, leader_id), (standby, standby_id)) = two_replicas(&env).await;
    let tampered = env.shared_claim("tampered", "192.0.2.95:2049").await.0;
    let (stop_tampering, tamperer) = tamper(&env, &tampered);
    tokio::time::sleep(Duration::from_secs(1)).await;

    // The leader can no longer renew its Lease; everything else it does still works. Its lease
    // manager only retries with back-off and says it lost the Lease at a later read.
    let refused = RefusedRenewals::install(&env, leader_id).await;
    eventually("the standby to lead", WAIT, || async {
        (standby.metric(LEADER).await == 1.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop_tampering.cancel();
    tamperer.await.unwrap();
    refused.remove().await;

    let lease = env.api::<Lease>().get("svc-leader").await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some(standby_id));
    let acquired: SystemTime = lease.acquire_time.expect("acquireTime").0.into();
    only_the_new_leader_wrote(
        &env,
        leader_id,
        standby_id,
        acquired,
        "after the standby took the Lease",
    );
    // The dashboard sums the gauge over replicas: only the leader may count the volume.
    eventually("the new leader to count the volume", WAIT, || async {
        (standby.metric(SHARED).await == 1.0).then_some(())
    })
    .await;
    assert_eq!(leader.metric(LEADER).await, 0.0);
    assert_eq!(leader.metric(SHARED).await, 0.0, "a former leader counts no volume");
    leader.stop().await;
    standby.stop().await;
    env.cleanup().await;
}

/// By Service name: every ClusterIP and every uid it was seen with.
type Seen = BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)>;

/// Records every ClusterIP and uid each Service of the namespace is ever seen with.
struct ServiceHistory {
    seen: Arc<Mutex<Seen>>,
    task: tokio::task::JoinHandle<()>,
}

impl ServiceHistory {
    fn start(env: &TestEnv) -> Self {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let stream = watcher(env.api::<Service>(), watcher::Config::default())
            .default_backoff()
            .applied_objects();
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                futures::pin_mut!(stream);
                while let Some(Ok(service)) = stream.next().await {
                    let name = service.metadata.name.clone().unwrap_or_default();
                    let ip = service.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
                    let mut seen = seen.lock().unwrap();
                    let (ips, uids) = seen.entry(name).or_default();
                    ips.insert(ip);
                    uids.insert(service.metadata.uid.unwrap_or_default());
                }
            }
        });
        Self { seen, task }
    }

    /// Services seen with more than one ClusterIP, or recreated (more than one uid).
    fn changed(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(_, (ips, uids))| ips.len() > 1 || uids.len() > 1)
            .map(|(name, (ips, uids))| format!("{name}: ClusterIPs {ips:?}, uids {uids:?}"))
            .collect()
    }
}

impl Drop for ServiceHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A small deterministic generator (the seed is printed, `SVC_FAULT_SEED` replays a run).
struct Random(u64);

impl Random {
    fn from_env() -> Self {
        let seed = std::env::var("SVC_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        println!("fault seed {seed} (SVC_FAULT_SEED={seed} replays it)");
        Self(seed)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound.max(1)
    }
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn killed_again_and_again_while_claims_converge_nothing_is_lost_or_moved() {
    let (claims, kills) = if long_run() { (200, 10) } else { (40, 3) };
    let env = common::setup("flt-kill9").await;
    let mut random = Random::from_env();
    let history = ServiceHistory::start(&env);
    let args = ControllerArgs::alone(&env.ns);
    let start = || env.start_as("controller", &format!("{}-controller", env.ns), &args.as_strs(), &[]);

    let mut pvs = Vec::new();
    let mut servers = BTreeMap::new();
    let mut controller = start();
    for i in 0..claims {
        let server = format!("192.0.2.{}:2049", 100 + i % 100);
        let (_, pv) = env.bound_rwx_claim(&format!("data-{i}"), serving(&server)).await;
        let name = pv.metadata.name.unwrap();
        servers.insert(name.clone(), server);
        pvs.push(name);
    }
    let mut survived = 0;
    for round in 0..kills {
        // Let it work for a random while, then kill it without warning.
        tokio::time::sleep(Duration::from_millis(random.below(1500))).await;
        controller.kill().await;
        survived += 1;
        // Meanwhile some primaries move: the endpoints must follow once a controller runs again.
        for _ in 0..claims / 10 {
            let pv = &pvs[random.below(pvs.len() as u64) as usize];
            let server = format!("198.51.100.{}:2049", 1 + random.below(200));
            env.annotate_pv(pv, common::SERVICE_ENDPOINT, Some(&server)).await;
            servers.insert(pv.clone(), server);
        }
        println!("round {}: killed with -9 and restarted", round + 1);
        controller = start();
    }

    // Every volume published at its Service's ClusterIP, endpoints at its current server.
    let converged = Instant::now();
    every_claim_converged(&env, &pvs, &servers).await;
    println!(
        "{claims} claims converged {:.1} s after the last restart, through {survived} kills",
        converged.elapsed().as_secs_f64()
    );

    // Nothing duplicated, nothing orphaned, no ClusterIP ever changed.
    one_of_each_owned_by_its_claim(&env, &pvs).await;
    let changed = history.changed();
    println!("ClusterIP changes: {}", changed.len());
    assert!(changed.is_empty(), "no Service recreated or readdressed: {changed:#?}");
    controller.stop().await;
    env.cleanup().await;
}

/// Waits until every volume is published at its Service's ClusterIP, with endpoints at its
/// current server.
async fn every_claim_converged(env: &TestEnv, pvs: &[String], servers: &BTreeMap<String, String>) {
    eventually("every claim converged", WAIT, || async {
        let services = env.all::<Service>().await;
        let slices = env.all::<EndpointSlice>().await;
        let ips: BTreeMap<String, String> = services
            .iter()
            .map(|s| {
                (
                    s.metadata.name.clone().unwrap(),
                    s.spec.clone().unwrap().cluster_ip.unwrap(),
                )
            })
            .collect();
        let at: BTreeMap<String, String> = slices
            .iter()
            .filter_map(|slice| {
                let ip = slice.endpoints.first()?.addresses.first()?;
                let port = slice.ports.as_ref()?.first()?.port?;
                Some((slice.metadata.name.clone()?, format!("{ip}:{port}")))
            })
            .collect();
        for pv in pvs {
            let mount = env.pv_annotation(pv, MOUNT_ENDPOINT).await?;
            (mount == format!("{}:2049", ips.get(pv)?)).then_some(())?;
            (at.get(pv) == servers.get(pv)).then_some(())?;
        }
        Some(())
    })
    .await;
}

/// One Service and EndpointSlice per claim, named after its PV, each owned by its claim alone;
/// no core/v1 Endpoints.
async fn one_of_each_owned_by_its_claim(env: &TestEnv, pvs: &[String]) {
    let claims = pvs.len();
    no_core_endpoints(env).await;
    let services = env.all::<Service>().await;
    let slices = env.all::<EndpointSlice>().await;
    let named = |names: Vec<Option<String>>| names.into_iter().flatten().collect::<BTreeSet<String>>();
    let expected: BTreeSet<String> = pvs.iter().cloned().collect();
    assert_eq!(services.len(), claims, "one Service per claim");
    assert_eq!(
        named(services.iter().map(|s| s.metadata.name.clone()).collect()),
        expected
    );
    assert_eq!(slices.len(), claims, "one EndpointSlice per claim");
    for owned in services
        .iter()
        .map(|s| &s.metadata)
        .chain(slices.iter().map(|s| &s.metadata))
    {
        let owners = owned.owner_references.as_deref().unwrap_or_default();
        assert!(
            owners.len() == 1 && owners[0].kind == "PersistentVolumeClaim",
            "{:?} is owned by its claim: {owners:?}",
            owned.name
        );
    }
}

/// The test's namespace holds no core/v1 Endpoints: the default (`--write-endpoints auto`)
/// writes none on a 1.33+ control plane.
async fn no_core_endpoints(env: &TestEnv) {
    let endpoints = env.names::<Endpoints>().await;
    assert!(endpoints.is_empty(), "no core/v1 Endpoints from 1.33: {endpoints:?}");
}
