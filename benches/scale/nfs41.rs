//! P8s and P8c: what NFSv4.1 clients that hold state see of moves, on the real data path with
//! the install guide's ganesha template (a server scope per volume, recovery records on the
//! volume). P8s: what each operation class waits for after a node's loss, per grace setting. P8c:
//! what a run of moves of each kind takes from the clients (it must take nothing).

use std::time::Duration;

use super::Figure;
use common::datapath::{NfsGrace, ProxyMode};
use common::outage::{ClientModel, Move, Outage, Scenario};
use common::stateful::Tally;

use ClientModel::{HeldNormalClose, IdleHolder, LockTester, NewConnection, NewOpen, Stateful};

const fn grace(lease_seconds: u32) -> NfsGrace {
    NfsGrace::On {
        lease_seconds,
        grace_seconds: 15,
    }
}

/// One grace setting of P8s: what it is, the servers' grace, the clients, and whether the grace
/// period may lift early (every client in the records is NFSv4.1 and can renew within its lease).
struct Setting {
    what: &'static str,
    grace: NfsGrace,
    clients: &'static [ClientModel],
    early_lift: bool,
}

const SETTINGS: [Setting; 6] = [
    Setting {
        what: "grace on (lease 10 s), NFSv4.0 clients beside",
        grace: grace(10),
        clients: &[Stateful, NewOpen, LockTester, NewConnection, HeldNormalClose],
        early_lift: false,
    },
    Setting {
        what: "grace on (lease 10 s), NFSv4.1 clients alone, all busy (early lift)",
        grace: grace(10),
        clients: &[Stateful, NewOpen, LockTester],
        early_lift: true,
    },
    Setting {
        what: "grace on (lease 10 s), NFSv4.1 clients alone, one idle (early lift)",
        grace: grace(10),
        clients: &[Stateful, NewOpen, LockTester, IdleHolder],
        early_lift: true,
    },
    Setting {
        what: "grace on (lease 7 s), NFSv4.1 clients alone, one idle (early lift)",
        grace: grace(7),
        clients: &[Stateful, NewOpen, LockTester, IdleHolder],
        early_lift: true,
    },
    Setting {
        what: "grace on (lease 4 s), NFSv4.1 clients alone, one idle (early lift)",
        grace: grace(4),
        clients: &[Stateful, NewOpen, LockTester, IdleHolder],
        early_lift: true,
    },
    Setting {
        what: "grace off",
        grace: NfsGrace::Off,
        // The headline client must get through: the writer loses its lock.
        clients: &[NewOpen, Stateful, LockTester],
        early_lift: false,
    },
];

/// The operation classes P8s times, by the client that does them.
const CLASSES: [(ClientModel, &str); 3] = [
    (Stateful, "I/O on its open, locked file"),
    (NewOpen, "a new OPEN"),
    (LockTester, "a new LOCK (LOCKT)"),
];

/// P8s: from the loss of the primary's node to each operation class's first success, one run per
/// setting, the clients carrying on 20 s after. A setting that cost a client its lock, a write or
/// a handle misses every target.
pub async fn grace_by_operation_class() -> Vec<Figure> {
    let mut figures = Vec::new();
    for (at, setting) in SETTINGS.iter().enumerate() {
        let scenario = Scenario {
            grace: setting.grace,
            clients: setting.clients,
            patience: Duration::from_secs(30),
            // Four renewals of an idle client after the move.
            linger: Duration::from_secs(20),
            ..Scenario::repaired(ProxyMode::Iptables)
        };
        let env = common::setup(&format!("bench-nfs41-{at}")).await;
        let outage = common::outage::client_through_a_fail_over(&env, scenario, &|_| {}, None).await;
        println!("P8s {}: {outage}", setting.what);
        env.cleanup().await;
        for (model, class) in CLASSES {
            figures.push(class_figure(setting, class, &outage, model));
        }
    }
    figures
}

/// One P8s row: the outage of one operation class in one setting.
fn class_figure(setting: &Setting, class: &str, outage: &Outage, model: ClientModel) -> Figure {
    let (target, bound) = if setting.early_lift {
        ("< 5 s, every known client reclaims".to_owned(), Duration::from_secs(5))
    } else {
        ("< 20 s (grace 15 s + fail-over)".to_owned(), Duration::from_secs(20))
    };
    let mut taken = Tally::default();
    for (_, tally) in &outage.lost {
        taken.add(tally);
    }
    let what = if taken.lost_nothing() {
        format!("NFSv4.1 outage, {class}; {}", setting.what)
    } else {
        format!("NFSv4.1 outage, {class}; {}; taken: {taken}", setting.what)
    };
    let time = outage.of(model);
    Figure {
        id: "P8s",
        what,
        n: 1,
        product: time.map_or(f64::NAN, |t| t.as_secs_f64() * 1000.0),
        floor: None,
        unit: "ms",
        target,
        met: taken.lost_nothing() && time.is_some_and(|t| t < bound),
    }
}

/// P8c: a run of `n` moves (a planned move, a loss right after inside the new server's grace
/// period, another loss, and again), with two clients holding files open and locked (one busy,
/// one idle), one testing their locks throughout and one opening new files, grace on as the
/// install guide sets it. Rows: locks lost, acknowledged writes lost, stale handles; each 0.
pub async fn what_a_run_of_moves_takes(n: usize) -> Vec<Figure> {
    const CYCLE: [Move; 3] = [Move::planned(0, 1), Move::loss(1, 2), Move::loss(2, 0)];
    let moves: Vec<Move> = CYCLE.iter().copied().cycle().take(n).collect();
    let scenario = Scenario {
        grace: grace(10),
        clients: &[Stateful, IdleHolder, LockTester, NewOpen],
        ..Scenario::repaired(ProxyMode::Iptables)
    };
    let env = common::setup("bench-nfs41-moves").await;
    let say = |line: String| println!("P8c {line}");
    let run = common::outage::clients_through_fail_overs(&env, scenario, &moves, &say).await;
    env.cleanup().await;
    let tally = run.tally;
    println!("P8c over {n} moves: {tally}");
    let what = |lost: &str, of: usize| {
        format!(
            "{lost} of {of}, over {n} moves (planned, lost, lost inside grace), NFSv4.1 clients holding locks, grace on"
        )
    };
    let stuck = run.outages.iter().filter(|(_, o)| o[0].total.is_none()).count();
    [
        (tally.lost_locks, what("locks lost", tally.locks)),
        (tally.lost_writes, what("acknowledged writes lost", tally.acknowledged)),
        (tally.stale_handles, what("stale file handles", tally.locks)),
        (stuck, what("moves the writer did not get through", n)),
    ]
    .into_iter()
    .map(|(count, what)| Figure {
        id: "P8c",
        what,
        n,
        product: count as f64,
        floor: None,
        unit: "count",
        target: "0".to_owned(),
        met: count == 0,
    })
    .collect()
}
