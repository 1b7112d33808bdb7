//! Every flag the binary takes, read from clap's own definition, against what the chart and the
//! flags page say about it: a chart value in `values.yaml` and its schema for each flag of a
//! long-running component (or set by the chart's own template), whose environment variable is the
//! one the flag reads; no chart value the binary does not take; every flag on the flags page.

use std::collections::BTreeSet;

use clap::{Arg, CommandFactory};
use serde_json::Value;
use shared_volume_controller::{COMPATIBILITY, Cli};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/shared-volume-controller");
const FLAGS_PAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference/flags.md");

/// The chart's components that run a subcommand for good: (subcommand, values key, template).
const COMPONENTS: [(&str, &str, &str); 3] = [
    ("controller", "controller", "controller-deployment.yaml"),
    ("agent", "agent", "agent-daemonset.yaml"),
    ("conntrack", "conntrack", "conntrack-daemonset.yaml"),
];

/// The common flags that are kubectl's, with no environment variable (as kubectl's).
const KUBECTL_FLAGS: [&str; 6] = ["kubeconfig", "context", "cluster", "user", "as", "as-group"];

/// The flags of `subcommand`, the global ones included, `--help` left out.
fn flags_of(subcommand: &str) -> Vec<Arg> {
    let mut cli = Cli::command();
    cli.build();
    let command = cli
        .find_subcommand(subcommand)
        .unwrap_or_else(|| panic!("no subcommand {subcommand}"));
    command
        .get_arguments()
        .filter(|arg| arg.get_long().is_some_and(|long| long != "help"))
        .cloned()
        .collect()
}

fn long(arg: &Arg) -> &str {
    arg.get_long().unwrap()
}

fn env(arg: &Arg) -> Option<String> {
    arg.get_env().map(|e| e.to_string_lossy().into_owned())
}

