#!/usr/bin/env bash
# Builds the kernel NFS client's guest for the data-path tests: Debian's own cloud kernel (the
# newest the registry's linux-image-cloud-amd64 names, or KERNEL_PACKAGE), unpacked with
# dpkg-deb, and a busybox initramfs holding the kernel's NFS and virtio modules, the guest's init
# and its probe (tests/common/kernel_client/probe.c, built static). qemu boots it under software
# emulation. Idempotent: a built image is kept in the tools cache and only linked.
#
#   hack/kernel-client.sh BIN_DIR    build if missing, link BIN_DIR/kernel-client to the image
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
guest_src="$here/../tests/common/kernel_client"
bin_dir=$1
cache_root=$(dirname "$bin_dir")
log() { printf '[tools] %s\n' "$*" >&2; }

package=${KERNEL_PACKAGE:-}
if [[ -z $package ]]; then
  package=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*\)$/\1/p' | head -n 1)
  [[ -n $package ]] || { log "FAILED: apt-cache finds no kernel behind linux-image-cloud-amd64 (run apt-get update)"; exit 1; }
fi
# The image changes with the kernel, the probe and the init script.
stamp=$(cat "$guest_src/probe.c" "$guest_src/init" | sha256sum | cut -c1-12)
image="$cache_root/kernel-client-$package-$stamp"
if [[ ! -s $image/initrd.gz ]]; then
  log "building the kernel NFS client's guest ($package; about a minute)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && apt-get download "$package" >/dev/null 2>&1) || { log "FAILED: apt-get download $package"; exit 1; }
  dpkg-deb -x "$work"/linux-image-*.deb "$work/root"
  release=$(ls "$work/root/lib/modules")
  ir="$work/initramfs"
  mkdir -p "$ir"/{bin,proc,sys,dev,mnt,tmp} "$ir/lib/modules/$release/kernel"
  cp /bin/busybox "$ir/bin/busybox"
  # What the NFS client and the guest's network card need, with their dependencies (busybox's
  # depmod in the guest indexes them at boot).
  for module in fs/nfs fs/nfs_common fs/lockd fs/netfs fs/fscache net/sunrpc net/dns_resolver \
    drivers/virtio drivers/net/virtio_net.ko drivers/net/net_failover.ko net/core/failover.ko; do
    mkdir -p "$ir/lib/modules/$release/kernel/$(dirname "$module")"
    cp -r "$work/root/lib/modules/$release/kernel/$module" "$ir/lib/modules/$release/kernel/$(dirname "$module")/"
  done
  cc -O2 -static -Wall -Werror -o "$ir/bin/probe" "$guest_src/probe.c"
  install -m 0755 "$guest_src/init" "$ir/init"
  mkdir -p "$image.tmp"
  (cd "$ir" && find . | cpio -o -H newc 2>/dev/null | gzip -1 >"$image.tmp/initrd.gz")
  cp "$work/root/boot/vmlinuz-$release" "$image.tmp/vmlinuz"
  echo "$package" >"$image.tmp/kernel"
  rm -rf "$image"
  mv "$image.tmp" "$image"
fi
ln -sfn "$image" "$bin_dir/kernel-client"
