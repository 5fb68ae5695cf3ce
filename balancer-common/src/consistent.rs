//! Consistent candidates (the tunnel modes): a new flow's candidates are
//! not drawn at random but read from a table row picked by a keyed hash
//! of its 5-tuple, so any balancer holding the same table (the same VIP
//! seed and eligible set) recomputes the same candidates for a segment
//! whose flow entry it lost. The choice between the candidates stays on
//! live load (power of two choices, Mitzenmacher 2001); the daemon fills
//! the rows by weighted rendezvous (highest random weight) hashing
//! (Thaler & Ravishankar 1998; weighted: Schindelhauer & Schomaker 2005),
//! so a change of the eligible set moves only the rows it must. The table
//! of rows, each with a primary and a secondary, is GitHub GLB's
//! forwarding table.
//!
//! Everything here is specified bit for bit (MurmurHash3's 64-bit
//! finalizer, Appleby 2011; words in network byte order), so balancers of
//! different builds and architectures agree.

use bytemuck::{Pod, Zeroable};

use crate::{Addr, MAX_VIPS};

/// Rows of a VIP's candidate table: a power of two. With `n` backends
/// each appears in about `2 * CANDIDATE_ROWS / n` rows (33 at 1,000
/// backends): the pairs form a random graph of that degree, on which two
/// choices keep their `log log n` gap (Kenthapadi & Panigrahy, "Balanced
/// allocation on graphs", SODA 2006).
pub const CANDIDATE_ROWS: u32 = 1 << 14;

/// Candidates per row (a primary and a secondary).
pub const CANDIDATES_PER_ROW: usize = 2;

/// Entries of the `CANDIDATES` array: every VIP's rows.
pub const CANDIDATES_LEN: u32 = MAX_VIPS * CANDIDATE_ROWS;

/// Index into `CANDIDATES` of row `row` of VIP `vip_index`.
#[inline(always)]
pub const fn candidate_index(vip_index: u32, row: u32) -> u32 {
    vip_index * CANDIDATE_ROWS + (row & (CANDIDATE_ROWS - 1))
}

/// Value of the `CANDIDATES` array: a row's two candidates as backend
/// slots plus one (0: none; an all-zero row, never written, makes the data
/// path fall back to two random choices).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
pub struct CandidateRow {
    /// The first candidate's slot + 1 (0: none).
    pub first: u16,
    /// The second candidate's slot + 1 (0: none).
    pub second: u16,
}

impl CandidateRow {
    /// A row of `first` and (when there is one) `second` (slots below
    /// `BACKEND_SLOTS`, which fits 16 bits).
    pub const fn new(first: u32, second: Option<u32>) -> CandidateRow {
        CandidateRow {
            first: (first + 1) as u16,
            second: match second {
                Some(s) => (s + 1) as u16,
                None => 0,
            },
        }
    }

    /// How many candidates the row holds (0, 1 or 2).
    #[inline(always)]
    pub const fn len(&self) -> u32 {
        if self.first == 0 {
            0
        } else if self.second == 0 {
            1
        } else {
            2
        }
    }

    /// `true` for a row never written.
    #[inline(always)]
    pub const fn is_empty(&self) -> bool {
        self.first == 0
    }

    /// The slot of candidate `i` (0 or 1); `None` past the row's length.
    #[inline(always)]
    pub const fn slot(&self, i: u32) -> Option<u32> {
        let v = if i == 0 { self.first } else { self.second };
        if v == 0 {
            None
        } else {
            Some(v as u32 - 1)
        }
    }
}

/// MurmurHash3's 64-bit finalizer (`fmix64`, Appleby 2011): every input
/// bit affects every output bit.
#[inline(always)]
pub const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// One absorption step: `h` with the 32-bit word `w` mixed in.
#[inline(always)]
const fn absorb(h: u64, w: u32) -> u64 {
    fmix64(h ^ (w as u64)).wrapping_add(0x9e37_79b9_7f4a_7c15)
}

/// `a`'s four words in network byte order (the same numbers on every
/// architecture).
#[inline(always)]
const fn words(a: &Addr) -> [u32; 4] {
    [
        u32::from_be(a.0[0]),
        u32::from_be(a.0[1]),
        u32::from_be(a.0[2]),
        u32::from_be(a.0[3]),
    ]
}

/// The keyed hash of a flow's 5-tuple (client address and port, VIP
/// address and port, ports in network byte order as the packet carries
/// them, IP protocol) under the VIP's `seed`. A client that does not know
/// the seed cannot aim its flows at chosen rows.
#[inline(always)]
pub fn flow_hash(
    seed: u64,
    src: &Addr,
    dst: &Addr,
    sport_be: u16,
    dport_be: u16,
    proto: u8,
) -> u64 {
    let mut h = fmix64(seed);
    let s = words(src);
    let d = words(dst);
    h = absorb(h, s[0]);
    h = absorb(h, s[1]);
    h = absorb(h, s[2]);
    h = absorb(h, s[3]);
    h = absorb(h, d[0]);
    h = absorb(h, d[1]);
    h = absorb(h, d[2]);
    h = absorb(h, d[3]);
    h = absorb(
        h,
        ((u16::from_be(sport_be) as u32) << 16) | u16::from_be(dport_be) as u32,
    );
    fmix64(h ^ proto as u64)
}

