//! Operator mistakes and crashes (`balancer-testbed mistakes`): a change
//! that cannot be persisted is rolled back, map entries no state file holds
//! are removed at start, dotted interface names, a restart after a stop
//! with no change, SIGTERM during a long start, a refused `--fresh`, the
//! limits of `detach`, refused starts leaving nothing, a relative state
//! file. Isolated in network and mount namespaces of its own.

#[test]
fn mistakes_and_crashes_damage_nothing() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["mistakes"],
        &["mistakes: done"],
    );
}
