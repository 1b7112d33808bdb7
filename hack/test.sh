#!/usr/bin/env bash
# The whole test suite on a fresh or warm machine: tools, lint, unit tests and end-to-end tests on a
# real control plane started for this run and stopped afterwards. Exit status is the tests'.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "tools (hack/tools.sh)"
bin=$(hack/tools.sh)
export PATH="$bin:$PATH"

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy --all-targets -- -D warnings"
cargo clippy --locked --all-targets -- -D warnings
step "hadolint Dockerfile"
hadolint Dockerfile
step "build"
cargo build --locked --all-targets

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/svc-test.XXXXXX")
cleanup() { hack/cluster.sh down "$run_dir/cluster" || true; rm -rf "$run_dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

step "control plane up"
hack/cluster.sh up "$run_dir/cluster"
export KUBECONFIG="$run_dir/cluster/kubeconfig"
export SVC_TOOLS_BIN="$bin"

step "cargo test (unit and end-to-end)"
cargo test --locked --all-targets -- --include-ignored
