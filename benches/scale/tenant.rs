//! P9 beside a noisy tenant: the mass move on a control plane with API Priority and Fairness on,
//! while another account writes as fast as the API server lets it, with and without the chart's
//! FlowSchema. The controller and agents sign in as the chart's ServiceAccounts (APF classifies a
//! request by who signed in), the tenant as a ServiceAccount of its own, as in a cluster.
//!
//! The API server's seats are cut (`SVC_BENCH_API_SEATS`, reads and writes in flight: 40,20 by
//! default; Kubernetes defaults to 400,200): one tenant on a two-core machine cannot fill a
//! default server's seats, thousands of clients fill a large one's. Where the machine's CPU runs
//! out before the seats do, no priority level can share it out: fewer seats show what the
//! FlowSchema changes once seats are what is scarce.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::{Figure, Identities, product_mass_move_on};
use common::accounts::{SignIn, config_from};
use common::cluster::PrivateCluster;
use common::{self, TestEnv};

/// What the tenant offers: writes a second, and how many it keeps in flight at most.
const TENANT_RATE: u64 = 400;
const TENANT_IN_FLIGHT: usize = 64;

/// The chart's API priority template.
const API_PRIORITY_TEMPLATE: &str = "templates/api-priority.yaml";

/// The three runs; the smoke size (`full` false) leaves out the one without the FlowSchema, to
/// keep the test command short.
pub async fn mass_move_beside_a_tenant(n: usize, full: bool) -> Vec<Figure> {
    let seats = std::env::var("SVC_BENCH_API_SEATS").unwrap_or_else(|_| "40,20".into());
    let chart_sets = std::env::var("SVC_BENCH_CHART_SETS").unwrap_or_default();
    let sets: Vec<&str> = chart_sets.split(',').filter(|set| !set.is_empty()).collect();
    let cluster = PrivateCluster::up_with("bench-apf", &[("SVC_API_PRIORITY", "true"), ("SVC_API_SEATS", &seats)]);
    let config = cluster.config().await;
    let admin = cluster.kubeconfig();
    let mut runs = Vec::new();
    let scenarios = [
        ("quiet", false, true),
        ("beside the tenant, with the chart's FlowSchema", true, true),
        ("beside the tenant, without it", true, false),
    ];
    for (what, tenant, flow_schema) in scenarios.into_iter().take(if full { 3 } else { 2 }) {
        let env = common::setup_on(config.clone(), "bench-apf").await;
        let identities = chart_identities(&env, &admin, &sets, flow_schema);
        let noise = if tenant {
            Some(Tenant::start(&env, &admin).await)
        } else {
            None
        };
        // Alone on the control plane, the chart's accounts are the only service accounts
        // writing: whatever of theirs the FlowSchema misses lands in the catch-all schemas.
        let outside_before = if flow_schema && !tenant {
            Some(outside_every_own_schema(&env.client).await)
        } else {
            None
        };
        let moved = product_mass_move_on(&env, &identities, n).await;
        if let Some(before) = outside_before {
            let missed = outside_every_own_schema(&env.client).await - before;
            assert_eq!(
                missed, 0.0,
                "{missed} requests of the chart's accounts went past its FlowSchema into the tenants' levels"
            );
        }
        let tenant_writes = noise.map(Tenant::stop);
        println!(
            "P9 {what}: {:.2} s; tenant {}",
            moved.took.as_secs_f64(),
            tenant_writes.as_ref().map_or("none".into(), ToString::to_string)
        );
        env.remove_chart_permissions(&admin);
        env.cleanup().await;
        runs.push((what, moved.took, tenant_writes));
    }
    drop(cluster);
    let setting = match chart_sets.as_str() {
        "" => format!("seats {seats}"),
        sets => format!("seats {seats}; {sets}"),
    };
    figures(n, &setting, &runs)
}

/// The chart's controller and agent accounts, signed in with tokens; the chart's API priority
/// objects installed or not (`apiPriority.enabled`, off by default), with the chart
/// values `sets` (from `SVC_BENCH_CHART_SETS`: `apiPriority.lendablePercent=0,...`).
fn chart_identities(env: &TestEnv, admin: &str, sets: &[&str], flow_schema: bool) -> Identities {
    let extra: &[&str] = if flow_schema { &[API_PRIORITY_TEMPLATE] } else { &[] };
    let mut sets = sets.to_vec();
    if flow_schema {
        sets.push("apiPriority.enabled=true");
    }
    Identities {
        controller: env.chart_token_kubeconfig(admin, "controller", &sets, extra),
        agent: env.chart_token_kubeconfig(admin, "agent", &sets, extra),
    }
}

