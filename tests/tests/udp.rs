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

/// QUIC (`balancer-testbed quic`): Debian's ngtcp2 (HTTP/3 downloads
/// placed by 5-tuple) and quinn servers issuing QUIC-LB connection IDs,
/// whose connections survive a source-port change and an emptied flow
/// table; the control without QUIC-LB breaks some.
#[test]
fn quic_through_the_balancer() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["quic"],
        &[
            "quic: ngtcp2: 30 of 30 HTTP/3 downloads complete, byte for byte",
            "quic: quinn: 6 of 6 connections kept their backend",
            "quic: control: without QUIC-LB",
            "quic: no QUIC server left",
        ],
    );
}
