//! What each of the chart's ServiceAccounts may and may not do, asked of the API server with
//! `kubectl auth can-i`.

use super::*;

/// `kubectl auth can-i` as a ServiceAccount: does it have the permission?
fn can(sa: &str, namespace: &str, verb: &str, resource: &str) -> bool {
    let mut kubectl = tool("kubectl");
    kubectl.args(["auth", "can-i", verb, "-n", namespace, "--as", sa]);
    match resource.split_once('/') {
        Some((resource, subresource)) => kubectl.args([resource, "--subresource", subresource]),
        None => kubectl.arg(resource),
    };
    let status = kubectl.output().expect("run kubectl auth can-i").status;
    status.success()
}

/// Every account may do what its job needs and nothing of the rest, by RBAC alone.
pub(super) fn rbac_is_least_privilege(ns: &str, controller: &str, agent: &str, conntrack: &str) {
    let mut matrix = controller_permissions(ns, controller);
    matrix.extend(agent_permissions(ns, agent));
    matrix.extend(conntrack_permissions(ns, conntrack));
    let wrong: Vec<String> = matrix
        .iter()
        .filter(|(who, namespace, verb, resource, allowed)| can(who, namespace, verb, resource) != *allowed)
        .map(|(who, namespace, verb, resource, allowed)| {
            format!(
                "{who} {} {verb} {resource} in {namespace}",
                if *allowed { "cannot" } else { "can" }
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "RBAC differs from least privilege:\n{}",
        wrong.join("\n")
    );
}

const ELSEWHERE: &str = "kube-system";

fn controller_permissions<'a>(ns: &'a str, controller: &'a str) -> Vec<Permission<'a>> {
    vec![
        (controller, ns, "list", "persistentvolumeclaims", true),
        (controller, ns, "watch", "persistentvolumes", true),
        (controller, ns, "patch", "persistentvolumes", true),
        (controller, ELSEWHERE, "create", "services", true),
        (controller, ELSEWHERE, "patch", "endpoints", true),
        // Its own old Endpoints where they are no longer written; an admission policy narrows it.
        (controller, ELSEWHERE, "delete", "endpoints", true),
        (controller, ELSEWHERE, "create", "endpointslices.discovery.k8s.io", true),
        (controller, ELSEWHERE, "delete", "endpointslices.discovery.k8s.io", true),
        (controller, ELSEWHERE, "create", "events.events.k8s.io", true),
        (controller, ns, "create", "leases.coordination.k8s.io", true),
        (controller, ns, "update", "leases.coordination.k8s.io", false),
        (controller, ns, "patch", "leases.coordination.k8s.io", false),
        (controller, ns, "watch", "leases.coordination.k8s.io", false),
        (controller, ELSEWHERE, "create", "leases.coordination.k8s.io", false),
        (controller, ELSEWHERE, "delete", "services", false),
        (controller, ELSEWHERE, "delete", "pods", false),
        (controller, ELSEWHERE, "create", "pods/eviction", false),
        (controller, ns, "patch", "nodes", false),
        (controller, ns, "delete", "volumeattachments.storage.k8s.io", false),
        (controller, ns, "delete", "persistentvolumes", false),
        (controller, ns, "get", "secrets", false),
    ]
}

fn agent_permissions<'a>(ns: &'a str, agent: &'a str) -> Vec<Permission<'a>> {
    vec![
        (agent, ELSEWHERE, "list", "pods", true),
        (agent, ELSEWHERE, "delete", "pods", true),
        (agent, ELSEWHERE, "create", "pods/eviction", true),
        (agent, ns, "patch", "nodes", true),
        (agent, ns, "update", "nodes", false),
        (agent, ns, "watch", "leases.coordination.k8s.io", true),
        (agent, ns, "delete", "volumeattachments.storage.k8s.io", true),
        (agent, ns, "patch", "persistentvolumes", true),
        (agent, ELSEWHERE, "patch", "endpointslices.discovery.k8s.io", true),
        (agent, ELSEWHERE, "patch", "endpoints", true),
        (agent, ELSEWHERE, "delete", "endpoints", false),
        (agent, ELSEWHERE, "create", "events.events.k8s.io", true),
        (agent, ns, "patch", "leases.coordination.k8s.io", true),
        (agent, ns, "update", "leases.coordination.k8s.io", false),
        (agent, ELSEWHERE, "patch", "leases.coordination.k8s.io", false),
        (agent, ns, "get", "volumeattachments.storage.k8s.io", false),
        (agent, ns, "get", "persistentvolumes", false),
        (agent, ELSEWHERE, "create", "services", false),
        (agent, ELSEWHERE, "delete", "services", false),
        // Allowed by RBAC, narrowed to the product's own slices by an admission policy.
        (agent, ELSEWHERE, "delete", "endpointslices.discovery.k8s.io", true),
        (agent, ns, "delete", "persistentvolumes", false),
        (agent, ns, "delete", "nodes", false),
        (agent, ELSEWHERE, "create", "pods", false),
        (agent, ns, "get", "secrets", false),
    ]
}

fn conntrack_permissions<'a>(ns: &'a str, conntrack: &'a str) -> Vec<Permission<'a>> {
    vec![
        (conntrack, ELSEWHERE, "list", "endpointslices.discovery.k8s.io", true),
        (conntrack, ELSEWHERE, "watch", "endpointslices.discovery.k8s.io", true),
        (conntrack, ELSEWHERE, "get", "endpointslices.discovery.k8s.io", false),
        (conntrack, ELSEWHERE, "patch", "endpointslices.discovery.k8s.io", false),
        (conntrack, ELSEWHERE, "get", "services", false),
        // LINSTOR CSI's Service, which its nfs-helper's slices name (`--linstor-nfs-service`).
        (conntrack, ELSEWHERE, "list", "services", true),
        (conntrack, ELSEWHERE, "watch", "services", true),
        (conntrack, ELSEWHERE, "list", "pods", false),
        (conntrack, ELSEWHERE, "create", "events.events.k8s.io", false),
        (conntrack, ns, "get", "leases.coordination.k8s.io", false),
    ]
}
