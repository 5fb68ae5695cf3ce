#!/bin/sh
# Installs the balancer on this machine (or under --destdir, for a package
# or a test): a release build of `balancer`, stripped; its man pages and
# shell completions; the systemd unit; and, when none is there yet, a
# default configuration file and /etc/default/p2c-balancer.
#
# Usage: contrib/install.sh [--destdir DIR] [--prefix /usr/local]
#
# Then, on the machine itself: set the interfaces in
# /etc/default/p2c-balancer (BALANCER_ARGS="--iface eth0 --metrics-address
# 127.0.0.1:9464": metrics on loopback), put VIPs in
# /etc/p2c-balancer/balancer.toml (or add them with the CLI once the daemon
# runs), and `systemctl daemon-reload && systemctl enable --now p2c-balancer`.
set -eu

destdir=""
prefix=/usr/local
while [ $# -gt 0 ]; do
    case $1 in
    --destdir) destdir=$2; shift 2 ;;
    --prefix) prefix=$2; shift 2 ;;
    *) echo "usage: $0 [--destdir DIR] [--prefix /usr/local]" >&2; exit 2 ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --manifest-path "$root/Cargo.toml" -p balancer-user --bin balancer
bin="${CARGO_TARGET_DIR:-$root/target}/release/balancer"

bindir="$destdir$prefix/bin"
mandir="$destdir$prefix/share/man/man1"
bashdir="$destdir$prefix/share/bash-completion/completions"
zshdir="$destdir$prefix/share/zsh/site-functions"
unitdir="$destdir/etc/systemd/system"
confdir="$destdir/etc/p2c-balancer"
install -d "$bindir" "$mandir" "$bashdir" "$zshdir" "$unitdir" "$confdir" "$destdir/etc/default"

# Stripped: the release profile keeps line tables for the benchmarks'
# profiles, which a running daemon does not need.
install -s -m 0755 "$bin" "$bindir/balancer"
"$bin" man --out-dir "$mandir"
"$bin" completions bash > "$bashdir/balancer"
"$bin" completions zsh > "$zshdir/_balancer"
sed "s#/usr/bin/balancer#$prefix/bin/balancer#g" "$root/contrib/p2c-balancer.service" \
    > "$unitdir/p2c-balancer.service"
chmod 0644 "$unitdir/p2c-balancer.service"
# An operator's files are never overwritten.
if [ ! -e "$confdir/balancer.toml" ]; then
    install -m 0644 "$root/contrib/balancer.toml" "$confdir/balancer.toml"
fi
if [ ! -e "$destdir/etc/default/p2c-balancer" ]; then
    install -m 0644 "$root/contrib/default/p2c-balancer" "$destdir/etc/default/p2c-balancer"
fi
echo "installed $prefix/bin/balancer, its man pages and completions, the unit p2c-balancer.service${destdir:+ under $destdir}"
