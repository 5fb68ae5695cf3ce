//! The operator's interface on the test bed (`balancer-testbed operator`):
//! the API with curl over the unix socket, the read-only socket, metrics
//! scraped against real traffic, `balancer top` under tmux, apply and
//! export, readiness notification, the systemd unit, logs. Isolates itself
//! in network and mount namespaces of its own.

#[test]
fn operator_interface_in_the_test_bed() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["operator"],
        &[
            "API with curl",
            "clients that hung up before their answer left the daemon serving",
            "read-only socket",
            "metrics scraped",
            "`balancer top` under tmux",
            "export, apply and export again identical",
            "READY=1",
            "systemd-analyze verify passed",
            "the log named every change",
            "warned about once as evicting",
        ],
    );
}
