#!/usr/bin/env bash
# The demo: builds what it needs, starts a local control plane, and runs the controller and three
# HA agents over simulated DRBD nodes through a node failure (tests/demo.rs tells the story).
# Exits 0 only when every step happened.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib.sh
source hack/lib.sh

step "tools (first run: 6-15 minutes to build Kubernetes from source on 2 cores), while cargo builds the demo"
start_tools
cargo build --locked --tests
wait_for_tools >/dev/null
step "control plane and demo"
SVC_DEMO=1 exec hack/with-cluster.sh cargo test --locked --quiet --test demo -- --ignored --nocapture
