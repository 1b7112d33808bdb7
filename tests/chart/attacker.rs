//! With the chart's policies on, each account tries what an attacker holding it would; every write
//! is refused and the objects are as they were. Then the agent does one write of its own job on
//! the same kinds, which goes through.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Namespace, Node, PersistentVolume, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::{client_as, refused};
use common::TestEnv;
use common::drbd::NODE_LABEL;

const CONTROLLER_LEASE: &str = "shared-volume-controller";

/// Objects of other owners the attacker aims at, planted by the admin.
struct Victims {
    /// A namespace with an unrelated Service `web`, its Endpoints and its EndpointSlice `web-1`.
    namespace: String,
    /// A Node with a foreign taint.
    node: String,
    /// A PV, and an attachment of it by another CSI driver.
    pv: String,
    foreign_attachment: String,
}

fn object<K: serde::de::DeserializeOwned>(kind: &str, value: Value) -> K {
    serde_json::from_value(value).unwrap_or_else(|err| panic!("{kind}: {err}"))
}

fn merge(value: Value) -> Patch<Value> {
    Patch::Merge(value)
}

pub async fn what_an_attacker_tries_is_refused(env: &TestEnv, controller_sa: &str, agent_sa: &str) {
    let victims = plant(env).await;
    let mut wrong = Vec::new();
    for (who, sa) in [("controller", controller_sa), ("agent", agent_sa)] {
        wrong.extend(either_account_tries(env, who, sa, &victims).await);
    }
    let taints = node_taints(env, &victims).await;
    wrong.extend(the_agent_tries(env, agent_sa, &victims, &taints).await);
    wrong.extend(the_controller_tries(env, controller_sa, &victims).await);
    assert!(wrong.is_empty(), "writes an attacker could make:\n{}", wrong.join("\n"));
    untouched(env, &victims, &taints).await;
    the_agents_own_writes_go_through(env, agent_sa, &victims, taints).await;
    remove(env, &victims).await;
}

