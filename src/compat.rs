//! Drop-in compatibility with the systems this product replaces: the flags of the Piraeus HA agent
//! and of the StorageOS api-manager are accepted as their users pass them today.
//!
//! - [`normalize`] runs on the raw arguments before parsing: StorageOS's Go-style single-dash
//!   long flags (`-k8s-create-poll-interval 1s`) become double-dash, and the flags that belong to
//!   the api-manager's other controllers (webhooks, node labels, fencing…) are dropped with a
//!   warning, so an existing argument list starts.
//! - [`apply`] maps the flags this product has a better equivalent for onto it (`--v` to the log
//!   level, `--request-timeout` to the API client timeout, `--metrics-addr` to the admin address…),
//!   each with a one-time deprecation warning.

use std::ffi::OsString;
use std::net::SocketAddr;

use crate::cli::{Cli, Command};
use crate::telemetry::LogFormat;

/// The StorageOS api-manager flags this product implements (taken with one dash too).
const STORAGEOS_FLAGS: &[&str] = &[
    "metrics-addr",
    "enable-leader-election",
    "namespace",
    "api-secret-path",
    "api-endpoint",
    "volume-poll-interval",
    "volume-expiry-interval",
    "api-refresh-interval",
    "api-retry-interval",
    "k8s-create-poll-interval",
    "k8s-create-wait-duration",
    "zap-log-level",
    "zap-encoder",
    "zap-devel",
    "zap-stacktrace-level",
    "zap-time-encoding",
];

/// Flags of the api-manager's other controllers: accepted and ignored. All take a value.
const STORAGEOS_OTHER_CONTROLLERS: &[&str] = &[
    "scheduler-name",
    "webhook-service-name",
    "webhook-service-namespace",
    "webhook-secret-name",
    "webhook-secret-namespace",
    "webhook-config-mutating",
    "webhook-mutate-pods-path",
    "webhook-mutate-pvcs-path",
    "webhook-cert-validity",
    "webhook-cert-refresh-interval",
    "node-poll-interval",
    "node-expiry-interval",
    "namespace-delete-gc-interval",
    "node-delete-gc-interval",
    "node-label-resync-interval",
    "pvc-label-resync-interval",
    "namespace-delete-gc-delay",
    "node-delete-gc-delay",
    "node-label-resync-delay",
    "pvc-label-resync-delay",
    "node-fencer-workers",
    "node-fencer-retry-interval",
    "node-fencer-timeout",
    "node-delete-workers",
    "namespace-delete-workers",
    "node-label-sync-workers",
    "pvc-label-sync-workers",
];

/// Rewrites the raw arguments (program name first) as clap expects them; returns them and the
/// warnings to log once logging is set up.
pub fn normalize(args: impl IntoIterator<Item = OsString>) -> (Vec<OsString>, Vec<String>) {
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let mut args = args.into_iter().peekable();
    if let Some(program) = args.next() {
        out.push(program);
    }
    while let Some(arg) = args.next() {
        let Some(text) = arg.to_str() else {
            out.push(arg);
            continue;
        };
        if text == "--" {
            out.push(arg);
            out.extend(args);
            break;
        }
        let Some((name, value)) = long_flag(text) else {
            out.push(arg);
            continue;
        };
        if STORAGEOS_OTHER_CONTROLLERS.contains(&name) {
            if value.is_none() {
                args.next();
            }
            warnings.push(format!(
                "flag --{name} belongs to another controller of the StorageOS api-manager; ignored"
            ));
        } else if STORAGEOS_FLAGS.contains(&name) && !text.starts_with("--") {
            out.push(OsString::from(format!("-{text}")));
        } else {
            out.push(arg);
        }
    }
    (out, warnings)
}

/// A long flag's name and inline value: `--name=value`, `--name`, or the Go spelling `-name`.
fn long_flag(text: &str) -> Option<(&str, Option<&str>)> {
    let body = text.strip_prefix("--").or_else(|| text.strip_prefix('-'))?;
    // `-x` alone is a short flag; a Go-style long flag has a name of two characters or more.
    let (name, value) = match body.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (body, None),
    };
    (name.len() > 1 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')).then_some((name, value))
}

