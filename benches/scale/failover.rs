//! P3, P3p and P3s: a primary's node lost, a partition noticed at different times, and stateful
//! pods on a node that crashes.

use super::*;

/// P3: the primary's node is lost (kubelet, agent and DRBD links at once) with the agents and,
/// at the same time on nodes of its own, with Kubernetes alone: when each outcome was seen, the
/// worst of the runs. The "floor" column is Kubernetes alone here; an outcome it never reached
/// shows `-` and its documented timer.
pub(super) async fn fail_over(sizes: &Sizes) -> Vec<Figure> {
    // How long Kubernetes alone is watched once NotReady: `SVC_BENCH_ALONE_WATCH` seconds (330
    // sees taint-eviction's default 300 s toleration run out), else 10.
    let settle = Duration::from_secs(
        std::env::var("SVC_BENCH_ALONE_WATCH")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10),
    );
    let mut runs = Vec::new();
    for run in 0..sizes.fail_overs {
        let (with_test, alone_test) = (format!("bench-failover-{run}"), format!("bench-alone-{run}"));
        let ((with, with_agents), (alone, kubernetes_alone)) = tokio::join!(
            lose_the_primarys_node(&with_test, true, settle),
            lose_the_primarys_node(&alone_test, false, settle)
        );
        println!("P3 run {run}:\n{}", side_by_side(&with_agents, &kubernetes_alone));
        runs.push((with_agents, kubernetes_alone));
        with.cleanup().await;
        alone.cleanup().await;
    }
    let quick = FAIL_OVER_TIMEOUT + Duration::from_secs(1);
    let grace = node_monitor_grace_period();
    OUTCOMES
        .iter()
        .map(|outcome| {
            let worst = |pick: fn(&(Timeline, Timeline)) -> &Timeline| {
                let seen: Option<Vec<Duration>> = runs.iter().map(|r| (outcome.at)(pick(r))).collect();
                seen.and_then(|all| all.into_iter().max())
            };
            let (agents, kubernetes) = (worst(|r| &r.0), worst(|r| &r.1));
            // The endpoints follow DRBD's promotion at once. The rest waits for Kubernetes: once
            // the new primary serves, node a holds only NFS clients, which the agents leave alone
            // on a node Kubernetes still has Ready (it may only have lost its storage links).
            let (target, met) = match outcome.what {
                "node NotReady" => {
                    let bound = grace + Duration::from_secs(10);
                    (format!("≤ {}s", bound.as_secs()), agents.is_some_and(|at| at <= bound))
                }
                // Kubernetes's own step, shown for the comparison: no target of ours.
                "node tainted unreachable:NoExecute" => ("-".to_owned(), true),
                "endpoints at the new primary" => {
                    (format!("≤ {}s", quick.as_secs()), agents.is_some_and(|at| at <= quick))
                }
                _ => (
                    "≤ NotReady + 5 s".to_owned(),
                    runs.iter().all(|(t, _)| match ((outcome.at)(t), t.not_ready) {
                        (Some(at), Some(not_ready)) => at <= not_ready + Duration::from_secs(5),
                        _ => false,
                    }),
                ),
            };
            let kubernetes_says = match kubernetes {
                Some(_) => String::new(),
                None => format!("; Kubernetes alone: {}", outcome.documented),
            };
            Figure {
                id: "P3",
                what: format!(
                    "{} after a node loss, worst run (floor: Kubernetes alone{kubernetes_says})",
                    outcome.what
                ),
                n: sizes.fail_overs,
                product: agents.map_or(f64::NAN, |at| at.as_secs_f64() * 1000.0),
                floor: kubernetes.map(|at| at.as_secs_f64() * 1000.0),
                unit: "ms",
                target,
                met,
            }
        })
        .collect()
}

