//! The conntrack repair (`conntrack` subcommand), one per node that runs NFS clients: it watches
//! the product's EndpointSlices (and those LINSTOR CSI's nfs-helper writes for its own RWX
//! volumes, [`linstor`]), and when a volume's endpoint moves, deletes this node's conntrack
//! entries that still bind the volume's ClusterIP to the old NFS server, so that clients holding
//! their connection (or reconnecting from the same source port, as the kernel's NFS client does)
//! follow the move instead of talking to a dead node until the entry times out.
//!
//! [`slices`] reads the watch, [`sweep`] decides which flows to delete and for how long to keep
//! looking, [`flow`] writes and reads the ctnetlink messages, [`table`] sends them.

mod flow;
mod linstor;
mod metrics;
mod proxy_poll;
mod proxy_sync;
mod slices;
mod sweep;
pub mod table;

pub use flow::Flow;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use prometheus::Registry;

use crate::admin::Probes;
use crate::cli::ConntrackArgs;
use crate::names::{LINSTOR_NFS_SLICE_MANAGER, NFS_PORT, SLICE_MANAGED_BY_LABEL, SLICE_MANAGER};
use crate::shutdown::Shutdown;
use linstor::LinstorServices;
use metrics::ConntrackMetrics;
use proxy_poll::{ProxyMetrics, ProxyPoller};
use slices::{Seen, Slices};
use sweep::{Moment, ProxyWord, Sweep, Sweeps};
use table::Table;

pub async fn run(
    args: ConntrackArgs,
    client: Client,
    registry: Registry,
    probes: Probes,
    shutdown: Shutdown,
) -> Result<()> {
    let metrics = ConntrackMetrics::register(&registry)?;
    if let Some(path) = &args.conntrack_path {
        tracing::warn!(
            conntrack_path = %path,
            "--conntrack-path is deprecated and ignored: the repair reads the table through ctnetlink"
        );
    }
    let table = Table::host(*args.command_timeout);
    // A node where the table cannot be read is a misconfigured pod: say so at once.
    table
        .list(false, NFS_PORT)
        .await
        .context("cannot read this node's conntrack table")?;
    report_tcp_loose(&metrics);
    let proxy = kube_proxy(&args).await?;
    let linstor = LinstorServices::watch(client.clone(), &args.linstor_nfs_service).await;
    let selector = selector(linstor.enabled());
    tracing::info!(
        node = %args.node_name,
        sweep_period = %args.sweep_period,
        sweep_for = %args.sweep_for,
        kube_proxy_metrics = %args.kube_proxy_metrics,
        %selector,
        "conntrack repair started"
    );
    let mut repair = Repair {
        table,
        metrics,
        proxy: proxy.map(ProxyPoller::new),
        settle: *args.kube_proxy_settle,
        period: *args.sweep_period,
        window: *args.sweep_for,
        slices: Slices::new(),
        sweeps: Sweeps::default(),
        listing: None,
        started: false,
        linstor,
    };
    let api: Api<EndpointSlice> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default().labels(&selector))
        .default_backoff()
        .boxed();
    let mut ticker = tokio::time::interval(*args.sweep_period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            event = events.next() => match event {
                Some(Ok(event)) => {
                    if repair.watched(event) {
                        probes.set_ready(true);
                    }
                }
                Some(Err(err)) => tracing::warn!(error = %err, "EndpointSlice watch failed; retrying"),
                None => anyhow::bail!("the EndpointSlice watch ended"),
            },
            _ = ticker.tick(), if !repair.sweeps.is_empty() => repair.sweep().await,
        }
    }
    Ok(())
}

/// kube-proxy's metrics endpoint, if one is named; warned of when it does not answer now (the
/// repair asks again at each sweep).
async fn kube_proxy(args: &ConntrackArgs) -> Result<Option<ProxyMetrics>> {
    if args.kube_proxy_metrics.is_empty() {
        return Ok(None);
    }
    let proxy = ProxyMetrics::new(args.kube_proxy_metrics.clone(), *args.command_timeout)?;
    if let Err(err) = proxy.read().await {
        tracing::warn!(
            url = %proxy.url(),
            error = %err,
            "cannot read kube-proxy's sync times: a moved volume is swept until a flow reaches its new server or --sweep-for ends; point --kube-proxy-metrics at kube-proxy's --metrics-bind-address, or set it empty"
        );
    }
    Ok(Some(proxy))
}

