//! What one HA-agent decision round costs (indexing the caches with `observe`, then `decide`),
//! as the cluster grows. Run: `cargo bench --bench agent_round`. Prints figures and the ratio of
//! the sizes measured side by side; asserts nothing.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use serde_json::json;
use shared_volume_controller::{
    Connection, DecisionSettings, Device, DrbdState, Filters, Resource, Snapshot, Timers, decide, observe,
};

const LOCAL_RESOURCES: usize = 100;
const NODES: usize = 50;

fn parse<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Arc<T> {
    Arc::new(serde_json::from_value(value).unwrap())
}

/// A cluster with `pods` pods spread over `NODES` nodes, one claim (and PV) per ten pods.
fn cluster(pods: usize) -> Snapshot {
    let claims = pods / 10;
    Snapshot {
        pvs: (0..claims)
            .map(|i| {
                parse::<PersistentVolume>(json!({
                    "metadata": {"name": format!("pv-{i}"), "annotations": {"storageos.com/nfs-service-endpoint": "10.0.0.1:2049"}},
                    "spec": {"accessModes": ["ReadWriteMany"], "claimRef": {"namespace": "apps", "name": format!("claim-{i}")},
                             "csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": format!("pvc-{i}")}}
                }))
            })
            .collect(),
        pods: (0..pods)
            .map(|i| {
                parse::<Pod>(json!({
                    "metadata": {"namespace": "apps", "name": format!("pod-{i}"), "uid": format!("u-{i}"),
                                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "r", "uid": "r"}]},
                    "spec": {"nodeName": format!("node-{}", i % NODES), "containers": [],
                             "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": format!("claim-{}", i % claims)}}]},
                    "status": {"phase": "Running"}
                }))
            })
            .collect(),
        attachments: vec![],
        nodes: (0..NODES)
            .map(|i| {
                parse::<Node>(json!({
                    "metadata": {"name": format!("node-{i}")},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}],
                               "addresses": [{"type": "InternalIP", "address": format!("10.0.1.{i}")}]}
                }))
            })
            .collect(),
        satellites: vec![],
        leases: vec![],
    }
}

/// This node is Secondary of `LOCAL_RESOURCES` resources whose primary (node-1) just vanished.
fn drbd() -> DrbdState {
    let resources: Vec<Resource> = (0..LOCAL_RESOURCES)
        .map(|i| Resource {
            name: format!("pvc-{i}"),
            role: "Secondary".into(),
            devices: vec![Device {
                quorum: true,
                ..Default::default()
            }],
            connections: vec![Connection {
                name: "node-1".into(),
                connection_state: "Connecting".into(),
                peer_role: "Unknown".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    let quorum_enabled = resources.iter().map(|r| r.name.clone()).collect();
    DrbdState {
        resources,
        quorum_enabled,
        ..Default::default()
    }
}

fn round_time(snapshot: &Snapshot) -> Duration {
    let settings = DecisionSettings {
        fail_over_timeout: Duration::ZERO,
        fail_over_unsafe_pods: false,
        disable_node_taints: false,
        max_tainted_fraction: 0.5,
        nfs_port: 2049,
        evacuate_taint: None,
        peers_restate_within: Duration::ZERO,
        report_interval: Duration::from_secs(5),
        not_ready_counts_after: Duration::ZERO,
    };
    let rounds = 20;
    let started = Instant::now();
    for _ in 0..rounds {
        let mut observed = observe("node-0", None, drbd(), snapshot, &Filters::default());
        observed.api_answering_since = Some(Instant::now());
        let actions = decide(&observed, &settings, &mut Timers::new(), Instant::now());
        black_box(actions);
    }
    started.elapsed() / rounds
}

fn main() {
    println!("one decision round: observe + decide, {LOCAL_RESOURCES} local resources failing over, {NODES} nodes");
    let mut previous: Option<(usize, Duration)> = None;
    for pods in [1_000, 10_000, 50_000] {
        let snapshot = cluster(pods);
        let time = round_time(&snapshot);
        let ratio = previous
            .map(|(p, t)| {
                format!(
                    "  ({:.1}x the time for {:.0}x the pods)",
                    time.as_secs_f64() / t.as_secs_f64(),
                    pods as f64 / p as f64
                )
            })
            .unwrap_or_default();
        println!(
            "{pods:>7} pods: {:>9.3} ms per round{ratio}",
            time.as_secs_f64() * 1000.0
        );
        previous = Some((pods, time));
    }
}
