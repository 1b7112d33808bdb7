//! The documentation a first-time installer reads: a README short enough to read, every link and
//! anchor in the docs, and every link into them from the chart, the dashboard, the alerts and the
//! tests, resolved; the changelog and the chart's `artifacthub.io/changes` saying the same.

use std::path::{Path, PathBuf};

use common::docs::{
    broken, chart_version, hack_setting, markdown_links, release_setting, repository_urls, root, sh_block_after,
    sh_commands,
};

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
        // A template names the chart's version as it renders it, the alert tests as they expect it.
        let version = format!("/blob/v{}/", chart_version());
        let text = ["/blob/v%s/", "/blob/v{{ .Version }}/", "/blob/v${CHART_VERSION}/"]
            .iter()
            .fold(text, |text, placeholder| text.replace(placeholder, &version));
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
    let version = chart_version();
    let section = changelog
        .split("\n## ")
        .find(|s| s.starts_with(&version))
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

/// Every command the pages that install, upgrade or verify (and the chart's README) show installs what a release
/// publishes: the chart from `CHART_REPOSITORY` (`hack/release.env`) at the chart's version, the
/// plugin's krew manifest and archives from the GitHub release of that version's tag, under the
/// names the release workflow uploads and `hack/plugin-archive.sh` packs. A command from a
/// checkout (`helm install …`, after `make images`) says so with its ellipsis.
#[test]
fn the_install_pages_install_what_a_release_publishes() {
    let version = chart_version();
    let chart = format!(
        "{}/shared-volume-controller --version {version} ",
        release_setting("CHART_REPOSITORY")
    );
    let downloads = format!(
        "https://github.com/{}/releases/download/v{version}/",
        release_setting("GITHUB_REPOSITORY")
    );
    let workflow = std::fs::read_to_string(Path::new(root()).join(".github/workflows/release.yml")).unwrap();
    let packer = std::fs::read_to_string(Path::new(root()).join("hack/plugin-archive.sh")).unwrap();
    assert!(
        workflow.contains("dist/*.tar.gz dist/checksums.txt dist/shared-volume.yaml"),
        "the release uploads the archives and the krew manifest"
    );
    assert!(
        packer.contains(r#"archive="$out/kubectl-shared_volume-$version-$platform.tar.gz""#),
        "the archives' names"
    );
    let archives: Vec<String> = ["linux-amd64", "linux-arm64", "darwin-amd64", "darwin-arm64"]
        .map(|platform| format!("kubectl-shared_volume-{version}-{platform}.tar.gz"))
        .into();
    let mut named = 0;
    for page in [
        "README.md",
        "docs/how-to/install.md",
        "docs/how-to/upgrade.md",
        "docs/how-to/verify.md",
        // What `helm show readme` and Artifact Hub show.
        "charts/shared-volume-controller/README.md",
    ] {
        for command in sh_commands(page) {
            let helm = command.starts_with("helm install ") || command.starts_with("helm upgrade ");
            if helm && !command.contains('…') {
                assert!(command.contains(&chart), "{page}: {command:?} does not install {chart}");
                named += 1;
            }
            for url in command.split_whitespace().filter(|w| w.contains("/releases/download/")) {
                let file = url.strip_prefix(downloads.as_str());
                let published = file.is_some_and(|f| f == "shared-volume.yaml" || archives.iter().any(|a| a == f));
                assert!(published, "{page}: {url} is not an artefact of the v{version} release");
                named += 1;
            }
        }
    }
    assert!(named >= 6, "the pages name {named} release artefacts");
}

/// The Kubernetes versions called supported are the ones the tests run on: `make test` on
/// `KUBERNETES_VERSION`, `make test-matrix` on `KUBERNETES_MATRIX` (`hack/versions.env`). The
/// chart's `kubeVersion` and the API types the binary is built with (k8s-openapi's feature) start
/// at the oldest of them, and the upgrade page's supported versions name the range and each one.
#[test]
fn the_supported_kubernetes_versions_are_the_tested_ones() {
    let mut tested = vec![hack_setting("versions.env", "KUBERNETES_VERSION")];
    tested.extend(
        hack_setting("versions.env", "KUBERNETES_MATRIX")
            .split_whitespace()
            .map(String::from),
    );
    let minor = |version: &str| -> u32 {
        version
            .strip_prefix("v1.")
            .unwrap()
            .split('.')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let oldest = tested.iter().map(|v| minor(v)).min().unwrap();
    let newest = tested.iter().map(|v| minor(v)).max().unwrap();

    let chart = std::fs::read_to_string(Path::new(root()).join("charts/shared-volume-controller/Chart.yaml")).unwrap();
    assert!(
        chart.contains(&format!("kubeVersion: \">=1.{oldest}.0-0\"")),
        "Chart.yaml's kubeVersion is not 1.{oldest}+"
    );
    let cargo = std::fs::read_to_string(Path::new(root()).join("Cargo.toml")).unwrap();
    assert!(
        cargo.contains(&format!("features = [\"v1_{oldest}\"]")),
        "k8s-openapi is not built for 1.{oldest}"
    );

    let upgrade = std::fs::read_to_string(Path::new(root()).join("docs/how-to/upgrade.md")).unwrap();
    let start = upgrade
        .find("- **Kubernetes**:")
        .expect("upgrade.md's supported Kubernetes");
    let item = &upgrade[start..];
    let line = &item[..item[1..].find("\n- ").map_or(item.len(), |end| end + 1)];
    assert!(line.contains(&format!("1.{oldest} to 1.{newest}")), "{line}");
    for version in &tested {
        assert!(
            line.contains(version.trim_start_matches('v')),
            "{line} does not name the tested {version}"
        );
    }
}