/// Whether the kernel tracks a flow picked up mid-connection: what a deleted entry's next segment
/// needs to go through the new rules.
const TCP_LOOSE: &str = "/proc/sys/net/netfilter/nf_conntrack_tcp_loose";

/// Reads the node's `nf_conntrack_tcp_loose` once, at start: exported, and warned of when off.
fn report_tcp_loose(metrics: &ConntrackMetrics) {
    let loose = tcp_loose(std::fs::read_to_string(TCP_LOOSE).ok().as_deref());
    metrics.tcp_loose.set(loose.map_or(-1, i64::from));
    match loose {
        Some(true) => {}
        Some(false) => tracing::warn!(
            "{TCP_LOOSE} is 0: after the repair deletes a stranded flow, the client's next segment is not the start of a connection, so the kernel marks it INVALID instead of sending it through the new rules, and the client follows only once it reconnects; set net.netfilter.nf_conntrack_tcp_loose=1 (the kernel's default)"
        ),
        None => tracing::warn!("cannot read {TCP_LOOSE}: the repair assumes it is 1 (the kernel's default)"),
    }
}

/// `nf_conntrack_tcp_loose` as the file reads: on, off, or unknown.
fn tcp_loose(file: Option<&str>) -> Option<bool> {
    match file?.trim() {
        "0" => Some(false),
        "" => None,
        _ => Some(true),
    }
}

/// The product's EndpointSlices, and nfs-helper's when LINSTOR CSI's volumes are followed.
fn selector(linstor: bool) -> String {
    if linstor {
        format!("{SLICE_MANAGED_BY_LABEL} in ({SLICE_MANAGER},{LINSTOR_NFS_SLICE_MANAGER})")
    } else {
        format!("{SLICE_MANAGED_BY_LABEL}={SLICE_MANAGER}")
    }
}

struct Repair {
    table: Table,
    metrics: ConntrackMetrics,
    proxy: Option<ProxyPoller>,
    settle: Duration,
    period: Duration,
    window: Duration,
    slices: Slices,
    sweeps: Sweeps,
    /// The slices of a (re)list in progress.
    listing: Option<BTreeSet<String>>,
    /// Whether the first list is done: slices first seen after it are new volumes.
    started: bool,
    linstor: LinstorServices,
}

impl Repair {
    /// Takes one watch event; whether the first list is now complete.
    fn watched(&mut self, event: watcher::Event<EndpointSlice>) -> bool {
        match event {
            watcher::Event::Init => self.listing = Some(BTreeSet::new()),
            watcher::Event::InitApply(slice) => {
                if let Some(listing) = &mut self.listing {
                    listing.insert(key(&slice));
                }
                self.slice(&slice);
            }
            watcher::Event::InitDone => {
                let listed = self.listing.take().unwrap_or_default();
                for gone in self.slices.keep_only(&listed, Instant::now()) {
                    self.sweeps.forget(&gone);
                }
                let first = !self.started;
                self.started = true;
                return first;
            }
            watcher::Event::Apply(slice) => self.slice(&slice),
            watcher::Event::Delete(slice) => {
                self.slices.forget(&key(&slice), Instant::now());
                self.sweeps.forget(&key(&slice));
            }
        }
        self.metrics.sweeping.set(self.sweeps.len() as i64);
        false
    }

    fn slice(&mut self, slice: &EndpointSlice) {
        let key = key(slice);
        let at = Moment::now();
        let service_of = |namespace: &str, name: &str| self.linstor.service(namespace, name);
        match self.slices.seen(&key, slice, &service_of, at.now) {
            Seen::Moved(served) => {
                tracing::info!(
                    slice = %key,
                    mount = %served.mount,
                    backends = ?served.backends,
                    "the volume's endpoint moved; sweeping its stranded conntrack entries"
                );
                self.sweeps
                    .changed(&key, served, slices::triggered(slice), at, self.window);
            }
            // After a restart a move may have gone unseen: sweep every volume once more.
            Seen::First(served) if !self.started => {
                self.sweeps.changed(&key, served, None, at, self.window);
            }
            Seen::First(_) | Seen::Same => {}
            Seen::Unusable(why) => tracing::debug!(slice = %key, "not repaired: {why}"),
        }
    }

