//! UDP with real servers and clients (`balancer-testbed udp`): Debian's
//! dnsmasq on four backends behind a VIP taking TCP and UDP, dig as the
//! client; 1,000 queries answered and spread, the counts back to 0 after
//! the timeout, DNS over TCP through the same VIP, and the controls.
//! Isolated in network and mount namespaces of its own.

#[test]
fn dns_over_udp_through_the_balancer() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["udp"],
        &[
            "udp: dig: 1000 queries, 1000 answered",
            "udp: counts back to 0",
            "udp: dig +tcp: 20 queries, 20 answered",
            "udp: control: with --protocol tcp, 3 of 3 UDP queries unanswered, 3 of 3",
            "udp: control: choices 1 (random)",
            "udp: no dnsmasq process left",
        ],
    );
}