/// The row of a flow hash.
#[inline(always)]
pub const fn row_of(flow_hash: u64) -> u32 {
    (flow_hash >> 32) as u32 & (CANDIDATE_ROWS - 1)
}

/// The rendezvous hash of backend `addr`:`port` (host byte order) for row
/// `row` of a VIP with `seed`: uniform over `u64`, independent across
/// rows and backends. The daemon turns it into a weighted score.
pub fn backend_hash(seed: u64, row: u32, addr: &Addr, port: u16) -> u64 {
    let mut h = fmix64(seed ^ 0x5bd1_e995_0000_0000);
    let w = words(addr);
    h = absorb(h, row);
    h = absorb(h, w[0]);
    h = absorb(h, w[1]);
    h = absorb(h, w[2]);
    h = absorb(h, w[3]);
    fmix64(absorb(h, port as u32))
}

/// The seed of a VIP: a cluster-wide secret mixed with the VIP's address
/// and port (host byte order), so every balancer of the VIP computes the
/// same table and different VIPs get independent ones.
pub fn vip_seed(secret: u64, vip: &Addr, port: u16) -> u64 {
    let w = words(vip);
    let mut h = fmix64(secret);
    h = absorb(h, w[0]);
    h = absorb(h, w[1]);
    h = absorb(h, w[2]);
    h = absorb(h, w[3]);
    fmix64(absorb(h, port as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4]) -> Addr {
        Addr::v4(u32::from_ne_bytes(a))
    }

    #[test]
    fn a_row_holds_slots_plus_one() {
        let r = CandidateRow::new(0, Some(16383));
        assert_eq!((r.len(), r.slot(0), r.slot(1)), (2, Some(0), Some(16383)));
        let one = CandidateRow::new(7, None);
        assert_eq!((one.len(), one.slot(0), one.slot(1)), (1, Some(7), None));
        assert!(CandidateRow::default().is_empty());
        assert_eq!(CandidateRow::default().slot(0), None);
        assert_eq!(candidate_index(2, 5), 2 * CANDIDATE_ROWS + 5);
    }

    #[test]
    fn fmix64_reference_values() {
        // MurmurHash3's fmix64 of 0 is 0; of 1, the published constant
        // chain gives this value (checked against the C reference).
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
    }

    #[test]
    fn a_flow_hash_depends_on_every_field_and_the_seed() {
        let (c, v) = (v4([10, 0, 1, 2]), v4([10, 0, 0, 10]));
        let base = flow_hash(7, &c, &v, 40000u16.to_be(), 80u16.to_be(), 6);
        assert_eq!(
            base,
            flow_hash(7, &c, &v, 40000u16.to_be(), 80u16.to_be(), 6)
        );
        for other in [
            flow_hash(8, &c, &v, 40000u16.to_be(), 80u16.to_be(), 6),
            flow_hash(
                7,
                &v4([10, 0, 1, 3]),
                &v,
                40000u16.to_be(),
                80u16.to_be(),
                6,
            ),
            flow_hash(
                7,
                &c,
                &v4([10, 0, 0, 11]),
                40000u16.to_be(),
                80u16.to_be(),
                6,
            ),
            flow_hash(7, &c, &v, 40001u16.to_be(), 80u16.to_be(), 6),
            flow_hash(7, &c, &v, 40000u16.to_be(), 81u16.to_be(), 6),
            flow_hash(7, &c, &v, 40000u16.to_be(), 80u16.to_be(), 17),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn rows_of_consecutive_ports_are_uniform() {
        // 2^20 flows of one client over 16 source addresses: every row
        // gets its share (64 expected) within a wide bound.
        let v = v4([10, 0, 0, 10]);
        let mut count = [0u32; CANDIDATE_ROWS as usize];
        for a in 0..16u8 {
            let c = v4([10, 0, 1, a]);
            for p in 0..65536u32 {
                let h = flow_hash(3, &c, &v, (p as u16).to_be(), 80u16.to_be(), 6);
                count[row_of(h) as usize] += 1;
            }
        }
        let (min, max) = (*count.iter().min().unwrap(), *count.iter().max().unwrap());
        assert!(
            min > 20 && max < 120,
            "rows got {min}..={max} of 64 expected"
        );
    }

    #[test]
    fn backend_hashes_differ_by_row_backend_and_seed() {
        let b = v4([10, 0, 2, 10]);
        let h = backend_hash(1, 5, &b, 8080);
        assert_ne!(h, backend_hash(1, 6, &b, 8080));
        assert_ne!(h, backend_hash(2, 5, &b, 8080));
        assert_ne!(h, backend_hash(1, 5, &v4([10, 0, 2, 11]), 8080));
        assert_ne!(h, backend_hash(1, 5, &b, 8081));
        assert_ne!(vip_seed(1, &b, 80), vip_seed(1, &b, 81));
        assert_ne!(vip_seed(1, &b, 80), vip_seed(2, &b, 80));
    }
}
