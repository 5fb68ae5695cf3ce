//! The desired state: VIPs and backends as the operator configured them,
//! its validation, and its persistence (the state file).

use std::{
    collections::{BTreeMap, BTreeSet},
    io::Write as _,
    net::{Ipv4Addr, SocketAddrV4},
    path::Path,
};

use balancer_common::{
    BACKEND_SLOTS, CHOICES_FULL_SCAN, MAX_CHOICES, MAX_VIPS, MAX_VIPS_PER_BACKEND,
};
use serde::{Deserialize, Serialize};

use crate::{
    api::BackendState,
    error::{BalancerError, Result},
};

/// Desired state of one backend.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendConfig {
    /// Address and port.
    pub addr: SocketAddrV4,
    /// Lifecycle state.
    pub state: BackendState,
    /// Slot in the backend arrays.
    pub slot: u32,
    /// Generation of the slot.
    pub generation: u32,
}

/// Desired state of one VIP.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VipConfig {
    /// Address and port.
    pub addr: SocketAddrV4,
    /// Index in the per-VIP arrays.
    pub index: u32,
    /// Choices per new flow.
    pub choices: u32,
    /// Which eligible list is active (0 or 1).
    pub list: u32,
    /// Backends in the order they were added.
    pub backends: Vec<BackendConfig>,
}

impl VipConfig {
    /// Slots of the backends that take new flows, in order.
    pub fn eligible_slots(&self) -> Vec<u32> {
        self.backends
            .iter()
            .filter(|b| b.state == BackendState::Active)
            .map(|b| b.slot)
            .collect()
    }
}

/// Everything the daemon persists to rebuild the same state after a restart.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct State {
    /// VIPs by address.
    pub vips: BTreeMap<SocketAddrV4, VipConfig>,
    /// Generation of each backend slot that has ever been used.
    pub slot_generations: BTreeMap<u32, u32>,
    /// Where the slot allocator continues.
    pub next_slot: u32,
}

/// Where one backend address and port is used: what the data path's
/// backend tables are derived from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendUse {
    /// The VIPs it serves, in address order.
    pub vips: Vec<SocketAddrV4>,
    /// Its slot under each of them (same order).
    pub configs: Vec<BackendConfig>,
}