async fn plant(env: &TestEnv) -> Victims {
    let admin = env.client.clone();
    let create = PostParams::default();
    let namespace = format!("{}-victim", env.ns);
    let ns: Namespace = object("Namespace", json!({"metadata": {"name": namespace}}));
    Api::<Namespace>::all(admin.clone()).create(&create, &ns).await.unwrap();
    let web: Service = object(
        "Service",
        json!({"metadata": {"name": "web"}, "spec": {"ports": [{"name": "nfs", "port": 2049}]}}),
    );
    Api::<Service>::namespaced(admin.clone(), &namespace)
        .create(&create, &web)
        .await
        .unwrap();
    let endpoints: Endpoints = object(
        "Endpoints",
        json!({"metadata": {"name": "web"}, "subsets": [{"addresses": [{"ip": "10.1.1.1"}], "ports": [{"name": "nfs", "port": 2049}]}]}),
    );
    Api::<Endpoints>::namespaced(admin.clone(), &namespace)
        .create(&create, &endpoints)
        .await
        .unwrap();
    let slice: EndpointSlice = object(
        "EndpointSlice",
        json!({"metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}}, "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.1.1.1"]}], "ports": [{"name": "nfs", "port": 2049}]}),
    );
    Api::<EndpointSlice>::namespaced(admin.clone(), &namespace)
        .create(&create, &slice)
        .await
        .unwrap();
    let node = format!("{}-victim", env.id);
    let victim_node: Node = object(
        "Node",
        json!({"metadata": {"name": node, "labels": {NODE_LABEL: env.id}},
               "spec": {"taints": [{"key": "example.com/foreign", "effect": "NoSchedule"}]}}),
    );
    Api::<Node>::all(admin.clone())
        .create(&create, &victim_node)
        .await
        .unwrap();
    let pv = env.pv_name("victim");
    env.create_pv(&pv, "victim", None, "ReadWriteMany", "", Default::default())
        .await;
    let foreign_attachment = format!("{}-foreign", env.id);
    let attachment: VolumeAttachment = object(
        "VolumeAttachment",
        json!({"metadata": {"name": foreign_attachment},
               "spec": {"attacher": "ebs.csi.aws.com", "nodeName": node, "source": {"persistentVolumeName": pv}}}),
    );
    Api::<VolumeAttachment>::all(admin.clone())
        .create(&create, &attachment)
        .await
        .unwrap();
    let leases: Api<Lease> = Api::namespaced(admin, &env.ns);
    if leases.get_opt(CONTROLLER_LEASE).await.unwrap().is_none() {
        let lease: Lease = object("Lease", json!({"metadata": {"name": CONTROLLER_LEASE}}));
        leases.create(&create, &lease).await.unwrap();
    }
    Victims {
        namespace,
        node,
        pv,
        foreign_attachment,
    }
}

/// What either account could try: another Service's endpoints, slices and PVs.
async fn either_account_tries(env: &TestEnv, who: &str, sa: &str, victims: &Victims) -> Vec<String> {
    let client = client_as(env, sa, &format!("{who}-attacker")).await;
    let (patch, create) = (PatchParams::default(), PostParams::default());
    let ours_elsewhere = json!({"metadata": {
        "name": "web",
        "labels": {"app.kubernetes.io/managed-by": "shared-volume-controller", "kubernetes.io/service-name": "web"},
        "ownerReferences": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "x",
                             "uid": "00000000-0000-0000-0000-000000000001"}],
    }});
    let mut wrong = Vec::new();
    let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), &victims.namespace);
    let evil = json!({"subsets": [{"addresses": [{"ip": "10.66.6.6"}], "ports": [{"name": "nfs", "port": 2049}]}]});
    wrong.extend(refused(
        &format!("{who} patches Endpoints of an unrelated Service"),
        endpoints.patch("web", &patch, &merge(evil.clone())).await,
    ));
    let mut disguised = ours_elsewhere.clone();
    disguised["subsets"] = evil["subsets"].clone();
    wrong.extend(refused(
        &format!("{who} relabels an unrelated Service's Endpoints as ours"),
        endpoints.patch("web", &patch, &merge(disguised)).await,
    ));
    let mut slice = ours_elsewhere;
    slice["metadata"]["name"] = json!("web-extra");
    slice["addressType"] = json!("IPv4");
    slice["endpoints"] = json!([{"addresses": ["10.66.6.6"]}]);
    slice["ports"] = json!([{"name": "nfs", "port": 2049}]);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &victims.namespace);
    wrong.extend(refused(
        &format!("{who} creates an EndpointSlice for an unrelated Service"),
        slices.create(&create, &object("EndpointSlice", slice)).await,
    ));
    wrong.extend(refused(
        &format!("{who} deletes an unrelated Service's EndpointSlice"),
        slices.delete("web-1", &DeleteParams::default()).await,
    ));
    wrong.extend(refused(
        &format!("{who} deletes an unrelated Service's Endpoints"),
        endpoints.delete("web", &DeleteParams::default()).await.map(|_| ()),
    ));
    let pvs: Api<PersistentVolume> = Api::all(client);
    let claim_ref = json!({"spec": {"claimRef": {"namespace": victims.namespace, "name": "stolen"}}});
    for (change, value) in [
        ("claimRef", claim_ref),
        (
            "reclaim policy",
            json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}}),
        ),
        (
            "foreign annotation",
            json!({"metadata": {"annotations": {"example.com/x": "y"}}}),
        ),
    ] {
        wrong.extend(refused(
            &format!("{who} changes a PV's {change}"),
            pvs.patch(&victims.pv, &patch, &merge(value)).await,
        ));
    }
    wrong
}

/// The victim Node's taints as the admin planted them.
async fn node_taints(env: &TestEnv, victims: &Victims) -> Value {
    let stored = Api::<Node>::all(env.client.clone()).get(&victims.node).await.unwrap();
    serde_json::to_value(stored.spec.unwrap().taints.unwrap()).unwrap()
}

