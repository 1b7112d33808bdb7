//! The chart's escape hatches: images, environment, volumes, accounts and monitoring follow the
//! values that move them.

use super::*;

/// The chart rendered with every escape hatch a locked-down cluster reaches for: a mirror
/// registry, a proxy and a corporate CA, spread constraints, cloud IAM annotations, its own
/// monitoring labels.
fn with_escape_hatches() -> Vec<Value> {
    template(&[
        "controller.image.registry=mirror.example.com/",
        "controller.image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "imageRegistry=mirror.example.com",
        "controller.extraEnv[0].name=HTTPS_PROXY",
        "controller.extraEnv[0].value=http://proxy:3128",
        "agent.extraEnv[0].name=SSL_CERT_FILE",
        "agent.extraEnv[0].value=/etc/ca/ca.crt",
        "agent.extraVolumes[0].name=ca",
        "agent.extraVolumes[0].configMap.name=corporate-ca",
        "agent.extraVolumeMounts[0].name=ca",
        "agent.extraVolumeMounts[0].mountPath=/etc/ca",
        "controller.extraVolumes[0].name=ca",
        "controller.extraVolumes[0].configMap.name=corporate-ca",
        "controller.extraVolumeMounts[0].name=ca",
        "controller.extraVolumeMounts[0].mountPath=/etc/ca",
        "agent.updateStrategy.rollingUpdate.maxUnavailable=10%",
        "controller.topologySpreadConstraints[0].maxSkew=1",
        "controller.topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "controller.topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "controller.serviceAccount.annotations.iam\\.example\\.com/role=svc",
        "agent.serviceAccount.annotations.iam\\.example\\.com/role=agent",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.namespace=monitoring",
        "metrics.serviceMonitor.scrapeTimeout=10s",
        "metrics.serviceMonitor.relabelings[0].targetLabel=cluster",
        "metrics.serviceMonitor.relabelings[0].replacement=east",
        "metrics.serviceMonitor.metricRelabelings[0].action=drop",
        "metrics.serviceMonitor.metricRelabelings[0].regex=process_.*",
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.disabledAlerts[0]=SharedVolumeAgentDryRun",
        "metrics.prometheusRule.agentSelector=job=\"my-agents\"",
    ])
}

#[test]
#[ignore = "needs helm: run `make test`"]
fn images_env_volumes_and_accounts_follow_the_escape_hatches() {
    let custom = with_escape_hatches();
    let deployment =
        &find(&custom, "Deployment", "demo-shared-volume-controller-controller")["spec"]["template"]["spec"];
    let controller = &deployment["containers"][0];
    assert_eq!(
        controller["image"],
        "mirror.example.com/shared-volume-controller/shared-volume-controller@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "the registry takes the place of the repository's own host"
    );
    assert_eq!(env_value(controller, "HTTPS_PROXY"), Some("http://proxy:3128"));
    assert_eq!(controller["volumeMounts"][0]["mountPath"], "/etc/ca");
    assert_eq!(deployment["volumes"][0]["configMap"]["name"], "corporate-ca");
    assert_eq!(
        deployment["topologySpreadConstraints"][0]["topologyKey"],
        "topology.kubernetes.io/zone"
    );
    let daemonset = find(&custom, "DaemonSet", "demo-shared-volume-controller-agent");
    assert_eq!(
        daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"],
        "10%"
    );
    let agent_pod = &daemonset["spec"]["template"]["spec"];
    let agent = &agent_pod["containers"][0];
    assert_eq!(
        agent["image"], "mirror.example.com/shared-volume-controller/shared-volume-agent:0.1.0",
        "imageRegistry: one value for every component"
    );
    let repair = find(&custom, "DaemonSet", "demo-shared-volume-controller-conntrack");
    assert_eq!(
        repair["spec"]["template"]["spec"]["containers"][0]["image"],
        "mirror.example.com/shared-volume-controller/shared-volume-agent:0.1.0"
    );
    assert_eq!(env_value(agent, "SSL_CERT_FILE"), Some("/etc/ca/ca.crt"));
    let mounts: Vec<&str> = agent["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(mounts, ["dev", "drbd-run", "ca"], "the agent's own mounts stay");
    assert_eq!(agent_pod["volumes"].as_array().unwrap().len(), 3);
    for (account, role) in [("controller", "svc"), ("agent", "agent")] {
        let sa = find(
            &custom,
            "ServiceAccount",
            &format!("demo-shared-volume-controller-{account}"),
        );
        assert_eq!(sa["metadata"]["annotations"]["iam.example.com/role"], role);
    }
}

/// The `--set` values of the install page's block that builds and pushes the images.
fn install_page_image_overrides() -> Vec<String> {
    let block = common::docs::sh_block_after("docs/how-to/install.md", "## Images");
    assert!(
        block.starts_with("make images"),
        "the install page's images block: {block}"
    );
    block
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|pair| pair[0] == "--set")
        .map(|pair| pair[1].to_owned())
        .collect()
}

