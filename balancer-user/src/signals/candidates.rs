//! A VIP's candidate table for consistent two choices (the tunnel modes;
//! the data-path side and the hashes are `balancer_common::consistent`):
//! [`CANDIDATE_ROWS`] rows, each the top two backends of the VIP's
//! eligible set by weighted rendezvous hashing. A backend's score in a
//! row is `-ln(u) / weight` with `u` uniform from its
//! `consistent::backend_hash`: the smallest score wins, so the first
//! candidate is backend `i` with probability `w_i / sum(w)` and the second
//! is the same draw among the rest (an exponential race: Efraimidis &
//! Spirakis 2006; weighted rendezvous hashing: Schindelhauer & Schomaker
//! 2005).
//!
//! Rows are kept with their scores so a change touches only what it must:
//! a backend that leaves is replaced in the rows that held it (each row
//! recomputed), one that joins enters the rows where it scores in the top
//! two, and no other row moves (the minimum any table of top-two rows can
//! move).

use std::{collections::BTreeMap, net::SocketAddr};

use balancer_common::{
    consistent::{backend_hash, CANDIDATES_PER_ROW, CANDIDATE_ROWS},
    Addr,
};

/// A backend of the table: its address (what every balancer agrees on;
/// slots are local) and weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    /// Address and port.
    pub addr: SocketAddr,
    /// Weight, 1..=1000.
    pub weight: u32,
}

/// One candidate of a row with its score (smaller wins).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Pick {
    score: f64,
    addr: SocketAddr,
}

/// `member`'s score in `row` under `seed`.
fn score(seed: u64, row: u32, m: &Member) -> f64 {
    let h = backend_hash(seed, row, &Addr::from(m.addr.ip()), m.addr.port());
    // u in (0, 1): the top 53 bits, centred.
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    -u.ln() / f64::from(m.weight.max(1))
}

/// A VIP's candidate table.
#[derive(Clone, Debug)]
pub struct CandidateTable {
    seed: u64,
    members: BTreeMap<SocketAddr, u32>,
    /// Per row, up to [`CANDIDATES_PER_ROW`] picks, best first.
    rows: Vec<Vec<Pick>>,
}

impl CandidateTable {
    /// The table of `members` under `seed` (their order does not matter).
    pub fn new(seed: u64, members: &[Member]) -> CandidateTable {
        let mut t = CandidateTable {
            seed,
            members: members.iter().map(|m| (m.addr, m.weight)).collect(),
            rows: Vec::new(),
        };
        t.rows = (0..CANDIDATE_ROWS).map(|r| t.compute(r)).collect();
        t
    }

    /// The members.
    pub fn members(&self) -> impl Iterator<Item = Member> + '_ {
        self.members.iter().map(|(a, w)| Member {
            addr: *a,
            weight: *w,
        })
    }

    /// Row `row` computed from scratch: the best [`CANDIDATES_PER_ROW`].
    fn compute(&self, row: u32) -> Vec<Pick> {
        let mut best: Vec<Pick> = Vec::with_capacity(CANDIDATES_PER_ROW + 1);
        for m in self.members() {
            let p = Pick {
                score: score(self.seed, row, &m),
                addr: m.addr,
            };
            insert(&mut best, p);
        }
        best
    }

    /// The candidates of `row`, best first (fewer than two only when the
    /// table has fewer members).
    pub fn row(&self, row: u32) -> Vec<SocketAddr> {
        self.rows[row as usize].iter().map(|p| p.addr).collect()
    }

    /// Makes the members `members`: those gone leave the rows that held
    /// them, those new (or with a new weight) enter where they score in
    /// the top two. Returns the rows that changed.
    pub fn update(&mut self, members: &[Member]) -> Vec<u32> {
        let want: BTreeMap<SocketAddr, u32> = members.iter().map(|m| (m.addr, m.weight)).collect();
        let gone: Vec<SocketAddr> = self
            .members
            .iter()
            .filter(|(a, w)| want.get(a) != Some(w))
            .map(|(a, _)| *a)
            .collect();
        let joining: Vec<Member> = want
            .iter()
            .filter(|(a, w)| self.members.get(a) != Some(w))
            .map(|(a, w)| Member {
                addr: *a,
                weight: *w,
            })
            .collect();
        self.members = want;
        let mut changed = Vec::new();
        for r in 0..CANDIDATE_ROWS {
            let row = &self.rows[r as usize];
            let before: Vec<SocketAddr> = row.iter().map(|p| p.addr).collect();
            if row.iter().any(|p| gone.contains(&p.addr)) || row.len() < CANDIDATES_PER_ROW {
                // A pick left (or the row was short): from scratch.
                self.rows[r as usize] = self.compute(r);
            } else {
                for m in &joining {
                    let p = Pick {
                        score: score(self.seed, r, m),
                        addr: m.addr,
                    };
                    insert(&mut self.rows[r as usize], p);
                }
            }
            if self.rows[r as usize].iter().map(|p| p.addr).ne(before) {
                changed.push(r);
            }
        }
        changed
    }
}

