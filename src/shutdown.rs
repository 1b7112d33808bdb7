//! One cancellation token per process, cancelled by SIGTERM or SIGINT.

use tokio::signal::unix::{SignalKind, signal};
pub use tokio_util::sync::CancellationToken as Shutdown;

/// Returns a token that is cancelled on the first SIGTERM or SIGINT.
pub fn on_signals() -> Shutdown {
    let token = Shutdown::new();
    let trigger = token.clone();
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
            tracing::error!("cannot install signal handlers; stop the process with SIGKILL");
            return;
        };
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(signal = name, "shutting down");
        trigger.cancel();
    });
    token
}
