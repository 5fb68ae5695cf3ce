//! Userspace of the XDP power-of-two-choices TCP load balancer.
//!
//! The library is in rooms, one folder each, lowest first; a module
//! imports only from its own room and the rooms below it (checked by
//! `balancer-user/tests/modules.rs`; docs/layout.md):
//!
//! 1. [`model`]: the desired state and its rules, the changes to it, its
//!    forms (the configuration file, the API's types, the state file) and
//!    its projection onto the maps;
//! 2. [`datapath`]: the program's maps (the only code touching them),
//!    expiry, interfaces, links, the decapsulation program;
//! 3. [`signals`]: health checks, the load signals, eligibility, locality,
//!    the views of counters and flows;
//! 4. [`balancer`]: the facade, [`Balancer`];
//! 5. [`serve`]: the control API over HTTP, metrics, the CLI's client;
//! 6. [`cluster`]: the flow sync with peer balancers, BGP;
//! 7. [`daemon`]: start-up, the daemon's services, shutdown.
//!
//! The `balancer` binary's CLI (`src/cli/`) uses it from above.
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
