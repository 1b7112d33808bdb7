//! The documentation a first-time installer reads: a README short enough to read, every link and
//! anchor in the docs, and every link into them from the chart, the dashboard, the alerts and the
//! tests, resolved; the changelog and the chart's `artifacthub.io/changes` saying the same.

use std::path::{Path, PathBuf};

use common::docs::{broken, markdown_links, repository_urls, root, sh_block_after};

/// Every file under `dirs` (relative to the repository), at any depth.
fn files_under(dirs: &[&str]) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs: Vec<PathBuf> = dirs.iter().map(|d| Path::new(root()).join(d)).collect();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Every Markdown page of the project (the generated chart README included).
fn pages() -> Vec<PathBuf> {
    let top = [
        "README.md",
        "ARCHITECTURE.md",
        "CHANGELOG.md",
        "charts/shared-volume-controller/README.md",
    ];
    let docs = files_under(&["docs"])
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"));
    top.iter().map(|p| Path::new(root()).join(p)).chain(docs).collect()
}

/// Files outside the docs that link into them: the chart (values, templates, metadata), the
/// dashboard, the alert tests and the sources.
fn linking_files() -> Vec<PathBuf> {
    files_under(&["charts", "grafana", "tests/alerts", "src", "hack"])
}

#[test]
fn every_link_and_anchor_in_the_docs_resolves() {
    let mut broken_links = Vec::new();
    let pages = pages();
    assert!(pages.len() > 12, "{pages:?}");
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for link in markdown_links(&text).into_iter().chain(repository_urls(&text)) {
            if let Some(why) = broken(page, &link) {
                broken_links.push(format!("{}: {why}", page.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(broken_links.is_empty(), "broken links:\n{}", broken_links.join("\n"));
}

#[test]
fn every_link_into_the_docs_from_the_chart_dashboard_and_alerts_resolves() {
    let mut broken_links = Vec::new();
    let mut checked = 0;
    for file in linking_files() {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for url in repository_urls(&text) {
            checked += 1;
            if let Some(why) = broken(&file, &url) {
                broken_links.push(format!("{}: {why}", file.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(checked > 10, "only {checked} links found");
    assert!(broken_links.is_empty(), "broken links:\n{}", broken_links.join("\n"));
}

#[test]
fn the_readme_is_short_and_leads_to_the_docs() {
    let readme = std::fs::read_to_string(Path::new(root()).join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 200, "README.md has {lines} lines: move detail into docs/");
    for needed in [
        "## Prerequisites",
        "## Install on a cluster",
        "## Verify one RWX claim end to end",
        "## Two commands",
        "docs/",
    ] {
        assert!(readme.contains(needed), "README.md lacks {needed:?}");
    }
    let install = readme.find("## Install on a cluster").unwrap();
    assert!(
        readme.find("## Prerequisites").unwrap() < install,
        "prerequisites come before the install command"
    );
}

#[test]
fn the_changelog_and_the_charts_changes_say_the_same() {
    let changelog = std::fs::read_to_string(Path::new(root()).join("CHANGELOG.md")).unwrap();
    let chart: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(Path::new(root()).join("charts/shared-volume-controller/Chart.yaml")).unwrap(),
    )
    .unwrap();
    let version = chart["version"].as_str().unwrap();
    let section = changelog
        .split("\n## ")
        .find(|s| s.starts_with(version))
        .unwrap_or_else(|| panic!("CHANGELOG.md has no section for chart version {version}"));
    let logged: Vec<(String, String)> = section
        .lines()
        .filter_map(|l| l.strip_prefix("- "))
        .map(|l| {
            let (kind, description) = l.split_once(": ").expect("- kind: description");
            (kind.to_owned(), description.to_owned())
        })
        .collect();
    let changes: Vec<serde_yaml::Value> =
        serde_yaml::from_str(chart["annotations"]["artifacthub.io/changes"].as_str().unwrap()).unwrap();
    let annotated: Vec<(String, String)> = changes
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap().to_owned(),
                c["description"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        annotated, logged,
        "Chart.yaml's artifacthub.io/changes is CHANGELOG.md's {version} section"
    );
    let kinds = ["added", "changed", "deprecated", "removed", "fixed", "security"];
    assert!(
        logged.iter().all(|(kind, _)| kinds.contains(&kind.as_str())),
        "{logged:?}"
    );
    let license = std::fs::read_to_string(Path::new(root()).join("LICENSE")).unwrap();
    assert!(license.contains("Apache License") && license.contains("Version 2.0"));
}

/// Every reason a failed reconcile is counted under (`ReconcileError::reason`, read from its
/// source) is named on the metrics page, where operators look a label value up.
#[test]
fn the_metrics_page_names_every_reconcile_error_reason() {
    let source = std::fs::read_to_string(Path::new(root()).join("src/controller/outcome.rs")).unwrap();
    let body = source
        .split("pub fn reason(&self) -> &'static str {")
        .nth(1)
        .and_then(|rest| rest.split("\n    }\n").next())
        .expect("ReconcileError::reason in src/controller/outcome.rs");
    let reasons: Vec<&str> = body
        .lines()
        .filter_map(|line| line.split("=> \"").nth(1)?.split('"').next())
        .collect();
    assert!(reasons.len() >= 5, "{reasons:?}");
    let page = std::fs::read_to_string(Path::new(root()).join("docs/reference/metrics.md")).unwrap();
    let row = page
        .lines()
        .find(|l| l.starts_with("| `storageos_shared_volume_reconcile_errors_total{reason}`"))
        .expect("the reconcile errors row");
    let missing: Vec<&&str> = reasons.iter().filter(|r| !row.contains(&format!("`{r}`"))).collect();
    assert!(
        missing.is_empty(),
        "docs/reference/metrics.md does not name {missing:?}"
    );
}

/// A user who follows the install page gets what the README's command (the one `make test` runs)
/// installs: the two are one command.
#[test]
fn the_install_page_runs_the_readmes_install_command() {
    let readme = sh_block_after("README.md", "## Install on a cluster");
    let page = sh_block_after("docs/how-to/install.md", "## The command");
    assert!(readme.contains("helm install shared-volume"), "{readme}");
    assert_eq!(
        page, readme,
        "docs/how-to/install.md's command differs from the README's"
    );
}
