//! Userspace of the XDP power-of-two-choices TCP load balancer.
//!
//! [`Balancer`] is a facade over one module per concern: [`datapath::maps`] (typed
//! handles, the only code touching the program's maps), [`model::state`] (the
//! desired state, its validation and persistence), [`datapath::gc`] (flow expiry and
//! count reconciliation), [`signals::telemetry`] (counters into views) and
//! [`datapath::netdev`] (interfaces), [`model::config`] (the declarative configuration) and
//! [`serve::metrics`] (Prometheus). The daemon ([`daemon::runtime`]) serves it over HTTP on
//! a unix socket ([`serve::http`], [`serve::control`]); the CLI ([`serve::client`]) talks to the
//! daemon with the [`model::api`] types.
#![deny(missing_docs)]

pub mod balancer;
pub mod cluster;
pub mod daemon;
pub mod datapath;
pub mod model;
pub mod serve;
pub mod signals;

pub use balancer::{Balancer, LoadOptions, PROGRAM};

/// The test bed's fault injector (`balancer-ebpf/src/faults.rs`: a tc
/// program that drops, duplicates and reorders frames on a link), built
/// with the balancer's objects so the test bed can load it; the balancer
/// itself never does.
#[doc(hidden)]
pub static FAULTS_PROGRAM: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/balancer-faults"));
pub use model::error::{BalancerError, Result};
pub use model::state::State;
pub use model::state::Timeouts;