/// Flags other tools spelt that way; the chart uses the product's own names.
fn is_compatibility(arg: &Arg) -> bool {
    arg.get_help_heading() == Some(COMPATIBILITY)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn values() -> Value {
    serde_yaml::from_str(&read(&format!("{CHART}/values.yaml"))).unwrap()
}

fn schema() -> Value {
    serde_json::from_str(&read(&format!("{CHART}/values.schema.json"))).unwrap()
}

/// The environment variables a template sets by name itself (downward API, admin address).
fn set_by_template(template: &str) -> BTreeSet<String> {
    read(&format!("{CHART}/templates/{template}"))
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- name: "))
        .filter(|name| name.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_flag_of_a_component_is_a_chart_value_with_the_environment_variable_it_reads() {
    let (values, schema) = (values(), schema());
    let mut missing = Vec::new();
    for (subcommand, key, template) in COMPONENTS {
        let in_values = values[key]["flags"]
            .as_object()
            .unwrap_or_else(|| panic!("{key}.flags"));
        let in_schema = schema["properties"][key]["properties"]["flags"]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("schema {key}.flags"));
        let by_template = set_by_template(template);
        let flags = flags_of(subcommand);
        for arg in flags.iter().filter(|a| !is_compatibility(a)) {
            let name = long(arg);
            match env(arg) {
                // kubectl's: the chart runs in the cluster, as its ServiceAccount, with no
                // kubeconfig file to choose from and no one to impersonate.
                None if KUBECTL_FLAGS.contains(&name) => {}
                None => missing.push(format!("{subcommand} --{name}: no environment variable")),
                Some(variable) if by_template.contains(&variable) => {}
                Some(variable) => {
                    if !in_values.contains_key(name) {
                        missing.push(format!("{key}.flags.{name} is not in values.yaml"));
                    }
                    if !in_schema.contains_key(name) {
                        missing.push(format!("{key}.flags.{name} is not in values.schema.json"));
                    }
                    // The chart turns a value's key into the variable (svc.flagEnv).
                    let rendered = name.to_uppercase().replace('-', "_");
                    if rendered != variable {
                        missing.push(format!(
                            "{key}.flags.{name} sets {rendered}, but --{name} reads {variable}"
                        ));
                    }
                }
            }
        }
        let taken: BTreeSet<&str> = flags.iter().map(long).collect();
        for name in in_values.keys().chain(in_schema.keys()) {
            if !taken.contains(name.as_str()) {
                missing.push(format!("{key}.flags.{name}: `{subcommand}` takes no --{name}"));
            }
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "the chart's flags and the binary's differ:\n{}",
        missing.join("\n")
    );
}

/// The part of the flags page under `heading`, up to the next heading of its level or above.
fn section<'a>(page: &'a str, heading: &str) -> &'a str {
    let start = page
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/reference/flags.md has no heading {heading:?}"));
    let level = heading.split(' ').next().unwrap().len();
    let rest = &page[start + heading.len() + 2..];
    let end = rest
        .match_indices("\n#")
        .find(|(at, _)| rest[at + 1..].chars().take_while(|c| *c == '#').count() <= level)
        .map_or(rest.len(), |(at, _)| at);
    &rest[..end]
}

/// Where the flags page documents a subcommand's own flags.
fn heading_of(subcommand: &str) -> String {
    match subcommand {
        "controller" => "### Controller flags".into(),
        "agent" => "### Agent flags".into(),
        other => format!("## `{other}`"),
    }
}

#[test]
fn the_flags_page_lists_every_flag_of_every_subcommand_where_it_belongs() {
    let page = read(FLAGS_PAGE);
    let mut cli = Cli::command();
    cli.build();
    let mut missing = Vec::new();
    for subcommand in cli.get_subcommands() {
        let name = subcommand.get_name();
        for arg in flags_of(name) {
            let flag = long(&arg);
            let heading = if is_compatibility(&arg) {
                "## Compatibility flags".to_owned()
            } else if arg.is_global_set() {
                "## Common flags".to_owned()
            } else {
                heading_of(name)
            };
            let text = section(&page, &heading);
            if !text.contains(&format!("`--{flag}`")) {
                missing.push(format!("{name} --{flag} under {heading:?}"));
            }
            if let Some(variable) = env(&arg)
                && !text.contains(&format!("`{variable}`"))
            {
                missing.push(format!("{name} --{flag}: its variable {variable} under {heading:?}"));
            }
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "docs/reference/flags.md does not name:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_check_reads_compatibility_flags_from_clap() {
    let compatibility: Vec<String> = flags_of("agent")
        .iter()
        .filter(|a| is_compatibility(a))
        .map(|a| long(a).to_owned())
        .collect();
    for name in ["health-bind-address", "v", "request-timeout"] {
        assert!(compatibility.iter().any(|c| c == name), "{compatibility:?}");
    }
}

/// A user's shell may set `LOG_LEVEL` or `ADMIN_ADDR` for something else: the plugin's
/// subcommands read their common flags from the command line alone, as kubectl does, while the
/// loops' subcommands read them from the environment too (the chart sets them that way).
#[test]
fn the_plugins_subcommands_read_no_common_flag_from_the_environment() {
    let run = |args: &[&str]| {
        let output = std::process::Command::new(common::process::product_binary())
            .args(args)
            .env("ADMIN_ADDR", "not-an-address")
            .env("KUBECONFIG", "/nonexistent/kubeconfig")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("run the binary");
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let refused = "invalid value 'not-an-address' for '--admin-addr";
    for plugin in [&["status"][..], &["share", "some-resource", "--size", "1Gi"]] {
        let said = run(plugin);
        assert!(!said.contains(refused), "{plugin:?} read ADMIN_ADDR: {said}");
        assert!(
            said.contains("/nonexistent/kubeconfig"),
            "{plugin:?} went on to the kubeconfig: {said}"
        );
    }
    let said = run(&["agent", "--node-name", "node-a"]);
    assert!(said.contains(refused), "the agent reads ADMIN_ADDR: {said}");
}
