//! P10: what kube-proxy's sync costs with as many Services as a cluster with thousands of RWX claims
//! has, in iptables and nftables modes. Each claim brings one selector-less ClusterIP Service and
//! one EndpointSlice, made here as the controller makes them (without the controller: this measures
//! kube-proxy, not us). Per mode: kube-proxy starts over all of them (its first sync is a full
//! one), then volumes move one at a time (their slice points elsewhere), each timed from the write
//! to the end of the sync whose rules send the Service there.

use std::time::{Duration, Instant, SystemTime};

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;

use super::{CONCURRENCY, Figure};
use common::datapath::{DataPath, ProxyMode};
use common::process::{http_get, sample_value};
use common::{self, TestEnv};

/// Where moved volumes' slices point: TEST-NET-1, never routed (no traffic is sent; only rules).
const MOVED_TO: &str = "192.0.2";

pub async fn sync_at_scale(services: usize, moves: usize) -> Vec<Figure> {
    let env = common::setup("bench-proxy").await;
    let names: Vec<String> = (0..services).map(|i| format!("nfs-{i}")).collect();
    let started = Instant::now();
    stream::iter(names.iter().enumerate())
        .for_each_concurrent(CONCURRENCY, |(i, name)| shared_volume_objects(&env, name, at(i)))
        .await;
    println!(
        "P10 {services} Services and EndpointSlices created in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut figures = Vec::new();
    // Each move goes somewhere no volume was before, in either mode.
    let mut destinations = (1..=250).map(|host| format!("{MOVED_TO}.{host}")).cycle();
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables] {
        // A namespace of its own per mode for the data path's Nodes; kube-proxy sees every
        // namespace's Services.
        let node_env = common::setup(&format!("bench-proxy-{}", mode.flag())).await;
        let path = DataPath::up(&node_env, &["a"], mode).await;
        let last = names.last().expect("at least one Service");
        let first_sync = until_programmed(&path, &env, last, &at(services - 1), Instant::now()).await;
        let (full_total, fulls) = syncs(&path, "full").await;
        let full = full_total / fulls.max(1.0);
        let (partial_before, partials_before) = syncs(&path, "partial").await;
        let mut moved = Vec::new();
        for k in 0..moves {
            let name = &names[k * services / moves];
            let to = destinations.next().expect("endless");
            let written = Instant::now();
            point_slice_at(&env, name, &to).await;
            moved.push(until_programmed(&path, &env, name, &to, written).await);
        }
        // kube-proxy counts a sync once it has written its rules: give the last one a moment.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (partial_after, partials_after) = syncs(&path, "partial").await;
        let partial = (partial_after - partial_before) / (partials_after - partials_before).max(1.0);
        println!(
            "P10 {}: all {services} programmed {:.1} s after kube-proxy started; full sync {:.2} s; moves {:?}",
            mode.flag(),
            first_sync.as_secs_f64(),
            full,
            moved
        );
        figures.extend(mode_figures(mode, services, full, partial, &moved));
        drop(path);
        node_env.cleanup().await;
    }
    env.cleanup().await;
    figures
}

/// P10's lines for one mode. Figures for users to size by, not targets.
fn mode_figures(mode: ProxyMode, services: usize, full: f64, partial: f64, moved: &[Duration]) -> Vec<Figure> {
    let line = |what: String, value: f64| Figure {
        id: "P10",
        what,
        n: services,
        product: value,
        floor: None,
        unit: "ms",
        target: "-".into(),
        met: true,
    };
    let mode = mode.flag();
    vec![
        line(
            format!("kube-proxy {mode}: full sync (its first, at start)"),
            full * 1000.0,
        ),
        line(
            format!("kube-proxy {mode}: partial sync, mean over the moves"),
            partial * 1000.0,
        ),
        line(
            format!("kube-proxy {mode}: a move programmed, median of {}", moved.len()),
            super::quantile(moved, 0.5),
        ),
    ]
}

/// The address volume `i` is served from before any move: 10.200.0.0/16, one per volume.
fn at(i: usize) -> String {
    format!("10.200.{}.{}", i / 250, 1 + i % 250)
}

