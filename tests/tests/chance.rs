//! The second chance with real TCP (`balancer-testbed chance`): 1,000
//! connections held through a consistent-candidates IP-in-IP VIP survive
//! the balancer losing every flow entry (its flow tables emptied, then a
//! restart with `--fresh`); the control, a random-candidates VIP's
//! connections, break. Isolated in network and mount namespaces of its own.

#[test]
fn held_connections_survive_a_lost_flow_table() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["chance"],
        &[
            "chance: flush:",
            "chance: restart with --fresh:",
            "chance: every held connection closed",
        ],
    );
}
