// SPDX-License-Identifier: MIT OR Apache-2.0
//
// An XDP program that passes every frame to the kernel's stack, for the
// veth peers of the interfaces the balancer attaches to: veth delivers a
// frame sent into it with XDP_TX (the balancer's resets) only when its
// peer runs an XDP program of its own (docs/deployment.md, step 4).
//
// scripts/setup.sh builds it (clang and libbpf-dev, Debian's packages):
//   clang -O2 -g -target bpf -I/usr/include/$(dpkg-architecture -qDEB_HOST_MULTIARCH) \
//     -c contrib/xdp-pass/xdp_pass.c -o target/xdp-pass/xdp_pass.o
// and it is attached with iproute2:
//   ip link set dev PEER xdpdrv obj target/xdp-pass/xdp_pass.o sec xdp

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	(void)ctx;
	return XDP_PASS;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
