//! The backends' side of the IP-in-IP and GUE modes: loading and attaching
//! the decapsulation program (`balancer decap attach`), which strips the
//! outer headers so the client's packet reaches the backend's stack as it
//! was sent. Its link and its maps are pinned under a directory of their
//! own, so it outlives the command; attaching again replaces the program
//! in the same link.
//!
//! It decapsulates only tunnels whose outer source is one of the
//! balancers' (`--source`, held in `DECAP_SOURCES`): anyone else's tunnel
//! would hand the backend's stack a packet with a source of the sender's
//! choosing. Those are dropped and counted.

use std::{collections::BTreeSet, net::IpAddr, path::Path};

use aya::{
    maps::{lpm_trie::Key, Array, LpmTrie, MapData, PerCpuArray},
    programs::{Xdp, XdpMode},
    Ebpf, EbpfLoader,
};
use balancer_common::{
    map_names, programs, Addr, DecapConfig, DECAP_STATS_LEN, DECAP_STAT_CHANCE_KERNEL,
    DECAP_STAT_CHANCE_LAST, DECAP_STAT_CHANCE_LOCAL, DECAP_STAT_CHANCE_NO_ROUTE,
    DECAP_STAT_CHANCE_SENT, DECAP_STAT_PASSED, DECAP_STAT_REFUSED_SOURCE, DECAP_STAT_STRIPPED,
    MAX_DECAP_SOURCES,
};

use crate::{
    datapath::{
        links::{self, Attached},
        netdev,
    },
    model::{
        error::{BalancerError, DatapathError, Result},
        prefix::ip_be,
    },
};

/// The compiled decapsulation program, built by build.rs.
pub static DECAP_PROGRAM: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/balancer-decap"));

/// Why `decap attach` wants at least one `--source`.
pub const NO_SOURCE: &str = "at least one --source ADDR[/LEN] is required (the balancers' \
     outer source addresses, the VIPs' --encap-source): a decapsulator open to every source \
     lets anyone inject packets with forged inner sources into this backend";

pub use crate::model::prefix::SourcePrefix;

/// What the decapsulation program accepts.
#[derive(Clone, Debug)]
pub struct DecapOptions {
    /// GUE's UDP destination port (the VIPs' `--gue-port`).
    pub gue_port: u16,
    /// Only packets to this outer destination (`None`: any).
    pub local: Option<IpAddr>,
    /// The outer sources tunnels are accepted from (at least one).
    pub sources: Vec<SourcePrefix>,
}

/// Makes the `DECAP_SOURCES` map of a loaded decapsulation object hold
/// exactly `sources`: the new entries go in before the stale ones go out,
/// so a source kept across an update is never refused in between.
///
/// # Errors
/// No sources (see [`NO_SOURCE`]), too many, or a map failure.
pub fn set_sources(ebpf: &mut Ebpf, sources: &[SourcePrefix]) -> Result<()> {
    if sources.is_empty() {
        return Err(BalancerError::Invalid {
            what: "decap sources",
            reason: NO_SOURCE.into(),
        });
    }
    let want: BTreeSet<SourcePrefix> = sources.iter().copied().collect();
    if want.len() > MAX_DECAP_SOURCES as usize {
        return Err(BalancerError::Full {
            what: "the decapsulation source list",
            capacity: MAX_DECAP_SOURCES,
        });
    }
    let map_err = |action| {
        move |source| {
            BalancerError::from(DatapathError::Map {
                map: map_names::DECAP_SOURCES,
                action,
                source,
            })
        }
    };
    let mut trie: LpmTrie<_, Addr, u8> = ebpf
        .map_mut(map_names::DECAP_SOURCES)
        .ok_or_else(|| missing(map_names::DECAP_SOURCES))?
        .try_into()
        .map_err(map_err("open"))?;
    let keys: BTreeSet<(u32, Addr)> = want
        .iter()
        .map(|p| {
            let k = p.key();
            (k.prefix_len(), k.data())
        })
        .collect();
    for &(bits, addr) in &keys {
        trie.insert(&Key::new(bits, addr), 1, 0)
            .map_err(map_err("write"))?;
    }
    let stale: Vec<Key<Addr>> = trie
        .keys()
        .filter_map(|k| k.ok())
        .filter(|k| !keys.contains(&(k.prefix_len(), k.data())))
        .collect();
    for k in &stale {
        trie.remove(k).map_err(map_err("remove"))?;
    }
    Ok(())
}

