//! Faulty, not hostile (`balancer-testbed faults`, short form): the
//! real-client scenario with loss, duplication and reordering injected on
//! the client's and the backends' links by a tc program of our own (no
//! netem in this kernel); each fault kind first checked alone with
//! numbered datagrams; downloads intact, wrk and ab without errors, every
//! fault counter above 0, nothing left open or counted after each client;
//! no nginx process left. Isolated in network and mount namespaces of its own.

#[test]
fn real_clients_through_faulty_links() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["faults"],
        &[
            "faults: self-check egress loss",
            "faults: self-check egress duplication",
            "faults: self-check egress reordering",
            "faults: self-check ingress loss",
            "faults: self-check ingress duplication",
            "faults: curl:",
            "faults: wrk:",
            "faults: ab:",
            "faults: injected on client cl0 egress",
            "faults: no nginx process left",
        ],
    );
}
