//! Eligibility with real TCP through the balancer (`balancer-testbed
//! health`, short form: choices 2 over 300 connections for the closed-port
//! case): isolates itself in network and mount namespaces of its own.

#[test]
fn eligibility_with_real_tcp() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["health"],
        &[
            "case 18",
            "address vanished",
            "refusing every SYN",
            "weights 1 and 3",
            "slow start",
        ],
    );
}
