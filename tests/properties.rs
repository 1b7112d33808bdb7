//! Bad input and fuzzing for the pure parsers and name derivations both loops rely on: the DRBD
//! `status`/`show` parsers, the NFS endpoint parser and the Service name of a PV. The corpus in
//! `tests/corpus/` holds the inputs seen or feared in the field; proptest adds random ones (a
//! short run here; `PROPTEST_CASES=100000 cargo test --test properties` for a long one).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use proptest::prelude::*;
use shared_volume_controller::{NfsEndpoint, is_dns1035_label, parse_quorum_enabled, parse_status, service_name};

const CORPUS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/corpus");

fn corpus_files(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(Path::new(CORPUS).join("drbd"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .map(|path| {
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&path).unwrap(),
            )
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no {prefix}* files in the corpus");
    files
}

#[test]
fn drbd_outputs_in_the_corpus_parse_or_are_refused_as_named() {
    for (name, bytes) in corpus_files("status-") {
        let text = String::from_utf8_lossy(&bytes);
        let parsed = parse_status(&text);
        if name.ends_with("-refused.json") {
            let err = parsed.expect_err(&name).to_string();
            assert!(
                err.contains("drbdsetup status --json"),
                "{name}: the error names the command: {err}"
            );
        } else {
            parsed.unwrap_or_else(|err| panic!("{name}: {err}"));
        }
    }
    for (name, bytes) in corpus_files("show-") {
        let parsed = parse_quorum_enabled(&String::from_utf8_lossy(&bytes));
        if name.ends_with("-refused.json") {
            assert!(parsed.is_err(), "{name}");
        } else {
            parsed.unwrap_or_else(|err| panic!("{name}: {err}"));
        }
    }
}

#[test]
fn what_the_corpus_outputs_mean() {
    let read = |name: &str| std::fs::read_to_string(Path::new(CORPUS).join("drbd").join(name)).unwrap();
    let huge = parse_status(&read("status-huge-counters.json")).unwrap();
    assert!(huge[0].is_primary() && huge[0].has_quorum() && huge[0].connections[0].is_connected());
    // Unknown roles and connection states are neither Primary nor Connected: never a reason to
    // promote on their account, and a peer in an unknown state is not counted as connected.
    let unknown = parse_status(&read("status-unknown-fields-roles-states.json")).unwrap();
    assert!(!unknown[0].is_primary() && unknown[0].has_quorum() && unknown[0].quorum_without_primary_peer());
    assert!(!unknown[0].connections[0].is_connected() && !unknown[0].fully_connected());
    let minimal = parse_status(&read("status-minimal.json")).unwrap();
    assert!(
        !minimal[0].has_quorum() && !minimal[0].quorum_without_primary_peer(),
        "no devices: no quorum"
    );
    let quorum = parse_quorum_enabled(&read("show-quorum-settings.json")).unwrap();
    let enabled: BTreeSet<&str> = quorum.iter().map(String::as_str).collect();
    assert_eq!(enabled, BTreeSet::from(["pvc-1", "pvc-5", "pvc-6"]));
}

#[test]
fn endpoints_in_the_corpus_give_what_they_say() {
    let text = std::fs::read_to_string(Path::new(CORPUS).join("endpoints.tsv")).unwrap();
    let mut wrong = Vec::new();
    for line in text.lines() {
        let (input, expected) = line.rsplit_once('\t').expect("input<TAB>expected");
        let got = match input.parse::<NfsEndpoint>() {
            Ok(_) => "ok".to_owned(),
            Err(err) => format!("{err:?}").split('(').next().unwrap().to_owned(),
        };
        if got != expected {
            wrong.push(format!("{input:?}: expected {expected}, got {got}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn pv_names_in_the_corpus_give_valid_distinct_service_names() {
    let text = std::fs::read_to_string(Path::new(CORPUS).join("pv-names.txt")).unwrap();
    let mut by_service: BTreeMap<String, &str> = BTreeMap::new();
    for name in text.lines() {
        let service = service_name(name);
        assert!(is_dns1035_label(&service), "{name:?} -> {service:?}");
        assert_eq!(service_name(name), service, "deterministic");
        if let Some(other) = by_service.insert(service.clone(), name) {
            panic!("{name:?} and {other:?} both give {service:?}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(512)))]

    #[test]
    fn the_drbd_parsers_never_panic(text in ".{0,400}") {
        let _ = parse_status(&text);
        let _ = parse_quorum_enabled(&text);
    }

    #[test]
    fn the_drbd_parser_takes_any_values_in_fields_it_does_not_use(
        role in "[A-Za-z]{0,12}",
        quorum in any::<bool>(),
        counter in any::<u64>(),
        float in any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()),
        state in "[A-Za-z]{0,16}",
    ) {
        let json = format!(
            r#"[{{"name": "r", "role": "{role}", "written": {float:e}, "devices": [{{"volume": {counter}, "quorum": {quorum}, "size": {counter}}}],
                "connections": [{{"name": "peer", "connection-state": "{state}", "ap-in-flight": {counter}}}]}}]"#
        );
        let resources = parse_status(&json).unwrap();
        prop_assert_eq!(resources[0].has_quorum(), quorum);
        prop_assert_eq!(resources[0].is_primary(), role == "Primary");
        prop_assert_eq!(resources[0].connections[0].is_connected(), state == "Connected");
    }

    #[test]
    fn the_endpoint_parser_never_panics_and_what_it_accepts_prints_back(text in "\\PC{0,60}") {
        if let Ok(endpoint) = text.parse::<NfsEndpoint>() {
            prop_assert_eq!(endpoint.to_string().parse::<NfsEndpoint>(), Ok(endpoint));
            prop_assert!(endpoint.port > 0);
        }
    }

    #[test]
    fn every_reachable_socket_address_round_trips(addr in any::<std::net::SocketAddr>()) {
        let ip = addr.ip().to_canonical();
        let unusable = ip.is_loopback() || ip.is_unspecified() || ip.is_multicast()
            || matches!(ip, std::net::IpAddr::V4(v4) if v4.is_link_local() || v4.is_broadcast())
            || matches!(ip, std::net::IpAddr::V6(v6) if v6.is_unicast_link_local());
        let printed = std::net::SocketAddr::new(addr.ip(), addr.port()).to_string();
        match printed.parse::<NfsEndpoint>() {
            Ok(endpoint) => {
                prop_assert!(!unusable && addr.port() != 0, "{printed} accepted");
                prop_assert_eq!(endpoint.ip, addr.ip());
                prop_assert_eq!(endpoint.to_string().parse::<NfsEndpoint>(), Ok(endpoint));
            }
            Err(_) => prop_assert!(unusable || addr.port() == 0, "{printed} refused"),
        }
    }

    #[test]
    fn service_names_are_valid_and_deterministic(name in "\\PC{1,300}") {
        let service = service_name(&name);
        prop_assert!(is_dns1035_label(&service), "{:?} -> {:?}", name, service);
        prop_assert_eq!(service_name(&name), service);
    }
}

/// Distinct PV names never share a Service name, over a large random sample of names that
/// are mostly not valid labels (so most go through the prefix-and-hash path).
#[test]
fn distinct_pv_names_never_share_a_service_name() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};
    let samples: usize = std::env::var("SVC_NAME_SAMPLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let mut runner = TestRunner::new(Config::default());
    let names = "[a-zA-Z0-9._/-]{1,80}";
    let mut by_service: BTreeMap<String, String> = BTreeMap::new();
    for _ in 0..samples {
        let name = names.new_tree(&mut runner).unwrap().current();
        let service = service_name(&name);
        if let Some(other) = by_service.insert(service.clone(), name.clone())
            && other != name
        {
            panic!("{name:?} and {other:?} both give {service:?}");
        }
    }
    println!(
        "{} distinct PV names, {} distinct Service names",
        by_service.len(),
        by_service.len()
    );
}
