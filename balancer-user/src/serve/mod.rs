//! Serving the balancer: [`control`] (what a request does, the server's
//! limits, the change log), [`http`] (the HTTP server, routes, OpenAPI,
//! the metrics listener), [`metrics`] (Prometheus), [`client`] (the CLI's
//! HTTP client) and [`logs`] (rate-limited warnings).
//!
//! May import the facade ([`crate::balancer`]), the rooms below it and
//! this room.

pub mod client;
pub mod control;
pub mod http;
pub mod logs;
pub mod metrics;
