//! The NFS data path end to end: a real NFS client (libnfs) writes through the claim's ClusterIP,
//! translated by the real kube-proxy's NAT rules to an NFS server (nfs-ganesha) in the primary's
//! network namespace, and keeps working through a fail-over without changing the address it uses.

mod common;

use common::datapath::leftovers;
use common::outage::client_through_a_fail_over;

#[tokio::test]
#[ignore = "needs a control plane and root: run `make test`"]
async fn an_nfs_client_keeps_working_through_the_cluster_ip_across_a_fail_over() {
    let env = common::setup("datapath").await;
    let outage = client_through_a_fail_over(&env, &|line| eprintln!("{line}")).await;
    eprintln!("{outage}");
    assert!(
        outage.succeeded > 0 && outage.succeeded < outage.operations,
        "{outage:?}"
    );
    assert_eq!(leftovers(), Vec::<String>::new(), "the data path leaves nothing behind");
    env.cleanup().await;
}
