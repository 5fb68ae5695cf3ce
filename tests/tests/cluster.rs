//! Several balancers behind a BGP/ECMP router in the test bed
//! (`balancer-testbed cluster`, docs/cluster.md): one of three drained and
//! put back under 1,000 held connections and steady new ones, nothing
//! broken; a connection cap of 50 held across the three (the peers' load
//! reports count toward it); a host cut off dropped from the router's route
//! within 1 s by BFD, and the control (a session without BFD, its hold
//! timer). `BALANCER_CLUSTER_FULL=1` runs the full form (UDP flows kept
//! across a drain by the flow sync, a host cut off under held
//! connections, a balancer added, the herd table). Isolates itself in
//! network and mount namespaces of its own.

#[test]
fn balancers_behind_ecmp_share_flows() {
    let long = std::env::var_os("BALANCER_CLUSTER_FULL").is_some();
    let mut args = vec!["cluster"];
    if long {
        args.push("--long");
    }
    let mut markers = vec![
        "cluster: the router learned the VIP from lb1, lb2 and lb3",
        "cluster: lb2 drained: 0 of 1000 held connections broken",
        "cluster: lb2 back in service: 0 of 1000 held connections broken,",
        "cluster: cap: | every 100 ms |",
        "cluster: failover: lb2's host cut off (BGP with BFD",
    ];
    if long {
        markers.extend([
            "cluster: udp: 200 UDP flows of a DSR VIP, lb2 drained: 0 moved",
            "cluster: udp: control: without flow sync",
            "cluster: lb3's host cut off",
            "cluster: lb4 added",
            "cluster: herd: |",
        ]);
    }
    balancer_tests::harness::scenario(env!("CARGO_BIN_EXE_balancer-testbed"), &args, &markers);
}

/// The tunnel form (`balancer-testbed cluster --tunnel`): IP-in-IP with
/// consistent candidates and no flow sync; a balancer drained, put back,
/// cut off and added under 1,000 held connections breaks none (the
/// control, a random-candidates VIP, loses some on the drain).
#[test]
fn balancers_without_sync_keep_consistent_flows() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["cluster", "--tunnel"],
        &[
            "cluster: tunnel: lb2 drained: 0 of 1000 held connections broken, 0 of",
            "cluster: tunnel: control: lb2 drained:",
            "cluster: tunnel: lb2 back in service: 0 of 1000 held connections broken, 0 of",
            "cluster: tunnel: lb3's host cut off: 0 of 1000 held connections broken, 0 of",
            "cluster: tunnel: lb4 added: 0 of 1000 held connections broken, 0 of",
        ],
    );
}
