//! Drop-in compatibility end to end: the agent started with the Piraeus HA agent's documented
//! flags and the controller with the StorageOS api-manager's (single-dash, other controllers'
//! flags included) both run, and honour each value, as their startup lines and behaviour show.

use common::drbd::{healthy, three_nodes};
use common::eventually;
use common::process::{Process, free_addr};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

/// The whole log of a process, once `line` appears in it.
async fn log_with(process: &Process, line: &str) -> String {
    eventually(&format!("{line:?} in the log"), common::drbd::WAIT, || async {
        let log = std::fs::read_to_string(&process.log).unwrap_or_default();
        log.contains(line).then_some(log)
    })
    .await
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn the_piraeus_agent_flags_work_unchanged() {
    let (env, nodes, pv) = three_nodes("compat-piraeus").await;
    healthy(&nodes, &[&pv], 1);
    let node = &nodes[1];
    let health = free_addr();
    let kubeconfig = std::env::var("KUBECONFIG").unwrap();
    let health_flag = format!("--health-bind-address={health}");
    let kubeconfig_flag = format!("--kubeconfig={kubeconfig}");
    let node_flag = format!("--node-name={}", node.name);
    // Every flag the Piraeus agent documents, none at its default.
    let piraeus = [
        "--drbd-status-interval=3s",
        "--fail-over-timeout=2s",
        "--grace-period-seconds=20",
        node_flag.as_str(),
        "--operations-timeout=45s",
        "--reconcile-interval=7s",
        "--request-timeout=30s",
        "--resync-interval=10m",
        "--v=4",
        health_flag.as_str(),
        kubeconfig_flag.as_str(),
    ];
    let mut args = vec!["agent"];
    args.extend(piraeus);
    let simulation = env.simulated_drbd_args(node);
    args.extend(simulation.iter().map(String::as_str));
    // The simulated node runs no NFS server to probe; a variable, so the flags stay Piraeus's own.
    let env_vars = [
        node.fake_drbd_env(),
        ("KUBECONFIG", "/nonexistent/kubeconfig"),
        ("NFS_PROBE", "false"),
    ];
    let agent = Process::start_with_env(&format!("{}-agent", env.ns), &args, &env_vars).serving_at(health);
    agent.wait_ready().await;
    let log = log_with(&agent, "agent starting").await;
    for setting in [
        "drbd_status_interval=3s",
        "fail_over_timeout=2s",
        "operations_timeout=45s",
        "reconcile_interval=7s",
        "resync_interval=10m",
        "grace_period_seconds=20",
        "log_level=debug",
        "kube_api_timeout=30s",
    ] {
        assert!(log.contains(setting), "{setting} not in the effective settings:\n{log}");
    }
    for flag in ["--v=4", "--request-timeout=30s", "--health-bind-address"] {
        assert!(log.contains(flag), "no deprecation warning for {flag}");
    }
    assert!(log.contains("DEBUG"), "--v=4 turns on debug logging");
    // It reached the API through --kubeconfig (KUBECONFIG points nowhere) and works: node b is
    // the primary and publishes itself.
    eventually("node b published", common::drbd::WAIT, || async {
        (env.pv_annotation(&pv, common::SERVICE_ENDPOINT).await == Some(node.endpoint())).then_some(())
    })
    .await;
    agent.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn the_storageos_controller_flags_work_unchanged() {
    let env = common::setup("compat-storageos").await;
    let metrics = free_addr();
    let metrics_flag = format!("-metrics-addr={metrics}");
    let secrets = std::env::temp_dir().join(format!("svc-e2e-{}-api-secret", env.ns));
    let secret_flag = format!("-api-secret-path={}", secrets.display());
    // StorageOS's flags as its operator passes them (single dash), those of the api-manager's
    // other controllers included, none at its default.
    let storageos = [
        metrics_flag.as_str(),
        "-enable-leader-election",
        "-namespace",
        &env.ns,
        secret_flag.as_str(),
        "-api-endpoint",
        "storageos-api:5705",
        "-volume-poll-interval=3s",
        "-volume-expiry-interval=2m",
        "-api-refresh-interval=2m",
        "-api-retry-interval=7s",
        "-k8s-create-poll-interval=2s",
        "-k8s-create-wait-duration=30s",
        "-zap-log-level=debug",
        "-zap-encoder=json",
        "-zap-devel=false",
        "-zap-stacktrace-level=panic",
        "-zap-time-encoding=rfc3339nano",
        "-scheduler-name=storageos-scheduler",
        "-webhook-service-name=storageos-webhook",
        "-webhook-cert-validity=8760h",
        "-node-poll-interval=10s",
        "-node-fencer-workers",
        "5",
        "-pvc-label-sync-workers=5",
    ];
    let mut args = vec!["controller"];
    args.extend(storageos);
    args.extend(["--watch-namespace", &env.ns]);
    let controller = Process::start(&format!("{}-controller", env.ns), &args).serving_at(metrics);
    controller.wait_ready().await;
    let log = log_with(&controller, "controller starting").await;
    for setting in [
        r#""api_endpoint":"storageos-api:5705""#,
        &format!(r#""api_secret_path":"{}""#, secrets.display()),
        r#""api_refresh_interval":"2m""#,
        r#""api_retry_interval":"7s""#,
        r#""volume_poll_interval":"3s""#,
        r#""k8s_create_poll_interval":"2s""#,
        r#""k8s_create_wait_duration":"30s""#,
        r#""leader_elect":true"#,
        &format!(r#""lease_namespace":"{}""#, env.ns),
        r#""log_level":"debug""#,
        r#""log_format":"Json""#,
    ] {
        assert!(log.contains(setting), "{setting} not in the effective settings:\n{log}");
    }
    for flag in [
        "--webhook-service-name",
        "--node-fencer-workers",
        "--volume-expiry-interval",
    ] {
        assert!(log.contains(flag), "no warning about {flag}");
    }
    // It leads through the Lease in -namespace, and publishes a claim.
    let leases: Api<Lease> = env.api();
    eventually("the leader Lease in -namespace", common::drbd::WAIT, || async {
        leases.get_opt("shared-volume-controller").await.unwrap()
    })
    .await;
    let (_, pv) = env.bound_rwx_claim("data", common::serving("10.0.0.9:2049")).await;
    let pv = pv.metadata.name.unwrap();
    env.published_mount_endpoint(&pv).await;
    controller.stop().await;
    env.cleanup().await;
}