/// Maps the compatibility flags onto this product's own settings; returns the deprecation
/// warnings to log once, or an error naming a value that cannot be mapped.
pub fn apply(cli: &mut Cli) -> Result<Vec<String>, String> {
    let mut warnings = Vec::new();
    let common = &mut cli.common;
    if let Some(v) = common.verbosity {
        common.log_level = klog_level(v).into();
        warnings.push(format!(
            "--v={v} is accepted for compatibility; use --log-level={} instead",
            common.log_level
        ));
    }
    if let Some(timeout) = common.request_timeout.take() {
        common.kube_api_timeout = go_duration(&timeout)?;
        warnings.push(format!(
            "--request-timeout={timeout} is accepted for compatibility; use --kube-api-timeout instead"
        ));
    }
    match &mut cli.command {
        Command::Agent(agent) => {
            if let Some(addr) = agent.health_bind_address.take() {
                common.admin_addr = listen_address(&addr)?;
                warnings.push(format!(
                    "--health-bind-address={addr} is accepted for compatibility; use --admin-addr instead (it serves /healthz, /readyz and /metrics)"
                ));
            }
        }
        Command::Controller(controller) => {
            if let Some(addr) = controller.metrics_addr.take() {
                common.admin_addr = listen_address(&addr)?;
                warnings.push(format!(
                    "--metrics-addr={addr} is accepted for compatibility; use --admin-addr instead"
                ));
            }
            if let Some(enabled) = controller.enable_leader_election.take() {
                controller.leader_elect = enabled;
                warnings.push(format!(
                    "--enable-leader-election={enabled} is accepted for compatibility; use --leader-elect={enabled} instead"
                ));
            }
            if let Some(level) = controller.zap_log_level.take() {
                common.log_level = zap_level(&level)?.into();
                warnings.push(format!(
                    "--zap-log-level={level} is accepted for compatibility; use --log-level={} instead",
                    common.log_level
                ));
            }
            if let Some(encoder) = controller.zap_encoder.take() {
                common.log_format = match encoder.as_str() {
                    "json" => LogFormat::Json,
                    "console" => LogFormat::Text,
                    other => return Err(format!("--zap-encoder {other:?}: expected json or console")),
                };
                warnings.push(format!(
                    "--zap-encoder={encoder} is accepted for compatibility; use --log-format instead"
                ));
            }
            if controller.volume_expiry_interval.is_some() {
                warnings.push(
                    "--volume-expiry-interval has no effect: every poll lists every volume, so none is cached for longer than --volume-poll-interval".into(),
                );
            }
            let zap_other = [
                ("zap-devel", controller.zap_devel.is_some()),
                ("zap-stacktrace-level", controller.zap_stacktrace_level.is_some()),
                ("zap-time-encoding", controller.zap_time_encoding.is_some()),
            ];
            for (flag, _) in zap_other.iter().filter(|(_, given)| *given) {
                warnings.push(format!("--{flag} has no effect: use --log-format and --log-level"));
            }
        }
        // New: no flags of the systems it replaces.
        Command::Selftest(_) | Command::Conntrack(_) | Command::Status(_) | Command::Share(_) => {}
    }
    Ok(warnings)
}

/// klog's verbosity as a log filter.
fn klog_level(v: u8) -> &'static str {
    match v {
        0 | 1 => "info",
        2..=4 => "debug",
        _ => "trace",
    }
}

/// zap's level (a name or a number, higher is more verbose) as a log filter.
fn zap_level(level: &str) -> Result<&'static str, String> {
    match level {
        "debug" => Ok("debug"),
        "info" => Ok("info"),
        "warn" => Ok("warn"),
        "error" | "dpanic" | "panic" | "fatal" => Ok("error"),
        number => match number.parse::<u8>() {
            Ok(0) => Ok("info"),
            Ok(1) => Ok("debug"),
            Ok(_) => Ok("trace"),
            Err(_) => Err(format!(
                "--zap-log-level {level:?}: expected debug, info, error or a number"
            )),
        },
    }
}

/// A Go duration as `--request-timeout` takes it; `0` means none.
fn go_duration(value: &str) -> Result<Option<humantime::Duration>, String> {
    if value.trim_start_matches('0').is_empty() {
        return Ok(None);
    }
    let duration: humantime::Duration = value
        .parse()
        .map_err(|err| format!("--request-timeout {value:?}: {err}; expected e.g. 30s or 1m"))?;
    // Go's client reads any zero duration (`0s`, `0ms`) as "no timeout", not as one of zero.
    Ok((!duration.is_zero()).then_some(duration))
}

