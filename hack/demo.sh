#!/usr/bin/env bash
# The demo: builds what it needs, starts a local control plane, and runs the controller and three
# HA agents over simulated DRBD nodes through a node failure (tests/demo.rs tells the story).
# Exits 0 only when every step happened.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

printf '==> building shared-volume-controller and the demo\n' >&2
cargo build --locked --tests
printf '==> tools and control plane (first run: about 10 minutes to build Kubernetes from source)\n' >&2
SVC_DEMO=1 exec hack/with-cluster.sh cargo test --locked --quiet --test demo -- --ignored --nocapture
