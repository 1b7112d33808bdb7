//! P8: what each NFS client model sees of a fail-over on the real data path.

use super::*;

/// P8: what each NFS client model sees of a fail-over on the real data path (kube-proxy,
/// nfs-ganesha, libnfs and held connections): from its last successful operation before the node
/// is lost to its first after, through the same ClusterIP; per kube-proxy mode, with the conntrack
/// repair on and off, grace off (`nfs_fail_overs` runs) and on (one run). The smoke run measures
/// iptables with the repair, grace off, once. Piraeus documents about 10 s for its fail-over,
/// Longhorn about 20 s.
pub(super) async fn nfs_outage(sizes: &Sizes, full: bool) -> Vec<Figure> {
    use common::datapath::{NfsGrace, ProxyMode};
    use common::outage::{ClientModel, Scenario};
    let mut scenarios = Vec::new();
    for mode in [ProxyMode::Iptables, ProxyMode::Nftables] {
        for repair in [Some("30s"), None] {
            let grace_off = Scenario {
                repair,
                patience: Duration::from_secs(20),
                ..Scenario::repaired(mode)
            };
            let grace_on = Scenario {
                grace: NfsGrace::On {
                    lease_seconds: 10,
                    grace_seconds: 15,
                },
                ..grace_off
            };
            scenarios.push((grace_off, sizes.nfs_fail_overs));
            scenarios.push((grace_on, 1));
        }
    }
    if !full {
        scenarios.truncate(1);
    }
    let mut figures = Vec::new();
    for (at, (scenario, runs)) in scenarios.into_iter().enumerate() {
        let mut per_model: Vec<Vec<Option<Duration>>> = vec![Vec::new(); ClientModel::ALL.len()];
        for run in 0..runs {
            let env = common::setup(&format!("bench-nfs-{at}-{run}")).await;
            let outage = common::outage::client_through_a_fail_over(&env, scenario, &|_| {}, None).await;
            println!("P8 {scenario}, run {run}: {outage}");
            for (i, model) in ClientModel::ALL.into_iter().enumerate() {
                per_model[i].push(outage.of(model));
            }
            env.cleanup().await;
        }
        for (model, outages) in ClientModel::ALL.into_iter().zip(per_model) {
            figures.push(client_figure(&scenario, model, &outages));
        }
    }
    figures
}

/// One P8 row: a client model's p50 and worst outage in one scenario; a client that never got
/// through counts as the scenario's patience, and misses the target.
pub(super) fn client_figure(
    scenario: &common::outage::Scenario,
    model: common::outage::ClientModel,
    outages: &[Option<Duration>],
) -> Figure {
    let stuck = outages.iter().filter(|o| o.is_none()).count();
    let measured: Vec<Duration> = outages.iter().map(|o| o.unwrap_or(scenario.patience)).collect();
    let worst = measured.iter().max().copied().unwrap_or_default();
    let stuck_note = if stuck > 0 {
        format!(
            "; {stuck} of {} runs still on the dead node after {} s",
            outages.len(),
            scenario.patience.as_secs()
        )
    } else {
        String::new()
    };
    Figure {
        id: "P8",
        what: format!(
            "NFS outage, {model}; {scenario}; p50 {:.0} ms{stuck_note}",
            quantile(&measured, 0.5)
        ),
        n: outages.len(),
        product: worst.as_secs_f64() * 1000.0,
        floor: None,
        unit: "ms (worst)",
        target: "< 10 s (Piraeus)".into(),
        met: stuck == 0 && worst < Duration::from_secs(10),
    }
}
