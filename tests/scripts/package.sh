#!/bin/sh
# The Debian package on a fresh machine: installs DEB into an overlay of
# this machine's root (its changes land in a tmpfs, never on the machine),
# checks that systemd and a POSIX shell read /etc/default/p2c-balancer
# alike, runs the daemon under the unit's own command line with that file's
# arguments on a veth pair, drives it with the installed CLI, scrapes its
# metrics at the package's default address, reinstalls it over the running
# daemon (an upgrade keeps the program attached), then purges it (the
# program is detached, every file and the state are gone).
#
# Run by tests/tests/package.rs as
#   unshare --mount --net --pid --fork --kill-child --propagation private \
#       sh package.sh DEB WORK OUT
# (WORK: an empty directory, the overlay's tmpfs is mounted on it; OUT: a
# directory where the scrape (metrics.txt) and the installed alerting
# rules (alerts.yml) are left for the test, which evaluates the rules on
# the scrape's series)
# so that the mounts, the interfaces and every process it starts (the
# daemon included) end with it, whatever happens. Prints "ok: STEP" for
# each step that held; exits non-zero at the first that did not.
set -eu
deb=$1
work=$2
out=$3
mount -t tmpfs tmpfs "$work"
mkdir "$work/upper" "$work/work" "$work/root"
r=$work/root
mount -t overlay overlay -o "lowerdir=/,upperdir=$work/upper,workdir=$work/work" "$r"
mount -t proc proc "$r/proc"
mount --rbind /dev "$r/dev"
mount -t sysfs sysfs "$r/sys"
mount -t bpf bpf "$r/sys/fs/bpf"
mount -t tmpfs tmpfs "$r/run"
mount -t tmpfs tmpfs "$r/tmp"
cp "$deb" "$r/tmp/p2c-balancer.deb"
mkdir "$r/tmp/out"
mount --bind "$out" "$r/tmp/out"
ip link set lo up
ip link add veth0 type veth peer name veth1
ip link set veth0 up
ip link set veth1 up
ip addr add 10.9.0.1/24 dev veth0

exec chroot "$r" /bin/sh -eu -c '
step() { echo "ok: $*"; }
xdp_attached() { ip -d link show veth0 | grep -q "prog/xdp"; }
# BALANCER_ARGS of the file $1 as systemd reads an EnvironmentFile=: by
# its parser of environment files, which the environment.d generator runs
# on the files of $XDG_CONFIG_HOME/environment.d and prints shell-quoted
# (environment.d also expands $VAR, which the file must not hold).
systemd_reads() {
    d=$(mktemp -d)
    mkdir "$d/environment.d"
    cp "$1" "$d/environment.d/p2c-balancer.conf"
    line=$(env -i XDG_CONFIG_HOME="$d" \
        /usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator |
        grep "^BALANCER_ARGS=") || { rm -rf "$d"; return 1; }
    rm -rf "$d"
    (eval "$line"; printf "%s" "$BALANCER_ARGS")
}
# ... and as a POSIX shell sourcing it does.
sh_reads() { sh -eu -c ". \"\$1\"; printf %s \"\$BALANCER_ARGS\"" sh "$1" 2>/dev/null; }
# Both, and the same.
read_alike() {
    sys=$(systemd_reads "$1") && shell=$(sh_reads "$1") && [ "$sys" = "$shell" ]
}
# Control: nothing of the package is there before it is installed.
if command -v balancer >/dev/null 2>&1 || [ -e /usr/lib/systemd/system/p2c-balancer.service ]; then
    echo "the root already has the balancer installed" >&2; exit 1
fi
step "not installed before"
dpkg -i /tmp/p2c-balancer.deb >/tmp/dpkg-i.log 2>&1 || { cat /tmp/dpkg-i.log >&2; exit 1; }
dpkg -s p2c-balancer | grep -q "^Status: install ok installed"
step "dpkg -i"
test -x /usr/bin/balancer
# Man pages gzip -9n as Debian policy wants: no plain page, and each .gz
# without a name or time stamp (header 1f 8b 08, flags 0, time 0, XFL 2).
test -s /usr/share/man/man1/balancer.1.gz
test -s /usr/share/man/man1/balancer-decap-attach.1.gz
if ls /usr/share/man/man1/balancer*.1 >/dev/null 2>&1; then
    echo "uncompressed man pages:" >&2; ls /usr/share/man/man1/balancer*.1 >&2; exit 1
