//! P8 and P8s with the Linux kernel's own NFS client (Debian's cloud kernel under qemu, a pod
//! behind the kube-proxy node, `vers=4.1,hard`) beside the test-only clients in the same runs, so
//! that the two can be compared: the worst of several node losses each.

use std::time::Duration;

use super::Figure;
use common::datapath::{NfsGrace, ProxyMode};
use common::outage::{ClientModel, Outage, Scenario};

use ClientModel::{HeldNormalClose, KernelNewOpen, KernelPosixWriter, NewOpen, Stateful};

const GRACE_ON: NfsGrace = NfsGrace::On {
    lease_seconds: 10,
    grace_seconds: 15,
};

/// One measured setting: its clients, and the rows it gives (client, what it stands for, target).
struct Setting {
    id: &'static str,
    what: &'static str,
    scenario: Scenario,
    rows: &'static [(ClientModel, &'static str, u64)],
}

fn settings() -> Vec<Setting> {
    let held = |mode| Scenario {
        clients: &[KernelNewOpen, HeldNormalClose],
        ..Scenario::repaired(mode)
    };
    let mut all = Vec::new();
    for (mode, what) in [
        (ProxyMode::Iptables, "kube-proxy iptables, repair on, grace off"),
        (ProxyMode::Nftables, "kube-proxy nftables, repair on, grace off"),
    ] {
        all.push(Setting {
            id: "P8",
            what,
            scenario: held(mode),
            rows: &[
                (
                    KernelNewOpen,
                    "kernel client, its held connection (a create each 100 ms)",
                    5,
                ),
                (HeldNormalClose, "test-only held connection, same source port", 5),
            ],
        });
    }
    all.push(Setting {
        id: "P8",
        what: "kube-proxy iptables, repair off, grace off",
        scenario: Scenario {
            repair: None,
            ..held(ProxyMode::Iptables)
        },
        rows: &[
            (
                KernelNewOpen,
                "kernel client, its held connection (a create each 100 ms)",
                30,
            ),
            (HeldNormalClose, "test-only held connection, same source port", 30),
        ],
    });
    all.push(Setting {
        id: "P8s",
        what: "grace on (lease 10 s, grace 15 s), kube-proxy iptables, repair on",
        scenario: Scenario {
            grace: GRACE_ON,
            clients: &[KernelPosixWriter, KernelNewOpen, Stateful, NewOpen],
            patience: Duration::from_secs(30),
            ..Scenario::repaired(ProxyMode::Iptables)
        },
        rows: &[
            (KernelPosixWriter, "kernel client, I/O on its POSIX-locked file", 5),
            (KernelNewOpen, "kernel client, a new OPEN (create)", 20),
            (Stateful, "test-only NFSv4.1 client, I/O on its locked file", 5),
            (NewOpen, "test-only NFSv4.1 client, a new OPEN", 20),
        ],
    });
    all
}

/// Each setting `runs` times (a node loss each), its rows the worst run's per client.
pub async fn kernel_client_outages(runs: usize) -> Vec<Figure> {
    let mut figures = Vec::new();
    for (at, setting) in settings().into_iter().enumerate() {
        let mut outages: Vec<Outage> = Vec::new();
        for run in 0..runs {
            let env = common::setup(&format!("bench-kernel-{at}-{run}")).await;
            let outage = common::outage::client_through_a_fail_over(&env, setting.scenario, &|_| {}, None).await;
            println!("{} kernel client, {}: {outage}", setting.id, setting.what);
            env.cleanup().await;
            outages.push(outage);
        }
        for &(model, client, target_s) in setting.rows {
            figures.push(worst(&setting, client, target_s, model, &outages));
        }
    }
    figures
}

/// One row: the worst outage of `model` over the runs; a run it never got through, or one that
/// took something from a client, misses the target.
fn worst(setting: &Setting, client: &str, target_s: u64, model: ClientModel, outages: &[Outage]) -> Figure {
    let times: Vec<Option<Duration>> = outages.iter().map(|o| o.of(model)).collect();
    let worst = times
        .iter()
        .copied()
        .collect::<Option<Vec<_>>>()
        .and_then(|t| t.into_iter().max());
    let lost: Vec<String> = outages
        .iter()
        .flat_map(|o| o.lost.iter().filter(|(m, _)| *m == model).map(|(_, t)| t.to_string()))
        .collect();
    let what = match lost.is_empty() {
        true => format!("{client}, worst of {}; {}", outages.len(), setting.what),
        false => format!(
            "{client}, worst of {}; {}; taken: {}",
            outages.len(),
            setting.what,
            lost.join("; ")
        ),
    };
    Figure {
        id: setting.id,
        what,
        n: outages.len(),
        product: worst.map_or(f64::NAN, |t| t.as_secs_f64() * 1000.0),
        floor: None,
        unit: "ms",
        target: format!("< {target_s} s"),
        met: lost.is_empty() && worst.is_some_and(|t| t < Duration::from_secs(target_s)),
    }
}
