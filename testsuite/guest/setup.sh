#!/usr/bin/env bash
# Prepare the QEMU guest that msgr's RDMA tests run in (see docs/GUEST.md).
#
#   1. apt-get install what the guest and the RDMA crates need, when missing;
#   2. pick a Debian linux-image-6.1.0-*-amd64 version for which
#      linux-headers-* and linux-source-6.1 of the same package version exist;
#   3. unpack that kernel package with dpkg -x (never installed on the host);
#   4. build the soft-iWARP module (siw) out of tree for it;
#   5. build a busybox initramfs with the modules and testsuite/guest/init;
#   6. write $MSGR_GUEST_CACHE/current.env, which the Rust runner reads.
#
# Everything lands in $MSGR_GUEST_CACHE (default /var/cache/msgr-guest), outside
# the repository, so a second run -- or a fresh clone on the same machine --
# finishes in about a second. Each step writes a stamp file as its last action;
# a step whose stamp is missing is redone from scratch, so an interrupted run
# never leaves a half-built cache behind that looks finished.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${MSGR_GUEST_CACHE:-/var/cache/msgr-guest}"
# The guest's kernel module load order, verified on this kind of machine
# (docs/GUEST.md). Modules that are built into the kernel are skipped.
# crc32_generic must precede rdma_rxe (ENOENT otherwise); crc32c_generic and
# libcrc32c must precede siw.
BASE_MODULES="crc32_generic crc32c_generic libcrc32c udp_tunnel ip6_udp_tunnel
  ib_core ib_uverbs rdma_rxe siw configfs iw_cm ib_cm rdma_cm rdma_ucm
  virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
  9pnet 9pnet_virtio netfs fscache 9p dummy"
# Extra modules of the "netem" variant: veth pairs between network namespaces
# and the netem queueing discipline.
NETEM_MODULES="veth sch_netem"

PACKAGES="qemu-system-x86 busybox-static kmod cpio xz-utils make gcc iproute2
  rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
  libibverbs-dev librdmacm-dev libclang-dev libfabric-dev libfabric-bin"

log() { printf '[guest-setup] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (apt-get, qemu's 9p export of /)"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9 # one setup at a time

# --- 1. packages -------------------------------------------------------------
missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qx installed || echo "$p"
  done
}
apt_updated=0
apt_install() {
  local missing
  missing="$(missing_packages "$@")"
  [ -z "$missing" ] && return 0
  log "installing: $(echo $missing)"
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq
    apt_updated=1
  fi
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >&2
}
# shellcheck disable=SC2086
apt_install $PACKAGES

# --- 2. kernel version -------------------------------------------------------
# Reuse the version an earlier run picked as long as its cache is complete;
# only a cold cache asks apt which versions exist.
pick_kernel() {
  local sv abi pkgs
  [ "$apt_updated" = 1 ] || { apt-get update -qq; apt_updated=1; }
  pkgs="$(apt-cache pkgnames linux-image-6.1.0- | grep -E '^linux-image-6\.1\.0-[0-9]+-amd64$' | sort -t- -k5,5nr)"
  for sv in $(apt-cache madison linux-source-6.1 | awk '{print $3}' | sort -Vr); do
    for abi in $pkgs; do
      abi="${abi#linux-image-}"
      if apt-cache madison "linux-image-$abi" | awk '{print $3}' | grep -qx "$sv" &&
        apt-cache madison "linux-headers-$abi" | awk '{print $3}' | grep -qx "$sv"; then
        echo "$abi $sv"
        return 0
      fi
    done
  done
  return 1
}
KABI="" KVER=""
if [ -f "$CACHE/current.env" ]; then
  # shellcheck disable=SC1091
  . "$CACHE/current.env"
  KABI="${MSGR_GUEST_KABI:-}" KVER="${MSGR_GUEST_KPKGVER:-}"
fi
if [ -z "$KABI" ] || [ ! -f "$CACHE/kernel-$KABI/.stamp" ] || [ ! -f "$CACHE/siw-$KABI/.stamp" ]; then
  read -r KABI KVER < <(pick_kernel) || die "no linux-image-6.1.0-*-amd64 with matching linux-headers and linux-source-6.1 versions"
fi
log "guest kernel $KABI (package version $KVER)"

# --- 3. kernel image, unpacked -----------------------------------------------
KDIR="$CACHE/kernel-$KABI"
if [ ! -f "$KDIR/.stamp" ]; then
  log "downloading and unpacking linux-image-$KABI=$KVER"
  rm -rf "$KDIR" "$KDIR.tmp"
  mkdir -p "$KDIR.tmp/deb"
  (cd "$KDIR.tmp/deb" && apt-get download -qq "linux-image-$KABI=$KVER")
  dpkg -x "$KDIR.tmp/deb"/linux-image-*.deb "$KDIR.tmp/root"
  rm -rf "$KDIR.tmp/deb"
  depmod -b "$KDIR.tmp/root" "$KABI"
  mv "$KDIR.tmp" "$KDIR"
  touch "$KDIR/.stamp"
