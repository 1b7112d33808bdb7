//! `helm test`: the selftest the chart runs, read-only, and what it says of a broken install.

use super::*;

#[test]
#[ignore = "needs helm: run `make test`"]
fn helm_test_runs_a_selftest_that_only_reads() {
    let defaults = template(&[]);
    let selftest = find(&defaults, "Pod", "demo-shared-volume-controller-selftest");
    assert_eq!(selftest["metadata"]["annotations"]["helm.sh/hook"], "test");
    let args: Vec<&str> = selftest["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "selftest");
    assert!(args.contains(&"--lease-name=shared-volume-controller"), "{args:?}");
    assert!(
        args.contains(&"--agent-selector=app.kubernetes.io/name=shared-volume-controller,app.kubernetes.io/instance=demo,app.kubernetes.io/component=agent"),
        "{args:?}"
    );
    let policies = args.iter().find(|a| a.starts_with("--policies=")).unwrap();
    assert_eq!(policies.split(',').count(), 9, "{policies}");
    let role = find(&defaults, "Role", "demo-shared-volume-controller-selftest");
    let verbs: Vec<&Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["verbs"].as_array().unwrap())
        .collect();
    assert!(
        verbs.iter().all(|v| *v == "get" || *v == "list"),
        "read only: {verbs:?}"
    );
    assert!(
        !template(&["helmTest.enabled=false"])
            .iter()
            .any(|o| o["metadata"]["name"] == "demo-shared-volume-controller-selftest")
    );
}

/// The `helm test` pod's arguments, as the chart renders them for `release` in `namespace`.
fn selftest_args(release: &str, namespace: &str) -> Vec<String> {
    let rendered = run(tool("helm").args([
        "template",
        release,
        CHART,
        "--namespace",
        namespace,
        "--show-only",
        "templates/tests/selftest.yaml",
    ]));
    let objects = objects(&rendered.stdout);
    let pod = objects.iter().find(|o| o["kind"] == "Pod").expect("the selftest pod");
    pod["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// Runs the binary with `args` (as the test pod would, but as the admin): (passed, output).
pub(super) fn selftest(args: &[String], namespace: &str) -> (bool, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_shared-volume-controller"))
        .args(args)
        .env("POD_NAMESPACE", namespace)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

#[tokio::test]
#[ignore = "needs a control plane: run `make test`"]
async fn helm_test_passes_on_a_working_install_and_names_what_is_broken() {
    let (env, nodes, _pv) = common::drbd::three_nodes("selftest").await;
    let release = env.release();
    let args = selftest_args(&release, &env.ns);
    let controller = env.start_leading_controller().await;
    let mut agents = Vec::new();
    for node in &nodes[..2] {
        let agent = env.start_agent(node, &[]).await;
        env.agent_pod(&node.name, &agent, Some(&release)).await;
        agents.push(agent);
    }
    // The conntrack repair on the host, seen as its DaemonSet's pod on node a.
    let repair_args = ["conntrack", "--node-name", &nodes[0].name, "--kube-proxy-metrics", ""];
    let repair = env.start_as("conntrack", &format!("{}-conntrack", env.ns), &repair_args, &[]);
    repair.wait_ready().await;
    env.component_pod("conntrack", &nodes[0].name, &repair, Some(&release))
        .await;
    // The leader Lease may take a renewal to appear.
    let passed = eventually("a passing selftest", WAIT, || async {
        let (passed, output) = selftest(&args, &env.ns);
        passed.then_some(output)
    })
    .await;
    assert!(passed.contains("all 13 checks passed"), "{passed}");

    // An agent down, the repair down, and a policy unbound: each named.
    let stopped = agents.remove(1);
    stopped.stop().await;
    repair.stop().await;
    let binding = format!("{}-{release}-shared-volume-controller-leases", env.ns);
    run(tool("kubectl").args(["delete", "validatingadmissionpolicybinding", &binding]));
    let (passed, output) = selftest(&args, &env.ns);
    assert!(!passed, "{output}");
    let failures: Vec<&str> = output.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert_eq!(failures.len(), 3, "{output}");
    assert!(failures[0].contains(&format!("agent-{}", nodes[1].name)), "{output}");
    assert!(
        failures[1].contains(&format!("repair {}/conntrack-{}", env.ns, nodes[0].name)),
        "{output}"
    );
    assert!(
        failures[2].contains(&binding) && failures[2].contains("no binding"),
        "{output}"
    );
    agents.push(controller);
    env.remove_chart_permissions(&common::accounts::admin_kubeconfig());
    common::drbd::teardown(env, agents).await;
}
