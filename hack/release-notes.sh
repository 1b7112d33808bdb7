#!/usr/bin/env bash
# Prints VERSION's section of CHANGELOG.md (its entries, without the heading): the release's notes.
#
#   hack/release-notes.sh VERSION
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
(($# == 1)) || { echo "usage: $0 VERSION" >&2; exit 2; }
notes=$(awk -v version="$1" '
  /^## / { inside = ($2 == version); next }
  inside { print }
' CHANGELOG.md)
[[ -n ${notes//[[:space:]]/} ]] || { echo "CHANGELOG.md has no section for $1" >&2; exit 1; }
printf '%s\n' "$notes"
