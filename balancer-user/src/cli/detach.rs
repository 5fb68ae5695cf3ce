//! `balancer detach`: the explicit end of the data path. Stopping the
//! daemon leaves the program attached (its links are pinned); this verb
//! removes it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use balancer::{
    daemon::preflight,
    datapath::{chain, links, maps, netdev},
    model::api::{Request, Response},
    serve::client,
};

/// `balancer detach` options.
#[derive(clap::Args, Debug)]
pub struct DetachArgs {
    /// The pin directory the daemon ran with: with no daemon on the socket,
    /// its links (and with --remove-maps its maps) are removed directly;
    /// with one, it must be that daemon's (default /sys/fs/bpf/p2c-balancer).
    #[arg(long)]
    pin_dir: Option<PathBuf>,
    /// Also remove the pinned maps: flows and counts are gone for good (the
    /// state file is kept, so the next start restores VIPs and backends).
    #[arg(long)]
    remove_maps: bool,
    /// With no daemon running and nothing of this balancer pinned, succeed
    /// and say nothing (a package's removal scripts; without it, that is
    /// an error: "nothing to detach").
    #[arg(long)]
    if_attached: bool,
}

impl DetachArgs {
    /// Asks the daemon on `socket` to detach and stop; with no daemon
    /// running, removes the link pins in the pin directory itself.
    ///
    /// # Errors
    /// The daemon refuses, the pins are not this balancer's, nothing was
    /// attached, or the pins cannot be removed.
    pub async fn run(self, socket: &Path, timeout: std::time::Duration) -> anyhow::Result<()> {
        let req = Request::Detach {
            remove_maps: self.remove_maps,
            pin_dir: self.pin_dir.clone(),
        };
        match client::call_with_timeout(socket, &req, timeout).await {
            Ok(Response::Detached {
                interfaces,
                removed_pins,
            }) => {
                print_done(&interfaces, &removed_pins);
                Ok(())
            }
            Ok(Response::Error { message, .. }) => bail!("{message}"),
            Ok(other) => bail!("unexpected answer {other:?}"),
            Err(e) if e.downcast_ref::<client::NotRunning>().is_some() => self.offline(socket),
            Err(e) => Err(e),
        }
    }

    fn offline(self, socket: &Path) -> anyhow::Result<()> {
        let dir = self
            .pin_dir
            .unwrap_or_else(|| PathBuf::from(super::run::DEFAULT_PIN_DIR));
        let dir = &dir;
        let link_dir = links::link_dir(dir);
        let interfaces = links::pinned_interfaces(&link_dir)?;
        // Components of libxdp chains (`run --xdp-chain libxdp`): each
        // chain rebuilt without the balancer, the others kept.
        let root = std::env::var_os("LIBXDP_BPFFS")
            .map_or_else(|| PathBuf::from("/sys/fs/bpf"), PathBuf::from);
        let mut chained = Vec::new();
        for ifindex in chain::joined(&root, balancer_common::programs::ENTRY) {
            let name = netdev::ifname(ifindex).unwrap_or_else(|| format!("ifindex {ifindex}"));
            if chain::leave(&root, &name, ifindex, balancer_common::programs::ENTRY)? {
                chained.push(format!("{name} (libxdp chain)"));
            }
        }
        if interfaces.is_empty() && !chained.is_empty() && !self.remove_maps {
            print_done(&chained, &[]);
            return Ok(());
        }
        let ours_maps = !maps::present_pins(dir).is_empty()
            && dir.join(balancer_common::map_names::LAYOUT).exists();
        if interfaces.is_empty() && !(self.remove_maps && ours_maps) {
            if self.if_attached {
                return Ok(());
            }
            bail!(
                "nothing to detach: no daemon listens on {} and no link is pinned in {}",
                socket.display(),
                link_dir.display()
            );
        }
        // A daemon serving another socket may own these pins.
        let _lock = preflight::lock_dir(dir, "the pin directory")?;
        // Only this balancer's: each link must run its program, the maps
        // must carry its layout map.
        for i in &interfaces {
            let pin = link_dir.join(links::pin_name(i));
            let name = links::pinned_link(&pin)?
                .and_then(|l| netdev::program_name(l.program_id))
                .unwrap_or_default();
            if name != balancer_common::programs::ENTRY {
                bail!(
                    "the link pinned at {} runs program {name:?}, not this balancer's; nothing \
                     was removed",
                    pin.display()
                );
            }
        }
        if self.remove_maps && !ours_maps {
            bail!(
                "{} holds no maps of this balancer (no {} pin); nothing was removed",
                dir.display(),
                balancer_common::map_names::LAYOUT
            );
        }
        for i in &interfaces {
            links::unpin(&link_dir.join(links::pin_name(i)))?;
        }
        let removed = if self.remove_maps {
            let r = maps::remove_pins(dir)?;
            let _ = std::fs::remove_dir(&link_dir);
            std::fs::remove_dir(dir)
                .with_context(|| format!("removing {} (it holds other files)", dir.display()))?;
            r
        } else {
            Vec::new()
        };
        print_done(&interfaces, &removed);
        Ok(())
    }
}

fn print_done(interfaces: &[String], removed: &[String]) {
    if interfaces.is_empty() {
        println!("no interface was attached");
    } else {
        println!("detached from {}", interfaces.join(", "));
    }
    if !removed.is_empty() {
        println!("removed {} map pins", removed.len());
    }
}
