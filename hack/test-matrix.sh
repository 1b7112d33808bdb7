#!/usr/bin/env bash
# Every test, unit and end-to-end, on each Kubernetes of KUBERNETES_MATRIX (hack/versions.env: the
# oldest the chart supports and the newest; `make test` runs the pinned one), each on a fresh control
# plane of its own, one version after the other. SVC_KUBERNETES_VERSIONS="v1.34.5 v1.35.2" picks
# others. Lint and the release check do not depend on the cluster and stay in `make test`.
# A cold run builds each version's kube-apiserver, kube-controller-manager, kube-proxy and kubectl
# (4-14 minutes each on 2 cores). Exit status 1 when any version failed; the summary names them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=lib.sh
source hack/lib.sh
# shellcheck source=versions.env
source hack/versions.env

read -r -a versions <<<"${SVC_KUBERNETES_VERSIONS:-$KUBERNETES_MATRIX}"
step "the pinned tools, the earlier commit the upgrade test starts from, then the build"
hack/tools.sh >/dev/null
hack/upgrade-from.sh
cargo build --locked --all-targets

results=()
failed=0
for version in "${versions[@]}"; do
  step "Kubernetes $version: its tools (hack/tools.sh), then every test binary"
  started=$SECONDS status=0
  SVC_KUBERNETES_VERSION=$version hack/tools.sh >/dev/null || status=$?
  ((status)) || SVC_KUBERNETES_VERSION=$version run_every_test_binary || status=$?
  results+=("$version: exit $status in $((SECONDS - started)) s")
  ((status)) && failed=1
done

step "test matrix"
printf '  %s\n' "${results[@]}" >&2
exit "$failed"
