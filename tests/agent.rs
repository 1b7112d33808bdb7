//! End-to-end tests of the `agent` subcommand: three simulated DRBD nodes (Node objects, a fake
//! `drbdsetup` each), real agent processes and the real control plane.

use std::time::{Duration, Instant};

use common::drbd::{
    FORCE_IO_ERROR, KUBELET_QUIET, LOST_QUORUM, SimNode, WAIT, app_on_node_a, cluster_events, drbd_taints,
    fail_over_durations, healthy, lost, no_labels, pod_state, pod_then_attachment_gone, resource, suspended, teardown,
    three_nodes, untouched, wait_for_eviction, wait_for_slice_at, wait_for_taint,
};
use common::process::Process;
use common::{MOUNT_ENDPOINT, SERVICE_ENDPOINT, TestEnv, eventually};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn the_primarys_node_fails_and_the_endpoints_follow_the_new_primary() {
    let (env, nodes, pv) = app_on_node_a("agent-failover").await;
    let attachment = env.attachment("att", &pv, &nodes[0].name).await;
    let controller = env.start_namespace_controller().await;
    let mount = env.published_mount_endpoint(&pv).await;
    let cluster_ip = env.cluster_ip(&pv).await.unwrap();
    let told = env.claim_condition_becomes("data", "True", "Served").await;
    assert!(told.contains(&mount) && told.contains(&nodes[0].endpoint()), "{told}");
    wait_for_slice_at(&env, &pv, &nodes[0]).await;
    let mut agents = agents_with_heartbeats(&env, &nodes).await;
    let lost = node_a_is_lost_and_failed_over(&env, &nodes, &pv, &attachment, &mut agents).await;
    let rewrite = node_b_is_promoted_and_serves(&env, &nodes, &pv).await;
    eprintln!(
        "fail-over figures: node lost → tainted in {:?} (fail-over timeout 1s), NotReady in \
         {:?} (Kubernetes, grace {:?}), force-delete + attachment deleted in {:?}; \
         DRBD role change → EndpointSlice at the new primary in {rewrite:?}",
        lost.tainted,
        lost.not_ready,
        common::drbd::node_monitor_grace_period(),
        lost.fail_over,
    );
    assert_eq!(
        env.cluster_ip(&pv).await.unwrap(),
        cluster_ip,
        "the ClusterIP never changes"
    );
    assert_eq!(env.pv_annotation(&pv, MOUNT_ENDPOINT).await, Some(mount));
    the_new_primary_counted_its_work(&agents).await;
    agents.push(controller);
    teardown(env, agents).await;
}

/// An agent on each node, each holding its heartbeat Lease.
async fn agents_with_heartbeats(env: &TestEnv, nodes: &[SimNode]) -> Vec<Process> {
    let mut agents = Vec::new();
    for node in nodes {
        agents.push(env.start_agent(node, &[]).await);
    }
    let leases: Api<Lease> = env.api();
    for node in nodes {
        let name = format!("shared-volume-agent-{}", node.name);
        let lease = eventually("the agent's heartbeat Lease", WAIT, || async {
            leases.get_opt(&name).await.unwrap()
        })
        .await;
        assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(node.name.as_str()));
    }
    assert_eq!(agents[0].get("/healthz").await.map(|r| r.0), Some(200));

    agents
}

/// When a fail-over's steps were seen, from the node's loss.
struct FailOverSeen {
    tainted: Duration,
    not_ready: Duration,
    fail_over: Duration,
}