impl State {
    /// Checks everything the API would have refused: addresses, choices,
    /// VIP indexes, duplicate backends, slots used twice or out of range.
    ///
    /// # Errors
    /// [`BalancerError::Invalid`] naming the first problem.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| BalancerError::Invalid {
            what: "state file",
            reason,
        };
        if self.vips.len() > MAX_VIPS as usize {
            return Err(bad(format!("{} VIPs, at most {MAX_VIPS}", self.vips.len())));
        }
        let mut indexes = BTreeSet::new();
        let mut slots = BTreeSet::new();
        for (addr, u) in self.backend_uses() {
            if u.vips.len() > MAX_VIPS_PER_BACKEND as usize {
                return Err(bad(format!(
                    "backend {addr} serves more than {MAX_VIPS_PER_BACKEND} VIPs"
                )));
            }
        }
        for (addr, v) in &self.vips {
            if *addr != v.addr {
                return Err(bad(format!("VIP {addr} stored as {}", v.addr)));
            }
            check_endpoint("VIP", v.addr).map_err(|e| bad(e.to_string()))?;
            check_choices(v.choices).map_err(|e| bad(format!("VIP {addr}: {e}")))?;
            if v.index >= MAX_VIPS || !indexes.insert(v.index) {
                return Err(bad(format!(
                    "VIP {addr}: index {} out of range or used twice",
                    v.index
                )));
            }
            let mut seen = BTreeSet::new();
            for b in &v.backends {
                check_backend(v.addr, b.addr).map_err(|e| bad(e.to_string()))?;
                if !seen.insert(b.addr) {
                    return Err(bad(format!("VIP {addr}: backend {} listed twice", b.addr)));
                }
                if b.slot >= BACKEND_SLOTS || !slots.insert(b.slot) {
                    return Err(bad(format!(
                        "backend {}: slot {} out of range or used twice",
                        b.addr, b.slot
                    )));
                }
            }
        }
        Ok(())
    }

    /// The VIP at `addr`.
    ///
    /// # Errors
    /// [`BalancerError::UnknownVip`].
    pub fn vip(&self, addr: &SocketAddrV4) -> Result<&VipConfig> {
        self.vips
            .get(addr)
            .ok_or(BalancerError::UnknownVip { vip: *addr })
    }

    /// The VIP at `addr`, mutable.
    ///
    /// # Errors
    /// [`BalancerError::UnknownVip`].
    pub fn vip_mut(&mut self, addr: &SocketAddrV4) -> Result<&mut VipConfig> {
        self.vips
            .get_mut(addr)
            .ok_or(BalancerError::UnknownVip { vip: *addr })
    }

    /// Backend `b` of VIP `vip`, mutable.
    ///
    /// # Errors
    /// [`BalancerError::UnknownVip`], [`BalancerError::UnknownBackend`].
    pub fn backend_mut(
        &mut self,
        vip: &SocketAddrV4,
        b: &SocketAddrV4,
    ) -> Result<&mut BackendConfig> {
        self.vip_mut(vip)?
            .backends
            .iter_mut()
            .find(|x| x.addr == *b)
            .ok_or(BalancerError::UnknownBackend {
                vip: *vip,
                backend: *b,
            })
    }

    /// Every backend address and port with the VIPs it serves.
    pub fn backend_uses(&self) -> BTreeMap<SocketAddrV4, BackendUse> {
        let mut m: BTreeMap<SocketAddrV4, BackendUse> = BTreeMap::new();
        for v in self.vips.values() {
            for b in &v.backends {
                let u = m.entry(b.addr).or_default();
                u.vips.push(v.addr);
                u.configs.push(b.clone());
            }
        }
        m
    }

    /// The VIP indexes each backend host (address, any port) serves.
    pub fn backend_hosts(&self) -> BTreeMap<Ipv4Addr, Vec<u32>> {
        let mut m: BTreeMap<Ipv4Addr, Vec<u32>> = BTreeMap::new();
        for v in self.vips.values() {
            for b in &v.backends {
                m.entry(*b.addr.ip()).or_default().push(v.index);
            }
        }
        m
    }

    /// Every backend slot in use, with its generation.
    pub fn slots(&self) -> BTreeMap<u32, u32> {
        self.vips
            .values()
            .flat_map(|v| v.backends.iter().map(|b| (b.slot, b.generation)))
            .collect()
    }

    /// Picks `n` free slots, continuing after the last one handed out so a
    /// freed slot is reused as late as possible.
    ///
    /// # Errors
    /// [`BalancerError::Full`] when fewer than `n` are free.
    pub fn allocate_slots(&self, n: usize) -> Result<Vec<u32>> {
        let used = self.slots();
        let free: Vec<u32> = (0..BACKEND_SLOTS)
            .map(|i| (self.next_slot + i) % BACKEND_SLOTS)
            .filter(|s| !used.contains_key(s))
            .take(n)
            .collect();
        if free.len() < n {
            return Err(BalancerError::Full {
                what: "backend slot table",
                capacity: BACKEND_SLOTS,
            });
        }
        Ok(free)
    }
}

/// Validates a `choices` value: 1..=16, or [`CHOICES_FULL_SCAN`].
///
/// # Errors
/// [`BalancerError::Invalid`] otherwise.
pub fn check_choices(choices: u32) -> Result<()> {
    if (1..=MAX_CHOICES).contains(&choices) || choices == CHOICES_FULL_SCAN {
        Ok(())
    } else {
        Err(BalancerError::Invalid {
            what: "choices",
            reason: format!("{choices} is not in 1..={MAX_CHOICES} (or \"all\" for a full scan)"),
        })
    }
}

/// Validates a VIP or backend address: unicast, not loopback, port not 0.
///
/// # Errors
/// [`BalancerError::Invalid`] naming `what`.
pub fn check_endpoint(what: &'static str, a: SocketAddrV4) -> Result<()> {
    if a.port() == 0 {
        return Err(BalancerError::Invalid {
            what,
            reason: format!("{a}: port 0"),
        });
    }
    if a.ip().is_unspecified() || a.ip().is_broadcast() || a.ip().is_multicast() {
        return Err(BalancerError::Invalid {
            what,
            reason: format!("{a}: not a unicast address"),
        });
    }
    if a.ip().is_loopback() {
        return Err(BalancerError::Invalid {
            what,
            reason: format!("{a}: a loopback address never reaches XDP on a NIC"),
        });
    }
    Ok(())
}