fi
for m in /usr/share/man/man1/balancer*.1.gz; do
    h=$(od -An -tx1 -N9 "$m" | tr -d " \n")
    if [ "$h" != 1f8b08000000000002 ]; then echo "$m: gzip header $h, not gzip -9n" >&2; exit 1; fi
done
zcat /usr/share/man/man1/balancer.1.gz | grep -q "^\.TH"
step "man pages gzip -9n"
test -s /usr/share/bash-completion/completions/balancer
test -s /usr/share/p2c-balancer/prometheus/alerts.yml
test -s /usr/share/doc/p2c-balancer/examples/keepalived.conf
# The keepalived notify script: installed executable, records a state, and
# exits 0 even where it cannot write.
notify=/usr/share/p2c-balancer/keepalived/balancer-vrrp-notify
test -x $notify
$notify --dir /tmp/vrrp-test INSTANCE VI_TEST MASTER 150
test "$(cat /tmp/vrrp-test/VI_TEST)" = MASTER
$notify --dir /proc/no-such-dir INSTANCE VI_TEST BACKUP 100 2>/dev/null
grep -q "^/etc/p2c-balancer/balancer.toml$" /var/lib/dpkg/info/p2c-balancer.conffiles
step "files installed"
# The unit is installed, not enabled: the interfaces are the operator s.
test ! -e /etc/systemd/system/multi-user.target.wants/p2c-balancer.service
unit=/usr/lib/systemd/system/p2c-balancer.service
systemd-analyze verify --man=no "$unit"
step "unit verified, not enabled"
defaults=/etc/default/p2c-balancer
read_alike $defaults || {
    echo "systemd reads BALANCER_ARGS=[$(systemd_reads $defaults)], a shell [$(sh_reads $defaults)]" >&2
    cat $defaults >&2; exit 1
}
args=$(systemd_reads $defaults)
case " $args " in *" --metrics-address 127.0.0.1:9464 "*) ;; *)
    echo "the defaults file serves no metrics at 127.0.0.1:9464: $args" >&2; exit 1 ;;
esac
# The unit falls back to the same arguments.
grep -qxF "Environment=\"BALANCER_ARGS=$args\"" "$unit" || {
    echo "the unit s Environment= is not BALANCER_ARGS=$args:" >&2; grep "^Environment=" "$unit" >&2; exit 1
}
# Control: the value unquoted, as the file had it, is not read alike (a
# shell runs the word after the first space as a command).
sed "s/^BALANCER_ARGS=\"\(.*\)\"$/BALANCER_ARGS=\1/" $defaults >/tmp/unquoted
if grep -q "^BALANCER_ARGS=\"" /tmp/unquoted; then echo "control: the value is still quoted" >&2; exit 1; fi
if read_alike /tmp/unquoted; then echo "control: the unquoted file was read alike" >&2; exit 1; fi
step "defaults file read alike by systemd and a shell"
# The daemon under the unit s own command line: ExecStart with
# BALANCER_ARGS from /etc/default/p2c-balancer as systemd reads it, the
# interface changed and the rest (the metrics address) as packaged, in the
# directories systemd would create (RuntimeDirectory, StateDirectory).
sed -i "s/--iface eth0/--iface veth0 --mode generic/" $defaults
args=$(systemd_reads $defaults)
case " $args " in *" --iface veth0 "*) ;; *) echo "the interface was not set: $args" >&2; exit 1 ;; esac
# Unquoted below, the command splits at whitespace as systemd splits
# $BALANCER_ARGS.
cmd=$(sed -n "s/^ExecStart=//p" "$unit")
cmd=$(printf "%s" "$cmd" | sed "s#\$BALANCER_ARGS#$args#")
case $cmd in /usr/bin/balancer\ run\ *) ;; *) echo "ExecStart is $cmd" >&2; exit 1 ;; esac
mkdir -p /run/p2c-balancer /var/lib/p2c-balancer
$cmd >/tmp/daemon.log 2>&1 &
daemon=$!
i=0
until balancer vip list >/dev/null 2>&1; do
    i=$((i + 1))
    if [ $i -gt 300 ] || ! kill -0 $daemon 2>/dev/null; then
        echo "the daemon did not answer:" >&2; cat /tmp/daemon.log >&2; exit 1
    fi
    sleep 0.1
