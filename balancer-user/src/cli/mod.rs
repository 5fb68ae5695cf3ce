//! The `balancer` command line: one file per verb group, each a thin
//! client of the control API.

pub mod agent;
pub mod args;
pub mod backend;
pub mod cluster;
pub mod config;
pub mod decap;
pub mod detach;
pub mod run;
pub mod service;
pub mod show;
pub mod top;
pub mod vip;

#[cfg(test)]
pub mod fixture;

/// The width of a column of addresses: 21 (an IPv4 address and port) or
/// the widest of `items` (IPv6 ones are up to 47 characters).
pub fn addr_width<T: ToString>(items: impl IntoIterator<Item = T>) -> usize {
    items
        .into_iter()
        .map(|a| a.to_string().len())
        .max()
        .unwrap_or(0)
        .max(21)
}
