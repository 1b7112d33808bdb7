//! Logging set-up: text or JSON lines, with a `RUST_LOG`-style filter.

use std::io::IsTerminal;

use anyhow::{Context, Result};
use tracing_subscriber::EnvFilter;

/// Output format of the log lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber. `RUST_LOG`, when set, wins over `filter`.
pub fn init(format: &LogFormat, filter: &str) -> Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(from_env) if !from_env.is_empty() => from_env,
        _ => filter.to_owned(),
    };
    let filter = EnvFilter::try_new(&filter).with_context(|| format!("bad log filter {filter:?}"))?;
    // Colours only on a terminal: a log file or a pod's log must not carry escape codes.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|err| anyhow::anyhow!("cannot install the log subscriber: {err}"))
}
