//! A volume moves while no client on the repair's node mounts it: what the conntrack repair does
//! for that move, beside the real kube-proxy, as its own metrics say. Nothing serves behind the
//! volume's endpoints; only the Service's rules and the repair's sweeps matter.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::datapath::{DataPath, ProxyMode};
use super::process::{Process, sample_value};
use super::{SERVICE_ENDPOINT, TestEnv, serving};

const SWEEPS: &str = "storageos_shared_volume_conntrack_sweeps_total";
const SWEEPING: &str = "storageos_shared_volume_conntrack_volumes_sweeping";
const ENDED: &str = "storageos_shared_volume_conntrack_sweeps_ended_total";
const REASONS: [&str; 3] = ["kube-proxy", "flow", "window"];
const WAIT: Duration = Duration::from_secs(60);

/// What the repair did for one move.
#[derive(Debug)]
pub struct QuietMove {
    /// Listings of the table from the move to the end of its sweep.
    pub listings: f64,
    /// Why the move's sweep ended (a count per reason).
    pub ended: BTreeMap<&'static str, f64>,
    /// From the move of the Service's endpoints to the end of the sweep.
    pub took: Duration,
}

/// The repair's counters now.
#[derive(Debug, Default)]
struct Counters {
    sweeps: f64,
    sweeping: f64,
    ended: BTreeMap<&'static str, f64>,
}

async fn counters(repair: &Process) -> Counters {
    let Some((200, text)) = repair.get("/metrics").await else {
        return Counters {
            sweeping: f64::NAN,
            ..Counters::default()
        };
    };
    let ended = REASONS
        .iter()
        .map(|reason| {
            let sample = format!("{ENDED}{{reason=\"{reason}\"}}");
            (*reason, sample_value(&text, &sample).unwrap_or(0.0))
        })
        .collect();
    Counters {
        sweeps: sample_value(&text, SWEEPS).unwrap_or(0.0),
        sweeping: sample_value(&text, SWEEPING).unwrap_or(f64::NAN),
        ended,
    }
}

/// Waits until the repair sweeps nothing, up to `within`; its counters then.
async fn swept_out(repair: &Process, within: Duration) -> Option<Counters> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let now = counters(repair).await;
        if now.sweeping == 0.0 {
            return Some(now);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Moves a claim's endpoints from node a to node b with the repair running beside kube-proxy in
/// `mode` and no client of the claim; what the repair did for the move, or `None` when its sweep
/// had not ended after `within`.
pub async fn a_move_no_client_here_mounts(env: &TestEnv, mode: ProxyMode, within: Duration) -> Option<QuietMove> {
    let path = DataPath::up(env, &["a", "b"], mode).await;
    let (a, b) = (path.nodes[0].ip.clone(), path.nodes[1].ip.clone());
    let (_, pv) = env.bound_rwx_claim("quiet", serving(&format!("{a}:2049"))).await;
    let pv = pv.metadata.name.unwrap();
    let controller = env.start_namespace_controller().await;
    env.published_mount_endpoint(&pv).await;
    let programmed = |ip: &str| path.programmed(&env.ns, &pv, ip);
    super::eventually("kube-proxy's rule to node a", WAIT, || {
        std::future::ready(programmed(&a).then_some(()))
    })
    .await;
    let repair = super::outage::start_repair(env, &path, "30s").await;
    // The repair sweeps every volume once at its start: that sweep ends first.
    let before = swept_out(&repair, Duration::from_secs(40))
        .await
        .expect("the start's sweep ends");
    env.annotate_pv(&pv, SERVICE_ENDPOINT, Some(&format!("{b}:2049"))).await;
    let moved = Instant::now();
    super::eventually("the repair sweeps the move", WAIT, || async {
        (counters(&repair).await.sweeping > 0.0).then_some(())
    })
    .await;
    let after = swept_out(&repair, within).await;
    let quiet = after.map(|after| QuietMove {
        listings: after.sweeps - before.sweeps,
        ended: REASONS
            .iter()
            .map(|r| (*r, after.ended[r] - before.ended[r]))
            .filter(|(_, n)| *n > 0.0)
            .collect(),
        took: moved.elapsed(),
    });
    assert!(programmed(&b), "kube-proxy's rules send the Service to node b");
    for process in [repair, controller] {
        process.stop().await;
    }
    drop(path);
    quiet
}