/// One shared volume's Service and EndpointSlice, as the controller writes them.
async fn shared_volume_objects(env: &TestEnv, name: &str, server: String) {
    let services = env.api::<Service>();
    let service = json!({
        "metadata": {"name": name},
        "spec": {"type": "ClusterIP", "ports": [{"name": "nfs", "port": 2049, "protocol": "TCP", "targetPort": 2049}]},
    });
    services
        .create(&PostParams::default(), &serde_json::from_value(service).unwrap())
        .await
        .expect("create Service");
    let slices = env.api::<EndpointSlice>();
    let slice = json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/service-name": name,
            "endpointslice.kubernetes.io/managed-by": "shared-volume-controller.storageos.com",
        }},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [server], "conditions": {"ready": true}}],
        "ports": [{"name": "nfs", "port": 2049, "protocol": "TCP"}],
    });
    slices
        .create(&PostParams::default(), &serde_json::from_value(slice).unwrap())
        .await
        .expect("create EndpointSlice");
}

/// What an agent's move writes: the slice's endpoint, and when the move was triggered.
async fn point_slice_at(env: &TestEnv, name: &str, ip: &str) {
    let slices = env.api::<EndpointSlice>();
    let triggered = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = json!({
        "metadata": {"annotations": {"endpoints.kubernetes.io/last-change-trigger-time": triggered}},
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
    });
    slices
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("move the slice");
}

/// From `since` to the end of the sync after which kube-proxy sends `name` to `ip`, by the sync's
/// own timestamp, so that polling does not add to it. Polls the cheap metric, and dumps the rules
/// (large at 10,000 Services) only once per sync.
async fn until_programmed(path: &DataPath, env: &TestEnv, name: &str, ip: &str, since: Instant) -> Duration {
    let since_wall = SystemTime::now() - since.elapsed();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut checked = 0.0;
    loop {
        assert!(Instant::now() < deadline, "kube-proxy never sent {name} to {ip}");
        let synced = metric(path, "kubeproxy_sync_proxy_rules_last_timestamp_seconds").await;
        if synced > checked {
            checked = synced;
            if sends_to(path, &env.ns, name, ip) {
                // The sync that wrote the rules may have ended after the timestamp read above:
                // its own is the latest one now.
                let synced = metric(path, "kubeproxy_sync_proxy_rules_last_timestamp_seconds").await;
                let synced_at = SystemTime::UNIX_EPOCH + Duration::from_secs_f64(synced);
                return synced_at.duration_since(since_wall).unwrap_or_default();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether kube-proxy's rules send `name` to `ip`. Beyond 1,000 endpoints kube-proxy's iptables
/// mode leaves out the comments [`DataPath::programmed`] reads; every address here belongs to one
/// Service, so a DNAT to it is that Service's.
fn sends_to(path: &DataPath, namespace: &str, name: &str, ip: &str) -> bool {
    match path.mode() {
        ProxyMode::Iptables => {
            let rules = std::process::Command::new("iptables-save")
                .args(["-t", "nat"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&rules.stdout).contains(&format!("--to-destination {ip}:2049"))
        }
        ProxyMode::Nftables => path.programmed(namespace, name, ip),
    }
}

/// The total time and count so far of kube-proxy's `kind` (full, partial) syncs, in one read.
async fn syncs(path: &DataPath, kind: &str) -> (f64, f64) {
    let [total, count] = metrics(
        path,
        [
            &format!("kubeproxy_sync_{kind}_proxy_rules_duration_seconds_sum"),
            &format!("kubeproxy_sync_{kind}_proxy_rules_duration_seconds_count"),
        ],
    )
    .await;
    (total, count)
}

/// One IPv4 sample of kube-proxy's metrics; 0 while it does not serve them yet.
async fn metric(path: &DataPath, name: &str) -> f64 {
    let [value] = metrics(path, [name]).await;
    value
}

/// IPv4 samples of kube-proxy's metrics from one read of `/metrics`; 0s while it does not
/// serve them yet.
async fn metrics<const N: usize>(path: &DataPath, names: [&str; N]) -> [f64; N] {
    let body = http_get(path.proxy_metrics(), "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default();
    names.map(|name| sample_value(&body, &format!("{name}{{ip_family=\"IPv4\"}}")).unwrap_or(0.0))
}
