//! The process's one Prometheus registry. Every metric name the project exports is defined here.

use anyhow::Result;
use prometheus::{IntGaugeVec, Opts, Registry};

/// Creates the registry with the process collector and the build-info gauge.
pub fn new_registry() -> Result<Registry> {
    let registry = Registry::new();
    registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
    let build_info = IntGaugeVec::new(
        Opts::new(
            "shared_volume_controller_build_info",
            "Build of the running binary; always 1.",
        ),
        &["version"],
    )?;
    build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
    registry.register(Box::new(build_info))?;
    Ok(registry)
}

/// Renders every metric of `registry` in the Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(err) = prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut out) {
        tracing::warn!(error = %err, "cannot encode metrics");
    }
    out
}