fi
VMLINUZ="$KDIR/root/boot/vmlinuz-$KABI"
MODDIR="$KDIR/root/lib/modules/$KABI"
[ -f "$VMLINUZ" ] || die "$VMLINUZ missing"

# --- 4. siw, built out of tree -----------------------------------------------
SIWDIR="$CACHE/siw-$KABI"
if [ ! -f "$SIWDIR/.stamp" ]; then
  log "building siw for $KABI (linux-headers and linux-source-6.1 $KVER)"
  apt_install "linux-headers-$KABI" "linux-source-6.1"
  for p in "linux-headers-$KABI" linux-source-6.1; do
    have="$(dpkg-query -W -f='${Version}' "$p")"
    if [ "$have" != "$KVER" ]; then
      [ "$apt_updated" = 1 ] || { apt-get update -qq; apt_updated=1; }
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-downgrades "$p=$KVER" >&2
    fi
  done
  rm -rf "$SIWDIR" "$SIWDIR.tmp"
  mkdir -p "$SIWDIR.tmp/src"
  tar -xJf /usr/src/linux-source-6.1.tar.xz -C "$SIWDIR.tmp/src" --strip-components=5 \
    linux-source-6.1/drivers/infiniband/sw/siw/
  make -s -C "/usr/src/linux-headers-$KABI" M="$SIWDIR.tmp/src" CONFIG_RDMA_SIW=m modules >&2
  cp "$SIWDIR.tmp/src/siw.ko" "$SIWDIR.tmp/siw.ko"
  rm -rf "$SIWDIR.tmp/src"
  mv "$SIWDIR.tmp" "$SIWDIR"
  touch "$SIWDIR/.stamp"
fi

# --- 5. initramfs ------------------------------------------------------------
# Named by a hash of its inputs, so editing init or the module lists rebuilds it.
inputs_hash="$( (cat "$HERE/init" /bin/busybox "$SIWDIR/siw.ko"; echo "$BASE_MODULES|$NETEM_MODULES|$KABI") | sha256sum | cut -c1-16)"
INITRD="$CACHE/initramfs-$KABI-$inputs_hash.cpio.gz"
if [ ! -f "$INITRD.stamp" ]; then
  log "building $INITRD"
  rm -f "$CACHE"/initramfs-"$KABI"-*
  work="$(mktemp -d "$CACHE/initramfs.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work"/{bin,dev,proc,sys,host,modules}
  cp /bin/busybox "$work/bin/busybox"
  cp "$HERE/init" "$work/init"
  chmod 755 "$work/init"
  add_modules() { # $1 = list file name, rest = module names, in load order
    local list="$1" m path
    shift
    : >"$work/modules/$list"
    for m in "$@"; do
      if [ "$m" = siw ]; then
        path="$SIWDIR/siw.ko"
      else
        path="$(awk -v m="$m" -F: '{ n=$1; sub(/.*\//, "", n); sub(/\.ko(\.[gx]z|\.zst)?$/, "", n);
                 gsub(/-/, "_", n); if (n == m) { print $1; exit } }' "$MODDIR/modules.dep")"
        if [ -z "$path" ]; then
          grep -Eq "/$m\.ko\$" "$MODDIR/modules.builtin" || die "module $m neither in modules.dep nor built in"
          continue # built into the kernel
        fi
        path="$MODDIR/$path"
      fi
      case "$path" in
        *.xz) xz -dc "$path" >"$work/modules/$m.ko" ;;
        *.gz) gzip -dc "$path" >"$work/modules/$m.ko" ;;
        *.zst) zstd -qdc "$path" >"$work/modules/$m.ko" ;;
        *) cp "$path" "$work/modules/$m.ko" ;;
      esac
      echo "$m" >>"$work/modules/$list"
    done
  }
  # shellcheck disable=SC2086
  add_modules base.list $BASE_MODULES
  # shellcheck disable=SC2086
  add_modules netem.list $NETEM_MODULES
  (cd "$work" && find . -mindepth 1 | cpio -o -H newc --quiet) | gzip -1 >"$INITRD.tmp"
  mv "$INITRD.tmp" "$INITRD"
  touch "$INITRD.stamp"
  rm -rf "$work"
  trap - EXIT
fi

# --- 6. what the runner reads ------------------------------------------------
cat >"$CACHE/current.env.tmp" <<EOF
MSGR_GUEST_KABI=$KABI
MSGR_GUEST_KPKGVER=$KVER
MSGR_GUEST_KERNEL=$VMLINUZ
MSGR_GUEST_INITRD=$INITRD
MSGR_GUEST_QEMU=$(command -v qemu-system-x86_64)
EOF
mv "$CACHE/current.env.tmp" "$CACHE/current.env"
log "ready: $CACHE/current.env"