/// P3p: a partition whose sides notice it at different times (`common::partition`): from the
/// last DRBD view change (the old primary's quorum lost) to the PV and EndpointSlice naming the
/// primary with quorum, worst and median of the runs. No floor: nothing else moves the endpoint.
pub(super) async fn staggered_partitions(sizes: &Sizes) -> Vec<Figure> {
    let mut settled = Vec::new();
    for run in 0..sizes.fail_overs {
        let seen = staggered_partition(&format!("bench-staggered-{run}")).await;
        println!(
            "P3p run {run}: published back {}, settled {:?}, stayed {}, held at the end {}",
            seen.published_back, seen.settled, seen.stayed, seen.held_at_end
        );
        assert!(seen.stayed, "the endpoint left the primary with quorum again");
        settled.push(seen.settled);
    }
    let worst = settled.iter().max().copied().unwrap_or_default();
    let target = Duration::from_secs(5);
    vec![Figure {
        id: "P3p",
        what: format!(
            "staggered partition: endpoint at the primary with quorum after the last DRBD change, worst of {} (median {:.0} ms)",
            settled.len(),
            quantile(&settled, 0.5)
        ),
        n: settled.len(),
        product: worst.as_secs_f64() * 1000.0,
        floor: None,
        unit: "ms",
        target: format!("≤ {}s", target.as_secs()),
        met: worst <= target,
    }]
}

/// P3s: a StatefulSet's pod and a Deployment's pod on a node that crashes silently, running on
/// another node (`common::workload`), with Kubernetes's default timers, DRBD's default net options
/// and the agents' defaults, worst and median of the runs per kind. Kubernetes alone is not run:
/// it never moves the StatefulSet's pod by itself (the pod stays Terminating on the unreachable
/// node until someone force-deletes it or sets the out-of-service taint), and the Deployment's
/// replacement waits on Multi-Attach until the attach-detach controller gives up on the lost
/// node, 6 minutes after the pod's eviction at NotReady + 300 s: its figures are documented ones.
pub(super) async fn stateful_crashes(sizes: &Sizes) -> Vec<Figure> {
    use common::cluster::PrivateCluster;
    use common::workload::{DRBD_DEFAULT_DETECTION, WATCHED, Workload, crash_under};
    let cluster = PrivateCluster::up_with(
        "p3s",
        &[(
            "SVC_EXTRA_CONTROLLERS",
            "statefulset-controller,deployment-controller,replicaset-controller",
        )],
    );
    let target = DRBD_DEFAULT_DETECTION + Duration::from_secs(5) + Duration::from_secs(1);
    let kinds = [
        (
            Workload::StatefulSet,
            "never by itself (force-delete or the out-of-service taint by hand)",
        ),
        (
            Workload::Deployment,
            "6 to 11.5 minutes (NotReady + 300 s eviction + 6 min force-detach)",
        ),
    ];
    let mut figures = Vec::new();
    for (workload, alone) in kinds {
        let mut seen = Vec::new();
        let mut missed = 0;
        for run in 0..sizes.stateful_crashes {
            let env = common::setup_on(cluster.config().await, &format!("bench-p3s-{run}")).await;
            let kubeconfig = env.chart_kubeconfig(&cluster.kubeconfig(), "agent", &[]);
            // DRBD notices at a point of its window that moves across the runs, the last at its end.
            let phase = (run + 1) as f64 / sizes.stateful_crashes as f64;
            let crash = crash_under(&env, &kubeconfig, workload, phase).await;
            println!(
                "P3s {workload:?} run {run}: DRBD noticed at {:?}, running elsewhere at {:?}",
                crash.noticed, crash.running_elsewhere
            );
            match crash.running_elsewhere {
                Some(at) => seen.push(at),
                None => missed += 1,
            }
            env.cleanup().await;
        }
        let worst = seen.iter().max().copied().unwrap_or_default();
        let median = if seen.is_empty() {
            f64::NAN
        } else {
            quantile(&seen, 0.5)
        };
        figures.push(Figure {
            id: "P3s",
            what: format!(
                "{workload:?}'s pod on a silently crashed node running on another, worst of {} (median {median:.0} ms{}; Kubernetes alone: {alone})",
                sizes.stateful_crashes,
                if missed > 0 { format!(", {missed} not within {WATCHED:?}") } else { String::new() }
            ),
            n: sizes.stateful_crashes,
            product: if missed > 0 { f64::NAN } else { worst.as_secs_f64() * 1000.0 },
            floor: None,
            unit: "ms",
            target: format!("≤ {:.1}s", target.as_secs_f64()),
            met: missed == 0 && worst <= target,
        });
    }
    figures
}
