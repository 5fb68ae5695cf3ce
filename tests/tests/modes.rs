//! The direct-server-return modes with real TCP (`balancer-testbed modes`):
//! L2 DSR, IP-in-IP and GUE through three backends holding the VIPs on
//! loopback, the encapsulating ones with the project's decapsulation
//! program attached. Isolated in network and mount namespaces of its own.

#[test]
fn direct_server_return_modes_with_real_tcp() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["modes"],
        &[
            "modes: dsr:",
            "modes: ipip:",
            "modes: gue:",
            "modes: dsr6:",
            "modes: ipip6:",
            "modes: gue6:",
            "modes: ipip6in4:",
            "modes: ipip4in6:",
            "modes: nat6:",
            "modes: forged tunnel:",
        ],
    );
}
