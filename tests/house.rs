//! The house's rules the compiler does not check.
//!
//! The ground floor: every module `ARCHITECTURE.md` marks pure (`yes`, with no caveat) imports no
//! Kubernetes client, no async runtime and nothing that reaches the filesystem, processes, the
//! network or netlink, outside its tests. They share a crate with the shell, so the compiler does
//! not see it; this test does, and it keeps the table honest: a row marked pure that stops being
//! so fails here, not in review.
//!
//! Rooms of a size to read: no function of `src/`, `tests/` or `benches/` is over 80 lines.

use std::path::{Path, PathBuf};

/// What a pure module must not name, and what it would be.
const FORBIDDEN: &[(&str, &str)] = &[
    ("kube::Client", "a Kubernetes client"),
    ("kube::Api", "a Kubernetes client"),
    ("kube::api::Api", "a Kubernetes client"),
    ("kube::runtime::watcher(", "a watch"),
    ("kube::runtime::reflector", "a cache fed by a watch"),
    ("kube::runtime::Controller", "a controller loop"),
    ("tokio", "the async runtime"),
    ("std::fs", "the filesystem"),
    ("std::process", "processes"),
    ("std::net::TcpStream", "the network"),
    ("std::net::UdpSocket", "the network"),
    ("reqwest", "an HTTP client"),
    ("hyper", "an HTTP client or server"),
    ("netlink_sys", "netlink sockets"),
];

/// The files of the rows whose "pure" column is `yes` exactly; a row's bare file names are in
/// the folder of the path before them.
fn pure_files(architecture: &str) -> Vec<String> {
    let mut files = Vec::new();
    for row in architecture.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim().trim_matches('|').split('|').map(str::trim).collect();
        if cells.len() < 3 || cells[2] != "yes" {
            continue;
        }
        let mut folder = String::new();
        for name in cells[1].split('`').skip(1).step_by(2) {
            if let Some((dir, _)) = name.rsplit_once('/') {
                folder = dir.to_owned();
                files.push(name.to_owned());
            } else if name.ends_with(".rs") {
                files.push(format!("{folder}/{name}"));
            }
        }
    }
    files
}

/// The lines of `source` before its test module, without comments and string literals.
fn code_lines(source: &str) -> Vec<(usize, String)> {
    let code = source.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    code.lines()
        .enumerate()
        .map(|(i, line)| (i + 1, without_strings(line.split("//").next().unwrap_or_default())))
        .collect()
}

fn without_strings(line: &str) -> String {
    let mut out = String::new();
    let mut in_string = false;
    let mut escaped = false;
    for c in line.chars() {
        match (in_string, escaped, c) {
            (true, false, '\\') => escaped = true,
            (true, false, '"') => in_string = false,
            (true, _, _) => escaped = false,
            (false, _, '"') => in_string = true,
            (false, _, c) => out.push(c),
        }
    }
    out
}

/// What `line` names of [`FORBIDDEN`], including inside a grouped `use kube::{...}`.
fn forbidden_in(line: &str) -> Vec<&'static str> {
    let mut found: Vec<&'static str> = FORBIDDEN
        .iter()
        .filter(|(path, _)| {
            line.match_indices(path).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = line[at + path.len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
        })
        .map(|(_, what)| *what)
        .collect();
    if let Some(group) = line.trim().strip_prefix("use kube::{") {
        let names = group.split(|c: char| !c.is_alphanumeric() && c != '_');
        if names.clone().any(|n| n == "Api" || n == "Client") {
            found.push("a Kubernetes client");
        }
    }
    found
}

#[test]
fn no_module_of_the_ground_floor_reaches_outside_the_process() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = pure_files(&std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap());
    assert!(files.len() > 30, "the table's pure rows: {files:?}");
    let mut breaches = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(root.join(file))
            .unwrap_or_else(|e| panic!("ARCHITECTURE.md names {file}, which cannot be read: {e}"));
        for (number, line) in code_lines(&source) {
            for what in forbidden_in(&line) {
                breaches.push(format!("{file}:{number} reaches {what}: {}", line.trim()));
            }
        }
    }
    assert!(
        breaches.is_empty(),
        "modules marked pure in ARCHITECTURE.md that are not:\n{}",
        breaches.join("\n")
    );
}

