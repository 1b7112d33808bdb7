use std::process::ExitCode;

use clap::Parser;
use shared_volume_controller::{cli::Cli, compat, run, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let (args, mut warnings) = compat::normalize(std::env::args_os());
    let mut cli = Cli::parse_from(args);
    match compat::apply(&mut cli) {
        Ok(mapped) => warnings.extend(mapped),
        Err(err) => {
            eprintln!("invalid flag: {err}");
            return ExitCode::from(2);
        }
    }
    if let Err(err) = telemetry::init(&cli.common.log_format, &cli.common.log_level) {
        eprintln!("invalid logging settings: {err:#}");
        return ExitCode::from(2);
    }
    for warning in warnings {
        tracing::warn!("{warning}");
    }
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "exiting after a fatal error");
            ExitCode::FAILURE
        }
    }
}