/// Inserts `p` into `best` (sorted, best first) and keeps the best
/// [`CANDIDATES_PER_ROW`]; ties go to the smaller address, so every
/// balancer breaks them alike.
fn insert(best: &mut Vec<Pick>, p: Pick) {
    let at = best
        .iter()
        .position(|q| (p.score, p.addr) < (q.score, q.addr))
        .unwrap_or(best.len());
    if at < CANDIDATES_PER_ROW {
        best.insert(at, p);
        best.truncate(CANDIDATES_PER_ROW);
    }
}

#[cfg(test)]
mod tests {
    use rand::{rngs::StdRng, Rng, SeedableRng};

    use super::*;

    fn members(n: u32) -> Vec<Member> {
        (0..n)
            .map(|i| Member {
                addr: SocketAddr::from(([10, 2, (i >> 8) as u8, i as u8], 8080)),
                weight: 1,
            })
            .collect()
    }

    fn rows(t: &CandidateTable) -> Vec<Vec<SocketAddr>> {
        (0..CANDIDATE_ROWS).map(|r| t.row(r)).collect()
    }

    #[test]
    fn the_same_seed_and_members_give_the_same_table_in_any_order() {
        let m = members(50);
        let mut rev = m.clone();
        rev.reverse();
        let (a, b) = (CandidateTable::new(9, &m), CandidateTable::new(9, &rev));
        assert_eq!(rows(&a), rows(&b));
        // Control: another seed gives another table.
        assert_ne!(rows(&a), rows(&CandidateTable::new(10, &m)));
        assert!(rows(&a).iter().all(|r| r.len() == 2 && r[0] != r[1]));
    }

    #[test]
    fn a_backend_leaving_moves_only_the_rows_that_held_it() {
        let m = members(40);
        let mut t = CandidateTable::new(1, &m);
        let before = rows(&t);
        let gone = m[7].addr;
        let changed = t.update(&m[..7].iter().chain(&m[8..]).copied().collect::<Vec<_>>());
        let held: Vec<u32> = (0..CANDIDATE_ROWS)
            .filter(|r| before[*r as usize].contains(&gone))
            .collect();
        assert_eq!(changed, held, "exactly the rows that held it");
        for r in &held {
            let (old, new) = (&before[*r as usize], t.row(*r));
            // The candidate that stays stays, and it is now first if it
            // was second.
            let kept: Vec<&SocketAddr> = old.iter().filter(|a| **a != gone).collect();
            assert_eq!(new[0], *kept[0], "row {r}: {old:?} -> {new:?}");
        }
        // And the result is what a table built afresh holds.
        let fresh = CandidateTable::new(1, &t.members().collect::<Vec<_>>());
        assert_eq!(rows(&t), rows(&fresh));
    }

