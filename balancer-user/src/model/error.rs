//! Errors of the balancer library.

use std::net::SocketAddr;

/// Everything a balancer operation can refuse or fail with. Refusals (bad
/// input, unknown names, full tables) leave the balancer unchanged.
#[derive(Debug, thiserror::Error)]
pub enum BalancerError {
    /// The VIP is not configured.
    #[error("no such VIP {vip}")]
    UnknownVip {
        /// The VIP asked for.
        vip: SocketAddr,
    },
    /// A VIP with this address and port exists already.
    #[error("VIP {vip} exists already")]
    DuplicateVip {
        /// The VIP asked for.
        vip: SocketAddr,
    },
    /// The backend is not a backend of the VIP.
    #[error("{backend} is not a backend of VIP {vip}")]
    UnknownBackend {
        /// The VIP.
        vip: SocketAddr,
        /// The backend asked for.
        backend: SocketAddr,
    },
    /// The backend is already a backend of the VIP.
    #[error("{backend} is already a backend of VIP {vip}")]
    DuplicateBackend {
        /// The VIP.
        vip: SocketAddr,
        /// The backend asked for.
        backend: SocketAddr,
    },
    /// A table is full.
    #[error("{what} is full ({capacity} entries)")]
    Full {
        /// Which table.
        what: &'static str,
        /// Its capacity.
        capacity: u32,
    },
    /// An argument is out of range or malformed.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// Loading the XDP program or its maps failed.
    #[error("loading the XDP program failed")]
    Load(#[source] aya::EbpfError),
    /// A program operation (load into the kernel, attach) failed.
    #[error("{action} failed")]
    Program {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map read or write failed.
    #[error("map {map}: {action} failed")]
    Map {
        /// Map name.
        map: &'static str,
        /// What was being done.
        action: &'static str,
        /// The underlying error.
        #[source]
        source: aya::maps::MapError,
    },
    /// A file or system call failed.
    #[error("{action} failed")]
    Io {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Result of balancer operations.
pub type Result<T, E = BalancerError> = std::result::Result<T, E>;

/// The OS error number at the bottom of `e`'s source chain, if any (the
/// kernel's answer to a failed system call, e.g. `libc::EBUSY`).
pub fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut found = None;
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            found = io.raw_os_error().or(found);
        }
        cur = c.source();
    }
    found
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
