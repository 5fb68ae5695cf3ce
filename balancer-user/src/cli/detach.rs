//! `balancer detach`: the explicit end of the data path. Stopping the
//! daemon leaves the program attached (its links are pinned); this verb
//! removes it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use balancer::{
    api::{Request, Response},
    client, links, maps, preflight,
};

/// `balancer detach` options.
#[derive(clap::Args, Debug)]
pub struct DetachArgs {
    /// The pin directory the daemon ran with (used when no daemon is
    /// running: its pinned links are removed directly).
    #[arg(long, default_value = super::run::DEFAULT_PIN_DIR)]
    pin_dir: PathBuf,
    /// Also remove the pinned maps: flows and counts are gone for good (the
    /// state file is kept, so the next start restores VIPs and backends).
    #[arg(long)]
    remove_maps: bool,
}

impl DetachArgs {
    /// Asks the daemon on `socket` to detach and stop; with no daemon
    /// running, removes the link pins in the pin directory itself.
    ///
    /// # Errors
    /// The daemon refuses, or the pins cannot be removed.
    pub async fn run(self, socket: &Path, timeout: std::time::Duration) -> anyhow::Result<()> {
        let req = Request::Detach {
            remove_maps: self.remove_maps,
        };
        match client::call_with_timeout(socket, &req, timeout).await {
            Ok(Response::Detached {
                interfaces,
                removed_pins,
            }) => {
                print_done(&interfaces, &removed_pins);
                Ok(())
            }
            Ok(Response::Error { message }) => bail!("{message}"),
            Ok(other) => bail!("unexpected answer {other:?}"),
            Err(e) if e.downcast_ref::<client::NotRunning>().is_some() => self.offline(),
            Err(e) => Err(e),
        }
    }

    fn offline(self) -> anyhow::Result<()> {
        let dir = &self.pin_dir;
        if !dir.exists() {
            println!("nothing pinned in {}: nothing to detach", dir.display());
            return Ok(());
        }
        // A daemon serving another socket may own these pins.
        let _lock = preflight::lock_dir(dir, "the pin directory")?;
        let link_dir = links::link_dir(dir);
        let interfaces = links::pinned_interfaces(&link_dir)?;
        for i in &interfaces {
            links::unpin(&link_dir.join(i))?;
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
