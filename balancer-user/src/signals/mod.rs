//! What the balancer learns about its backends and its traffic, and what
//! it makes of it: [`probe`] (path checks through the VIP's own
//! forwarding), [`health`] (active checks), [`eligibility`] (health,
//! ejections, fallback, slow start), [`agent`] (the agent load signal),
//! [`latency`] (the latency signal), [`locality`] (the zone preference),
//! [`candidates`] (the consistent two choices' candidate table),
//! [`regret`] (the choice's regret) and [`telemetry`] (counters, counts
//! and flows into the API's views).
//!
//! May import the model, the data path ([`crate::datapath`]) and this
//! room.

pub mod agent;
pub mod candidates;
pub mod eligibility;
pub mod health;
pub mod latency;
pub mod locality;
pub mod probe;
pub mod regret;
pub mod telemetry;
