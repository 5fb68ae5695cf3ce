//! The daemon: [`runtime`] (start-up, readiness, shutdown), [`services`]
//! (the daemon's loops, one stop) and [`preflight`] (every start-up
//! refusal, locks).
//!
//! The top room: may import every other.

pub mod preflight;
pub mod runtime;
pub mod services;
