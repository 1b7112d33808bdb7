//! A primary's NFS server on the data path, as the agent's probe sees it: a server that has not
//! started keeps the node from being published, and one that dies while published is reported.
//! nfs-ganesha runs in the node's network namespace; the agent probes it at the node's address,
//! as it would on the node.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;

use super::datapath::{DataPath, ProxyMode};
use super::drbd::{cluster_events_now, healthy};
use super::{SERVICE_ENDPOINT, TestEnv, eventually};

const NOT_ANSWERING: &str = "storageos_drbd_agent_nfs_servers_not_answering";
const REASON: &str = "NfsServerNotAnswering";
const SILENT_SERVER: &str = "storageos.com/nfs-server-not-answering";
const WAIT: Duration = Duration::from_secs(30);

/// What the probe made of the server's start and death.
#[derive(Debug)]
pub struct Probed {
    /// The Event that held the publication while no server ran, and the agent's gauge then.
    pub held: String,
    pub held_gauge: f64,
    /// The endpoint published before the server ran (none, as it should).
    pub published_before: Option<String>,
    /// From the server's start to the publication.
    pub published_after: Duration,
    /// The Event that reported the dead server, the gauge then, and the endpoint then.
    pub died: String,
    pub died_gauge: f64,
    pub endpoint_after_death: Option<String>,
    /// What the PV said of the dead server (`storageos.com/nfs-server-not-answering`), and the
    /// claim's condition then.
    pub said_on_pv: Option<String>,
    pub condition_while_dead: String,
    /// From the server's restart to the PV's word taken back, and the condition then.
    pub taken_back_after: Duration,
    pub condition_after: String,
}

/// Node a is the primary of a new volume; its server starts only after the agent has had time to
/// hold the publication, then dies (SIGKILL) once published.
pub async fn a_server_that_starts_late_then_dies(env: &TestEnv) -> Probed {
    let mut path = DataPath::up(env, &["a", "b", "c"], ProxyMode::Iptables).await;
    let (_, pv) = env.bound_rwx_claim("data", BTreeMap::new()).await;
    let pv = pv.metadata.name.unwrap();
    healthy(&path.nodes, &[&pv], 0);
    let controller = env.start_namespace_controller().await;
    let args = [
        "--nfs-probe",
        "true",
        "--nfs-probe-interval",
        "1s",
        "--reconcile-interval",
        "1s",
    ];
    let agent = env.start_agent(&path.nodes[0], &args).await;

    let held = told(env, &pv, "hold the publication").await;
    let held_gauge = agent.metric(NOT_ANSWERING).await;
    let published_before = env.pv_annotation(&pv, SERVICE_ENDPOINT).await;

    path.start_promoter(0, &pv);
    path.promoted(0);
    let started = Instant::now();
    let own = format!("{}:2049", path.nodes[0].ip);
    eventually("node a published once its server answers", WAIT, || async {
        (env.pv_annotation(&pv, SERVICE_ENDPOINT).await.as_deref() == Some(own.as_str())).then_some(())
    })
    .await;
    let published_after = started.elapsed();
    eventually("the gauge back at zero", WAIT, || async {
        (agent.metric(NOT_ANSWERING).await == 0.0).then_some(())
    })
    .await;

    path.kill_server(0);
    let died = told(env, &pv, "its published endpoint").await;
    let died_gauge = agent.metric(NOT_ANSWERING).await;
    let endpoint_after_death = env.pv_annotation(&pv, SERVICE_ENDPOINT).await;
    let condition_while_dead = env
        .claim_condition_becomes("data", "False", "NfsServerNotAnswering")
        .await;
    let said_on_pv = env.pv_annotation(&pv, SILENT_SERVER).await;

    path.start_server(0, &pv);
    let restarted = Instant::now();
    eventually("the PV's word taken back once the server answers", WAIT, || async {
        env.pv_annotation(&pv, SILENT_SERVER).await.is_none().then_some(())
    })
    .await;
    let taken_back_after = restarted.elapsed();
    let condition_after = env.claim_condition_becomes("data", "True", "ServedAfterMove").await;
    for process in [agent, controller] {
        process.stop().await;
    }
    drop(path);
    Probed {
        held,
        held_gauge,
        published_before,
        published_after,
        died,
        died_gauge,
        endpoint_after_death,
        said_on_pv,
        condition_while_dead,
        taken_back_after,
        condition_after,
    }
}

/// The note of the first NfsServerNotAnswering Event on `pv` that says `says`.
async fn told(env: &TestEnv, pv: &str, says: &str) -> String {
    let said = |event: &Event| event.note.clone().filter(|note| note.contains(says));
    eventually(&format!("an {REASON} Event that says {says:?}"), WAIT, || async {
        cluster_events_now(env, pv, REASON).await.iter().find_map(said)
    })
    .await
}
