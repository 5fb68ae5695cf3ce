//! Runs `balancer-testbed jumbo` (jumbo frames with real TCP in native
//! mode, both families), which isolates itself in network and mount
//! namespaces of its own, and fails with its output when it fails.

#[test]
fn jumbo_frames_in_native_mode_with_real_tcp() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["jumbo"],
        &["jumbo: 10.0.0.10:80:", "jumbo: [2001:db8::10]:80:"],
    );
}
