//! The `balancer` command line: one file per verb group, each a thin
//! client of the control API.

pub mod args;
pub mod backend;
pub mod decap;
pub mod detach;
pub mod run;
pub mod show;
pub mod vip;
