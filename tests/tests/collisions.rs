//! Real TCP through the balancer for the colliding-flow cases (14, 15 and
//! 16 of the packet-case list): runs `balancer-testbed collisions`, which
//! isolates itself in network and mount namespaces of its own.

#[test]
fn colliding_flows_with_real_tcp() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["collisions"],
        &[
            "collisions: case 14:",
            "collisions: case 15:",
            "collisions: case 16:",
            "all counts back to 0",
        ],
    );
}
