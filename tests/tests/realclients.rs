//! Real clients and servers (`balancer-testbed realclients`, short form):
//! Debian's nginx on three backends; curl downloads checked byte for byte,
//! wrk and ab without errors, iperf3 through a VIP with session affinity,
//! nothing left 1 s after each client stops. Isolated in network and mount
//! namespaces of its own.

#[test]
fn real_clients_and_servers_through_the_balancer() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["realclients"],
        &[
            "realclients: curl:",
            "realclients: wrk:",
            "realclients: ab:",
            "realclients: iperf3: 3 of 3 runs completed",
            "realclients: no nginx process left",
        ],
    );
}
