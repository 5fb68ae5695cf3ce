//! Runs `balancer-testbed flood` (100,000 spoofed SYNs against 100 idle
//! established connections through small tables), which isolates itself in
//! network and mount namespaces of its own, and fails with its output when it
//! fails.

#[test]
fn syn_flood_evicts_no_established_flow() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["flood"],
        &["100 of 100 idle established connections"],
    );
}
