#!/usr/bin/env bash
# The whole test suite on a fresh or warm machine: tools, lint, unit tests and end-to-end tests on a
# real control plane started for this run and stopped afterwards. Exit status is the tests'.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib.sh
source hack/lib.sh

step "tools (hack/tools.sh), built while cargo compiles"
start_tools

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --workspace --all-targets -- -D warnings (the tests' helpers too)"
cargo clippy --locked --workspace --all-targets -- -D warnings
step "the earlier commit the upgrade test starts from (hack/upgrade-from.sh), then the build"
hack/upgrade-from.sh
cargo build --locked --all-targets

step "waiting for the tools"
bin=$(wait_for_tools)
export PATH="$bin:$PATH"

step "hadolint Dockerfile"
hadolint Dockerfile
step "the Dockerfile's build stage has what it needs (hack/check-image-build.sh)"
hack/check-image-build.sh
step "the chart's README is generated from its values (hack/chart-docs.sh --check)"
hack/chart-docs.sh --check
step "the plain Prometheus rules file is the chart's alerts (hack/prometheus-rules.sh --check)"
hack/prometheus-rules.sh --check
promtool check rules docs/reference/prometheus-rules.yaml
step "the GitHub workflows (actionlint, zizmor --offline)"
actionlint
zizmor --quiet --offline .github/workflows
step "the release, short of pushing it (hack/release-check.sh for Cargo.toml's version; the debug build as the plugin)"
PLUGIN_BINARY=target/debug/shared-volume-controller \
  hack/release-check.sh "$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"

step "cargo test (unit and end-to-end, two binaries at a time on a fresh control plane; the fault soak for 45 s)"
run_every_test_binary
