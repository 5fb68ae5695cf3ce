//! A NAT VIP behind a pair of balancers with keepalived (VRRP) and flow
//! sync (`balancer-testbed natpair`, docs/cluster.md, "A NAT pair with
//! keepalived"): the active's links cut under 1,000 held TCP connections
//! and 200 UDP flows breaks none and moves none; the old active returns as
//! BACKUP and takes nothing back; the control (no sync) breaks held
//! connections. Isolates itself in network and mount namespaces of its
//! own.

#[test]
fn a_nat_pair_keeps_its_flows_through_a_takeover() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["natpair"],
        &[
            "natpair: lb1 MASTER",
            "natpair: lb2 holds 1000 of 1000 TCP and 200 of 200 UDP flows synced",
            "natpair: lb1's links down: lb2 MASTER after",
            "0 of 1000 held connections broken, 0 of 200 UDP flows moved to another backend, 0 unanswered",
            "natpair: lb1's links back: lb1 BACKUP after",
            "natpair: control: without flow sync",
            "natpair: daemons with --vrrp-state-dir alone report their roles",
        ],
    );
}
