//! The balancer among its peers: [`sync`] (flow sync and shared load with
//! peer balancers, the announcement loop) and [`bgp`] (the BIRD driver).
//!
//! May import every room below it (the serving room for its rate-limited
//! log) and this room.

pub mod bgp;
pub mod sync;
