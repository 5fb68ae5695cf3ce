//! Flow sync at table scale (`balancer-testbed sync`): a peer holds every
//! one of 50,000 flows injected as frames within 5 s, resets leave it too,
//! a peer restarted empty gets the whole table again (and, as the control,
//! one with an 8 KiB socket buffer does not), flow events lost on purpose
//! are repaired by a whole table (and, as the control, not while the
//! repair is held off), and the counts are true.
//! Isolates itself in network and mount namespaces of its own.

#[test]
fn a_peer_holds_every_flow() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["sync"],
        &[
            "the peer held every one",
            "the peer's copies equal lb1's",
            "sync: control: a peer restarted empty with an 8 KiB socket buffer held",
            "a peer restarted empty held all",
            "sync: control: lb1 with a 4 KiB flow-event ring lost",
            "sent its whole table again",
            "lb1's active counts equal its live flows per backend",
        ],
    );
}