/// A user who pushes the images to their own registry and sets what the install page sets gets
/// every container from there: the repair's DaemonSet, which runs the agent's image, too.
#[test]
#[ignore = "needs helm: run `make test`"]
fn the_install_pages_image_overrides_move_every_image() {
    let sets = install_page_image_overrides();
    assert!(!sets.is_empty(), "the page sets the images");
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let rendered = template(&sets);
    let images: Vec<&str> = rendered
        .iter()
        .flat_map(|object| {
            let pod = &object["spec"]["template"]["spec"];
            let containers = pod["containers"].as_array().into_iter().flatten();
            containers.chain(pod["initContainers"].as_array().into_iter().flatten())
        })
        .filter_map(|container| container["image"].as_str())
        .collect();
    assert!(images.len() >= 3, "controller, agent and repair: {images:?}");
    let left: Vec<&&str> = images
        .iter()
        .filter(|image| !image.starts_with("registry.example.com/storage/"))
        .collect();
    assert!(
        left.is_empty(),
        "images the page's overrides leave at their defaults: {left:?}"
    );

    let own = template(&[
        "conntrack.image.repository=repair.example.com/repair",
        "conntrack.image.tag=v1",
    ]);
    let repair = find(&own, "DaemonSet", "demo-shared-volume-controller-conntrack");
    assert_eq!(
        repair["spec"]["template"]["spec"]["containers"][0]["image"], "repair.example.com/repair:v1",
        "an image of the repair's own still wins"
    );
}

#[test]
#[ignore = "needs helm: run `make test`"]
fn monitoring_follows_the_escape_hatches() {
    let custom = with_escape_hatches();
    let monitor = find(&custom, "ServiceMonitor", "demo-shared-volume-controller-agent");
    assert_eq!(monitor["metadata"]["namespace"], "monitoring");
    assert_eq!(monitor["spec"]["namespaceSelector"]["matchNames"], json!(["storage"]));
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["scrapeTimeout"], "10s");
    assert_eq!(
        endpoint["relabelings"][0]["targetLabel"], "node",
        "the node label first"
    );
    assert_eq!(endpoint["relabelings"][1]["targetLabel"], "cluster");
    assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
    let rule = find(&custom, "PrometheusRule", "demo-shared-volume-controller");
    let alerts = alerts(rule);
    assert!(
        alerts.iter().all(|a| a["alert"] != "SharedVolumeAgentDryRun"),
        "switched off"
    );
    let agent_down = alerts.iter().find(|a| a["alert"] == "SharedVolumeAgentDown").unwrap();
    assert_eq!(
        agent_down["expr"], "up{job=\"my-agents\"} == 0",
        "the selector as given"
    );
    assert_eq!(
        agent_down["annotations"]["runbook_url"],
        format!(
            "https://github.com/shared-volume-controller/shared-volume-controller/blob/v{}/docs/reference/alerts.md#sharedvolumeagentdown",
            common::docs::chart_version()
        ),
        "the runbook of the chart's own version, at its tag"
    );
}

#[test]
#[ignore = "needs helm: run `make test`"]
fn monitoring_takes_its_own_selectors_runbooks_and_pod_monitor() {
    let own = template(&[
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.controllerSelector=job=\"my-controller\"",
        "metrics.prometheusRule.runbookUrl=https://wiki.example.com/storage",
        "metrics.podMonitor.enabled=true",
        "metrics.podMonitor.scrapeTimeout=5s",
        "metrics.podMonitor.metricRelabelings[0].action=drop",
    ]);
    let rule = find(&own, "PrometheusRule", "demo-shared-volume-controller");
    let no_leader = &rule["spec"]["groups"][0]["rules"][0];
    assert!(
        no_leader["expr"]
            .as_str()
            .unwrap()
            .contains("storageos_shared_volume_controller_leader{job=\"my-controller\"}"),
        "{no_leader}"
    );
    assert_eq!(
        no_leader["annotations"]["runbook_url"],
        "https://wiki.example.com/storage#sharedvolumecontrollernoleader"
    );
    let pod_monitor = find(&own, "PodMonitor", "demo-shared-volume-controller-controller");
    let endpoint = &pod_monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["scrapeTimeout"], "5s");
    assert_eq!(endpoint["metricRelabelings"][0]["action"], "drop");
    assert_eq!(
        pod_monitor["metadata"]["namespace"], "storage",
        "the release namespace by default"
    );
    assert!(pod_monitor["spec"]["namespaceSelector"].is_null());
}
