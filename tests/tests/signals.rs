//! Load signals (`balancer-testbed signals`): with `--signal agent`, a
//! backend whose agent reports three times the load per connection gets
//! about a third of another's share; the control, `--signal connections`,
//! an equal one; a killed agent's report goes stale, is counted, and the
//! backend's load falls back to connections. Isolated in network and
//! mount namespaces of its own.

#[test]
fn load_signals_steer_the_choice() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["signals"],
        &[
            "signals: agent:",
            "signals: control:",
            "signals: stale: backend 0's agent killed",
            "signals: backend 0's agent restarted",
        ],
    );
}
