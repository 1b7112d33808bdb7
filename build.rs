//! Embeds the git revision in the binary, for the `build_info` metric's `revision` label: from
//! `SVC_REVISION` when set (the image build passes it: the build context has no `.git`), else from
//! git, else "unknown".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=SVC_REVISION");
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        // Build again when HEAD moves: HEAD itself, the branch it names, or the packed refs.
        println!("cargo:rerun-if-changed={dir}/HEAD");
        println!("cargo:rerun-if-changed={dir}/packed-refs");
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={dir}/{branch}");
        }
    }
    let revision = std::env::var("SVC_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=SVC_GIT_REVISION={revision}");
}
