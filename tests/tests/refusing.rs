//! What a failing backend costs clients (`balancer-testbed refusing`): a
//! NAT VIP's closed port fails none of 300 requests from one /24 (control:
//! the same under DSR fails some); a backend that accepts then resets fails
//! at most 0.5 % of 900 connections (control: a VIP without detection).
//! Isolates itself in network and mount namespaces of its own.

#[test]
fn a_failing_backend_costs_clients_almost_nothing() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["refusing"],
        &[
            "refusing: NAT, backend",
            "refusing: control: DSR",
            "accepting then resetting",
            "refusing: control: 300 connections",
        ],
    );
}
