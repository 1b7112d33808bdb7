//! `selftest`: what `helm test` runs after an install or upgrade. Is the leader Lease held and
//! renewed in time, does every agent pod answer `/readyz`, is every admission policy of the
//! release bound? One line per check; the command fails when any check does.

use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::cli::SelftestArgs;

mod verdicts;

pub use verdicts::{Verdict, leader_verdict, policy_verdicts, readyz_url};

pub async fn run(args: SelftestArgs, client: Client) -> Result<()> {
    let mut verdicts = Vec::new();
    if let Some(name) = &args.lease_name {
        let lease = Api::<Lease>::namespaced(client.clone(), &args.namespace)
            .get_opt(name)
            .await;
        let found = match lease {
            Ok(lease) => leader_verdict(lease.as_ref(), Timestamp::now()),
            Err(err) => Err(format!("cannot read it: {err}")),
        };
        verdicts.push(Verdict::new(format!("leader Lease {}/{name}", args.namespace), found));
    }
    let components = [(&AGENT, &args.agent_selector), (&REPAIR, &args.repair_selector)];
    for (component, selector) in components {
        if let Some(selector) = selector {
            verdicts.extend(pod_verdicts(&client, &args.namespace, component, selector, *args.timeout).await);
        }
    }
    if !args.policies.is_empty() {
        verdicts.extend(policy_verdicts_from_api(&client, &args.policies).await);
    }
    let failed = verdicts.iter().filter(|v| v.found.is_err()).count();
    for verdict in &verdicts {
        match &verdict.found {
            Ok(found) => println!("ok    {}: {found}", verdict.what),
            Err(why) => println!("FAIL  {}: {why}", verdict.what),
        }
    }
    if verdicts.is_empty() {
        bail!("nothing to check: give --lease-name, --agent-selector, --repair-selector or --policies");
    }
    if failed > 0 {
        bail!("{failed} of {} checks failed", verdicts.len());
    }
    println!("all {} checks passed", verdicts.len());
    Ok(())
}

/// A DaemonSet whose every pod must answer `/readyz`: what its pods are called, and what to look
/// at when it has none.
struct Component {
    name: &'static str,
    none_found: &'static str,
}

const AGENT: Component = Component {
    name: "agent",
    none_found: "none found: is the DaemonSet scheduled on the storage nodes (nodeSelector, Pod Security)?",
};
const REPAIR: Component = Component {
    name: "repair",
    none_found: "none found: is the conntrack DaemonSet scheduled (its tolerations, Pod Security)?",
};

/// Each running pod's `/readyz` of `component`, at its address and its `admin` port.
async fn pod_verdicts(
    client: &Client,
    namespace: &str,
    component: &Component,
    selector: &str,
    timeout: Duration,
) -> Vec<Verdict> {
    let name = component.name;
    let pods = match Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(selector))
        .await
    {
        Ok(pods) => pods.items,
        Err(err) => return vec![Verdict::new(format!("{name} pods {selector}"), Err(err.to_string()))],
    };
    if pods.is_empty() {
        return vec![Verdict::new(
            format!("{name} pods {selector}"),
            Err(component.none_found.into()),
        )];
    }
    let http = reqwest::Client::builder().timeout(timeout).build();
    let mut verdicts = Vec::new();
    for pod in &pods {
        let what = format!("{name} {}/{}", namespace, pod.name_any());
        let found = match (&http, readyz_url(pod)) {
            (Ok(http), Ok(url)) => ready(http, &url).await,
            (Err(err), _) => Err(err.to_string()),
            (_, Err(why)) => Err(why),
        };
        verdicts.push(Verdict::new(what, found));
    }
    verdicts
}

async fn ready(http: &reqwest::Client, url: &str) -> Result<String, String> {
    let response = http.get(url).send().await.map_err(|err| format!("{url}: {err}"))?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if status.is_success() {
        Ok(format!("{url} answered {status}"))
    } else {
        Err(format!("{url} answered {status}: {}", body.trim()))
    }
}

async fn policy_verdicts_from_api(client: &Client, wanted: &[String]) -> Vec<Verdict> {
    let listed = async {
        let policies = Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .list(&ListParams::default())
            .await?;
        Ok::<_, kube::Error>((policies.items, bindings.items))
    };
    match listed.await {
        Ok((policies, bindings)) => {
            let policies: Vec<String> = policies.iter().map(ResourceExt::name_any).collect();
            let bindings: Vec<(String, Vec<String>)> = bindings
                .iter()
                .map(|b| {
                    let spec = b.spec.as_ref();
                    let policy = spec.and_then(|s| s.policy_name.clone()).unwrap_or_default();
                    let actions = spec.and_then(|s| s.validation_actions.clone()).unwrap_or_default();
                    (policy, actions)
                })
                .collect();
            policy_verdicts(wanted, &policies, &bindings)
        }
        Err(err) => vec![Verdict::new(
            "admission policies",
            Err(format!("cannot list them: {err}")),
        )],
    }
}
