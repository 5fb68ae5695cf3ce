//! One source of truth across restarts (`balancer-testbed truth`): what was
//! changed at runtime survives a restart with `--config`, a deleted state
//! file is written again, a drain works on a full disk, a clean restart
//! after removals warns of nothing. Isolates itself in network and mount
//! namespaces of its own.

#[test]
fn the_running_state_survives_restarts_deletions_and_full_disks() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["truth"],
        &[
            "survived a SIGKILL and a SIGTERM restart with --config",
            "also after another file was applied and the daemon killed",
            "an edit of the file was applied at the next restart",
            "written again within 5 s, and at stop",
            "was applied and reported unsaved",
            "a clean restart after removing a backend and a VIP warned of nothing",
            "was warned of",
            "a start with an empty configuration file kept the VIPs",
            "a VIP got a TCP check unless --health off",
            "flows listed live before closed",
        ],
    );
}