/// Validates a backend of `vip`.
///
/// # Errors
/// [`BalancerError::Invalid`].
pub fn check_backend(vip: SocketAddrV4, b: SocketAddrV4) -> Result<()> {
    check_endpoint("backend", b)?;
    if b == vip {
        return Err(BalancerError::Invalid {
            what: "backend",
            reason: format!("{b} is the VIP itself"),
        });
    }
    Ok(())
}

/// Reads a persisted state file; a missing file is an empty state.
///
/// # Errors
/// Unreadable or unparsable file.
pub fn read_state(path: &Path) -> Result<Option<State>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| BalancerError::Invalid {
                what: "state file",
                reason: format!("{}: {e}", path.display()),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(BalancerError::Io {
            action: format!("reading {}", path.display()),
            source,
        }),
    }
}

/// Writes the state file atomically and durably: a temporary file beside
/// it, fsync, rename over the old one, fsync of the directory.
///
/// # Errors
/// File system failure (the old file is then intact).
pub fn write_state(path: &Path, state: &State) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(state).map_err(|e| BalancerError::Invalid {
        what: "state",
        reason: e.to_string(),
    })?;
    let io = |action: String| move |source| BalancerError::Io { action, source };
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io(format!(
        "creating a temporary file in {}",
        dir.display()
    )))?;
    tmp.write_all(&bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(io(format!("writing {}", tmp.path().display())))?;
    tmp.persist(path).map_err(|e| BalancerError::Io {
        action: format!("renaming to {}", path.display()),
        source: e.error,
    })?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(format!("syncing {}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_bounds() {
        assert!(check_choices(0).is_err());
        assert!(check_choices(1).is_ok());
        assert!(check_choices(16).is_ok());
        assert!(check_choices(17).is_err());
        assert!(check_choices(CHOICES_FULL_SCAN).is_ok());
    }

    #[test]
    fn endpoints() {
        assert!(check_endpoint("VIP", "10.0.0.10:80".parse().unwrap()).is_ok());
        assert!(check_endpoint("VIP", "10.0.0.10:0".parse().unwrap()).is_err());
        assert!(check_endpoint("VIP", "0.0.0.0:80".parse().unwrap()).is_err());
        assert!(check_endpoint("VIP", "224.0.0.1:80".parse().unwrap()).is_err());
    }

    #[test]
    fn state_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(read_state(&path).unwrap(), None);
        let s = State {
            next_slot: 7,
            ..Default::default()
        };
        write_state(&path, &s).unwrap();
        assert_eq!(read_state(&path).unwrap(), Some(s));
        // Only the state file is left: no temporary files beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        std::fs::write(&path, b"{not json").unwrap();
        assert!(read_state(&path).is_err());
    }

    fn vip(addr: &str, index: u32, backends: &[(&str, u32)]) -> VipConfig {
        VipConfig {
            addr: addr.parse().unwrap(),
            index,
            choices: 2,
            list: 0,
            backends: backends
                .iter()
                .map(|(a, slot)| BackendConfig {
                    addr: a.parse().unwrap(),
                    state: BackendState::Active,
                    slot: *slot,
                    generation: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn backend_uses_and_hosts() {
        let mut s = State::default();
        for v in [
            vip(
                "10.0.0.40:80",
                0,
                &[("10.0.2.36:8080", 0), ("10.0.2.37:8080", 1)],
            ),
            vip(
                "10.0.0.41:80",
                3,
                &[("10.0.2.36:8080", 2), ("10.0.2.36:9090", 4)],
            ),
        ] {
            s.vips.insert(v.addr, v);
        }
        s.validate().unwrap();
        let uses = s.backend_uses();
        let shared = &uses[&"10.0.2.36:8080".parse().unwrap()];
        assert_eq!(shared.vips.len(), 2);
        assert_eq!(
            shared.configs.iter().map(|c| c.slot).collect::<Vec<_>>(),
            [0, 2]
        );
        assert_eq!(uses[&"10.0.2.37:8080".parse().unwrap()].vips.len(), 1);
        let hosts = s.backend_hosts();
        assert_eq!(hosts[&"10.0.2.36".parse::<Ipv4Addr>().unwrap()], [0, 3, 3]);
        assert_eq!(hosts[&"10.0.2.37".parse::<Ipv4Addr>().unwrap()], [0]);
        assert_eq!(s.allocate_slots(2).unwrap(), [3, 5]);
    }
}
