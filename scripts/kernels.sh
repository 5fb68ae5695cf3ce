#!/usr/bin/env bash
# The kernel matrix's VMs: Debian's own kernels booted in qemu (TCG) through
# virtme-ng, the guest seeing this machine's / read-only.
#
#   scripts/kernels.sh setup              install qemu, virtme-ng, the kernels (idempotent)
#   scripts/kernels.sh list               the kernels: NAME VMLINUZ, one a line
#   scripts/kernels.sh run NAME OUT CMD   boot kernel NAME, run CMD (a shell line) as root
#                                         in the guest with OUT writable; exit with CMD's
#                                         status (read from OUT/.status: vng's own exit
#                                         code is 255 even when the guest's command passed)
#
# The kernels are those of Debian 12's meta packages, resolved each time the
# set-up runs (the ABI number changes): linux-image-amd64 (6.1 LTS, the oldest
# the README promises) and linux-image-6.12-amd64 (the newest Debian 12 ships).
# Facts and pitfalls: shared/notes/toolchain.md ("other kernels in a VM").
set -euo pipefail

CACHE="${P2C_KERNELS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/p2c-balancer/kernels}"
VENV="$CACHE/venv"
METAS=(linux-image-amd64 linux-image-6.12-amd64)
log() { printf 'kernels: %s\n' "$*" >&2; }

setup() {
  mkdir -p "$CACHE"
  local need=()
  command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
  [ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || need+=(busybox-static)
  command -v depmod >/dev/null 2>&1 || need+=(kmod)
  command -v python3 >/dev/null 2>&1 || need+=(python3)
  python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
  command -v xdp-loader >/dev/null 2>&1 || need+=(xdp-tools)
  if [ "${#need[@]}" -gt 0 ]; then
    log "installing Debian packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
  if [ ! -x "$VENV/bin/vng" ]; then
    log "installing virtme-ng 1.42 into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q virtme-ng==1.42
  fi
  local meta dep ver dir
  for meta in "${METAS[@]}"; do
    # The meta package depends on the versioned image package.
    dep=$(apt-cache depends "$meta" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    if [ -z "$dep" ]; then
      apt-get update -qq
      dep=$(apt-cache depends "$meta" | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    fi
    [ -n "$dep" ] || { log "cannot resolve $meta"; exit 1; }
    ver=${dep#linux-image-}
    ver=${ver%-unsigned}
    dir="$CACHE/$ver"
    if ls "$dir"/boot/vmlinuz-* >/dev/null 2>&1; then continue; fi
    log "downloading $dep"
    rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
    (cd "$dir.tmp" && apt-get download -qq "$dep" >/dev/null && dpkg -x ./*.deb x && rm -f ./*.deb)
    mv "$dir.tmp/x" "$dir" && rm -rf "$dir.tmp"
  done
}

list() {
  local d
  for d in "$CACHE"/*/boot/vmlinuz-*; do
    [ -e "$d" ] || continue
    printf '%s %s\n' "$(basename "$(dirname "$(dirname "$d")")")" "$d"
  done | sort -V
}

run() {
  local name=$1 out=$2 cmd=$3 vmlinuz
  vmlinuz=$(ls "$CACHE/$name"/boot/vmlinuz-* 2>/dev/null | head -1)
  [ -n "$vmlinuz" ] || { log "no kernel $name (run setup)"; exit 1; }
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  rm -f "$out/.status"
  # The guest: bpffs mounted, the command's status written where the host reads it.
  local script="mount -t bpf bpf /sys/fs/bpf 2>/dev/null; cd '$PWD'; ( $cmd ); echo \$? > '$out/.status'"
  PATH="$VENV/bin:$PATH" timeout "${P2C_KERNELS_TIMEOUT:-3000}" vng --verbose --disable-kvm --cpus 2 --memory 4G \
    --rwdir="$out" -r "$vmlinuz" --exec "$script" > "$out/console.log" 2>&1 || true
  if [ ! -s "$out/.status" ]; then
    log "$name: the guest wrote no status (console: $out/console.log)"
    tail -30 "$out/console.log" >&2
    exit 99
  fi
  return "$(cat "$out/.status")"
}

case "${1:-}" in
  setup) setup ;;
  list) list ;;
  run) shift; run "$@" ;;
  *) echo "usage: $0 setup|list|run NAME OUT CMD" >&2; exit 2 ;;
esac