async fn node_a_is_lost_and_failed_over(
    env: &TestEnv,
    nodes: &[SimNode],
    pv: &str,
    attachment: &str,
    agents: &mut Vec<Process>,
) -> FailOverSeen {
    // Node a dies: its agent and its kubelet with it; b and c see its DRBD links drop. The agents
    // act on DRBD's verdict (b and c could take the data over, so a cannot write) while
    // Kubernetes still has the node Ready: taint and evict at once, then force-delete the pod and
    // release the attachment once a's kubelet has gone silent too, as the seeds' controller does,
    // so that a replacement can attach before NotReady with Kubernetes's defaults.
    agents.remove(0).stop().await;
    nodes[0].kubelet.stop();
    let failed_at = Instant::now();
    lost(nodes, &[pv], 0, None);
    wait_for_taint(env, &nodes[0].name, LOST_QUORUM, true).await;
    let tainted = failed_at.elapsed();
    wait_for_eviction(env, "app").await;
    let evicted = failed_at.elapsed();
    let ready_when_evicted = env.node_ready(&nodes[0].name).await;
    pod_then_attachment_gone(env, "app", attachment, WAIT).await;
    let fail_over = failed_at.elapsed();
    env.wait_not_ready(&nodes[0].name).await;
    let not_ready = failed_at.elapsed();
    assert!(
        ready_when_evicted && evicted < not_ready,
        "the pod is evicted before Kubernetes decides: {evicted:?} vs NotReady at {not_ready:?}"
    );
    assert!(
        fail_over < KUBELET_QUIET + Duration::from_secs(4),
        "the pod and attachment are gone once a's kubelet is silent: {fail_over:?}"
    );
    // The agent that failed node a over reports how long the volume's fail-over took.
    let (count, sum) = fail_over_durations(agents, 1).await;
    assert!(count <= 2.0, "one volume, reported by the agents that tainted: {count}");
    let took = sum / count;
    assert!(
        (1.0..fail_over.as_secs_f64() + 5.0).contains(&took),
        "from the first sign of loss to the last step: {took:.2} s (fail-over timeout 1 s, steps done after {fail_over:?})"
    );
    cluster_events(env, &nodes[0].name, "NodeStorageQuorumLost").await;
    env.wait_for_events("app", "VolumeWithoutQuorum").await;
    assert_eq!(
        drbd_taints(env, &nodes[1].name).await,
        None,
        "healthy nodes stay untainted"
    );

    FailOverSeen {
        tainted,
        not_ready,
        fail_over,
    }
}

/// DRBD promotes node b; its agent publishes itself and rewrites the endpoints: how long that
/// took from the role change.
async fn node_b_is_promoted_and_serves(env: &TestEnv, nodes: &[SimNode], pv: &str) -> Duration {
    let promoted_at = Instant::now();
    lost(nodes, &[pv], 0, Some(1));
    wait_for_slice_at(env, pv, &nodes[1]).await;
    let rewrite = promoted_at.elapsed();
    let on_b = format!("on node {}", nodes[1].name);
    env.claim_condition_says("data", "True", "ServedAfterMove", &on_b).await;
    let endpoints = env.api::<k8s_openapi::api::core::v1::Endpoints>().get_opt(pv).await;
    assert!(
        endpoints.unwrap().is_none(),
        "no core/v1 Endpoints on a 1.33+ control plane (--write-endpoints auto)"
    );
    assert_eq!(env.pv_annotation(pv, SERVICE_ENDPOINT).await, Some(nodes[1].endpoint()));
    cluster_events(env, pv, "ServiceEndpointMoved").await;
    rewrite
}