/// Attaches the decapsulation program to `iface` (native or generic XDP)
/// with its link pinned at `{pin_dir}/links/{iface}`; an earlier attachment
/// of ours there gets the new program and settings atomically.
///
/// # Errors
/// No such interface; another XDP program on it; the kernel's refusal.
pub fn attach(iface: &str, mode: XdpMode, opts: DecapOptions, pin_dir: &Path) -> Result<Attached> {
    if opts.sources.is_empty() {
        return Err(BalancerError::Invalid {
            what: "decap sources",
            reason: NO_SOURCE.into(),
        });
    }
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
    drop_short_stats_pin(pin_dir)?;
    let mut loader = EbpfLoader::new();
    for name in [
        map_names::DECAP_CONFIG,
        map_names::DECAP_STATS,
        map_names::DECAP_SOURCES,
    ] {
        loader.map_pin_path(name, pin_dir.join(name));
    }
    let mut ebpf = loader
        .load(DECAP_PROGRAM)
        .map_err(|e| BalancerError::from(DatapathError::Load(e)))?;
    set_sources(&mut ebpf, &opts.sources)?;
    let mut config: Array<_, DecapConfig> = ebpf
        .map_mut(map_names::DECAP_CONFIG)
        .ok_or_else(|| missing(map_names::DECAP_CONFIG))?
        .try_into()
        .map_err(|source| {
            BalancerError::from(DatapathError::Map {
                map: map_names::DECAP_CONFIG,
                action: "open",
                source,
            })
        })?;
    config
        .set(
            0,
            DecapConfig {
                local_addr: opts.local.map_or(Addr::ZERO, ip_be),
                gue_port: opts.gue_port.to_be(),
                _pad: 0,
            },
            0,
        )
        .map_err(|source| {
            BalancerError::from(DatapathError::Map {
                map: map_names::DECAP_CONFIG,
                action: "write",
                source,
            })
        })?;
    let prog: &mut Xdp = ebpf
        .program_mut(programs::DECAP)
        .ok_or_else(|| missing(programs::DECAP))?
        .try_into()
        .map_err(|source| {
            BalancerError::from(DatapathError::Program {
                action: "opening the decapsulation program".into(),
                source,
            })
        })?;
    prog.load().map_err(|source| {
        BalancerError::from(DatapathError::Program {
            action: "loading the decapsulation program (verifier)".into(),
            source,
        })
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

/// A counter map pinned by an older version, with fewer counters than
/// this program writes, is unpinned so the load creates a full one (its
/// counts restart): the kernel would refuse the new indexes silently.
fn drop_short_stats_pin(pin_dir: &Path) -> Result<()> {
    let pin = pin_dir.join(map_names::DECAP_STATS);
    let Ok(data) = MapData::from_pin(&pin) else {
        return Ok(());
    };
    let short = data.info().is_ok_and(|i| i.max_entries() < DECAP_STATS_LEN);
    drop(data);
    if short {
        std::fs::remove_file(&pin).map_err(|source| BalancerError::Io {
            action: format!("removing the outdated {}", pin.display()),
            source,
        })?;
    }
    Ok(())
}

/// The decapsulation program's counters, summed over CPUs, and the
/// sources it accepts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DecapStats {
    /// Packets decapsulated.
    pub stripped: u64,
    /// Frames passed untouched (not tunnels for us).
    pub passed: u64,
    /// Tunnels for us from an outer source not accepted, dropped.
    pub refused_source: u64,
    /// Second-chance tunnels whose segment has a socket here: kept.
    pub chance_local: u64,
    /// Second-chance tunnels sent on to their next candidate by XDP.
    pub chance_sent: u64,
    /// Second-chance tunnels sent on through this host's kernel (no
    /// neighbour entry for the next hop yet).
    pub chance_kernel: u64,
    /// Second-chance tunnels with no hops left: kept whatever the kernel
    /// holds.
    pub chance_last: u64,
    /// Second-chance tunnels with no route to their next candidate: kept.
    pub chance_no_route: u64,
    /// The accepted outer sources.
    pub sources: Vec<SourcePrefix>,
}

/// The decapsulation counters and sources pinned in `pin_dir`.
///
/// # Errors
/// Nothing pinned there, or a map failure.
pub fn stats(pin_dir: &Path) -> Result<DecapStats> {
    let data = MapData::from_pin(pin_dir.join(map_names::DECAP_STATS)).map_err(|source| {
        BalancerError::from(DatapathError::Map {
            map: map_names::DECAP_STATS,
            action: "open pin",
            source,
        })
    })?;
    let arr: PerCpuArray<MapData, u64> = PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data))
        .map_err(|source| {
        BalancerError::from(DatapathError::Map {
            map: map_names::DECAP_STATS,
            action: "open",
            source,
        })
    })?;
    let sum = |i: u32| -> Result<u64> {
        Ok(arr
            .get(&i, 0)
            .map_err(|source| {
                BalancerError::from(DatapathError::Map {
                    map: map_names::DECAP_STATS,
                    action: "read",
                    source,
                })
            })?
            .iter()
            .sum())
    };
    let mut sources = Vec::new();
    if let Ok(data) = MapData::from_pin(pin_dir.join(map_names::DECAP_SOURCES)) {
        let trie: LpmTrie<MapData, Addr, u8> = LpmTrie::try_from(aya::maps::Map::LpmTrie(data))
            .map_err(|source| {
                BalancerError::from(DatapathError::Map {
                    map: map_names::DECAP_SOURCES,
                    action: "open",
                    source,
                })
            })?;
        sources = trie
            .keys()
            .filter_map(|k| k.ok().as_ref().and_then(SourcePrefix::from_key))
            .collect();
        sources.sort();
    }
    Ok(DecapStats {
        stripped: sum(DECAP_STAT_STRIPPED)?,
        passed: sum(DECAP_STAT_PASSED)?,
        refused_source: sum(DECAP_STAT_REFUSED_SOURCE)?,
        chance_local: sum(DECAP_STAT_CHANCE_LOCAL)?,
        chance_sent: sum(DECAP_STAT_CHANCE_SENT)?,
        chance_kernel: sum(DECAP_STAT_CHANCE_KERNEL)?,
        chance_last: sum(DECAP_STAT_CHANCE_LAST)?,
        chance_no_route: sum(DECAP_STAT_CHANCE_NO_ROUTE)?,
        sources,
    })
}

