//! Userspace of the XDP power-of-two-choices TCP load balancer.
//!
//! [`Balancer`] owns the XDP program and its maps and holds the desired state
//! (VIPs and backends); the daemon ([`daemon`]) serves it on a unix socket
//! and runs flow expiry, count reconciliation and stats polling; the CLI
//! ([`client`]) talks to the daemon with the [`api`] types.
#![deny(missing_docs)]

pub mod api;
pub mod balancer;
pub mod client;
pub mod daemon;
pub mod error;

pub use balancer::{Balancer, LoadOptions, State, Timeouts, PROGRAM};
pub use error::{BalancerError, Result};
