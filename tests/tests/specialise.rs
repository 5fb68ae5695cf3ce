//! Specialisation at load with real TCP (`balancer-testbed specialise`):
//! the latency signal and a source rate turned on under 1,000 held
//! connections load the programs again and swap them in; none breaks; the
//! control, flows removed, breaks some. Isolated in network and mount
//! namespaces of its own.

#[test]
fn a_feature_turned_on_under_held_connections_breaks_none() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["specialise"],
        &[
            "specialise: a plain NAT VIP: features none",
            "specialise: swap:",
            "held connections across the swap: 0 broken",
            "specialise: control:",
        ],
    );
}
