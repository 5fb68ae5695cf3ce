//! Runs `balancer-testbed refusals` (start-up refusals against a running
//! daemon), which isolates itself in network and mount namespaces of its own,
//! and fails with its output when it fails.

#[test]
fn start_up_refuses_before_changing_anything() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["refusals"],
        &[
            "refusals: the running daemon served",
            "refusals: a veth at MTU 9000 in --mode native: attached",
        ],
    );
}
