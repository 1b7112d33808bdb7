#!/usr/bin/env bash
# Checks that VERSION can be released from this tree, short of pushing anything:
#   - the version is the same in Cargo.toml, Chart.yaml (version, appVersion) and CHANGELOG.md's
#     heading (with RELEASE_TAG=1, as the release workflow runs it, no longer "(unreleased)"), and
#     the chart's artifacthub.io/changes has as many entries as that CHANGELOG section;
#   - the chart's home is the repository the release is published from (hack/release.env);
#   - the chart lints and packages, and the package renders with no values only images under the
#     release's IMAGE_PREFIX (hack/release.env);
#   - the binary builds for every plugin target of the release workflow, short of linking
#     (hack/check-targets.sh: no Linux-only crate outside Linux, `cargo check` for macOS);
#   - the plugin, packed by hack/plugin-archive.sh for this platform, runs from its archive as
#     `kubectl shared-volume`; the krew manifest names the archive with its SHA-256, and krew's
#     validator takes it;
#   - an SBOM of the Rust dependencies is generated (cargo-cyclonedx, from crates.io).
# PLUGIN_BINARY: the binary to pack (default target/release/shared-volume-controller, built when
# missing; `make test` passes its debug build). Needs helm, kubectl and zig on PATH (hack/tools.sh).
#
#   hack/release-check.sh VERSION
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
(($# == 1)) || { echo "usage: $0 VERSION" >&2; exit 2; }
version=$1
fail() { printf 'release-check %s: %s\n' "$version" "$*" >&2; exit 1; }
say() { printf 'release-check %s: %s\n' "$version" "$*" >&2; }
chart=charts/shared-volume-controller
# shellcheck source=release.env
source hack/release.env

cargo_version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
[[ $cargo_version == "$version" ]] || fail "Cargo.toml says $cargo_version"
chart_version=$(sed -n 's/^version: *//p' "$chart/Chart.yaml")
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' "$chart/Chart.yaml")
[[ $chart_version == "$version" ]] || fail "Chart.yaml's version is $chart_version"
[[ $app_version == "$version" ]] || fail "Chart.yaml's appVersion is $app_version"
heading=$(grep -m1 -E "^## $version( |\$)" CHANGELOG.md) || fail "CHANGELOG.md has no heading ## $version"
if [[ ${RELEASE_TAG:-} == 1 && $heading == *unreleased* ]]; then
  fail "CHANGELOG.md's heading still says unreleased: date it (## $version (YYYY-MM-DD)) before tagging"
fi
entries=$(hack/release-notes.sh "$version" | grep -c '^- ')
changes=$(grep -c '^    - kind: ' "$chart/Chart.yaml")
((entries == changes)) || fail "CHANGELOG.md's section has $entries entries, the chart's changes $changes"
say "versions agree ($heading; $entries changes)"
home=$(sed -n 's/^home: *//p' "$chart/Chart.yaml")
[[ $home == "https://github.com/$GITHUB_REPOSITORY" ]] || fail "Chart.yaml's home is $home, the release's repository $GITHUB_REPOSITORY"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
helm lint --quiet "$chart" >/dev/null || fail "helm lint $chart"
helm package "$chart" -d "$work" >/dev/null || fail "helm package"
package="$work/shared-volume-controller-$version.tgz"
[[ -f $package ]] || fail "helm package did not make $package"
images=$(helm template release-check "$package" --namespace storage-system | sed -n 's/^ *image: *"\{0,1\}\([^" ]*\)"\{0,1\}$/\1/p' | sort -u)
[[ -n $images ]] || fail "the packaged chart renders no image"
while read -r image; do
  [[ $image == "$IMAGE_PREFIX/"*":$version" ]] || fail "the packaged chart renders $image, not under $IMAGE_PREFIX/ at $version"
done <<<"$images"
say "chart packaged; it renders $(wc -l <<<"$images") images under $IMAGE_PREFIX/"

hack/check-targets.sh || fail "the plugin does not build for every target the release lists"
say "not built here: the macOS plugin's link (it needs Apple's SDK) and the images (no Docker engine; hack/check-image-build.sh checks the build stage's inputs): the release workflow builds both on runners of each platform"

binary=${PLUGIN_BINARY:-target/release/shared-volume-controller}
if [[ ! -x $binary && -z ${PLUGIN_BINARY:-} ]]; then
  cargo build --locked --release
fi
os=$(uname -s | tr '[:upper:]' '[:lower:]')
arch=$(uname -m | sed 's/x86_64/amd64/; s/aarch64/arm64/')
archive=$(hack/plugin-archive.sh "$binary" "$os-$arch" "$version" "$work/dist")
mkdir "$work/installed"
tar -xzf "$archive" -C "$work/installed"
usage=$(PATH="$work/installed:$PATH" kubectl shared-volume status --help) || fail "kubectl shared-volume status --help failed"
grep -q -- "--namespace" <<<"$usage" || fail "kubectl shared-volume status --help printed no usage"
hack/krew-manifest.sh "$version" "$work/dist" >"$work/shared-volume.yaml"
sha=$(sha256sum "$archive" | cut -d' ' -f1)
grep -q "sha256: $sha" "$work/shared-volume.yaml" || fail "the krew manifest does not carry the archive's SHA-256"
grep -q "releases/download/v$version/$(basename "$archive")" "$work/shared-volume.yaml" ||
  fail "the krew manifest does not name the archive"
grep -q "bin: kubectl-shared_volume" "$work/shared-volume.yaml" || fail "the krew manifest names no binary"
# krew's own validator, its structure only: installing would download the release's archives.
validate-krew-manifest -manifest "$work/shared-volume.yaml" -skip-install 2>"$work/krew.log" ||
  fail "validate-krew-manifest: $(cat "$work/krew.log")"
say "plugin runs from $(basename "$archive") as kubectl shared-volume; the krew manifest names it ($sha)"

cyclonedx=$(command -v cargo-cyclonedx || true)
[[ -n $cyclonedx ]] || fail "cargo-cyclonedx not found (hack/tools.sh installs it)"
cargo cyclonedx --format json --override-filename "shared-volume-controller-sbom" >/dev/null 2>&1 ||
  fail "cargo cyclonedx failed"
sbom=shared-volume-controller-sbom.json
components=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["components"]))' "$sbom")
# One per member of the workspace: the tests' helpers get one too.
rm -f "$sbom" "tests/common/$sbom"
((components > 50)) || fail "the SBOM lists only $components components"
say "SBOM generated ($components components)"
say "ok"