fn missing(what: &str) -> BalancerError {
    BalancerError::Invalid {
        what: "object",
        reason: format!("{what} missing from the decapsulation object"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<SourcePrefix, String> {
        s.parse()
    }

    #[test]
    fn sources_parse_in_both_families() {
        let one = p("10.0.2.1").unwrap();
        assert_eq!(one.len, 32);
        assert_eq!(one.to_string(), "10.0.2.1/32");
        assert_eq!(one.key().prefix_len(), 128);
        assert_eq!(
            one.key().data(),
            Addr::from(std::net::Ipv4Addr::new(10, 0, 2, 1))
        );
        let net = p("10.0.2.0/24").unwrap();
        assert_eq!(net.key().prefix_len(), 96 + 24);
        let six = p("2001:db8:2::1").unwrap();
        assert_eq!((six.len, six.key().prefix_len()), (128, 128));
        let six_net = p("2001:db8:2::/48").unwrap();
        assert_eq!(six_net.key().prefix_len(), 48);
        for s in [
            "10.0.2.1",
            "10.0.2.0/24",
            "0.0.0.0/0",
            "2001:db8:2::/48",
            "::/0",
        ] {
            let q = p(s).unwrap();
            assert_eq!(SourcePrefix::from_key(&q.key()), Some(q), "{s}");
        }
    }

    #[test]
    fn bad_sources_are_refused_with_the_reason() {
        assert!(p("10.0.2.1/33").unwrap_err().contains("0..=32"));
        assert!(p("2001:db8::/129").unwrap_err().contains("0..=128"));
        assert!(p("10.0.2.1/24").unwrap_err().contains("10.0.2.0/24"));
        assert!(p("eth0").unwrap_err().contains("not an IPv4 or IPv6"));
        assert!(p("10.0.2.0/x").is_err());
    }

    #[test]
    fn attach_without_sources_is_refused_before_touching_anything() {
        let err = attach(
            "no-such-interface-xyz",
            XdpMode::Default,
            DecapOptions {
                gue_port: 6080,
                local: None,
                sources: Vec::new(),
            },
            Path::new("/nonexistent/pins"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("--source"), "{err}");
        assert!(err.contains("forged inner sources"), "{err}");
    }
}
