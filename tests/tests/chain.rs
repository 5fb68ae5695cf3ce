//! The balancer beside other XDP programs (`balancer-testbed chain`):
//! xdp-filter first, the balancer joins its libxdp dispatcher
//! (`--xdp-chain libxdp`). On a kernel that refuses freplace programs
//! (this machine's) it checks the refusal and reports a stated skip; the
//! kernel VMs of `cargo xtask kernels` run the whole scenario. Isolates
//! itself in network and mount namespaces of its own.

#[test]
fn the_balancer_joins_a_libxdp_chain_or_says_why_not() {
    let out =
        balancer_tests::harness::scenario(env!("CARGO_BIN_EXE_balancer-testbed"), &["chain"], &[]);
    let skipped = out.contains("chain: SKIPPED on kernel")
        && out.contains("refuses freplace")
        && out.contains("still attached");
    let passed = out.contains("chain: every assertion held");
    assert!(
        skipped || passed,
        "neither a stated skip nor a pass:\n{out}"
    );
    if skipped {
        eprintln!(
            "stated skip: {}",
            out.lines().find(|l| l.contains("SKIPPED")).unwrap_or("")
        );
    }
}
