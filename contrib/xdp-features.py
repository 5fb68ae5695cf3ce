#!/usr/bin/env python3
# SPDX-License-Identifier: MIT OR Apache-2.0
"""Prints the XDP features each network interface's driver reports.

    python3 contrib/xdp-features.py [IFACE ...]

The kernel reports them through the generic netlink family "netdev"
(NETDEV_CMD_DEV_GET, attribute xdp-features; Linux 6.3 and later), the
same bits `xdp-loader features` (xdp-tools 1.4 and later) and the
kernel's `ynl --family netdev --dump dev-get` print. Python's standard
library only. What the balancer needs of them is in docs/nics.md:

  basic        native XDP with XDP_PASS, XDP_DROP and XDP_TX
  redirect     XDP_REDIRECT from this interface's program
  ndo-xmit     frames may be redirected *to* this interface
  rx-sg        multi-buffer frames on receive (an MTU above one page)
  ndo-xmit-sg  multi-buffer frames redirected to this interface
"""
import os
import socket
import struct
import sys

NETLINK_GENERIC = 16
GENL_ID_CTRL = 16
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
NETDEV_CMD_DEV_GET = 1
NETDEV_A_DEV_IFINDEX = 1
NETDEV_A_DEV_XDP_FEATURES = 3
# enum netdev_xdp_act, bit by bit (include/uapi/linux/netdev.h).
FEATURES = ["basic", "redirect", "ndo-xmit", "xsk-zerocopy", "hw-offload", "rx-sg", "ndo-xmit-sg"]


def attrs(b):
    out = {}
    while len(b) >= 4:
        length, kind = struct.unpack_from("HH", b)
        if length < 4:
            break
        out[kind & 0x3FFF] = b[4:length]
        b = b[(length + 3) & ~3:]
    return out


def request(sock, family, flags, cmd, payload=b""):
    body = struct.pack("BBH", cmd, 1, 0) + payload
    sock.send(struct.pack("IHHII", 16 + len(body), family, flags, 1, 0) + body)


def replies(sock):
    """Yields the generic netlink payloads of the answer; None on an error."""
    while True:
        data = sock.recv(1 << 16)
        while len(data) >= 16:
            length, kind, _, _, _ = struct.unpack_from("IHHII", data)
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                err = struct.unpack_from("i", data, 16)[0]
                if err:
                    raise OSError(-err, os.strerror(-err))
                return
            yield data[16 + 4:length]  # past the genl header
            data = data[(length + 3) & ~3:]


def netdev_family(sock):
    name = b"netdev\0"
    pad = b"\0" * (-len(name) % 4)
    request(sock, GENL_ID_CTRL, NLM_F_REQUEST, CTRL_CMD_GETFAMILY,
            struct.pack("HH", 4 + len(name), CTRL_ATTR_FAMILY_NAME) + name + pad)
    for payload in replies(sock):
        return struct.unpack("H", attrs(payload)[CTRL_ATTR_FAMILY_ID][:2])[0]
    return None


def main(wanted):
    names = {}
    for n in os.listdir("/sys/class/net"):
        with open(f"/sys/class/net/{n}/ifindex") as f:
            names[int(f.read())] = n
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC) as s:
        try:
            family = netdev_family(s)
        except OSError as e:
            sys.exit(f"xdp-features: no netlink family 'netdev' ({e}): Linux 6.3 or later reports XDP features")
        request(s, family, NLM_F_REQUEST | NLM_F_DUMP, NETDEV_CMD_DEV_GET)
        for payload in replies(s):
            a = attrs(payload)
            index = struct.unpack("I", a[NETDEV_A_DEV_IFINDEX])[0]
            name = names.get(index, str(index))
            if wanted and name not in wanted:
                continue
            bits = struct.unpack("Q", a[NETDEV_A_DEV_XDP_FEATURES])[0] if NETDEV_A_DEV_XDP_FEATURES in a else 0
            shown = [f for i, f in enumerate(FEATURES) if bits >> i & 1]
            print(f"{name}: {' '.join(shown) or 'none'}")


if __name__ == "__main__":
    main(set(sys.argv[1:]))
