//! The backends' side of the IP-in-IP and GUE modes: loading and attaching
//! the decapsulation program (`balancer decap attach`), which strips the
//! outer headers so the client's packet reaches the backend's stack as it
//! was sent. Its link and its maps are pinned under a directory of their
//! own, so it outlives the command; attaching again replaces the program
//! in the same link.

use std::{net::IpAddr, path::Path};

use aya::{
    maps::{Array, MapData, PerCpuArray},
    programs::{Xdp, XdpMode},
    EbpfLoader,
};
use balancer_common::{map_names, programs, DecapConfig, DECAP_STAT_PASSED, DECAP_STAT_STRIPPED};

use crate::{
    error::{BalancerError, Result},
    links::{self, Attached},
    maps::ip_be,
    netdev,
};

/// The compiled decapsulation program, built by build.rs.
pub static DECAP_PROGRAM: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/balancer-decap"));

/// What the decapsulation program accepts.
#[derive(Clone, Copy, Debug)]
pub struct DecapOptions {
    /// GUE's UDP destination port (the VIPs' `--gue-port`).
    pub gue_port: u16,
    /// Only packets to this outer destination (`None`: any).
    pub local: Option<IpAddr>,
}

/// Attaches the decapsulation program to `iface` (native or generic XDP)
/// with its link pinned at `{pin_dir}/links/{iface}`; an earlier attachment
/// of ours there gets the new program and settings atomically.
///
/// # Errors
/// No such interface; another XDP program on it; the kernel's refusal.
pub fn attach(iface: &str, mode: XdpMode, opts: DecapOptions, pin_dir: &Path) -> Result<Attached> {
    let ifindex = netdev::ifindex(iface)?;
    netdev::mac(iface)?;
    let link_pin = links::link_dir(pin_dir).join(links::pin_name(iface));
    if let Some(now) = netdev::xdp_attached(ifindex)? {
        let ours = links::pinned_link(&link_pin)?;
        if ours.map(|l| l.program_id) != Some(now.program_id) {
            return Err(BalancerError::Invalid {
                what: "interface",
                reason: format!(
                    "{iface} already carries {}; {}, or choose another interface",
                    links::describe_program(now.program_id, now.mode),
                    links::removal_hint(iface, now.program_id)
                ),
            });
        }
    }
    std::fs::create_dir_all(pin_dir).map_err(|source| BalancerError::Io {
        action: format!("creating {}", pin_dir.display()),
        source,
    })?;
    let mut loader = EbpfLoader::new();
    for name in [map_names::DECAP_CONFIG, map_names::DECAP_STATS] {
        loader.map_pin_path(name, pin_dir.join(name));
    }
    let mut ebpf = loader.load(DECAP_PROGRAM).map_err(BalancerError::Load)?;
    let mut config: Array<_, DecapConfig> = ebpf
        .map_mut(map_names::DECAP_CONFIG)
        .ok_or_else(|| missing(map_names::DECAP_CONFIG))?
        .try_into()
        .map_err(|source| BalancerError::Map {
            map: map_names::DECAP_CONFIG,
            action: "open",
            source,
        })?;
    config
        .set(
            0,
            DecapConfig {
                local_addr: opts.local.map_or(balancer_common::Addr::ZERO, ip_be),
                gue_port: opts.gue_port.to_be(),
                _pad: 0,
            },
            0,
        )
        .map_err(|source| BalancerError::Map {
            map: map_names::DECAP_CONFIG,
            action: "write",
            source,
        })?;
    let prog: &mut Xdp = ebpf
        .program_mut(programs::DECAP)
        .ok_or_else(|| missing(programs::DECAP))?
        .try_into()
        .map_err(|source| BalancerError::Program {
            action: "opening the decapsulation program".into(),
            source,
        })?;
    prog.load().map_err(|source| BalancerError::Program {
        action: "loading the decapsulation program (verifier)".into(),
        source,
    })?;
    let (_held, how) = links::attach_pinned(prog, iface, mode, &link_pin)?;
    Ok(how)
}

/// Detaches the decapsulation program from `iface` (removes its link pin);
/// returns whether it was attached.
///
/// # Errors
/// The pin cannot be removed.
pub fn detach(iface: &str, pin_dir: &Path) -> Result<bool> {
    let pin = links::link_dir(pin_dir).join(links::pin_name(iface));
    let was = pin.exists();
    links::unpin(&pin)?;
    Ok(was)
}

/// The decapsulation counters pinned in `pin_dir`: (packets decapsulated,
/// frames passed untouched), summed over CPUs.
///
/// # Errors
/// Nothing pinned there, or a map failure.
pub fn stats(pin_dir: &Path) -> Result<(u64, u64)> {
    let data = MapData::from_pin(pin_dir.join(map_names::DECAP_STATS)).map_err(|source| {
        BalancerError::Map {
            map: map_names::DECAP_STATS,
            action: "open pin",
            source,
        }
    })?;
    let arr: PerCpuArray<MapData, u64> = PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data))
        .map_err(|source| BalancerError::Map {
        map: map_names::DECAP_STATS,
        action: "open",
        source,
    })?;
    let sum = |i: u32| -> Result<u64> {
        Ok(arr
            .get(&i, 0)
            .map_err(|source| BalancerError::Map {
                map: map_names::DECAP_STATS,
                action: "read",
                source,
            })?
            .iter()
            .sum())
    };
    Ok((sum(DECAP_STAT_STRIPPED)?, sum(DECAP_STAT_PASSED)?))
}

fn missing(what: &str) -> BalancerError {
    BalancerError::Invalid {
        what: "object",
        reason: format!("{what} missing from the decapsulation object"),
    }
}
