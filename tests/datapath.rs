//! The NFS data path end to end: a real NFS client (libnfs) writes through the claim's ClusterIP,
//! translated by the real kube-proxy's NAT rules to an NFS server (nfs-ganesha) in the primary's
//! network namespace, and keeps working through a fail-over without changing the address it uses,
//! with the servers' NFSv4 grace period off and on.

mod common;

use common::datapath::{NfsGrace, leftovers};
use common::outage::client_through_a_fail_over;

/// Grace on, as a production server should run it, with the rule grace ≥ lease; shorter than
/// ganesha's defaults (lease 60 s, grace 90 s) so that the test waits 15 s, not 90.
const GRACE_ON: NfsGrace = NfsGrace::On {
    lease_seconds: 10,
    grace_seconds: 15,
};

#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn an_nfs_client_keeps_working_through_the_cluster_ip_across_a_fail_over() {
    let mut outages = Vec::new();
    for (run, grace) in [NfsGrace::Off, GRACE_ON].into_iter().enumerate() {
        let env = common::setup(&format!("datapath-{run}")).await;
        let outage = client_through_a_fail_over(&env, grace, &|line| eprintln!("{line}")).await;
        eprintln!("{outage}");
        assert!(
            outage.succeeded > 0 && outage.succeeded < outage.operations,
            "{outage:?}"
        );
        assert_eq!(leftovers(), Vec::<String>::new(), "the data path leaves nothing behind");
        env.cleanup().await;
        outages.push(outage);
    }
    // A new client opens nothing on a server in its grace period: the outage lasts at least
    // until the new primary's grace ends, and grace off spares exactly that.
    let (off, on) = (&outages[0], &outages[1]);
    assert!(
        on.reconnect.as_secs_f64() >= 0.8 * 15.0,
        "grace on: the client waited out the grace period: {on}"
    );
    assert!(off.total < on.total, "grace off: {off}; grace on: {on}");
}
