//! The watchers: what must never happen (a healthy primary tainted, evicted, detached or
//! demoted; a ClusterIP that changes) and what must happen by when, checked all the time.

use super::*;

/// The watchers: taints, evictions and detachments of healthy primaries, slices away from them,
/// ClusterIPs that change.
pub fn watch(soak: &Soak) -> Vec<tokio::task::JoinHandle<()>> {
    vec![
        watch_taints(soak),
        watch_pod_removals(soak),
        watch_attachment_deletions(soak),
        watch_forced_demotions(soak),
        watch_cluster_ips(soak),
        watch_slices(soak),
        watch_consumers_of_lost_nodes(soak),
    ]
}

/// A consumer still on a node that has been down for longer than [`POD_MOVE_BOUND`]: a lost
/// node's pods must go (and come back elsewhere) while the loss lasts.
pub fn watch_consumers_of_lost_nodes(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let names: Vec<String> = soak.nodes.iter().map(|n| n.name.clone()).collect();
    let truth = soak.truth.clone();
    let pods: Api<Pod> = soak.env.api();
    tokio::spawn(async move {
        let mut reported: HashMap<String, Instant> = HashMap::new();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let down = truth.lock().unwrap().down_since;
            for i in (0..3).filter(|&i| down[i].is_some()) {
                let on_node = ListParams::default().fields(&format!("spec.nodeName={}", names[i]));
                let Ok(list) = pods.list(&on_node).await else { continue };
                for pod in list.items {
                    let name = pod.name_any();
                    let Some(v) = volume_of(&name, "app-") else { continue };
                    let Some(since) = truth.lock().unwrap().consumer_move_late(i, v) else {
                        continue;
                    };
                    if reported.get(&name) == Some(&since) {
                        continue;
                    }
                    reported.insert(name.clone(), since);
                    let what = format!(
                        "pod {name} still on node {}, {:?} after it was down, volume {v} had a healthy primary elsewhere and an agent there ran",
                        NODES[i],
                        since.elapsed()
                    );
                    truth.lock().unwrap().violation(what);
                }
            }
        }
    })
}

/// The volume a name of the soak's (`<prefix><v>`) is of.
pub fn volume_of(name: &str, prefix: &str) -> Option<usize> {
    name.strip_prefix(prefix).and_then(|v| v.parse::<usize>().ok())
}

/// A lost-quorum taint (a peer's fail-over or the node's own) put on a healthy primary's node.
pub fn watch_taints(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let names: Vec<String> = soak.nodes.iter().map(|n| n.name.clone()).collect();
    let client = soak.env.client.clone();
    let (truth, nodes) = (soak.truth.clone(), names);
    let selector = format!("{NODE_LABEL}={}", soak.env.id);
    let node_api: Api<Node> = Api::all(client.clone());
    tokio::spawn(async move {
        let mut tainted: HashMap<String, bool> = HashMap::new();
        let config = watcher::Config::default().labels(&selector);
        let mut events = watcher(node_api, config).default_backoff().applied_objects().boxed();
        while let Some(event) = events.next().await {
            let Ok(node) = event else { continue };
            let name = node.name_any();
            let now = node
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == "drbd.linbit.com/lost-quorum");
            let before = tainted.insert(name.clone(), now).unwrap_or(false);
            let Some(i) = nodes.iter().position(|n| *n == name) else {
                continue;
            };
            if now && !before {
                let mut truth = truth.lock().unwrap();
                if let Some(v) = (0..VOLUMES).find(|&v| truth.long_healthy(v, i)) {
                    truth.violation(format!("node {name} tainted while the healthy primary of volume {v}"));
                }
            }
        }
    })
}

/// A consumer evicted or deleted on its volume's healthy primary.
pub fn watch_pod_removals(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let names: Vec<String> = soak.nodes.iter().map(|n| n.name.clone()).collect();
    let (truth, nodes) = (soak.truth.clone(), names);
    let pods: Api<Pod> = soak.env.api();
    tokio::spawn(async move {
        let mut events = watcher(pods, watcher::Config::default()).default_backoff().boxed();
        while let Some(event) = events.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(pod)) if pod.metadata.deletion_timestamp.is_some() => pod,
                Ok(watcher::Event::Delete(pod)) => pod,
                _ => continue,
            };
            let (Some(v), Some(node)) = (
                volume_of(&pod.name_any(), "app-"),
                pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            ) else {
                continue;
            };
            let Some(i) = nodes.iter().position(|n| *n == node) else {
                continue;
            };
            let mut truth = truth.lock().unwrap();
            if truth.long_healthy(v, i) {
                truth.violation(format!(
                    "pod {} removed from node {node}, the healthy primary of volume {v}",
                    pod.name_any()
                ));
            }
        }
    })
}