/// What only the agent could try: Nodes beyond its taints, other drivers' attachments, the
/// controller's Lease.
async fn the_agent_tries(env: &TestEnv, agent_sa: &str, victims: &Victims, taints: &Value) -> Vec<String> {
    let agent = client_as(env, agent_sa, "agent-attacker").await;
    let patch = PatchParams::default();
    let mut with_foreign = taints.clone();
    with_foreign
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "example.com/evil", "effect": "NoExecute"}));
    let without_foreign: Vec<&Value> = taints
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["key"] != "example.com/foreign")
        .collect();
    let mut wrong = Vec::new();
    let nodes: Api<Node> = Api::all(agent.clone());
    for (change, value) in [
        (
            "adds a label to a Node",
            json!({"metadata": {"labels": {"example.com/x": "y"}}}),
        ),
        ("adds a foreign taint", json!({"spec": {"taints": with_foreign}})),
        ("removes a foreign taint", json!({"spec": {"taints": without_foreign}})),
        ("cordons a Node", json!({"spec": {"unschedulable": true}})),
    ] {
        wrong.extend(refused(
            &format!("agent {change}"),
            nodes.patch(&victims.node, &patch, &merge(value)).await,
        ));
    }
    wrong.extend(refused(
        "agent deletes a VolumeAttachment of another driver",
        Api::<VolumeAttachment>::all(agent.clone())
            .delete(&victims.foreign_attachment, &DeleteParams::default())
            .await,
    ));
    wrong.extend(refused(
        "agent takes the controller's Lease",
        Api::<Lease>::namespaced(agent, &env.ns)
            .patch(
                CONTROLLER_LEASE,
                &patch,
                &merge(json!({"spec": {"holderIdentity": "attacker"}})),
            )
            .await,
    ));
    wrong
}

/// What only the controller could try: retarget another Service, write another Lease.
async fn the_controller_tries(env: &TestEnv, controller_sa: &str, victims: &Victims) -> Vec<String> {
    let controller = client_as(env, controller_sa, "controller-attacker").await;
    let retarget = json!({"spec": {"ports": [{"name": "nfs", "port": 2049, "targetPort": 9}]}});
    let mut wrong = Vec::new();
    wrong.extend(refused(
        "controller retargets an unrelated Service",
        Api::<Service>::namespaced(controller.clone(), &victims.namespace)
            .patch("web", &PatchParams::default(), &merge(retarget))
            .await,
    ));
    let lease: Lease = object("Lease", json!({"metadata": {"name": "shared-volume-agent-x"}}));
    wrong.extend(refused(
        "controller writes another Lease",
        Api::<Lease>::namespaced(controller, &env.ns)
            .create(&PostParams::default(), &lease)
            .await,
    ));
    wrong
}

/// The victims are as the admin planted them.
async fn untouched(env: &TestEnv, victims: &Victims, taints: &Value) {
    let admin = env.client.clone();
    let endpoints = Api::<Endpoints>::namespaced(admin.clone(), &victims.namespace)
        .get("web")
        .await
        .unwrap();
    assert_eq!(
        endpoints.subsets.unwrap()[0].addresses.as_ref().unwrap()[0].ip,
        "10.1.1.1"
    );
    let pv = env.pvs().get(&victims.pv).await.unwrap();
    assert_eq!(
        pv.spec.as_ref().unwrap().persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(&node_taints(env, victims).await, taints);
    let stored = Api::<Node>::all(admin).get(&victims.node).await.unwrap();
    assert!(!stored.metadata.labels.unwrap().contains_key("example.com/x"));
}

/// The agent's own writes on the same objects still go through.
async fn the_agents_own_writes_go_through(env: &TestEnv, agent_sa: &str, victims: &Victims, mut taints: Value) {
    let agent = client_as(env, agent_sa, "agent-attacker").await;
    let patch = PatchParams::default();
    taints
        .as_array_mut()
        .unwrap()
        .push(json!({"key": "drbd.linbit.com/lost-quorum", "value": "fail-over", "effect": "NoSchedule"}));
    Api::<Node>::all(agent.clone())
        .patch(&victims.node, &patch, &merge(json!({"spec": {"taints": taints}})))
        .await
        .expect("the agent adds a drbd.linbit.com taint");
    let endpoint = json!({"metadata": {"annotations": {common::SERVICE_ENDPOINT: "10.0.0.9:2049"}}});
    Api::<PersistentVolume>::all(agent.clone())
        .patch(&victims.pv, &patch, &merge(endpoint))
        .await
        .expect("the agent publishes a service endpoint");
    let own_attachment = env.attachment("own", &victims.pv, &victims.node).await;
    Api::<VolumeAttachment>::all(agent)
        .delete(&own_attachment, &DeleteParams::default())
        .await
        .expect("the agent deletes an attachment of the storage's driver");
}

async fn remove(env: &TestEnv, victims: &Victims) {
    let admin = env.client.clone();
    let _ = Api::<Namespace>::all(admin.clone())
        .delete(&victims.namespace, &DeleteParams::default())
        .await;
    let _ = Api::<VolumeAttachment>::all(admin)
        .delete(&victims.foreign_attachment, &DeleteParams::default())
        .await;
}