/// A Go listen address (`:8080`, `host:8080`) as a socket address. Go's `:8080` listens on every
/// address of both families: `[::]:8080` here.
fn listen_address(addr: &str) -> Result<SocketAddr, String> {
    let full = if addr.starts_with(':') {
        format!("[::]{addr}")
    } else {
        addr.to_owned()
    };
    full.parse()
        .map_err(|err| format!("address {addr:?}: {err}; expected :PORT or IP:PORT"))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    fn parse(args: &[&str]) -> (Cli, Vec<String>) {
        let (args, mut warnings) = normalize(args.iter().map(OsString::from));
        let mut cli = Cli::try_parse_from(args).unwrap();
        warnings.extend(apply(&mut cli).unwrap());
        (cli, warnings)
    }

    #[test]
    fn storageos_single_dash_flags_and_other_controllers_flags() {
        let (args, warnings) = normalize(
            [
                "bin",
                "controller",
                "-k8s-create-poll-interval",
                "2s",
                "-api-endpoint=storageos:5705",
                "-enable-leader-election",
                "-webhook-service-name",
                "storageos-webhook",
                "-node-fencer-workers=5",
                "-v",
                "--watch-namespace",
                "apps",
            ]
            .map(OsString::from),
        );
        let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap()).collect();
        assert_eq!(
            args,
            [
                "bin",
                "controller",
                "--k8s-create-poll-interval",
                "2s",
                "--api-endpoint=storageos:5705",
                "--enable-leader-election",
                "-v",
                "--watch-namespace",
                "apps"
            ]
        );
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("--webhook-service-name"));
    }

    #[test]
    fn piraeus_flags_map_onto_ours() {
        let (cli, warnings) = parse(&[
            "bin",
            "agent",
            "--node-name",
            "n1",
            "--v=4",
            "--request-timeout=30s",
            "--health-bind-address=:8000",
        ]);
        assert_eq!(cli.common.log_level, "debug");
        assert_eq!(
            cli.common.kube_api_timeout.map(|t| *t),
            Some(std::time::Duration::from_secs(30))
        );
        assert_eq!(cli.common.admin_addr, "[::]:8000".parse().unwrap());
        assert_eq!(warnings.len(), 3);
        let Command::Agent(agent) = cli.command else { panic!() };
        assert_eq!(*agent.operations_timeout, std::time::Duration::from_secs(60));
        assert_eq!(*agent.reconcile_interval, std::time::Duration::from_secs(5));
        assert_eq!(*agent.resync_interval, std::time::Duration::from_secs(300));
        let (cli, _) = parse(&["bin", "agent", "--node-name", "n1", "--request-timeout", "0"]);
        assert!(cli.common.kube_api_timeout.is_none(), "0 means no timeout");
        for zero in ["0s", "0ms"] {
            let (cli, _) = parse(&["bin", "agent", "--node-name", "n1", "--request-timeout", zero]);
            assert!(cli.common.kube_api_timeout.is_none(), "{zero} means no timeout");
        }
    }

    #[test]
    fn storageos_flags_map_onto_ours() {
        let (cli, warnings) = parse(&[
            "bin",
            "controller",
            "-metrics-addr=:9090",
            "-enable-leader-election=false",
            "-namespace",
            "storageos",
            "-zap-log-level",
            "debug",
            "-zap-encoder",
            "console",
            "-api-retry-interval",
            "7s",
        ]);
        assert_eq!(cli.common.admin_addr, "[::]:9090".parse().unwrap());
        assert_eq!(cli.common.log_level, "debug");
        assert_eq!(cli.common.log_format, LogFormat::Text);
        let Command::Controller(controller) = cli.command else {
            panic!()
        };
        assert!(!controller.leader_elect);
        assert_eq!(controller.lease_namespace, "storageos");
        assert_eq!(*controller.api_retry_interval, std::time::Duration::from_secs(7));
        assert_eq!(warnings.len(), 4, "{warnings:?}");
    }

    #[test]
    fn bad_compatibility_values_are_errors_that_say_what_is_expected() {
        let (args, _) = normalize(["bin", "controller", "-zap-encoder", "xml"].map(OsString::from));
        let mut cli = Cli::try_parse_from(args).unwrap();
        let err = apply(&mut cli).unwrap_err();
        assert!(err.contains("json or console"), "{err}");
        let (args, _) =
            normalize(["bin", "agent", "--node-name", "n", "--health-bind-address", "nowhere"].map(OsString::from));
        let mut cli = Cli::try_parse_from(args).unwrap();
        assert!(apply(&mut cli).unwrap_err().contains(":PORT"));
    }
}
