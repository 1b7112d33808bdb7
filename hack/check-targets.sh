#!/usr/bin/env bash
# Checks that the binary, which the release also ships as the kubectl plugin, builds for every
# target of the release workflow's plugin job (.github/workflows/release.yml), short of linking:
#   - no Linux-only crate (netlink-*, procfs) in the dependency tree of a target that is not
#     Linux (`cargo tree --target`): the conntrack repair is Linux's alone;
#   - `cargo check --target` for one macOS target (aarch64-apple-darwin; the other differs from
#     it only in its CPU), the C parts of the dependencies (ring, zstd) compiled by `zig cc`
#     against zig's own macOS headers. Linking needs Apple's SDK, so the release links the macOS
#     plugin on a macOS runner; the Linux targets build natively in `make test` and the release.
# Needs zig on PATH (hack/tools.sh) and rustup, which installs each target's standard library
# once (`rustup target add`).
#
#   hack/check-targets.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fail() { printf 'check-targets: %s\n' "$*" >&2; exit 1; }
say() { printf 'check-targets: %s\n' "$*" >&2; }

linux_only='^(netlink-[a-z-]+|procfs|procfs-core) '
checked=aarch64-apple-darwin

mapfile -t targets < <(sed -n 's/.*target: \([a-z0-9_]*-[a-z]*-[a-z-]*\)}.*/\1/p' .github/workflows/release.yml)
((${#targets[@]} > 0)) || fail "found no plugin target in .github/workflows/release.yml"
for target in "${targets[@]}"; do
  tree=$(cargo tree --locked --target "$target" --edges normal,build --prefix none | sort -u) ||
    fail "cargo tree --target $target"
  if [[ $target != *-linux-* ]] && found=$(grep -E "$linux_only" <<<"$tree"); then
    fail "the $target build depends on Linux-only crates: $(tr '\n' ' ' <<<"$found")(make them [target.'cfg(target_os = \"linux\")'.dependencies] and their code #[cfg(target_os = \"linux\")])"
  fi
done
say "no Linux-only crate in the trees of ${targets[*]}"

[[ " ${targets[*]} " == *" $checked "* ]] || fail "the release no longer lists $checked: check another macOS target"
command -v zig >/dev/null || fail "zig is not on PATH (hack/tools.sh installs it)"
rustup target list --installed | grep -qx "$checked" || rustup target add "$checked" >&2 ||
  fail "rustup target add $checked (its standard library comes from rustup's server)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The cc crate speaks to Apple's clang (-arch, --target=arm64-apple-macosx…); zig takes its own.
cat >"$work/cc" <<'CC'
#!/usr/bin/env bash
args=()
skip=0
for arg in "$@"; do
  if ((skip)); then skip=0; continue; fi
  case $arg in
    -arch) skip=1 ;;
    --target=* | -mmacosx-version-min=*) ;;
    *) args+=("$arg") ;;
  esac
done
exec zig cc -target aarch64-macos "${args[@]}"
CC
chmod +x "$work/cc"
CC_aarch64_apple_darwin="$work/cc" \
  cargo check --locked --quiet --target "$checked" --bin shared-volume-controller ||
  fail "cargo check --target $checked"
say "cargo check --target $checked passed (C parts by zig cc; not linked)"
