#!/usr/bin/env bash
# One-time, idempotent machine set-up for building and testing the balancer.
#
# Installs what a fresh machine of this project's kind lacks:
#   - Debian packages: ethtool (test bed offload settings), iproute2, util-linux
#     (unshare, setpriv); tmux (the live view's test), jq (the README's
#     examples), systemd (systemd-analyze
#     verify of the unit; nothing is started), binutils (strip, for
#     contrib/install.sh and its test);
#     the real clients and servers of the test bed: nginx, curl, wrk, ab
#     (apache2-utils), iperf3; bird2 (the cluster test bed's BGP speakers and
#     router); keepalived (the NAT pair test bed's VRRP, run by the test in
#     its namespaces; the package's service is not started); dnsmasq-base
#     and bind9-dnsutils (dig), ngtcp2-server and
#     ngtcp2-client, openssl (the UDP and QUIC scenarios); iputils-ping (pings
#     to VIPs); prometheus, without its recommends, for promtool (the alerting
#     rules' tests; the server is not started); with --bench also
#     haproxy, nginx's stream
#     module, a font
#   - the nightly toolchain pinned in balancer-ebpf/rust-toolchain.toml (the
#     eBPF build's), with its components: rust-src (for -Z build-std=core on
#     bpfel-unknown-none) and clippy (`cargo xtask lint-ebpf`)
#   - bpf-linker 0.13 linked against the LLVM 22 shared library that the pinned
#     nightly ships (Debian has only LLVM 14, and bpf-linker's default
#     feature wants a system LLVM of its own version)
#   - cargo-nextest (the test runner), when the machine lacks it
#   - cargo-deb 3.8.0 (the Debian package)
#   - clang and libbpf-dev, and with them contrib/xdp-pass/xdp_pass.c built
#     to target/xdp-pass/xdp_pass.o: the XDP_PASS program for the veth peers
#     of the quick start (docs/deployment.md, step 4); built again only when
#     the source is newer
#   - a bpffs mount at /sys/fs/bpf
# Each step checks first and is quick when already done.
set -euo pipefail

log() { printf 'setup: %s\n' "$*" >&2; }

