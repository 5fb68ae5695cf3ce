//! Runs `balancer-testbed abuse` (the control socket under abuse: 20,000 idle
//! connections, a stopped daemon), which isolates itself in network and mount
//! namespaces of its own, and fails with its output when it fails.

#[test]
fn control_socket_survives_abuse() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["abuse"],
        &["abuse: against a stopped daemon"],
    );
}