/// Node b rewrote the endpoints once and timed its DRBD reads; node c never published.
async fn the_new_primary_counted_its_work(agents: &[Process]) {
    let rewrites = agents[0]
        .metric("storageos_drbd_agent_endpoint_rewrite_duration_seconds_count")
        .await;
    assert_eq!(rewrites, 1.0, "node b rewrote the endpoints once");
    let reads = agents[0]
        .metric("storageos_drbd_agent_drbd_read_duration_seconds_count")
        .await;
    assert!(reads >= 1.0, "node b's DRBD reads are timed: {reads}");
    assert_eq!(
        agents[1]
            .metric("storageos_drbd_agent_actions_total{action=\"publish\",result=\"ok\"}")
            .await,
        0.0,
        "node c never publishes while b is primary"
    );
    assert_eq!(
        agents[0]
            .metric("storageos_drbd_agent_resources{quorum=\"true\",role=\"Primary\"}")
            .await,
        1.0
    );
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn own_taints_follow_quorum_and_io_errors_and_a_suspended_primary_is_demoted() {
    let (env, nodes, pv) = three_nodes("agent-own-node").await;
    let b = &nodes[1];
    env.running_pod("local", &b.name, "data", json!({}), no_labels()).await;
    let isolated = || {
        resource(
            &pv,
            "Primary",
            false,
            &[
                (&nodes[0].name, "Connecting", "Unknown"),
                (&nodes[2].name, "Connecting", "Unknown"),
            ],
        )
    };
    b.set(&[isolated()]);
    let agent = env.start_agent(b, &[]).await;

    // Isolated primary without quorum: own taint, and it never publishes itself.
    wait_for_taint(&env, &b.name, LOST_QUORUM, true).await;
    cluster_events(&env, &b.name, "NodeStorageQuorumLost").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        env.pv_annotation(&pv, SERVICE_ENDPOINT).await,
        Some(nodes[0].endpoint())
    );

    // Quorum regained as primary: taint removed, and now it does publish itself.
    let peers = [
        (nodes[0].name.as_str(), "Connected", "Secondary"),
        (nodes[2].name.as_str(), "Connected", "Secondary"),
    ];
    b.set(&[resource(&pv, "Primary", true, &peers)]);
    wait_for_taint(&env, &b.name, LOST_QUORUM, false).await;
    cluster_events(&env, &b.name, "NodeStorageQuorumRegained").await;
    eventually("node b published", WAIT, || async {
        (env.pv_annotation(&pv, SERVICE_ENDPOINT).await == Some(b.endpoint())).then_some(())
    })
    .await;

    // Forcing IO errors: own force-io taint and the local pod evicted (node Ready).
    let mut failing = resource(&pv, "Secondary", true, &peers);
    failing["force-io-failures"] = json!(true);
    b.set(&[failing]);
    wait_for_taint(&env, &b.name, FORCE_IO_ERROR, true).await;
    wait_for_eviction(&env, "local").await;
    env.wait_for_events("local", "VolumeForcingIoErrors").await;
    b.set(&[resource(&pv, "Secondary", true, &peers)]);
    wait_for_taint(&env, &b.name, FORCE_IO_ERROR, false).await;

    // IO suspended by a snapshot (`user`), with quorum, past the fail-over timeout: left alone.
    let forced = format!("secondary --force {pv}");
    b.set(&[suspended(resource(&pv, "Primary", true, &peers), "user")]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !b.calls().contains(&forced),
        "a snapshot's suspension is no reason to demote"
    );
    // Suspended for quorum, without quorum, node a's agent stating quorum with c: demoted (its
    // only local consumer is terminating).
    let a = &nodes[0];
    a.set(&[resource(
        &pv,
        "Secondary",
        true,
        &[
            (&b.name, "Connecting", "Unknown"),
            (&nodes[2].name, "Connected", "Secondary"),
        ],
    )]);
    let agent_a = env.start_agent(a, &[]).await;
    b.set(&[suspended(isolated(), "quorum")]);
    eventually("drbdsetup secondary --force", WAIT, || async {
        b.calls().contains(&forced).then_some(())
    })
    .await;
    teardown(env, vec![agent, agent_a]).await;
}

