//! Runs `balancer-testbed orphans` (connections whose backend was removed, or
//! which expired, get a reset), which isolates itself in network and mount
//! namespaces of its own, and fails with its output when it fails.

#[test]
fn orphaned_flows_get_a_reset() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["orphans"],
        &["names the reset"],
    );
}
