//! A real Prometheus (Debian's package) on loopback, scraping our processes every second, and the
//! check that every panel of the Grafana dashboard returns data through its HTTP API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::{Child, Command};

use super::eventually;

const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/shared-volume-controller.json");

pub struct Prometheus {
    _child: Child,
    pub addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus scraping `jobs`: (job name, admin addresses).
    pub async fn start(name: &str, jobs: &[(&str, Vec<SocketAddr>)]) -> Self {
        let dir = std::env::temp_dir().join(format!("svc-e2e-prometheus-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut config = String::from("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n");
        for (job, targets) in jobs {
            let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
                targets.join(", ")
            ));
        }
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
        eventually("Prometheus to be ready", Duration::from_secs(30), || async {
            let url = format!("http://{}/-/ready", prometheus.addr);
            reqwest::get(url).await.ok()?.status().is_success().then_some(())
        })
        .await;
        prometheus
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

    /// Runs every query of the dashboard (panels and annotations, every variable set to "all")
    /// until each returns data; returns (panels, queries) checked.
    pub async fn check_dashboard(&self) -> (usize, usize) {
        let dashboard = dashboard();
        let queries = dashboard_queries(&dashboard);
        for (title, expr) in &queries {
            let expr = ["$cluster", "$namespace", "$job", "$instance", "$node"]
                .iter()
                .fold(expr.clone(), |expr, variable| expr.replace(variable, ".*"))
                .replace("$__rate_interval", "1m")
                .replace("$__range", "1h");
            let what = format!("data for {title}: {expr}");
            eventually(&what, Duration::from_secs(30), || async {
                (!self.query(&expr).await.is_empty()).then_some(())
            })
            .await;
        }
        (dashboard["panels"].as_array().map_or(0, Vec::len), queries.len())
    }
}

pub fn dashboard() -> Value {
    serde_json::from_str(&std::fs::read_to_string(DASHBOARD).unwrap()).unwrap()
}

/// Every query of the dashboard, panel targets and annotations, each with its title.
pub fn dashboard_queries(dashboard: &Value) -> Vec<(String, String)> {
    let panels = dashboard["panels"].as_array().into_iter().flatten().flat_map(|panel| {
        panel["targets"].as_array().into_iter().flatten().map(|target| {
            (
                format!("panel {}", panel["title"]),
                target["expr"].as_str().unwrap().to_owned(),
            )
        })
    });
    let annotations = dashboard["annotations"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| Some((format!("annotation {}", a["name"]), a["expr"].as_str()?.to_owned())));
    panels.chain(annotations).collect()
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
