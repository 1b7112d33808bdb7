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
step "the Dockerfile's build stage has what it needs (hack/check-image-build.sh)"
hack/check-image-build.sh
step "build"
cargo build --locked --all-targets

step "cargo test (unit and end-to-end, on a fresh control plane)"
hack/with-cluster.sh cargo test --locked --all-targets -- --include-ignored
