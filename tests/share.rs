//! The LINSTOR path that binds, on a live control plane: `share` turns an existing DRBD resource
//! into a ReadWriteMany claim that Kubernetes' own PV controller binds, the controller serves it,
//! and each agent keeps drbd-reactor's promoter snippet for it on its node (a disk here: written;
//! a tie-breaker: none; the resource gone: removed; still Primary: kept until it is not).
//!
//! What it leaves out: drbd-reactor itself (no systemd here) and LINSTOR (the resource exists
//! only in the simulated `drbdsetup`); `tests/datapath.rs` runs the NFS server a promoter starts.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use common::drbd::{SimNode, WAIT, diskless, healthy, resource, teardown};
use common::process::Process;
use common::{SERVICE_ENDPOINT, TestEnv, eventually, tool};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;

/// Kubernetes' PV controller (the rest of the tests' control plane runs without it, so that no
/// other test's hand-bound PVs are touched), for the life of this test binary's one test.
struct VolumeBinder(Child);

impl VolumeBinder {
    fn start() -> Self {
        let kubeconfig = std::env::var("KUBECONFIG").expect("KUBECONFIG of the tests' control plane");
        let log = std::fs::File::create(std::env::temp_dir().join("svc-e2e-volume-binder.log")).unwrap();
        let child = tool("kube-controller-manager")
            .args([
                "--kubeconfig",
                &kubeconfig,
                "--controllers",
                "persistentvolume-binder-controller",
            ])
            .args(["--leader-elect=false", "--secure-port", "0"])
            // It syncs every PV of the cluster, also the hundreds earlier tests leave (PVs outlive
            // their namespaces): at the default 20 requests/s their status writes delayed this
            // test's binding past its 30 s wait.
            .args(["--kube-api-qps", "200", "--kube-api-burst", "400"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kube-controller-manager");
        Self(child)
    }
}

impl Drop for VolumeBinder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `share <args>` as the cluster's admin: its stdout, or its stderr when it fails.
fn share(args: &[&str]) -> Result<String, String> {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_shared-volume-controller"))
        .arg("share")
        .args(args)
        .output()
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    if output.status.success() {
        Ok(text(&output.stdout))
    } else {
        Err(text(&output.stderr))
    }
}

fn snippet(dir: &Path, resource: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(format!("shared-volume-{resource}.toml"))).ok()
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn a_shared_resource_binds_is_served_and_has_a_promoter_on_each_replica() {
    let binder = VolumeBinder::start();
    let env = common::setup("share").await;
    let res = env.pv_name("shared");
    let (nodes, dirs, processes) = replicas_with_agents(&env, &res).await;
    let claim_args = ["-n", env.ns.as_str(), "--claim", "data", "--size", "1Gi"];

    // A resource no agent reports is refused, and nothing is created.
    let missing = env.pv_name("missing");
    let refused = share(&[&[missing.as_str()][..], &claim_args].concat()).expect_err("refused");
    assert!(refused.contains("no agent reports a DRBD resource"), "{refused}");
    let pvs = Api::<PersistentVolume>::all(env.client.clone());
    assert!(pvs.get_opt(&missing).await.unwrap().is_none());

    let said = eventually("share to find the resource and the claim served", WAIT, || async {
        share(&[&[res.as_str(), "--wait", "30s"][..], &claim_args].concat()).ok()
    })
    .await;
    assert!(said.contains("True") && said.contains("clients mount"), "{said}");
    let claim = env.api::<PersistentVolumeClaim>().get("data").await.unwrap();
    let phase = claim.status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Bound"), "bound by the PV controller");
    // The volume's own NFS server port, on the node that is its primary.
    let port = env
        .pv_annotation(&res, "storageos.com/nfs-port")
        .await
        .expect("a port of its own");
    let served_at = format!("{}:{port}", nodes[0].ip);
    assert_eq!(env.pv_annotation(&res, SERVICE_ENDPOINT).await, Some(served_at));
    // Run again: the same objects, no error.
    share(&[&[res.as_str(), "--wait", "0s"][..], &claim_args].concat()).expect("a second run is harmless");

    snippets_follow_the_volume(&env, &nodes, &dirs, &port).await;
    teardown(env, processes).await;
    drop(binder);
}

/// Nodes a (Primary), b and c (a diskless tie-breaker) replicate `res`; the controller and an
/// agent per node, each writing snippets into its node's directory.
async fn replicas_with_agents(env: &TestEnv, res: &str) -> (Vec<SimNode>, Vec<PathBuf>, Vec<Process>) {
    let nodes = env.sim_nodes(&["a", "b", "c"]).await;
    healthy(&nodes, &[res], 0);
    let tie_breaker_peers = [
        (nodes[0].name.as_str(), "Connected", "Primary"),
        (&nodes[1].name, "Connected", "Secondary"),
    ];
    nodes[2].set(&[diskless(resource(res, "Secondary", true, &tie_breaker_peers))]);
    let dirs: Vec<PathBuf> = nodes.iter().map(|n| n.dir.join("drbd-reactor.d")).collect();
    let mut processes = vec![env.start_namespace_controller().await];
    for (node, dir) in nodes.iter().zip(&dirs) {
        std::fs::create_dir_all(dir).unwrap();
        let dir = dir.to_str().unwrap();
        processes.push(env.start_agent(node, &["--promoter-snippets-dir", dir]).await);
    }
    (nodes, dirs, processes)
}

/// The snippet is on each node with a disk (naming the volume's units and port) and none on the
/// tie-breaker; it goes from a node the resource leaves; when the volume stops being shared it
/// stays on the Primary until that is Secondary, so that its NFS server is never stopped under
/// its clients.
async fn snippets_follow_the_volume(env: &TestEnv, nodes: &[SimNode], dirs: &[PathBuf], port: &str) {
    let res = env.pv_name("shared");
    for dir in &dirs[..2] {
        let text = eventually("a snippet on each node with a disk", WAIT, || async {
            snippet(dir, &res)
        })
        .await;
        assert!(text.contains(&format!("shared-volume-fs@{res}.service")), "{text}");
        assert!(
            text.contains(&format!("shared-volume-nfs@{res}:{port}.service")),
            "{text}"
        );
    }
    assert_eq!(snippet(&dirs[2], &res), None, "a tie-breaker serves nothing");

    nodes[1].set(&[]);
    eventually("the snippet gone from node b", WAIT, || async {
        snippet(&dirs[1], &res).is_none().then_some(())
    })
    .await;

    env.api::<PersistentVolumeClaim>()
        .delete("data", &Default::default())
        .await
        .unwrap();
    let pvs = Api::<PersistentVolume>::all(env.client.clone());
    pvs.delete(&res, &Default::default()).await.unwrap();
    eventually("the PV gone", WAIT, || async {
        pvs.get_opt(&res).await.unwrap().is_none().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(snippet(&dirs[0], &res).is_some(), "kept while Primary");
    let peers = [(nodes[2].name.as_str(), "Connected", "Secondary")];
    nodes[0].set(&[resource(&res, "Secondary", true, &peers)]);
    eventually("the snippet gone from node a once Secondary", WAIT, || async {
        snippet(&dirs[0], &res).is_none().then_some(())
    })
    .await;
}