    /// The flows to the ports the family's swept volumes are mounted on: one listing per port
    /// (this product's volumes share 2049; LINSTOR CSI's have one each). `None` when one fails.
    async fn list(&mut self, ipv6: bool) -> Option<Vec<Flow>> {
        let mut listed = Vec::new();
        for port in self.sweeps.mount_ports(ipv6) {
            self.metrics.sweeps.inc();
            match self.table.list(ipv6, port).await {
                Ok(flows) => listed.extend(flows),
                Err(err) => {
                    self.metrics.failures.inc();
                    tracing::warn!(error = %err, "cannot list conntrack entries; trying again next sweep");
                    return None;
                }
            }
        }
        Some(listed)
    }

    /// Lists the flows of each address family being swept, deletes the stranded ones, and
    /// reports each volume's first repair and the end of its sweep.
    async fn sweep(&mut self) {
        // Read before the listing: rules that held the move then made no entry the listing misses.
        let reading = self.proxy.as_mut().map(ProxyPoller::poll).unwrap_or_default();
        for ipv6 in [false, true] {
            if !self.sweeps.any_due(ipv6, Instant::now()) {
                continue;
            }
            let Some(listed) = self.list(ipv6).await else { continue };
            let deleted = self.delete(self.sweeps.stranded(&listed)).await;
            let sweep = Sweep {
                ipv6,
                listed: &listed,
                deleted: &deleted,
                proxy: reading[usize::from(ipv6)].map(|sync| ProxyWord {
                    sync,
                    settle: self.settle,
                    lag: self.period,
                }),
                at: Moment::now(),
            };
            let (repaired, ended) = self.sweeps.swept(&sweep);
            for repaired in repaired {
                self.metrics.repair_duration.observe(repaired.after.as_secs_f64());
                tracing::info!(
                    slice = %repaired.volume,
                    mount = %repaired.mount,
                    after_ms = repaired.after.as_millis() as u64,
                    "clients of the volume on this node were sent to its new NFS server"
                );
            }
            for (volume, why) in ended {
                self.metrics.sweeps_ended.with_label_values(&[why.label()]).inc();
                tracing::debug!(slice = %volume, ended_by = why.label(), "the volume's sweep ended");
            }
        }
        self.metrics.sweeping.set(self.sweeps.len() as i64);
    }

    /// Deletes the entries of `stranded`; the volumes whose entries went.
    async fn delete(&mut self, stranded: Vec<(String, Flow)>) -> Vec<String> {
        if stranded.is_empty() {
            return Vec::new();
        }
        let flows = stranded.iter().map(|(_, flow)| flow.clone()).collect();
        let answers = match self.table.delete(flows).await {
            Ok(answers) => answers,
            Err(err) => {
                self.metrics.failures.inc();
                tracing::warn!(error = %err, "cannot delete stranded conntrack entries; trying again next sweep");
                return Vec::new();
            }
        };
        let mut deleted = Vec::new();
        for ((volume, flow), answer) in stranded.into_iter().zip(answers) {
            match answer {
                Ok(0) => {}
                Ok(count) => {
                    self.metrics.deleted.inc_by(count);
                    tracing::info!(
                        slice = %volume,
                        client = %flow.orig_src,
                        mount = %flow.orig_dst,
                        old_backend = %flow.reply_src,
                        state = flow.state,
                        "deleted a conntrack entry stranded on the old NFS server"
                    );
                    deleted.push(volume);
                }
                Err(err) => {
                    self.metrics.failures.inc();
                    tracing::warn!(slice = %volume, client = %flow.orig_src, error = %err, "cannot delete a stranded conntrack entry");
                }
            }
        }
        deleted
    }
}

fn key(slice: &EndpointSlice) -> String {
    format!("{}/{}", slice.namespace().unwrap_or_default(), slice.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_loose_is_read_as_the_kernel_writes_it() {
        assert_eq!(tcp_loose(Some("1\n")), Some(true));
        assert_eq!(tcp_loose(Some("0\n")), Some(false));
        assert_eq!(tcp_loose(Some("")), None);
        assert_eq!(tcp_loose(None), None);
    }
}