/// `drbdsetup rename-resource`: events2 prints `rename resource`, and the changes after it name
/// the new resource; the agent's stream stays trusted (no full read on every change after it).
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn a_renamed_resource_keeps_the_events2_stream_trusted() {
    let env = common::setup("agent-rename").await;
    let nodes = env.sim_nodes(&["a", "b"]).await;
    let peers = [(nodes[1].name.as_str(), "Connected", "Secondary")];
    nodes[0].set(&[resource("old-name", "Secondary", true, &peers)]);
    let agent = env.start_agent(&nodes[0], &[]).await;
    let mut renamed = resource("new-name", "Primary", true, &peers);
    renamed["renamed-from"] = json!("old-name");
    nodes[0].set(&[renamed]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(
        !log.contains("printed a line that is"),
        "the stream was taken for garbage"
    );
    teardown(env, vec![agent]).await;
}

/// Volumes that are not this product's to share get nothing from either loop: an RWX Block volume
/// (a VM disk shared for live migration), one LINSTOR CSI's own NFS export serves, one whose PV is
/// opted out, and one of a storage class neither loop is given. No service endpoint, no Service,
/// no condition (but LINSTOR's claim's, which says what LINSTOR advertises), no event, while an
/// ordinary volume beside them is published and served (so the test can fail).
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn volumes_that_are_not_ours_to_share_get_nothing() {
    let env = common::setup("agent-not-ours").await;
    let nodes = env.sim_nodes(&["a", "b"]).await;
    let opt_out = [("storageos.com/shared-volume".to_owned(), "false".to_owned())].into();
    let pvs = [
        env.bound_rwx_block_claim("vm-disk", Default::default()).await,
        env.bound_rwx_claim_served_by_linstor_nfs("linstor-nfs").await,
        env.bound_rwx_claim("opted-out", opt_out).await,
        env.bound_claim("other-class", "ReadWriteMany", "other", Default::default())
            .await,
        env.bound_rwx_claim("ours", Default::default()).await,
    ]
    .map(|(_, pv)| pv.metadata.name.unwrap());
    let resources: Vec<&str> = pvs.iter().map(String::as_str).collect();
    healthy(&nodes, &resources, 0);
    let agent = env.start_agent(&nodes[0], &["--storage-class", "replicated"]).await;
    let filters = [
        "--csi-driver",
        "linstor.csi.linbit.com",
        "--storage-class",
        "replicated",
    ];
    let controller = env.start_controller(&filters).await;
    let ours = &pvs[4];
    eventually("the ordinary volume published", WAIT, || {
        env.pv_annotation(ours, SERVICE_ENDPOINT)
    })
    .await;
    // The agent published it, so the controller tells where it moved.
    env.claim_condition_becomes("ours", "True", "ServedAfterMove").await;
    // Rounds enough for the agent and the controller to have acted on the others too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let claims = ["vm-disk", "linstor-nfs", "opted-out", "other-class"];
    for (claim, pv) in claims.iter().zip(&pvs) {
        assert_eq!(
            env.pv_annotation(pv, SERVICE_ENDPOINT).await,
            None,
            "{claim}: no service endpoint"
        );
        assert_eq!(env.cluster_ip(pv).await, None, "{claim}: no Service");
        let pvc = env
            .api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>()
            .get(claim)
            .await
            .unwrap();
        let conditions = pvc.status.and_then(|s| s.conditions).unwrap_or_default();
        let stated: Vec<_> = conditions
            .iter()
            .filter(|c| c.type_ == "SharedVolumeReady")
            .map(|c| c.reason.as_deref().unwrap_or_default())
            .collect();
        let expected: &[&str] = match *claim {
            "linstor-nfs" => &["LinstorNfsNotAdvertised"],
            _ => &[],
        };
        assert_eq!(stated, expected, "{claim}: its condition");
        let events = Api::<k8s_openapi::api::events::v1::Event>::all(env.client.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        let about: Vec<_> = events
            .iter()
            .filter(|e| {
                e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_deref())
                    .is_some_and(|n| n == *claim || n == pv)
            })
            .map(|e| e.reason.clone())
            .collect();
        assert!(about.is_empty(), "{claim}: no event, got {about:?}");
    }
    teardown(env, vec![agent, controller]).await;
}

/// An agent keeps only its node's volumes: of twenty-one PVs (one of a resource on its node) it
/// holds one, with its attachment. A resource that reaches the node after its PV (a new replica)
/// is listed again and served at once.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn an_agent_keeps_only_its_nodes_volumes_and_takes_one_that_arrives() {
    let env = common::setup("agent-locality").await;
    let nodes = env.sim_nodes(&["a", "b"]).await;
    for claim in ["ours", "later"] {
        env.bound_rwx_claim(claim, Default::default()).await;
    }
    let (ours, later) = (env.pv_name("ours"), env.pv_name("later"));
    let mut elsewhere = Vec::new();
    for i in 0..20 {
        let (pv, claim) = (env.pv_name(&format!("elsewhere-{i}")), format!("elsewhere-{i}"));
        env.create_pv(&pv, &claim, None, "ReadWriteMany", "replicated", Default::default())
            .await;
        elsewhere.push(pv);
    }
    env.attachment("ours", &ours, &nodes[1].name).await;
    env.attachment("elsewhere", &elsewhere[0], &nodes[1].name).await;
    healthy(&nodes, &[&ours], 0);
    let agent = env.start_agent(&nodes[0], &[]).await;
    let published_here = |pv: String| {
        let env = &env;
        let at = nodes[0].endpoint();
        async move { (env.pv_annotation(&pv, SERVICE_ENDPOINT).await == Some(at)).then_some(()) }
    };
    eventually("its own volume published", WAIT, || published_here(ours.clone())).await;
    let cached = |kind: &str| format!("storageos_drbd_agent_cached_objects{{kind=\"{kind}\"}}");
    assert_eq!(agent.metric(&cached("pvs")).await, 1.0, "only the PV of its resource");
    assert_eq!(
        agent.metric(&cached("attachments")).await,
        1.0,
        "only that PV's attachment"
    );

    // The other volume's resource reaches node a, Primary there: its PV was dropped until now.
    healthy(&nodes, &[&ours, &later], 0);
    eventually("the newly local volume published", WAIT, || {
        published_here(later.clone())
    })
    .await;
    assert_eq!(agent.metric(&cached("pvs")).await, 2.0);
    teardown(env, vec![agent]).await;
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn a_flapping_peer_is_left_alone_and_ignored_pods_are_never_touched() {
    let (env, nodes, pv) = app_on_node_a("agent-flapping").await;
    let ignored = json!({"drbd.linbit.com/ignore-fail-over": ""});
    env.running_pod("ignored", &nodes[0].name, "data", ignored, no_labels())
        .await;
    let agent = env.start_agent(&nodes[1], &["--fail-over-timeout", "3s"]).await;

    // Node a drops out for about a second at a time, three times: shorter than the timeout.
    for _ in 0..3 {
        lost(&nodes, &[&pv], 0, None);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        healthy(&nodes, &[&pv], 0);
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert_eq!(drbd_taints(&env, &nodes[0].name).await, None, "no fail-over for a flap");
    assert!(pod_state(&env, "app").await.is_some());
    assert_eq!(
        agent
            .metric("storageos_drbd_agent_actions_total{action=\"taint\",result=\"ok\"}")
            .await,
        0.0
    );

    // Gone for good (node still Ready): taint, the owned pod evicted, the ignored one untouched.
    lost(&nodes, &[&pv], 0, None);
    wait_for_taint(&env, &nodes[0].name, LOST_QUORUM, true).await;
    wait_for_eviction(&env, "app").await;
    let ignored = pod_state(&env, "ignored").await.expect("the ignored pod still exists");
    assert!(
        ignored.metadata.deletion_timestamp.is_none(),
        "the ignored pod is untouched"
    );
    teardown(env, vec![agent]).await;
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn dry_run_reports_and_writes_nothing_and_the_guard_refuses_taints() {
    let (env, nodes, pv) = app_on_node_a("agent-safety").await;
    let attachment = env.attachment("att", &pv, &nodes[0].name).await;
    env.lose_node_and_wait_not_ready(&nodes[0]).await;
    let dry = env.start_agent(&nodes[1], &["--dry-run"]).await;
    lost(&nodes, &[&pv], 0, Some(1));

    let reports = env.wait_for_events("app", "DryRun").await;
    assert!(
        reports[0]
            .note
            .as_deref()
            .unwrap()
            .starts_with("dry run: would force-delete pod")
    );
    eventually("every action reported", WAIT, || async {
        let refused = dry
            .metric("storageos_drbd_agent_refused_actions_total{action=\"publish\",why=\"dry_run\"}")
            .await;
        (refused >= 1.0).then_some(())
    })
    .await;
    for kind in ["taint", "force_delete", "delete_attachment"] {
        let sample = format!("storageos_drbd_agent_refused_actions_total{{action=\"{kind}\",why=\"dry_run\"}}");
        assert!(dry.metric(&sample).await >= 1.0, "{kind} reported");
    }
    assert_eq!(drbd_taints(&env, &nodes[0].name).await, None);
    assert!(pod_state(&env, "app").await.is_some());
    assert!(env.attachment_exists(&attachment).await);
    assert_eq!(
        env.pv_annotation(&pv, SERVICE_ENDPOINT).await,
        Some(nodes[0].endpoint())
    );
    dry.stop().await;

    // The guard: with node c already tainted, tainting a would leave 2 of 3 nodes tainted.
    env.add_taint(&nodes[2].name, "example.com/maintenance").await;
    env.add_taint(&nodes[2].name, LOST_QUORUM).await;
    let agent = env.start_agent(&nodes[1], &[]).await;
    cluster_events(&env, &nodes[0].name, "FailOverRefused").await;
    assert_eq!(
        agent
            .metric("storageos_drbd_agent_refused_actions_total{action=\"taint\",why=\"guard\"}")
            .await,
        1.0
    );
    assert!(!env.taints(&nodes[0].name).await.contains(&LOST_QUORUM.to_string()));
    let taints = env.taints(&nodes[2].name).await;
    assert!(
        taints.contains(&LOST_QUORUM.to_string()) && taints.contains(&"example.com/maintenance".to_string()),
        "other writers' taints are kept: {taints:?}"
    );
    eventually(
        "Kubernetes's own taint on the lost node, beside nothing of ours",
        WAIT,
        || async {
            let taints = env.taints(&nodes[0].name).await;
            taints
                .contains(&"node.kubernetes.io/unreachable".to_string())
                .then_some(())
        },
    )
    .await;
    teardown(env, vec![agent]).await;
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn the_evacuate_policy_moves_the_primary_off_a_drained_node() {
    let (env, nodes, pv) = three_nodes("agent-evacuate").await;
    healthy(&nodes, &[&pv], 0);
    let labels = json!({"app": "nfs-server"});
    env.running_pod("server", &nodes[0].name, "data", json!({}), labels)
        .await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "nfs-server"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "nfs-server"}}},
    }))
    .unwrap();
    let pdbs: Api<PodDisruptionBudget> = env.api();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let evacuate = ["--node-drain-policy", "evacuate"];
    let a = env.start_agent(&nodes[0], &evacuate).await;
    let b = env.start_agent(&nodes[1], &evacuate).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(untouched(&env, "server").await);

    env.add_taint(&nodes[0].name, "piraeus.io/evacuate").await;
    env.wait_for_events("server", "EvictionBlocked").await;
    assert!(untouched(&env, "server").await, "the PDB holds");
    pdbs.delete("nfs-server", &DeleteParams::default()).await.unwrap();
    wait_for_eviction(&env, "server").await;
    env.wait_for_events("server", "NodeEvacuation").await;

    // DRBD hands the primary over to node b, whose agent takes the service endpoint.
    healthy(&nodes, &[&pv], 1);
    eventually("node b published", WAIT, || async {
        (env.pv_annotation(&pv, SERVICE_ENDPOINT).await == Some(nodes[1].endpoint())).then_some(())
    })
    .await;
    teardown(env, vec![a, b]).await;
}

