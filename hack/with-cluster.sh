#!/usr/bin/env bash
# Runs a command against a fresh local control plane: builds the tools if needed, starts etcd,
# kube-apiserver and kube-controller-manager on loopback, exports KUBECONFIG, SVC_TOOLS_BIN and
# PATH, runs "$@", and stops the control plane whatever happens. Exit status is the command's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bin=$(hack/tools.sh --print) # cluster.sh up builds whatever is missing
export PATH="$bin:$PATH" SVC_TOOLS_BIN="$bin"

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/svc-cluster.XXXXXX")
cleanup() {
  hack/cluster.sh down "$run_dir/cluster" >&2 || true
  if [[ -n "${SVC_KEEP_LOGS:-}" ]]; then
    printf '==> kept the logs of this run in %s\n' "$run_dir/tmp" >&2
    rm -rf "$run_dir/cluster"
  else
    rm -rf "$run_dir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

printf '\n==> control plane up\n' >&2
hack/cluster.sh up "$run_dir/cluster" >&2
export KUBECONFIG="$run_dir/cluster/kubeconfig"
# The tests' logs, kubeconfigs and simulated nodes go under the run's directory, removed with it
# (SVC_KEEP_LOGS=1 keeps them).
mkdir -p "$run_dir/tmp"
export TMPDIR="$run_dir/tmp"
"$@"
