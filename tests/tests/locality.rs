//! Locality (`balancer-testbed locality`): a VIP preferring the
//! balancer's zone keeps its new connections on that zone's backends while
//! one is below the threshold, spills over once none is, shows the split,
//! and returns when the zone empties; the control, no preference, spreads
//! them over both zones. Isolated in network and mount namespaces of its
//! own.

#[test]
fn zone_preference_spills_at_the_threshold() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["locality"],
        &[
            "locality: control:",
            "locality: prefer zone a below",
            "locality: zone a emptied",
        ],
    );
}
