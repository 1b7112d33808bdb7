//! The project's Markdown as GitHub shows it: the anchors of a page's headings, and the links in
//! a text (relative, or to this repository on GitHub at any ref) resolved to a file and an anchor.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository's root (this crate is `tests/common` in it), as a plain path.
pub fn root() -> &'static str {
    static ROOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        root.canonicalize().unwrap().display().to_string()
    })
}
/// How this repository's files are linked from outside it (alerts, the dashboard, Chart.yaml).
pub const REPOSITORY_URL: &str = "https://github.com/shared-volume-controller/shared-volume-controller/blob/";

/// The first `sh` block after `heading` in `page` (a path from the repository's root).
pub fn sh_block_after(page: &str, heading: &str) -> String {
    block_after(page, heading, "sh")
}

/// Every command of the `sh` blocks of `page`, each on one line (a line ending in `\` joined
/// with the next) with its words one space apart.
pub fn sh_commands(page: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(root()).join(page)).unwrap();
    let blocks = text
        .split("```sh\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap_or_default());
    let joined: Vec<String> = blocks.map(|block| block.replace("\\\n", " ")).collect();
    let lines = joined.iter().flat_map(|block| block.lines());
    lines
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// `KEY` from `hack/release.env`: where a release is published.
pub fn release_setting(key: &str) -> String {
    hack_setting("release.env", key)
}

/// `KEY` from the shell settings file `hack/<file>`, without its quotes.
pub fn hack_setting(file: &str, key: &str) -> String {
    let text = std::fs::read_to_string(Path::new(root()).join("hack").join(file)).unwrap();
    let prefix = format!("{key}=");
    let line = text.lines().find(|l| l.starts_with(&prefix));
    let value = &line.unwrap_or_else(|| panic!("hack/{file} sets {key}"))[prefix.len()..];
    value.trim_matches('"').to_owned()
}

/// The first code block of `language` after `heading` in `page`.
pub fn block_after(page: &str, heading: &str, language: &str) -> String {
    let text = std::fs::read_to_string(Path::new(root()).join(page)).unwrap();
    let section = &text[text.find(heading).unwrap_or_else(|| panic!("{page} has {heading}"))..];
    let block = section
        .split(&format!("```{language}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("{page}: a {language} block after {heading}"));
    block.split("```").next().unwrap_or_default().to_owned()
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`.
pub fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (a repeated heading gets `-1`, `-2`, … as on
/// GitHub); headings inside fenced code blocks are not headings.
pub fn anchors(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    for line in outside_code(&text).filter(|line| line.starts_with('#')) {
        let base = slug(line.trim_start_matches('#'));
        let count = seen.entry(base.clone()).or_default();
        anchors.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// The targets of the Markdown links `[text](target)` in `text`, outside fenced code blocks.
pub fn markdown_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    for line in outside_code(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            links.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    links
}

/// The lines of Markdown `text` outside fenced code blocks.
fn outside_code(text: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// The links to this repository on GitHub (`…/blob/<ref>/<path>#anchor`) anywhere in `text`.
pub fn repository_urls(text: &str) -> Vec<String> {
    let mut urls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(REPOSITORY_URL) {
        let url: String = rest[at..]
            .chars()
            .take_while(|c| !c.is_whitespace() && !"\"'`)<>,".contains(*c))
            .collect();
        rest = &rest[at + url.len()..];
        urls.push(url);
    }
    urls
}

/// The chart's version (`Chart.yaml`): what `hack/release-check.sh` packages and a tag publishes.
pub fn chart_version() -> String {
    let text = std::fs::read_to_string(Path::new(root()).join("charts/shared-volume-controller/Chart.yaml")).unwrap();
    let line = text.lines().find_map(|l| l.strip_prefix("version:"));
    line.expect("Chart.yaml has a version")
        .trim()
        .trim_matches('"')
        .to_owned()
}

/// The repository's tags.
fn tags() -> Vec<String> {
    let out = std::process::Command::new("git")
        .args(["-C", root(), "tag", "--list"])
        .output()
        .expect("git");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Why `link`, found in `from`, leads nowhere; `None` when it resolves (or leaves the repository).
pub fn broken(from: &Path, link: &str) -> Option<String> {
    let (file, anchor) = match link.strip_prefix(REPOSITORY_URL) {
        // `<ref>/<path>`: the ref is the version the link is for, `main`, a tag this repository
        // has or the tag of the chart's version (the release this tree becomes); the path must
        // exist here.
        Some(at_ref) => {
            let (git_ref, path) = at_ref.split_once('/')?;
            let upcoming = git_ref == format!("v{}", chart_version());
            if git_ref != "main" && !upcoming && !tags().iter().any(|t| t == git_ref) {
                return Some(format!(
                    "{link}: no branch or tag {git_ref} (only main until releases are tagged)"
                ));
            }
            let (path, anchor) = path.split_once('#').unwrap_or((path, ""));
            (Path::new(root()).join(path), anchor)
        }
        None if link.contains("://") || link.starts_with("mailto:") => return None,
        None => {
            let (path, anchor) = link.split_once('#').unwrap_or((link, ""));
            let file = if path.is_empty() {
                from.to_path_buf()
            } else {
                from.parent().unwrap().join(path)
            };
            (file, anchor)
        }
    };
    if !file.exists() {
        return Some(format!("{link}: no file {}", shown(&file)));
    }
    if !anchor.is_empty() && file.extension().is_some_and(|e| e == "md") && !anchors(&file).contains(anchor) {
        return Some(format!("{link}: {} has no heading #{anchor}", shown(&file)));
    }
    None
}

fn shown(path: &Path) -> String {
    let path: PathBuf = path.components().collect();
    path.strip_prefix(root()).unwrap_or(&path).display().to_string()
}
