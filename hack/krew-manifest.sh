#!/usr/bin/env bash
# Prints the krew manifest of the plugin for VERSION from the archives in DIR
# (kubectl-shared_volume-VERSION-{os}-{arch}.tar.gz, made by hack/plugin-archive.sh), each with its
# SHA-256 and its download address on the GitHub release of the tag vVERSION (hack/release.env).
#
#   hack/krew-manifest.sh VERSION DIR
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
(($# == 2)) || { echo "usage: $0 VERSION DIR" >&2; exit 2; }
version=$1 dir=$2
repository=$(sed -n 's/^GITHUB_REPOSITORY=//p' hack/release.env)
shopt -s nullglob
archives=("$dir"/kubectl-shared_volume-"$version"-*.tar.gz)
((${#archives[@]})) || { echo "no plugin archive for $version in $dir" >&2; exit 1; }
cat <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: shared-volume
spec:
  version: v$version
  homepage: https://github.com/$repository
  shortDescription: Status of shared-volume-controller and its RWX volumes
  description: |
    Shows the shared-volume-controller installation at a glance: the leader, each DRBD HA agent,
    the fail-over guard's reservations and every claim served over NFS, with its mount endpoint
    and last move; and shares an existing DRBD resource as a ReadWriteMany claim.
  platforms:
YAML
for archive in "${archives[@]}"; do
  name=$(basename "$archive")
  platform=${name#kubectl-shared_volume-"$version"-}
  platform=${platform%.tar.gz}
  sha=$(sha256sum "$archive" | cut -d' ' -f1)
  cat <<YAML
    - selector:
        matchLabels:
          os: ${platform%-*}
          arch: ${platform#*-}
      uri: https://github.com/$repository/releases/download/v$version/$name
      sha256: $sha
      bin: kubectl-shared_volume
YAML
done
