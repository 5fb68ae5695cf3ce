//! The data path's side: the only code touching the program's maps,
//! links and interfaces. [`maps`] (typed handles; `Maps::sync` writes a
//! projection's difference in one order; pins), [`batch`] (batched map
//! reads), [`gc`] (flow expiry, count reconciliation, orphans), [`wire`] (a
//! flow's form in the cluster sync, read from the flow table), [`netdev`]
//! (interfaces, their XDP program, neighbours), [`links`] (pinned XDP
//! links: adopt, replace, detach), [`decap`] (the backends' decapsulation
//! program).
//!
//! May import the model ([`crate::model`]) and this room.

pub mod batch;
pub mod chain;
pub mod decap;
pub mod gc;
pub mod links;
pub mod maps;
pub mod netdev;
pub mod wire;
