use std::process::ExitCode;

use clap::Parser;
use shared_volume_controller::{cli::Cli, run, telemetry};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(err) = telemetry::init(&cli.common.log_format, &cli.common.log_level) {
        eprintln!("invalid logging settings: {err:#}");
        return ExitCode::from(2);
    }
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "exiting after a fatal error");
            ExitCode::FAILURE
        }
    }
}
