//! Running as a service: the build's identity (`--version`, `balancer
//! version`), shell completions and man pages generated from the clap
//! definitions.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use balancer::{
    model::api::{Request, Response, VersionView},
    serve::client,
};

/// `X.Y.Z (commit C)` for `-V`.
pub fn version() -> &'static str {
    let v = VersionView::this_build();
    format!("{} (commit {})", v.version, v.commit).leak()
}

/// `--version`: the version, the commit and the layout fingerprint of the
/// maps the program shares with the daemon.
pub fn long_version() -> &'static str {
    let v = VersionView::this_build();
    format!(
        "{}\ncommit {}\nlayout fingerprint {}",
        v.version, v.commit, v.fingerprint
    )
    .leak()
}

/// Prints this CLI's build and the daemon's; warns when their layouts
/// differ (a restart with this build then starts with empty maps).
///
/// # Errors
/// The daemon answers with an error.
pub async fn print_versions(socket: &Path, timeout: std::time::Duration) -> anyhow::Result<()> {
    let me = VersionView::this_build();
    println!(
        "cli     {} commit {} fingerprint {}",
        me.version, me.commit, me.fingerprint
    );
    match client::call_with_timeout(socket, &Request::Version, timeout).await {
        Ok(Response::Version(d)) => {
            println!(
                "daemon  {} commit {} fingerprint {}",
                d.version, d.commit, d.fingerprint
            );
            if d.fingerprint != me.fingerprint {
                eprintln!(
                    "warning: the daemon's map layout differs from this build's: starting this \
                     build's daemon would not keep the pinned maps (flows, counts)"
                );
            }
            Ok(())
        }
        Ok(Response::Error { message, .. }) => bail!("{message}"),
        Ok(other) => bail!("unexpected answer {other:?}"),
        Err(e) if e.downcast_ref::<client::NotRunning>().is_some() => {
            println!("daemon  not running");
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// `balancer completions` options.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

impl CompletionsArgs {
    /// Prints the completion script of `cmd` for the shell.
    ///
    /// # Errors
    /// None in practice (writing to standard output).
    pub fn run(self, mut cmd: clap::Command) -> anyhow::Result<()> {
        let name = cmd.get_name().to_string();
        clap_complete::generate(self.shell, &mut cmd, name, &mut std::io::stdout());
        Ok(())
    }
}

/// `balancer man` options.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Write `balancer.1` and one page per verb (`balancer-vip-add.1`, …)
    /// here; without it the main page goes to standard output.
    #[arg(long)]
    out_dir: Option<PathBuf>,
}

impl ManArgs {
    /// Pages written to `dir` (the tests' way in).
    #[cfg(test)]
    pub fn for_dir(dir: PathBuf) -> ManArgs {
        ManArgs { out_dir: Some(dir) }
    }

    /// Renders the man pages of `cmd`.
    ///
    /// # Errors
    /// The directory cannot be written.
    pub fn run(self, cmd: clap::Command) -> anyhow::Result<()> {
        let Some(dir) = self.out_dir else {
            clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?;
            return Ok(());
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut written = Vec::new();
        write_pages(&cmd.clone(), &dir, &mut written)?;
        for w in written {
            println!("{}", w.display());
        }
        Ok(())
    }
}

/// Writes the page of `cmd` (named after its path of verbs) and of each
/// of its verbs.
fn write_pages(cmd: &clap::Command, dir: &Path, written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut cmd = cmd.clone();
    cmd.build();
    write_tree(&cmd, cmd.get_name().to_string(), dir, written)
}

fn write_tree(
    cmd: &clap::Command,
    name: String,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let page = cmd.clone().name(name.clone().leak() as &str);
    let path = dir.join(format!("{name}.1"));
    let mut out = Vec::new();
    clap_mangen::Man::new(page).render(&mut out)?;
    std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_tree(sub, format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}
