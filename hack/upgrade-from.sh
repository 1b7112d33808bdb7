#!/usr/bin/env bash
# Builds the binary of the commit the upgrade test starts from (UPGRADE_FROM in hack/versions.env)
# and keeps its source, chart included, beside it: target/upgrade-from/<commit>/{src,
# shared-volume-controller}. Idempotent: a warm run returns at once.
#
# It builds into the working tree's own target folder, with one of the old commit's integration
# tests beside the binary so that cargo unifies the dev-dependencies' features as `cargo build
# --all-targets` does: the dependencies built once serve both, and only the old crate compiles.
# Cargo links the old binary to target/debug/ on the way; the working tree's next `cargo build`
# links its own back, so run this before that build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=versions.env
source hack/versions.env

target=${CARGO_TARGET_DIR:-$PWD/target}
dir=$target/upgrade-from/$UPGRADE_FROM
binary=$dir/shared-volume-controller
if [[ -x $binary ]]; then
  exit 0
fi
if ! git cat-file -e "$UPGRADE_FROM^{commit}" 2>/dev/null &&
  [[ $(git rev-parse --is-shallow-repository) == true ]]; then
  # A shallow clone lacks the history: fetch it from where the clone came from.
  git fetch --quiet --unshallow origin || true
fi
if ! git cat-file -e "$UPGRADE_FROM^{commit}" 2>/dev/null; then
  echo "hack/upgrade-from.sh: commit $UPGRADE_FROM is not in this clone;" \
    "a shallow clone lacks it: git fetch --unshallow" >&2
  exit 1
fi
rm -rf "$dir"
mkdir -p "$dir/src"
git archive "$UPGRADE_FROM" | tar -x -C "$dir/src"
executable=$(
  CARGO_TARGET_DIR=$target cargo build --locked --manifest-path "$dir/src/Cargo.toml" \
    --bin shared-volume-controller --test flags --message-format=json-render-diagnostics |
    sed -n 's/.*"target":{[^}]*"kind":\["bin"\].*"executable":"\([^"]*\)".*/\1/p'
)
if [[ -z $executable ]]; then
  echo "hack/upgrade-from.sh: cargo named no binary for $UPGRADE_FROM" >&2
  exit 1
fi
cp "$executable" "$binary.tmp"
mv "$binary.tmp" "$binary"
