//! [`Candidates`]: the candidate tables of the VIPs with consistent
//! candidates, which the balancer owns with the cluster-wide secret their
//! seeds derive from: each table is brought up to its VIP's eligible set
//! before a projection, and its rows in slots go into the projection's
//! inputs.

use std::{collections::BTreeMap, net::SocketAddr, sync::Arc};

use balancer_common::{
    consistent::{vip_seed, CandidateRow, CANDIDATE_ROWS},
    Addr,
};

use crate::{
    model::{project::Inputs, state::State},
    signals::{
        candidates::{CandidateTable, Member},
        eligibility::Eligibility,
    },
};

/// A VIP's candidate table as last computed, with the rows in slots.
#[derive(Debug)]
struct VipTable {
    table: CandidateTable,
    /// The members it was computed for (sorted).
    members: Vec<Member>,
    /// The slot of each backend of the VIP.
    slots: BTreeMap<SocketAddr, u32>,
    seed: u64,
    /// The rows in slots; `None` when they must be computed again.
    rows: Option<Arc<Vec<CandidateRow>>>,
}

/// The candidate tables and their secret.
#[derive(Debug, Default)]
pub struct Candidates {
    /// The candidate table of each VIP with consistent candidates.
    tables: BTreeMap<SocketAddr, VipTable>,
    /// The cluster-wide secret of the candidate tables' seeds
    /// ([`balancer_common::consistent::vip_seed`]).
    secret: u64,
}

impl Candidates {
    /// Sets the secret; the tables are computed again at the next
    /// refresh.
    pub(super) fn set_secret(&mut self, secret: u64) {
        self.secret = secret;
        self.tables.clear();
    }

    /// Brings the candidate table of each VIP with consistent candidates
    /// up to its eligible set (members: the eligible backends with their
    /// configured weights, not slow start's, which moves every 100 ms and
    /// differs between balancers): incrementally when the set changed
    /// ([`CandidateTable::update`]), its rows in slots when either changed.
    pub(super) fn refresh(&mut self, state: &State, eligibility: &Eligibility) {
        let secret = self.secret;
        self.tables.retain(|a, _| {
            state
                .vips
                .get(a)
                .is_some_and(|v| !v.settings.candidates.is_random())
        });
        for v in state.vips.values() {
            if v.settings.candidates.is_random() {
                continue;
            }
            let (list, _) = eligibility.list(state, v);
            let mut members: Vec<Member> = v
                .backends
                .iter()
                .filter(|b| list.contains(&b.slot))
                .map(|b| Member {
                    addr: b.addr,
                    weight: b.weight,
                })
                .collect();
            members.sort();
            let slots: BTreeMap<SocketAddr, u32> =
                v.backends.iter().map(|b| (b.addr, b.slot)).collect();
            let seed = vip_seed(secret, &Addr::from(v.addr.ip()), v.addr.port());
            let t = match self.tables.remove(&v.addr) {
                Some(mut t) if t.seed == seed => {
                    if t.members != members {
                        t.table.update(&members);
                        t.members = members;
                        t.rows = None;
                    }
                    if t.slots != slots {
                        t.slots = slots;
                        t.rows = None;
                    }
                    t
                }
                _ => VipTable {
                    table: CandidateTable::new(seed, &members),
                    members,
                    slots,
                    seed,
                    rows: None,
                },
            };
            self.tables.insert(v.addr, t);
        }
        for t in self.tables.values_mut() {
            if t.rows.is_none() {
                let rows = (0..CANDIDATE_ROWS)
                    .map(|r| {
                        let row = t.table.row(r);
                        match (row.first().and_then(|a| t.slots.get(a)), row.get(1)) {
                            (Some(s0), second) => {
                                CandidateRow::new(*s0, second.and_then(|a| t.slots.get(a)).copied())
                            }
                            (None, _) => CandidateRow::default(),
                        }
                    })
                    .collect();
                t.rows = Some(Arc::new(rows));
            }
        }
    }

    /// The rows of each table (computed) into the projection's inputs.
    pub(super) fn fill_inputs(&self, inputs: &mut Inputs) {
        for (a, t) in &self.tables {
            if let Some(rows) = &t.rows {
                inputs.candidates.insert(*a, (t.seed, rows.clone()));
            }
        }
    }
}
