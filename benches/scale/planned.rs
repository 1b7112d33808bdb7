//! P8m: what NFSv4.1 clients that hold state see of a move no node's loss forces, on the LINSTOR
//! path (`share`, drbd-reactor serving; the real data path with the install guide's template and
//! units): a drain, whose agent asks drbd-reactor to hand the volume over, and a server that
//! crashes past its restarts, whose unit fails and gives the volume up. Worst of `n` runs per
//! kind and operation class, from the client's last success before the move to its first after.

use std::time::Duration;

use super::Figure;
use common::datapath::NfsGrace;
use common::outage::{ClientModel, Move, Scenario};
use common::stateful::Tally;

use ClientModel::{IdleHolder, LockTester, NewOpen, Stateful};

/// The operation classes, by the client that does them, and the most each may wait in a drain
/// (issue: a lock holder's I/O within 2 s, a new open within 3 s).
const CLASSES: [(ClientModel, &str, Duration); 4] = [
    (
        Stateful,
        "a lock holder's I/O (FILE_SYNC writes)",
        Duration::from_secs(2),
    ),
    (IdleHolder, "an idle lock holder's next renewal", Duration::from_secs(2)),
    (NewOpen, "a new OPEN", Duration::from_secs(3)),
    (LockTester, "a new LOCK (LOCKT)", Duration::from_secs(3)),
];

/// The moves, what each is, and the bound of each class scaled: a drain as planned; a crash
/// within the unplanned bound (grace 15 s and the move).
const KINDS: [(Move, &str, Option<Duration>); 2] = [
    (Move::drain(0, 1), "drain", None),
    (
        Move::crash(0, 1),
        "crashed server given up",
        Some(Duration::from_secs(20)),
    ),
];

pub async fn planned_moves(n: usize) -> Vec<Figure> {
    let grace = NfsGrace::On {
        lease_seconds: 10,
        grace_seconds: 15,
    };
    let clients: &'static [ClientModel] = &[Stateful, IdleHolder, LockTester, NewOpen];
    let scenario = Scenario::shared_on_linstor(grace, clients);
    let mut figures = Vec::new();
    for (step, kind, unplanned) in KINDS {
        let mut worst = [Duration::ZERO; CLASSES.len()];
        let mut stuck = [0usize; CLASSES.len()];
        let mut taken = Tally::default();
        for run in 0..n {
            let env = common::setup(&format!("bench-p8m-{}-{run}", kind.split(' ').next().unwrap())).await;
            let say = |line: String| println!("P8m {kind} {run}: {line}");
            let moves = common::outage::clients_through_fail_overs(&env, scenario, &[step], &say).await;
            env.cleanup().await;
            taken.add(&moves.tally);
            for (i, (model, _, _)) in CLASSES.iter().enumerate() {
                match moves.outages[0]
                    .1
                    .iter()
                    .find(|o| o.model == *model)
                    .and_then(|o| o.total)
                {
                    Some(total) => worst[i] = worst[i].max(total),
                    None => stuck[i] += 1,
                }
            }
        }
        println!("P8m {kind} over {n} runs: {taken}");
        for (i, (_, class, bound)) in CLASSES.iter().enumerate() {
            let bound = unplanned.unwrap_or(*bound);
            let kept = taken.lost_nothing();
            figures.push(Figure {
                id: "P8m",
                what: format!(
                    "NFSv4.1 outage, {class}; {kind} on LINSTOR, grace on (lease 10 s), worst of {n}; {} of {} locks lost, {} of {} writes lost",
                    taken.lost_locks, taken.locks, taken.lost_writes, taken.acknowledged
                ),
                n,
                product: if stuck[i] > 0 {
                    f64::NAN
                } else {
                    worst[i].as_secs_f64() * 1000.0
                },
                floor: None,
                unit: "ms",
                target: format!("≤ {} s", bound.as_secs()),
                met: kept && stuck[i] == 0 && worst[i] <= bound,
            });
        }
    }
    figures
}