/// `pv`'s resource Primary here, connected to `peers` whose disks are still syncing.
fn primary_with_peers_syncing(pv: &str, peers: &[(&str, &str, &str)]) -> serde_json::Value {
    let mut syncing = resource(pv, "Primary", true, peers);
    for connection in syncing["connections"].as_array_mut().unwrap() {
        connection["peer_devices"][0]["peer-disk-state"] = json!("Inconsistent");
    }
    syncing
}

/// A drain does not evict the NFS server while no connected peer has all of the data (here both
/// replicas are still syncing): the agent says so on the PV, and evicts once one is UpToDate.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn a_drain_waits_for_a_replica_that_can_take_over() {
    let (env, nodes, pv) = three_nodes("agent-evacuate-held").await;
    let peers = [
        (nodes[1].name.as_str(), "Connected", "Secondary"),
        (nodes[2].name.as_str(), "Connected", "Secondary"),
    ];
    nodes[0].set(&[primary_with_peers_syncing(&pv, &peers)]);
    env.running_pod("server", &nodes[0].name, "data", json!({}), no_labels())
        .await;
    let a = env.start_agent(&nodes[0], &["--node-drain-policy", "evacuate"]).await;
    env.add_taint(&nodes[0].name, "piraeus.io/evacuate").await;
    let held = cluster_events(&env, &pv, "EvacuationHeld").await;
    assert_eq!(held[0].type_.as_deref(), Some("Warning"));
    assert!(untouched(&env, "server").await);

    nodes[0].set(&[resource(&pv, "Primary", true, &peers)]);
    wait_for_eviction(&env, "server").await;
    teardown(env, vec![a]).await;
}

