//! A real Prometheus (Debian's package) on loopback, scraping our processes every second, and the
//! check that every panel of the Grafana dashboard returns data through its HTTP API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::{Child, Command};

use super::eventually;

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../grafana/shared-volume-controller.json"
);
/// The alerts as a plain rules file, for a Prometheus without the Operator: it selects the jobs
/// [`CONTROLLER_JOB`] and [`AGENT_JOB`].
const PLAIN_RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/reference/prometheus-rules.yaml"
);
pub const CONTROLLER_JOB: &str = "shared-volume-controller";
pub const AGENT_JOB: &str = "shared-volume-agent";

/// The dashboard's row of the clients' data path (the conntrack repair, kube-proxy): its panels
/// have data only while a data path runs.
pub const DATA_PATH_ROW: &str = "Clients' data path";

/// Which of the dashboard's panels a check covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Panels {
    /// Every panel but the data path's row, and the annotations.
    ControlPlane,
    /// The data path's row.
    DataPath,
}

pub struct Prometheus {
    _child: Child,
    pub addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus scraping `jobs`: (job name, admin addresses), with the plain rules file
    /// loaded; [`Self::scrape`] adds more.
    pub async fn start(name: &str, jobs: &[(&str, Vec<SocketAddr>)]) -> Self {
        let dir = std::env::temp_dir().join(format!("svc-e2e-prometheus-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("targets")).unwrap();
        // Targets come from files Prometheus watches, so that jobs started later join.
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{PLAIN_RULES}']\nscrape_configs:\n  - job_name: processes\n    file_sd_configs:\n      - files: ['{}/targets/*.json']\n",
            dir.display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("start prometheus (installed by hack/tools.sh)");
        let prometheus = Self {
            _child: child,
            addr,
            dir,
        };
        for (job, targets) in jobs {
            prometheus.scrape(job, targets);
        }
        eventually("Prometheus to be ready", Duration::from_secs(30), || async {
            let url = format!("http://{}/-/ready", prometheus.addr);
            reqwest::get(url).await.ok()?.status().is_success().then_some(())
        })
        .await;
        prometheus
    }

    /// Scrapes `targets` as `job` from now on (written where Prometheus watches, then renamed into
    /// place, so that it never reads half a file).
    pub fn scrape(&self, job: &str, targets: &[SocketAddr]) {
        let group = json!([{
            "targets": targets.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "labels": {"job": job},
        }]);
        let file = self.dir.join("targets").join(format!("{job}.json"));
        let partial = self.dir.join(format!("{job}.json.partial"));
        std::fs::write(&partial, group.to_string()).unwrap();
        std::fs::rename(&partial, &file).unwrap();
    }

    /// The alerting rules Prometheus loaded.
    pub async fn alerting_rules(&self) -> Vec<LoadedRule> {
        let url = format!("http://{}/api/v1/rules?type=alert", self.addr);
        let response: Value = reqwest::get(url)
            .await
            .expect("ask Prometheus for its rules")
            .json()
            .await
            .expect("Prometheus answers JSON");
        let groups = response["data"]["groups"].as_array().cloned().unwrap_or_default();
        groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .map(|r| {
                let field = |k: &str| r[k].as_str().unwrap_or_default().to_owned();
                LoadedRule {
                    name: field("name"),
                    state: field("state"),
                    health: field("health"),
                    query: field("query"),
                }
            })
            .collect()
    }

    /// The `data.result` of an instant query.
    pub async fn query(&self, expr: &str) -> Vec<Value> {
        let url = format!("http://{}/api/v1/query", self.addr);
        let response: Value = reqwest::Client::new()
            .get(url)
            .query(&[("query", expr)])
            .send()
            .await
            .expect("query Prometheus")
            .json()
            .await
            .expect("Prometheus answers JSON");
        assert_eq!(response["status"], "success", "query {expr} failed: {response}");
        response["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Runs every query of the dashboard's `panels` (every variable set to "all", kube-proxy's job
    /// to `kube-proxy`) until each returns data; returns (panels, queries) checked.
    pub async fn check_dashboard(&self, panels: Panels) -> (usize, usize) {
        let dashboard = dashboard();
        let queries: Vec<Query> = dashboard_queries(&dashboard)
            .into_iter()
            .filter(|q| (q.row.as_deref() == Some(DATA_PATH_ROW)) == (panels == Panels::DataPath))
            .collect();
        for query in &queries {
            let expr = ["$cluster", "$namespace", "$job", "$instance", "$node"]
                .iter()
                .fold(query.expr.clone(), |expr, variable| expr.replace(variable, ".*"))
                .replace("$kube_proxy_job", "kube-proxy")
                .replace("$__rate_interval", "1m")
                .replace("$__range", "1h");
            let what = format!("data for {}: {expr}", query.title);
            eventually(&what, Duration::from_secs(30), || async {
                (!self.query(&expr).await.is_empty()).then_some(())
            })
            .await;
        }
        let titles: std::collections::BTreeSet<&str> = queries
            .iter()
            .filter(|q| q.title.starts_with("panel "))
            .map(|q| q.title.as_str())
            .collect();
        (titles.len(), queries.len())
    }
}

/// An alerting rule as Prometheus reports it: its state (`inactive`, `pending`, `firing`), its
/// health (`ok` when it evaluates) and its expression.
#[derive(Debug)]
pub struct LoadedRule {
    pub name: String,
    pub state: String,
    pub health: String,
    pub query: String,
}

pub fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap()
}

/// One query of the dashboard: where it is (`panel "…"` or `annotation "…"`), the row its panel
/// sits in, its PromQL.
pub struct Query {
    pub title: String,
    pub row: Option<String>,
    pub expr: String,
}

/// Every query of the dashboard, panel targets and annotations.
pub fn dashboard_queries(dashboard: &Value) -> Vec<Query> {
    let mut queries = Vec::new();
    let mut row = None;
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        if panel["type"] == "row" {
            row = panel["title"].as_str().map(str::to_owned);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(Query {
                title: format!("panel {}", panel["title"]),
                row: row.clone(),
                expr: target["expr"].as_str().unwrap().to_owned(),
            });
        }
    }
    let annotations = dashboard["annotations"]["list"].as_array().into_iter().flatten();
    queries.extend(annotations.filter_map(|a| {
        Some(Query {
            title: format!("annotation {}", a["name"]),
            row: None,
            expr: a["expr"].as_str()?.to_owned(),
        })
    }));
    queries
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