/// Requests the API server has dispatched by Kubernetes' schemas for accounts no other schema
/// takes: service accounts outside kube-system, other signed-in users, anonymous ones.
async fn outside_every_own_schema(client: &Client) -> f64 {
    const CATCH_ALL_SCHEMAS: [&str; 3] = ["service-accounts", "global-default", "catch-all"];
    common::apiserver_samples(client, "apiserver_flowcontrol_dispatched_requests_total")
        .await
        .into_iter()
        .filter(|(labels, _)| {
            CATCH_ALL_SCHEMAS
                .iter()
                .any(|schema| labels.contains(&format!("flow_schema=\"{schema}\"")))
        })
        .map(|(_, count)| count)
        .sum()
}

/// P9's lines beside the tenant: each run against the quiet one.
fn figures(n: usize, setting: &str, runs: &[(&str, Duration, Option<TenantWrites>)]) -> Vec<Figure> {
    let quiet = runs[0].1.as_secs_f64();
    runs.iter()
        .map(|(what, took, tenant)| {
            let ratio = took.as_secs_f64() / quiet;
            let with_flow_schema = what.contains("with the chart's");
            Figure {
                id: "P9t",
                what: format!(
                    "mass move {what} (APF on, {setting}){}",
                    tenant.as_ref().map_or(String::new(), |t| format!("; tenant {t}"))
                ),
                n,
                product: took.as_secs_f64() * 1000.0,
                floor: Some(quiet * 1000.0),
                unit: "ms",
                target: if with_flow_schema {
                    "≤ 1.5× quiet".into()
                } else {
                    "-".into()
                },
                met: !with_flow_schema || ratio <= 1.5,
            }
        })
        .collect()
}

/// A ServiceAccount of its own in the test's namespace, allowed to write ConfigMaps there, that writes
/// ConfigMaps at [`TENANT_RATE`] with up to [`TENANT_IN_FLIGHT`] writes waiting.
struct Tenant {
    started: Instant,
    writes: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

/// What the tenant got through while it ran.
struct TenantWrites {
    per_second: f64,
    refused: u64,
}

impl std::fmt::Display for TenantWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.0} writes/s, {} refused", self.per_second, self.refused)
    }
}

impl Tenant {
    async fn start(env: &TestEnv, admin: &str) -> Self {
        let account = "noisy-tenant";
        let created = PostParams::default();
        let service_account = serde_json::from_value(json!({"metadata": {"name": account}})).unwrap();
        env.api::<ServiceAccount>()
            .create(&created, &service_account)
            .await
            .unwrap();
        // A Role of its own: the aggregated `edit` role is empty without kube-controller-manager's
        // aggregation controller, which the test control plane does not run.
        let role = serde_json::from_value(json!({
            "metadata": {"name": account},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "patch"]}],
        }))
        .unwrap();
        env.api::<Role>().create(&created, &role).await.unwrap();
        let binding = serde_json::from_value(json!({
            "metadata": {"name": account},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": env.ns}],
        }))
        .unwrap();
        env.api::<RoleBinding>().create(&created, &binding).await.unwrap();
        let token = env.token_of(admin, account);
        let kubeconfig = env.kubeconfig_as(admin, account, SignIn::Token(token));
        let client = Client::try_from(config_from(&kubeconfig).await).unwrap();
        let config_maps: Api<ConfigMap> = Api::namespaced(client, &env.ns);
        for i in 0..TENANT_IN_FLIGHT {
            let map = serde_json::from_value(json!({"metadata": {"name": format!("noise-{i}")}})).unwrap();
            config_maps
                .create(&created, &map)
                .await
                .expect("the tenant's ConfigMap");
        }
        let (writes, refused) = (Arc::default(), Arc::default());
        let task = tokio::spawn(write_noise(config_maps, Arc::clone(&writes), Arc::clone(&refused)));
        Self {
            started: Instant::now(),
            writes,
            refused,
            task,
        }
    }

    fn stop(self) -> TenantWrites {
        self.task.abort();
        TenantWrites {
            per_second: self.writes.load(Ordering::Relaxed) as f64 / self.started.elapsed().as_secs_f64(),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }
}

/// Writes one of the tenant's ConfigMaps at each tick; a tick that finds every map's write
/// still in flight is skipped.
async fn write_noise(config_maps: Api<ConfigMap>, writes: Arc<AtomicU64>, refused: Arc<AtomicU64>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(TENANT_IN_FLIGHT));
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / TENANT_RATE));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    for count in 0u64.. {
        tick.tick().await;
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        let (config_maps, writes, refused) = (config_maps.clone(), Arc::clone(&writes), Arc::clone(&refused));
        tokio::spawn(async move {
            let name = format!("noise-{}", count % TENANT_IN_FLIGHT as u64);
            let patch = json!({"data": {"count": count.to_string()}});
            match config_maps
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => writes.fetch_add(1, Ordering::Relaxed),
                Err(_) => refused.fetch_add(1, Ordering::Relaxed),
            };
            drop(slot);
        });
    }
}
