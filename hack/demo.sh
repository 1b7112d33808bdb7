#!/usr/bin/env bash
# The demo: builds what it needs, starts a local control plane, and runs the controller and three
# HA agents over simulated DRBD nodes through a node failure (tests/demo.rs tells the story).
# Exits 0 only when every step happened.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

printf '==> tools (first run: about 10 minutes to build the Kubernetes control plane from source)\n' >&2
hack/tools.sh >/dev/null
printf '==> building shared-volume-controller and the demo\n' >&2
cargo build --locked --quiet --tests
exec hack/with-cluster.sh cargo test --locked --quiet --test demo -- --ignored --nocapture
