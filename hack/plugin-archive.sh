#!/usr/bin/env bash
# Packs the binary as the kubectl plugin: OUT/kubectl-shared_volume-VERSION-PLATFORM.tar.gz holding
# kubectl-shared_volume (the same binary; `kubectl shared-volume status` runs its status
# subcommand) and LICENSE. Prints the archive's path.
#
#   hack/plugin-archive.sh BINARY PLATFORM VERSION OUT     e.g. … target/release/shared-volume-controller linux-amd64 0.1.0 dist
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
(($# == 4)) || { echo "usage: $0 BINARY PLATFORM VERSION OUT" >&2; exit 2; }
binary=$1 platform=$2 version=$3 out=$4
[[ -x $binary ]] || { echo "$binary: no such executable (build it first)" >&2; exit 1; }
[[ $platform =~ ^(linux|darwin)-(amd64|arm64)$ ]] || { echo "$platform: not one of {linux,darwin}-{amd64,arm64}" >&2; exit 2; }
staging=$(mktemp -d)
trap 'rm -rf "$staging"' EXIT
install -m 0755 "$binary" "$staging/kubectl-shared_volume"
cp LICENSE "$staging/"
mkdir -p "$out"
archive="$out/kubectl-shared_volume-$version-$platform.tar.gz"
if tar --version 2>/dev/null | grep -q GNU; then
  # Reproducible: fixed owner, order and times.
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$staging" -cf - kubectl-shared_volume LICENSE |
    gzip -n >"$archive"
else
  # macOS's bsdtar, on the release's darwin runners.
  tar -C "$staging" -cf - kubectl-shared_volume LICENSE | gzip -n >"$archive"
fi
echo "$archive"
