//! [`Host`]: the addresses of the balancer's host, which the balancer
//! owns: where they are learned ([`HostAddresses`]) and the list as last
//! read, which the projection's martian sources hold.

use std::{collections::BTreeSet, net::IpAddr};

use super::HostAddresses;
use crate::{datapath::netdev, model::error::Result};

/// The host's addresses.
pub struct Host {
    /// Where they come from ([`netdev::host_addresses`]; tests give their
    /// own).
    source: HostAddresses,
    /// As last read (`None`: to be read at the next sync).
    addrs: Option<Vec<IpAddr>>,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            source: netdev::host_addresses,
            addrs: None,
        }
    }
}

impl Host {
    /// The addresses the host owns now, read through the source (the
    /// rules of a change check against them).
    ///
    /// # Errors
    /// The source's failure.
    pub fn now(&self) -> Result<BTreeSet<IpAddr>> {
        (self.source)()
    }

    /// Replaces the source; the addresses are read through it at the next
    /// sync.
    pub(super) fn set_source(&mut self, f: HostAddresses) {
        self.source = f;
        // Read through it at the next sync.
        self.addrs = None;
    }

    /// Reads the host's addresses again (a failed read keeps the last
    /// list); returns whether they changed.
    pub(super) fn read(&mut self) -> bool {
        let before = self.addrs.clone();
        if let Ok(a) = (self.source)() {
            self.addrs = Some(a.into_iter().collect());
        }
        self.addrs != before
    }

    /// Reads them when they were never read (or the source changed).
    pub(super) fn read_if_unknown(&mut self) {
        if self.addrs.is_none() {
            self.read();
        }
    }

    /// The addresses as last read.
    pub(super) fn addrs(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.addrs.iter().flatten().copied()
    }
}