#[test]
fn the_check_sees_what_a_pure_module_must_not_name() {
    assert_eq!(forbidden_in("use kube::{Api, ResourceExt};"), ["a Kubernetes client"]);
    assert_eq!(
        forbidden_in("    let t = tokio::time::Instant::now();"),
        ["the async runtime"]
    );
    assert_eq!(forbidden_in("use std::fs::read;"), ["the filesystem"]);
    assert!(forbidden_in("use kube::ResourceExt;").is_empty());
    assert!(forbidden_in("    Api(String),").is_empty(), "a variant of that name");
    assert!(
        forbidden_in("use kube::runtime::events::EventType;").is_empty(),
        "a value"
    );
    assert!(
        code_lines("let a = \"tokio\"; // tokio\n")
            .iter()
            .all(|(_, l)| forbidden_in(l).is_empty())
    );
    let table = "| a | `src/x/a.rs`, `b.rs` | yes |\n| c | `src/c.rs` | yes (its I/O) |\n";
    assert_eq!(pure_files(table), ["src/x/a.rs", "src/x/b.rs"]);
}

/// The longest function a reader should have to hold in mind at once.
const MOST_LINES: usize = 80;

/// The `.rs` files under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// Each function of `source` longer than [`MOST_LINES`]: its first line, name and length, from
/// its `fn` line to the closing brace at the same indentation (rustfmt's layout).
fn long_functions(source: &str) -> Vec<(usize, String, usize)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut long = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let code = line.trim_start();
        let indent = &line[..line.len() - code.len()];
        let signature = ["pub ", "pub(crate) ", "pub(super) ", "async ", "const ", "unsafe "]
            .iter()
            .fold(code, |rest, prefix| rest.strip_prefix(prefix).unwrap_or(rest));
        let Some(name) = signature.strip_prefix("fn ") else {
            continue;
        };
        let closing = format!("{indent}}}");
        if let Some(end) = lines[start + 1..].iter().position(|l| *l == closing) {
            let length = end + 2;
            if length > MOST_LINES {
                let name = name
                    .split(|c: char| !c.is_alphanumeric() && c != '_')
                    .next()
                    .unwrap_or(name);
                long.push((start + 1, name.to_owned(), length));
            }
        }
    }
    long
}

#[test]
fn no_function_is_over_80_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for dir in ["src", "tests", "benches"] {
        for file in rust_files(&root.join(dir)) {
            let source = std::fs::read_to_string(&file).unwrap();
            for (line, name, length) in long_functions(&source) {
                let file = file.strip_prefix(root).unwrap_or(&file).display().to_string();
                long.push(format!("{file}:{line} fn {name}: {length} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MOST_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn a_long_function_is_measured_from_its_fn_to_its_closing_brace() {
    let body = "        x();\n".repeat(MOST_LINES);
    let source = format!("impl A {{\n    pub async fn long(&self) {{\n{body}    }}\n\n    fn short() {{}}\n}}\n");
    assert_eq!(long_functions(&source), [(2, "long".to_owned(), MOST_LINES + 2)]);
    let fits = format!("fn fits() {{\n{}}}\n", "    x();\n".repeat(MOST_LINES - 2));
    assert!(long_functions(&fits).is_empty());
}

/// The most lines a test or benchmark file may hold: past that it has rooms worth their own files.
const MOST_TEST_FILE_LINES: usize = 800;

#[test]
fn no_test_or_benchmark_file_is_over_800_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut large = Vec::new();
    for dir in ["tests", "benches"] {
        for file in rust_files(&root.join(dir)) {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            if lines > MOST_TEST_FILE_LINES {
                let file = file.strip_prefix(root).unwrap_or(&file).display().to_string();
                large.push(format!("{file}: {lines} lines"));
            }
        }
    }
    assert!(
        large.is_empty(),
        "test files over {MOST_TEST_FILE_LINES} lines (split them where they have seams):\n{}",
        large.join("\n")
    );
}