done
step "daemon started by the unit s command line"
balancer vip add 10.9.0.100:80 --health off >/dev/null
balancer backend add 10.9.0.100:80 10.9.0.2:80 >/dev/null
balancer vip list | grep -q "10.9.0.100:80"
xdp_attached
step "balancer vip list"
# The metrics at the address the defaults file names, once the VIP has
# its eligible backend; the scrape and the installed rules are left in
# OUT for the test.
addr=$(printf "%s\n" "$args" | sed -n "s/.*--metrics-address \([^ ]*\).*/\1/p")
[ "$addr" = 127.0.0.1:9464 ] || { echo "metrics address $addr" >&2; exit 1; }
i=0
until curl -fsS -o /tmp/out/metrics.txt "http://$addr/metrics" &&
    grep -q "^p2c_balancer_vip_eligible_backends{vip=\"10.9.0.100:80\"} 1" /tmp/out/metrics.txt; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then
        echo "no metrics with the VIP eligible at $addr:" >&2; cat /tmp/out/metrics.txt >&2 || true
        cat /tmp/daemon.log >&2; exit 1
    fi
    sleep 0.1
done
cp /usr/share/p2c-balancer/prometheus/alerts.yml /tmp/out/alerts.yml
step "metrics at 127.0.0.1:9464"
# An upgrade (the same package again) keeps the program attached and the
# daemon running; a unit would be restarted by postinst, which keeps
# connections.
dpkg -i /tmp/p2c-balancer.deb >/tmp/dpkg-u.log 2>&1 || { cat /tmp/dpkg-u.log >&2; exit 1; }
xdp_attached
kill -0 $daemon
balancer vip list | grep -q "10.9.0.100:80"
step "reinstalled over the running daemon"
test -s /var/lib/p2c-balancer/state.json
dpkg --purge p2c-balancer >/tmp/dpkg-p.log 2>&1 || { cat /tmp/dpkg-p.log >&2; exit 1; }
i=0
while kill -0 $daemon 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then echo "the daemon outlived the purge" >&2; exit 1; fi
    sleep 0.1
done
if xdp_attached; then echo "the program is still attached after the purge" >&2; exit 1; fi
step "purge detached the program and stopped the daemon"
for f in /usr/bin/balancer /etc/p2c-balancer /etc/default/p2c-balancer \
         /var/lib/p2c-balancer /sys/fs/bpf/p2c-balancer "$unit" \
         /usr/share/man/man1/balancer.1.gz; do
    if [ -e "$f" ]; then echo "$f is left after the purge" >&2; exit 1; fi
done
if dpkg -s p2c-balancer >/dev/null 2>&1; then echo "dpkg still knows the package" >&2; exit 1; fi
step "purged"
# Installed again and purged with no daemon ever run: nothing to detach,
# and nothing said about it (prerm: detach --if-attached).
dpkg -i /tmp/p2c-balancer.deb >/tmp/dpkg-i2.log 2>&1 || { cat /tmp/dpkg-i2.log >&2; exit 1; }
dpkg --purge p2c-balancer >/tmp/dpkg-p2.log 2>&1 || { cat /tmp/dpkg-p2.log >&2; exit 1; }
if grep -q "^error: \|nothing to detach" /tmp/dpkg-p2.log; then
    echo "the purge with no daemon running said:" >&2; cat /tmp/dpkg-p2.log >&2; exit 1
fi
step "purged with no daemon running, quietly"
'