    #[test]
    fn a_backend_joining_enters_only_where_it_scores_in_the_top_two() {
        let m = members(40);
        let mut t = CandidateTable::new(2, &m[..39]);
        let before = rows(&t);
        let changed = t.update(&m);
        let new = m[39].addr;
        let entered: Vec<u32> = (0..CANDIDATE_ROWS)
            .filter(|r| t.row(*r).contains(&new))
            .collect();
        assert_eq!(changed, entered);
        // About 2/40 of the rows.
        let share = entered.len() as f64 / f64::from(CANDIDATE_ROWS);
        assert!((0.04..0.06).contains(&share), "{share}");
        for r in 0..CANDIDATE_ROWS {
            if !entered.contains(&r) {
                assert_eq!(t.row(r), before[r as usize]);
            }
        }
        let fresh = CandidateTable::new(2, &m);
        assert_eq!(rows(&t), rows(&fresh));
    }

    #[test]
    fn weights_set_how_often_a_backend_is_first() {
        let mut m = members(10);
        m[0].weight = 3;
        let t = CandidateTable::new(5, &m);
        let first = |a: SocketAddr| (0..CANDIDATE_ROWS).filter(|r| t.row(*r)[0] == a).count();
        // Weight 3 of a total 12: a quarter of the rows; weight 1: 1/12.
        let heavy = first(m[0].addr) as f64 / f64::from(CANDIDATE_ROWS);
        let light = first(m[1].addr) as f64 / f64::from(CANDIDATE_ROWS);
        assert!((0.23..0.27).contains(&heavy), "{heavy}");
        assert!((0.07..0.097).contains(&light), "{light}");
        // A weight change moves rows to and from it only.
        let mut t2 = t.clone();
        m[0].weight = 1;
        let changed = t2.update(&m);
        assert!(!changed.is_empty());
        let fresh = CandidateTable::new(5, &m);
        assert_eq!(rows(&t2), rows(&fresh));
    }

    /// Places `flows` flows on `n` backends, each on the lighter of its
    /// two candidates (ties to the first); returns max - mean.
    fn gap(n: u32, flows: u32, mut pair: impl FnMut(&mut StdRng) -> (usize, usize)) -> u32 {
        let mut rng = StdRng::seed_from_u64(42);
        let mut load = vec![0u32; n as usize];
        for _ in 0..flows {
            let (a, b) = pair(&mut rng);
            let pick = if load[b] < load[a] { b } else { a };
            load[pick] += 1;
        }
        load.iter().max().copied().unwrap_or(0) - flows / n
    }

    #[test]
    fn balance_stays_that_of_two_random_choices() {
        // The seeds' case: 1,000 backends, 100,000 flows; two random
        // choices leave a gap of about 2, one choice about 32.
        let n = 1000;
        let m = members(n);
        let t = CandidateTable::new(77, &m);
        let index: BTreeMap<SocketAddr, usize> =
            m.iter().enumerate().map(|(i, b)| (b.addr, i)).collect();
        let table: Vec<(usize, usize)> = (0..CANDIDATE_ROWS)
            .map(|r| {
                let row = t.row(r);
                (index[&row[0]], index[&row[1]])
            })
            .collect();
        let consistent = gap(n, 100_000, |rng| table[rng.gen_range(0..table.len())]);
        let random = gap(n, 100_000, |rng| {
            let a = rng.gen_range(0..n as usize);
            let mut b = rng.gen_range(0..n as usize - 1);
            if b >= a {
                b += 1;
            }
            (a, b)
        });
        let one = gap(n, 100_000, |rng| {
            let a = rng.gen_range(0..n as usize);
            (a, a)
        });
        assert!(
            consistent <= random + 1 && consistent <= 3,
            "consistent {consistent}, random {random}"
        );
        // Control: one choice is far worse, so the measure can tell.
        assert!(one > 10 * consistent.max(1), "one choice {one}");
    }
}