need_apt=()
command -v ethtool >/dev/null 2>&1 || need_apt+=(ethtool)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v unshare >/dev/null 2>&1 || need_apt+=(util-linux)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)
command -v jq >/dev/null 2>&1 || need_apt+=(jq)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
command -v strip >/dev/null 2>&1 || need_apt+=(binutils)
command -v pgrep >/dev/null 2>&1 || need_apt+=(procps)
# Real clients and servers (balancer-testbed realclients).
[ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v wrk >/dev/null 2>&1 || need_apt+=(wrk)
command -v ab >/dev/null 2>&1 || need_apt+=(apache2-utils)
command -v iperf3 >/dev/null 2>&1 || need_apt+=(iperf3)
# The cluster test bed: BIRD 2 as the balancers' BGP speaker and the router.
[ -x /usr/sbin/bird ] && [ -x /usr/sbin/birdc ] || need_apt+=(bird2)
# The NAT pair test bed (balancer-testbed natpair): keepalived's VRRP on
# both balancers, run by the test inside their namespaces (no service: the
# policy below keeps the package from starting one).
[ -x /usr/sbin/keepalived ] || need_apt+=(keepalived)
command -v ss >/dev/null 2>&1 || need_apt+=(iproute2)
# UDP VIPs (balancer-testbed udp): dnsmasq's binary as the DNS backends
# (no service), dig as the client.
[ -x /usr/sbin/dnsmasq ] || need_apt+=(dnsmasq-base)
command -v dig >/dev/null 2>&1 || need_apt+=(bind9-dnsutils)
# QUIC (balancer-testbed quic): ngtcp2's example HTTP/3 server and client,
# openssl to convert the test certificate for them.
[ -x /usr/sbin/gtlsserver ] || need_apt+=(ngtcp2-server)
command -v gtlsclient >/dev/null 2>&1 || need_apt+=(ngtcp2-client)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
# Beside other XDP programs (balancer-testbed chain): xdp-filter,
# xdp-loader and xdpdump, and libxdp.
command -v xdp-loader >/dev/null 2>&1 || need_apt+=(xdp-tools)
command -v xdpdump >/dev/null 2>&1 || need_apt+=(xdp-tools)
# Pings to VIPs (answered by the data path).
command -v ping >/dev/null 2>&1 || need_apt+=(iputils-ping)
# The quick start's XDP_PASS program for veth peers (contrib/xdp-pass):
# clang for the BPF target, libbpf-dev for <bpf/bpf_helpers.h>.
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
[ -f /usr/include/bpf/bpf_helpers.h ] || need_apt+=(libbpf-dev)
# promtool checks and unit-tests contrib/prometheus/alerts.yml
# (tests/tests/alerts.rs); installed below without the package's
# recommends (a node exporter).
need_promtool=0
command -v promtool >/dev/null 2>&1 || need_promtool=1
if [ "${1:-}" = "--bench" ]; then
  # The peers the benchmark compares against, and a font for its plot.
  [ -x /usr/sbin/haproxy ] || need_apt+=(haproxy)
  [ -f /usr/lib/nginx/modules/ngx_stream_module.so ] || need_apt+=(libnginx-mod-stream)
  [ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need_apt+=(fonts-dejavu-core)
  command -v pgrep >/dev/null 2>&1 || need_apt+=(procps)
fi
if [ "${#need_apt[@]}" -gt 0 ] || [ "$need_promtool" = 1 ]; then
  log "installing Debian packages: ${need_apt[*]}$([ "$need_promtool" = 1 ] && echo ' prometheus')"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # No services started by package scripts (haproxy, nginx, iperf3): the
  # test bed and the bench run their own instances inside their namespaces.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  if [ "${#need_apt[@]}" -gt 0 ]; then
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
  fi
  if [ "$need_promtool" = 1 ]; then
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  fi
  [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

if ! rustup component list --installed | grep -q '^clippy'; then
  log "adding clippy (CI runs it)"
  rustup component add clippy
fi
# The eBPF build's nightly, by name: `rustup run` (aya-build) and the
# RUSTUP_TOOLCHAIN that cargo sets for `cargo xtask` both override toolchain
# files, so the file's `channel` is read and named wherever it is used.
ebpf_toolchain_file="$(dirname "$0")/../balancer-ebpf/rust-toolchain.toml"
ebpf_toolchain="$(sed -n 's/^channel *= *"\(.*\)".*/\1/p' "$ebpf_toolchain_file")"
if [ -z "$ebpf_toolchain" ]; then
  echo "setup: no channel in $ebpf_toolchain_file" >&2
  exit 1
fi
if ! rustup toolchain list | grep -q "^$ebpf_toolchain-"; then
  log "installing the eBPF build's toolchain $ebpf_toolchain"
  rustup toolchain install "$ebpf_toolchain" --profile minimal \
    --component rust-src --component clippy
fi
for component in rust-src clippy; do
  if ! rustup component list --toolchain "$ebpf_toolchain" --installed | grep -q "^$component"; then
    log "adding $component to $ebpf_toolchain"
    rustup component add "$component" --toolchain "$ebpf_toolchain"
  fi
done

CARGO_HOME_DIR="${CARGO_HOME:-$HOME/.cargo}"
bpf_linker="$(command -v bpf-linker 2>/dev/null || echo "$CARGO_HOME_DIR/bin/bpf-linker")"
# Built once; again only if it no longer runs (the LLVM library it was
# linked against is gone, e.g. with the toolchain that shipped it).
if ! "$bpf_linker" --version >/dev/null 2>&1; then
  sysroot="$(rustc +"$ebpf_toolchain" --print sysroot)"
  llvm_so="$(ls "$sysroot"/lib/libLLVM.so.* 2>/dev/null | head -n1)"
  if [ -z "$llvm_so" ]; then
    echo "setup: no libLLVM.so.* in the $ebpf_toolchain sysroot $sysroot" >&2
    exit 1
  fi
  prefix="$CARGO_HOME_DIR/bpf-linker-llvm"
  mkdir -p "$prefix/lib"
  ln -sf "$llvm_so" "$prefix/lib/libLLVM.so"
  ln -sf "$llvm_so" "$prefix/lib/$(basename "$llvm_so")"
  log "building bpf-linker against $(basename "$llvm_so") (about 90 s)"
  LLVM_PREFIX="$prefix" cargo install bpf-linker --version 0.13.0 --locked --force \
    --no-default-features --features llvm-22
fi

# cargo-nextest runs the tests (`cargo xtask test`: test binaries at once,
# .config/nextest.toml). Machines of this kind ship it in /usr/local/bin;
# elsewhere it is built from crates.io (several minutes, once).
if ! cargo nextest --version >/dev/null 2>&1; then
  log "installing cargo-nextest 0.9.143 (a build from source, several minutes)"
  cargo install cargo-nextest --version 0.9.143 --locked
fi

# cargo-deb builds the Debian package (`cargo xtask deb`, and the package's
# test in tests/tests/package.rs).
if ! "$CARGO_HOME_DIR/bin/cargo-deb" --version 2>/dev/null | grep -q ' 3\.8\.0'; then
  log "installing cargo-deb 3.8.0 (about 60 s)"
  cargo install cargo-deb --version 3.8.0 --locked
fi

# The XDP_PASS program for veth peers (docs/deployment.md, step 4): one
# clang call, well under a second; again only when the source changed.
repo_dir="$(cd "$(dirname "$0")/.." && pwd)"
xdp_pass_src="$repo_dir/contrib/xdp-pass/xdp_pass.c"
xdp_pass_obj="$repo_dir/target/xdp-pass/xdp_pass.o"
if [ ! -f "$xdp_pass_obj" ] || [ "$xdp_pass_src" -nt "$xdp_pass_obj" ]; then
  log "building $xdp_pass_obj"
  mkdir -p "$(dirname "$xdp_pass_obj")"
  clang -O2 -g -target bpf -I"/usr/include/$(uname -m)-linux-gnu" \
    -c "$xdp_pass_src" -o "$xdp_pass_obj"
fi

if ! mount | grep -q ' /sys/fs/bpf type bpf'; then
  log "mounting bpffs at /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf || true
fi
log "ok"