/// On the drbd-reactor path no pod holds the primary, so a drain asks drbd-reactor to hand the
/// resource over: a request file in the snippets directory, which the host's path unit turns into
/// `drbd-reactorctl evict --keep-masked`. Held while no connected peer has all of the data (and
/// said on the PV), asked once one catches up, kept while the peer serves the volume (the node
/// does not take it back), withdrawn once the node is uncordoned.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn a_drain_asks_drbd_reactor_to_hand_the_primary_over_once_a_replica_can_take_it() {
    let (env, nodes, pv) = three_nodes("agent-evacuate-reactor").await;
    let peers = [
        (nodes[1].name.as_str(), "Connected", "Secondary"),
        (nodes[2].name.as_str(), "Connected", "Secondary"),
    ];
    nodes[0].set(&[primary_with_peers_syncing(&pv, &peers)]);
    let snippets = nodes[0].dir.join("drbd-reactor.d");
    std::fs::create_dir_all(&snippets).unwrap();
    let dir = snippets.display().to_string();
    let flags = ["--node-drain-policy", "evacuate", "--promoter-snippets-dir", &dir];
    let a = env.start_agent(&nodes[0], &flags).await;
    let request = snippets.join(".shared-volume-evict").join(&pv);
    let asked = || async { request.exists().then_some(()) };
    env.cordon(&nodes[0].name, true).await;
    let held = cluster_events(&env, &pv, "EvacuationHeld").await;
    assert_eq!(held[0].type_.as_deref(), Some("Warning"));
    assert!(!request.exists(), "no hand-over while no peer has all of the data");

    nodes[0].set(&[resource(&pv, "Primary", true, &peers)]);
    eventually("the hand-over asked of drbd-reactor", WAIT, asked).await;
    let gauge = "storageos_drbd_agent_promoter_hand_overs";
    eventually("the gauge at 1", WAIT, || async {
        (a.metric(gauge).await == 1.0).then_some(())
    })
    .await;
    // drbd-reactor evicts it: node a demoted, b promoted. The request stays while a drains.
    healthy(&nodes, &[&pv], 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        request.exists(),
        "kept while the node drains: it does not take the volume back"
    );

    env.cordon(&nodes[0].name, false).await;
    eventually("the request withdrawn", WAIT, || async {
        (!request.exists()).then_some(())
    })
    .await;
    teardown(env, vec![a]).await;
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn the_agent_warns_when_piraeus_ha_controller_runs_on_its_node() {
    let (env, nodes, _pv) = three_nodes("agent-piraeus").await;
    let b = &nodes[1];
    let agent = env.start_agent(b, &[]).await;
    let gauge = "storageos_drbd_agent_piraeus_ha_controller_pods";
    assert_eq!(agent.metric(gauge).await, 0.0);
    // A pod of piraeus-operator v2's HA Controller DaemonSet on another node: not this agent's.
    let piraeus = json!({"app.kubernetes.io/component": "ha-controller"});
    let elsewhere = json!({"name": "none", "emptyDir": {}});
    env.running_pod_with(
        "ha-controller-a",
        &nodes[0].name,
        elsewhere.clone(),
        json!({}),
        piraeus.clone(),
    )
    .await;
    env.running_pod_with("ha-controller-b", &b.name, elsewhere, json!({}), piraeus)
        .await;
    let warning = cluster_events(&env, &b.name, "PiraeusHaControllerRunning").await;
    assert_eq!(warning[0].type_.as_deref(), Some("Warning"));
    let note = warning[0].note.clone().unwrap();
    assert!(
        note.contains("ha-controller-b")
            && !note.contains("ha-controller-a")
            && note.contains("highAvailabilityController"),
        "{note}"
    );
    eventually("the gauge at 1", WAIT, || async {
        (agent.metric(gauge).await == 1.0).then_some(())
    })
    .await;
    assert_eq!(drbd_taints(&env, &b.name).await, None, "a warning, nothing else");
    teardown(env, vec![agent]).await;
}

