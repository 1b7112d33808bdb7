#!/usr/bin/env bash
# The Dockerfile's build stage without a Docker engine: copies exactly what that stage's COPY lines
# copy (from the build context, minus .dockerignore) into an empty folder and runs the stage's cargo
# command there as `cargo check` (same manifest, lock file, profile and targets), so a file the
# build needs but the Dockerfile forgets fails here as it would in `docker build`.
#
#   hack/check-image-build.sh [Dockerfile]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dockerfile=${1:-Dockerfile}

# The stage named `build`: from its FROM line to the next FROM.
stage=$(awk '/^FROM /{in_stage = ($0 ~ / AS build$/)} in_stage' "$dockerfile")
[[ -n "$stage" ]] || { echo "check-image-build: no 'FROM … AS build' stage in $dockerfile" >&2; exit 1; }
grep -q 'cargo build --release --locked' <<<"$stage" ||
  { echo "check-image-build: the build stage no longer runs 'cargo build --release --locked'; update this check" >&2; exit 1; }

context=$(mktemp -d "${TMPDIR:-/tmp}/svc-image-build.XXXXXX")
trap 'rm -rf "$context"' EXIT
# COPY <sources…> <destination> relative to WORKDIR /src; --from= copies come from other stages.
while read -r -a words; do
  [[ ${#words[@]} -gt 0 && "${words[0]}" == COPY ]] || continue
  [[ "${words[1]}" == --from=* ]] && continue
  sources=("${words[@]:1:${#words[@]}-2}")
  destination=${words[-1]}
  for source in "${sources[@]}"; do
    [[ -e "$source" ]] || { echo "check-image-build: COPY $source: not in the build context" >&2; exit 1; }
    if [[ "$destination" == */ || ${#sources[@]} -gt 1 ]]; then
      mkdir -p "$context/$destination"
      cp -R "$source" "$context/$destination/"
    else
      # Docker makes a missing parent folder; tools that read the Dockerfile's COPY lines and copy
      # by hand do not (a nested destination failed that way): each lands directly in WORKDIR.
      [[ -d "$(dirname "$context/$destination")" ]] ||
        { echo "check-image-build: COPY $source $destination: copy its parent folder instead" >&2; exit 1; }
      cp -R "$source" "$context/$destination"
    fi
  done
done <<<"$stage"
# What .dockerignore keeps out of the context never reaches the image either.
rm -rf "$context/target" "$context/.git"

# Dependencies are checked once into a cache that survives runs; only the crate is checked anew.
export CARGO_TARGET_DIR="$PWD/target/image-build-check"
(cd "$context" && cargo check --release --locked --quiet) || {
  echo "check-image-build: the Dockerfile's build stage would fail: add what it needs to its COPY lines" >&2
  exit 1
}
echo "check-image-build: the build stage has everything it needs" >&2
