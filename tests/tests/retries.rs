//! Retries sampled afresh (`balancer-testbed retries`): with a NAT VIP's
//! backend silent, every connection succeeds, those first placed on it
//! after one SYN retransmission, each counted in `syn_resampled`; the
//! control, a DSR VIP under the same fault, times out and counts nothing.
//! The abandoned backend's late SYN-ACKs are dropped and counted
//! (`abandoned_syn_ack`), the held connections unharmed. Isolated in
//! network and mount namespaces of its own.

#[test]
fn retried_syns_are_placed_afresh() {
    balancer_tests::harness::scenario(
        env!("CARGO_BIN_EXE_balancer-testbed"),
        &["retries"],
        &[
            "retries: silent backend:",
            "retries: control: DSR VIP",
            "retries: lost answers:",
        ],
    );
}