/// A round that stalls does not keep the node's report from its peers. Node b's round hangs for
/// 30 s on `drbdsetup secondary --force` (b, a suspended primary of the volume without quorum or
/// consumers, is demoted: node a states quorum); meanwhile b's DRBD notices the link to c of
/// another resource drop. Its report must say so in seconds: a peer that reads an unchanged report
/// past its hold takes b for silent. Nor does it keep b from stopping when asked.
#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn a_stalled_round_still_reports_a_drbd_change_at_once() {
    let (env, nodes, pv) = three_nodes("agent-stalled-round").await;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    fn up<'a>(node: &'a SimNode, role: &'a str) -> (&'a str, &'a str, &'a str) {
        (node.name.as_str(), "Connected", role)
    }
    fn down(node: &SimNode) -> (&str, &str, &str) {
        (node.name.as_str(), "Connecting", "Unknown")
    }
    let stuck = || suspended(resource(&pv, "Primary", false, &[down(a), down(c)]), "quorum");
    a.set(&[resource(&pv, "Secondary", true, &[down(b), up(c, "Secondary")])]);
    b.set(&[
        stuck(),
        resource("r2", "Secondary", true, &[up(a, "Secondary"), up(c, "Secondary")]),
    ]);
    std::fs::write(b.dir.join("hang-secondary"), "").unwrap();
    let agents = vec![
        env.start_agent(a, &[]).await,
        env.start_agent(b, &["--operations-timeout", "30s"]).await,
    ];
    let forced = format!("secondary --force {pv}");
    eventually("b's round stalled on the demotion", WAIT, || async {
        b.calls().contains(&forced).then_some(())
    })
    .await;
    b.set(&[
        stuck(),
        resource("r2", "Secondary", true, &[up(a, "Secondary"), down(c)]),
    ]);
    let changed = Instant::now();
    let leases: Api<Lease> = env.api();
    let report_of_b = format!("shared-volume-agent-report-{}", b.name);
    eventually("b's report of the dropped link", Duration::from_secs(5), || async {
        let lease = leases.get_opt(&report_of_b).await.unwrap()?;
        let text = lease.metadata.annotations?.get("storageos.com/drbd-report")?.clone();
        let report: serde_json::Value = serde_json::from_str(&text).ok()?;
        let disconnected = report["resources"]["r2"]["disconnected"].as_array()?.clone();
        disconnected.contains(&json!(c.name)).then_some(())
    })
    .await;
    eprintln!(
        "stalled round: b's report stated the drop {:?} after it",
        changed.elapsed()
    );
    // Asked to stop while its round still hangs, b stops at once: a rolling update or a drain
    // must not wait out the operations timeout (30 s here, 1 min by default) and a SIGKILL.
    let mut agents = agents;
    let stalled = agents.pop().unwrap();
    let asked = Instant::now();
    stalled.stop().await;
    let stopped = asked.elapsed();
    eprintln!("stalled round: b stopped {stopped:?} after SIGTERM, its round still hanging");
    assert!(stopped < Duration::from_secs(5), "b took {stopped:?} to stop");
    std::fs::remove_file(b.dir.join("hang-secondary")).unwrap();
    teardown(env, agents).await;
}
