#!/usr/bin/env bash
# Generates charts/shared-volume-controller/README.md from values.yaml and README.md.gotmpl with
# helm-docs (built by hack/tools.sh).
#
#   hack/chart-docs.sh           write the README
#   hack/chart-docs.sh --check   fail, with the difference, when the committed README is stale
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=$(hack/tools.sh --print)
chart=charts/shared-volume-controller
helm_docs=("$bin/helm-docs" --chart-search-root "$chart" --template-files README.md.gotmpl --log-level warning)

if [[ "${1:-}" == "--check" ]]; then
  if ! diff -u "$chart/README.md" <("${helm_docs[@]}" --dry-run); then
    echo "$chart/README.md is stale: run hack/chart-docs.sh and commit it" >&2
    exit 1
  fi
  exit 0
fi
"${helm_docs[@]}"