/// An attachment deleted on its volume's healthy primary.
pub fn watch_attachment_deletions(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let names: Vec<String> = soak.nodes.iter().map(|n| n.name.clone()).collect();
    let client = soak.env.client.clone();
    let (truth, nodes, id) = (soak.truth.clone(), names, soak.env.id.clone());
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    tokio::spawn(async move {
        let prefix = format!("{id}-att-");
        let mut events = watcher(attachments, watcher::Config::default())
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(watcher::Event::Delete(attachment)) = event else {
                continue;
            };
            let Some(v) = volume_of(&attachment.name_any(), &prefix) else {
                continue;
            };
            let Some(i) = nodes.iter().position(|n| *n == attachment.spec.node_name) else {
                continue;
            };
            let mut truth = truth.lock().unwrap();
            if truth.long_healthy(v, i) {
                truth.violation(format!(
                    "attachment {} deleted on the healthy primary of volume {v}",
                    attachment.name_any()
                ));
            }
        }
    })
}

/// A ClusterIP that changes.
pub fn watch_cluster_ips(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let truth = soak.truth.clone();
    let services: Api<Service> = soak.env.api();
    tokio::spawn(async move {
        let mut first: HashMap<String, String> = HashMap::new();
        let mut events = watcher(services, watcher::Config::default())
            .default_backoff()
            .applied_objects()
            .boxed();
        while let Some(event) = events.next().await {
            let Ok(service) = event else { continue };
            let Some(ip) = service.spec.and_then(|s| s.cluster_ip) else {
                continue;
            };
            let known = first
                .entry(service.metadata.name.clone().unwrap_or_default())
                .or_insert(ip.clone());
            if *known != ip {
                let what = format!(
                    "Service {:?} moved from ClusterIP {known} to {ip}",
                    service.metadata.name
                );
                truth.lock().unwrap().violation(what);
                *known = ip;
            }
        }
    })
}

/// A slice away from a primary that has been healthy for longer than the bound.
pub fn watch_slices(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let ips: Vec<String> = soak.nodes.iter().map(|n| n.ip.clone()).collect();
    let client = soak.env.client.clone();
    let (truth, pvs) = (soak.truth.clone(), soak.pvs.clone());
    let env = soak.env.view(client.clone());
    tokio::spawn(async move {
        let mut reported: HashMap<usize, Instant> = HashMap::new();
        // Per volume: since when its slice has been seen away from the healthy primary, without
        // a look that found it right. The bound runs from then too: a hand edit just made is
        // owed its repair from the edit, not from when the primary became healthy.
        let mut wrong_since: HashMap<usize, Instant> = HashMap::new();
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            for (v, pv) in pvs.iter().enumerate() {
                let owed = truth.lock().unwrap().slice_owed_since(v);
                let Some((p, owed)) = owed else {
                    wrong_since.remove(&v);
                    continue;
                };
                let Ok(Some(slice)) = env.api::<EndpointSlice>().get_opt(pv).await else {
                    continue;
                };
                let at: Vec<String> = slice.endpoints.iter().flat_map(|e| e.addresses.clone()).collect();
                if at == [ips[p].clone()] {
                    wrong_since.remove(&v);
                    continue;
                }
                let since = owed.max(*wrong_since.entry(v).or_insert_with(Instant::now));
                if since.elapsed() >= SLICE_BOUND && reported.get(&v) != Some(&since) {
                    reported.insert(v, since);
                    let what = format!(
                        "volume {v}'s slice at {at:?}, not at its healthy primary {} for over {SLICE_BOUND:?} while its agent ran",
                        ips[p]
                    );
                    truth.lock().unwrap().violation(what);
                }
            }
        }
    })
}

/// A healthy primary forced to Secondary (its IO suspended for a snapshot is no reason), from the
/// `drbdsetup` calls each simulated node records.
pub fn watch_forced_demotions(soak: &Soak) -> tokio::task::JoinHandle<()> {
    let (truth, pvs) = (soak.truth.clone(), soak.pvs.clone());
    let dirs: Vec<std::path::PathBuf> = soak.nodes.iter().map(|n| n.dir.clone()).collect();
    tokio::spawn(async move {
        let mut seen = vec![0; dirs.len()];
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            for (i, dir) in dirs.iter().enumerate() {
                let calls = std::fs::read_to_string(dir.join("calls")).unwrap_or_default();
                let forced: Vec<&str> = calls.lines().filter(|l| l.starts_with("secondary --force")).collect();
                for call in &forced[seen[i].min(forced.len())..] {
                    let Some(v) = pvs.iter().position(|pv| call.ends_with(pv.as_str())) else {
                        continue;
                    };
                    let mut truth = truth.lock().unwrap();
                    if truth.long_healthy(v, i) {
                        truth.violation(format!(
                            "node {}, the healthy primary of volume {v}, forced to Secondary",
                            NODES[i]
                        ));
                    }
                }
                seen[i] = forced.len();
            }
        }
    })
}
