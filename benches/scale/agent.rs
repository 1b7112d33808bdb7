//! P6 (agent) and P7: an agent's memory among many pods, and what churn on other nodes costs it.

use super::*;

/// `n` pods of a realistic size, `own` of them on `node` and the rest spread over 50 other nodes.
pub(super) async fn pods_around(env: &TestEnv, node: &str, n: usize, own: usize) {
    let pod = |i: usize, node: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("load-{i}"), "labels": {"app": format!("app-{}", i % 100)},
                         "annotations": {"example.com/config": "x".repeat(500)}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.example.com/app:1",
                     "env": (0..15).map(|k| json!({"name": format!("VAR_{k}"), "value": "value-value-value"})).collect::<Vec<Value>>()}]}
        }))
        .unwrap()
    };
    let pods: Api<Pod> = env.api();
    let elsewhere = |i: usize| format!("{}-other-{}", env.id, i % 50);
    stream::iter(0..n)
        .map(|i| {
            let node = if i < own { node.to_owned() } else { elsewhere(i) };
            let pods = pods.clone();
            let pod = pod(i, &node);
            async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|_| async {})
        .await;
}

/// `n` PVs of DRBD resources that live on other nodes (ReadWriteMany, bound, each with a service
/// endpoint), as an agent sees them in a cluster of many storage nodes.
pub(super) async fn foreign_pvs(env: &TestEnv, n: usize) {
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    stream::iter(0..n)
        .map(|i| {
            let pvs = pvs.clone();
            let name = env.pv_name(&format!("foreign-{i}"));
            let pv: PersistentVolume = serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": {SERVICE_ENDPOINT: "10.99.0.1:2049"}},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "capacity": {"storage": "1Gi"},
                    "storageClassName": "replicated",
                    "persistentVolumeReclaimPolicy": "Delete",
                    "claimRef": {"namespace": env.ns, "name": format!("foreign-{i}")},
                    "csi": {"driver": "linstor.csi.linbit.com", "volumeHandle": name},
                }
            }))
            .unwrap();
            async move { pvs.create(&PostParams::default(), &pv).await.unwrap() }
        })
        .buffer_unordered(CONCURRENCY)
        .for_each(|_| async {})
        .await;
}

/// P6 (agent) and P7: an agent's memory among many pods, and what their churn on other nodes
/// costs it.
pub(super) async fn agent_cost(sizes: &Sizes) -> Vec<Figure> {
    let env = common::setup("bench-agent").await;
    let nodes = env.sim_nodes(&["a"]).await;
    let own = sizes.pods / 200;
    let pods: Api<Pod> = env.api();
    pods_around(&env, &nodes[0].name, sizes.pods, own).await;
    let foreign = std::env::var("SVC_BENCH_FOREIGN_PVS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(sizes.foreign_pvs);
    foreign_pvs(&env, foreign).await;
    // A few resources of its own, among them: their PVs are the ones it keeps.
    let local: Vec<String> = (0..5).map(|i| env.pv_name(&format!("local-{i}"))).collect();
    for (i, pv) in local.iter().enumerate() {
        let claim = format!("local-{i}");
        env.create_pv(pv, &claim, None, "ReadWriteMany", "replicated", Default::default())
            .await;
    }
    healthy(&nodes, &local.iter().map(String::as_str).collect::<Vec<_>>(), 0);
    let agent = env.start_agent(&nodes[0], &[]).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss = peak_rss_mib(&agent);
    let received = "storageos_drbd_agent_watch_events_total{watch=\"pods\"}";
    let before = agent.metric(received).await;
    // Churn on other nodes: every such pod relabelled, then deleted.
    let others: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(nodes[0].name.as_str()))
        .map(|p| p.name_any())
        .collect();
    stream::iter(&others)
        .for_each_concurrent(CONCURRENCY, |name| {
            let pods = pods.clone();
            async move {
                let relabel = json!({"metadata": {"labels": {"churn": "1"}}});
                pods.patch(name, &PatchParams::default(), &Patch::Merge(relabel))
                    .await
                    .unwrap();
                pods.delete(name, &Default::default()).await.unwrap();
            }
        })
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let churn_events = agent.metric(received).await - before;
    agent.stop().await;
    env.cleanup().await;
    vec![
        Figure {
            id: "P6",
            what: format!("agent peak RSS, {own} pods on its node, {foreign} PVs of resources on other nodes"),
            n: sizes.pods + foreign,
            product: rss,
            floor: None,
            unit: "MiB",
            target: "≤ 32 MiB".into(),
            met: rss <= 32.0,
        },
        Figure {
            id: "P7",
            what: format!(
                "pod events the agent received while {} pods elsewhere churned",
                others.len()
            ),
            n: 2 * others.len(),
            product: churn_events,
            floor: Some(0.0),
            unit: "events",
            target: "does not grow with the churn".into(),
            met: churn_events == 0.0,
        },
    ]
}
