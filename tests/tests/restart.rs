//! Hitless restart and upgrade with real TCP (`balancer-testbed restart`,
//! short form: 14 connections moving data through each of a SIGTERM
//! restart, a SIGKILL restart and an upgrade): isolates itself in network
//! and mount namespaces of its own.

#[test]
fn connections_survive_restarts_and_upgrades() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["restart"],
        &[
            "Sigterm",
            "Sigkill",
            "Upgrade",
            "another layout refused",
            "detach",
        ],
    );
}
