//! End-to-end tests of the `storageos` volume backend: the controller against the real control
//! plane and a local StorageOS API (tests/common/storageos.rs) with expiring tokens and conflicts.

use std::time::Duration;

use common::process::Process;
use common::storageos::{FakeStorageOs, PASSWORD, USERNAME};
use common::{TestEnv, eventually};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

const WAIT: Duration = Duration::from_secs(30);

/// Writes the credentials as a mounted Secret would, and starts a storageos-backed controller.
async fn start_controller(env: &TestEnv, api: &FakeStorageOs) -> (Process, tempdir::Dir) {
    start_controller_with_password(env, api, PASSWORD).await
}

async fn start_controller_with_password(env: &TestEnv, api: &FakeStorageOs, password: &str) -> (Process, tempdir::Dir) {
    let secret = tempdir::Dir::new(&env.ns);
    std::fs::write(secret.path.join("username"), format!("{USERNAME}\n")).unwrap();
    std::fs::write(secret.path.join("password"), password).unwrap();
    let endpoint = api.endpoint();
    let secret_path = secret.path.to_str().unwrap().to_owned();
    let args = [
        "--volume-backend",
        "storageos",
        "--api-endpoint",
        &endpoint,
        "--api-secret-path",
        &secret_path,
        "--volume-poll-interval",
        "200ms",
        "--api-refresh-interval",
        "500ms",
        "--api-timeout",
        "2s",
        "--api-retry-interval",
        "1s",
        "--max-retry-interval",
        "4s",
    ];
    (env.start_controller(&args).await, secret)
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_hanging_or_failing_api_is_bounded_by_the_request_timeout_and_recovered_from() {
    let env = common::setup("sos-hang").await;
    let api = FakeStorageOs::start(Duration::from_secs(60)).await;
    api.set_delay(Duration::from_secs(3600));
    let (controller, _secret) = start_controller(&env, &api).await;
    let (_, pv) = env.bound_rwx_claim("data", Default::default()).await;
    let name = pv.metadata.name.clone().unwrap();
    api.add_volume("vol-1", &name, &env.ns, "data", "192.0.2.30:2049", true);

    // Every call gives up after --api-timeout (2 s here): the claim fails as VolumeBackend and
    // is retried; nothing waits for the hour the API would take, and the loop keeps turning.
    let errors = "storageos_shared_volume_reconcile_errors_total{reason=\"VolumeBackend\"}";
    eventually("reconciles failing on the hanging API", WAIT, || async {
        (controller.metric(errors).await >= 2.0).then_some(())
    })
    .await;
    assert_eq!(controller.get("/healthz").await.map(|(status, _)| status), Some(200));

    // Back, but failing a few times with 500: retried until it works.
    api.inject_failures(3);
    api.set_delay(Duration::ZERO);
    let mount = eventually("a mount endpoint published once the API answers", WAIT, || async {
        api.mount_endpoint("vol-1")
    })
    .await;
    let cluster_ip = env.cluster_ip(&name).await.unwrap();
    assert_eq!(mount, format!("{cluster_ip}:2049"));
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn a_wrong_password_is_not_tried_again_and_again_and_a_fixed_one_works_at_once() {
    let env = common::setup("sos-password").await;
    let api = FakeStorageOs::start(Duration::from_secs(60)).await;
    let (controller, secret) = start_controller_with_password(&env, &api, "wrong").await;
    let mut names = Vec::new();
    for claim in ["data-1", "data-2", "data-3", "data-4", "data-5"] {
        let (_, pv) = env.bound_rwx_claim(claim, Default::default()).await;
        let name = pv.metadata.name.clone().unwrap();
        api.add_volume(&format!("vol-{claim}"), &name, &env.ns, claim, "192.0.2.20:2049", true);
        names.push(claim);
    }
    // Five claims retried and a poll every 200 ms: each used to log in again with the same
    // wrong password.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let refused = api.stats().refused_logins;
    assert!(
        (1..=4).contains(&refused),
        "the same refused credentials are not sent again before the back-off: {refused} refused logins in 10 s"
    );

    // The Secret is corrected: the next attempt logs in, without waiting out the back-off.
    std::fs::write(secret.path.join("password"), PASSWORD).unwrap();
    for claim in names {
        eventually("a mount endpoint published", Duration::from_secs(15), || async {
            api.mount_endpoint(&format!("vol-{claim}"))
        })
        .await;
    }
    assert_eq!(api.stats().logins, 1, "{:?}", api.stats());
    controller.stop().await;
    env.cleanup().await;
}

/// A throwaway directory removed on drop.
mod tempdir {
    pub struct Dir {
        pub path: std::path::PathBuf,
    }
    impl Dir {
        pub fn new(name: &str) -> Self {
            let path = std::env::temp_dir().join(format!("svc-e2e-secret-{name}"));
            std::fs::create_dir_all(&path).unwrap();
            Self { path }
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn publishes_through_the_storageos_api_across_token_expiry_and_conflicts() {
    let env = common::setup("sos-publish").await;
    let api = FakeStorageOs::start(Duration::from_secs(2)).await;
    let (controller, _secret) = start_controller(&env, &api).await;
    let (_, pv) = env.bound_rwx_claim("data", Default::default()).await;
    let name = pv.metadata.name.clone().unwrap();
    api.inject_conflicts(1);
    api.add_volume("vol-1", &name, &env.ns, "data", "192.0.2.10:2050", true);

    let mount = eventually("a mount endpoint published to StorageOS", WAIT, || async {
        api.mount_endpoint("vol-1")
    })
    .await;
    let service = env.api::<Service>().get(&name).await.unwrap();
    let cluster_ip = service.spec.unwrap().cluster_ip.unwrap();
    assert_eq!(mount, format!("{cluster_ip}:2049"));
    assert_eq!(service.metadata.labels.unwrap()["storageos.com/volume-id"], "vol-1");
    assert!(api.stats().conflicts >= 1, "{:?}", api.stats());
    assert_eq!(api.stats().publishes, 1);
    env.wait_for_events("data", "MountEndpointPublished").await;

    // Tokens are refreshed before they expire, and a rejected token leads to a new login.
    eventually("a token refresh", WAIT, || async {
        (api.stats().refreshes >= 1).then_some(())
    })
    .await;
    api.expire_tokens();
    // Failover seen through polling: the endpoints follow, the mount endpoint stays.
    api.set_service_endpoint("vol-1", "192.0.2.11:2051");
    eventually("the EndpointSlice at the new NFS server", WAIT, || async {
        let slice = env.api::<EndpointSlice>().get(&name).await.unwrap();
        let at = (
            slice.endpoints.first()?.addresses.first()?.clone(),
            slice.ports?.first()?.port,
        );
        (at == ("192.0.2.11".to_string(), Some(2051))).then_some(())
    })
    .await;
    let stats = api.stats();
    assert!(stats.rejected_tokens >= 1 && stats.logins >= 2, "{stats:?}");
    assert_eq!(api.mount_endpoint("vol-1"), Some(mount));
    assert_eq!(
        api.stats().publishes,
        1,
        "an unchanged mount endpoint is not published again"
    );
    controller.stop().await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a control plane (see common::NEEDS_CLUSTER)"]
async fn warns_about_volumes_without_csi_labels() {
    let env = common::setup("sos-labels").await;
    let api = FakeStorageOs::start(Duration::from_secs(60)).await;
    let (controller, _secret) = start_controller(&env, &api).await;
    let (_, pv) = env.bound_rwx_claim("bare", Default::default()).await;
    let name = pv.metadata.name.clone().unwrap();
    api.add_volume("vol-bare", &name, &env.ns, "bare", "192.0.2.20:2049", false);

    let events = env.wait_for_events("bare", "VolumeWithoutCsiLabels").await;
    let note = events[0].note.clone().unwrap();
    assert!(
        note.contains("csi.storage.k8s.io/pvc/name") && note.contains("vol-bare"),
        "{note}"
    );
    assert!(env.api::<Service>().get_opt(&name).await.unwrap().is_none());
    assert_eq!(api.mount_endpoint("vol-bare"), None);
    assert_eq!(api.stats().publishes, 0);
    controller.stop().await;
    env.cleanup().await;
}
