//! The model: what the balancer is told and what it keeps, as data and
//! rules, with no kernel and no network: errors ([`error`]), addresses and
//! prefixes in the maps' form ([`prefix`]), the desired state, its types
//! and rules ([`state`]), a VIP's settings declared once with their rules
//! ([`settings`]), [`command`] (`Command`, the one vocabulary of
//! changes, and `State::apply`), the declarative configuration
//! ([`config`]), the API's requests, answers and views ([`api`]), what is
//! remembered of removed VIPs and backends ([`retired`]), the pure
//! projection of a state onto the control-plane maps ([`project`]), the
//! state file ([`persist`]) and the VRRP roles keepalived records
//! ([`vrrp`]).
//!
//! The lowest room: its modules import only each other (the rooms' order
//! is checked by `balancer-user/tests/modules.rs`).

// First: the settings' table (`vip_settings!`) is expanded in the modules
// below it (`state`, `config`, `api`).
#[macro_use]
pub mod settings;

pub mod api;
pub mod command;
pub mod config;
pub mod error;
pub mod persist;
pub mod prefix;
pub mod project;
pub mod retired;
pub mod state;
pub mod vrrp;

#[cfg(test)]
mod edge_tests;
