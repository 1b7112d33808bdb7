use std::process::ExitCode;

use shared_volume_controller::{Cli, apply_legacy_flags, init_logging, normalize_legacy_flags, run};

#[tokio::main]
async fn main() -> ExitCode {
    let (args, mut warnings) = normalize_legacy_flags(std::env::args_os());
    let mut cli = Cli::parse_args(args);
    match apply_legacy_flags(&mut cli) {
        Ok(mapped) => warnings.extend(mapped),
        Err(err) => {
            eprintln!("invalid flag: {err}");
            return ExitCode::from(2);
        }
    }
    if let Err(err) = init_logging(&cli.common.log_format, &cli.common.log_level) {
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
