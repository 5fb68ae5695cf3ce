//! Checks of the compiled XDP object itself (no kernel needed).

use aya_obj::Object;

/// Every `bpf_tail_call` (helper 12) of the balancer's object is reached
/// with its program-array index loaded as a constant in the same basic
/// block: the verifier then lets the JIT jump straight to the stage. A
/// call site shared by two stages (the compiler merges identical tails)
/// gets a key that differs by path, which the verifier marks as unknown,
/// and the tail call becomes an indirect jump through the array (measured
/// at about 24 ns more per call on this machine kind).
#[test]
fn every_tail_call_has_a_constant_index() {
    let obj = Object::parse(balancer::PROGRAM).expect("parsing the XDP object");
    let mut sites = 0;
    for f in obj.functions.values() {
        let insns = &f.instructions;
        // Instructions some jump lands on: a new basic block starts there.
        let mut targets = std::collections::BTreeSet::new();
        for (i, insn) in insns.iter().enumerate() {
            let class = insn.code & 0x07;
            let op = insn.code & 0xf0;
            // BPF_JMP (5) and BPF_JMP32 (6), but calls (0x80) and exit (0x90).
            if (class == 0x05 || class == 0x06) && op != 0x80 && op != 0x90 {
                let off = if class == 0x06 && op == 0x00 {
                    insn.imm as i64 // gotol
                } else {
                    insn.off as i64
                };
                targets.insert((i as i64 + 1 + off) as usize);
            }
        }
        for (i, insn) in insns.iter().enumerate() {
            // BPF_JMP | BPF_CALL, helper 12 (bpf_tail_call).
            if insn.code != 0x85 || insn.src_reg() != 0 || insn.imm != 12 {
                continue;
            }
            sites += 1;
            let mut j = i;
            let key = loop {
                assert!(
                    !targets.contains(&j),
                    "{}: the tail call at instruction {i} is reached by a jump before its \
                     index is set (a shared call site)",
                    f.name
                );
                assert!(j > 0, "{}: no index before the tail call at {i}", f.name);
                j -= 1;
                let w = &insns[j];
                if w.dst_reg() == 3 && w.code & 0x07 != 0x05 {
                    // A write to r3: it must be `mov r3, imm` (BPF_ALU64 | BPF_MOV | BPF_K).
                    assert_eq!(
                        w.code, 0xb7,
                        "{}: the tail call at {i} takes its index from a register",
                        f.name
                    );
                    break w.imm;
                }
            };
            assert!(key >= 0, "{}: tail call index {key}", f.name);
        }
    }
    // The entry's five, the new-flow and reply stages' two each, the ICMP
    // stage's one, the forward stage's one (into the too-big stage).
    assert!(sites >= 11, "only {sites} tail calls found");
}
