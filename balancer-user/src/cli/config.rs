//! `balancer apply` and `balancer export`: the declarative configuration
//! (see `balancer::model::config` for the file's form).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use balancer::{
    model::{
        api::{Request, Response},
        config,
    },
    serve::client,
};

/// `balancer apply` options.
#[derive(clap::Args, Debug)]
pub struct ApplyArgs {
    /// The configuration file (TOML; `-` reads standard input).
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Only show what would change.
    #[arg(long)]
    dry_run: bool,
    /// Let a file without any `[[vip]]` remove every running VIP (refused
    /// otherwise: an empty or truncated file is more often a mistake).
    #[arg(long)]
    allow_empty: bool,
    /// Make the running state exactly the file: drains, weights and
    /// backends changed at runtime that the file did not change are undone
    /// too. Without it, what the file changed since it was last applied is
    /// applied and the rest keeps its running value (listed with `=`).
    #[arg(long)]
    exact: bool,
}

/// `balancer export` options.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// Write to this file instead of standard output (replaced whole, or
    /// left as it was).
    #[arg(short = 'o', long = "output")]
    output: Option<PathBuf>,
}

/// The file's configuration and its text.
fn read(file: &Path) -> anyhow::Result<(config::Config, String)> {
    let text = if file == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading standard input")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
    };
    // Checked here first: a mistake is named with its file, line and
    // column, and the daemon is not asked at all.
    let c = config::read(&text)
        .map_err(|e| anyhow::Error::new(e.in_file(file.display().to_string())))?;
    Ok((c, text))
}

/// The daemon's refusal of a file's change, with the file, and the line
/// and column of the refused key or of the table of the VIP or backend it
/// names (`balancer.toml:14:1: ...`; a backend named without its VIP: its
/// first listing); the file alone when the answer names neither.
fn located(message: &str, r: &Response, file: &Path, text: &str) -> String {
    let Response::Error {
        vip,
        backend,
        field,
        ..
    } = r
    else {
        return message.to_string();
    };
    let path: Vec<&str> = field
        .as_deref()
        .map_or(Vec::new(), |f| f.split('.').collect());
    let backend: Option<std::net::SocketAddr> = backend.as_deref().and_then(|b| b.parse().ok());
    let vip = vip
        .as_deref()
        .and_then(|v| v.parse().ok())
        .or_else(|| backend.and_then(|b| config::vip_of_backend(text, b)));
    let at = vip.and_then(|v| config::locate_path(text, Some(v), backend, &path));
    match at {
        Some((line, column)) => format!("{}:{line}:{column}: {message}", file.display()),
        None => format!("{}: {message}", file.display()),
    }
}

fn applied(r: Response, file: &Path, text: &str) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    match r {
        Response::Applied {
            changes,
            kept,
            warning,
            ..
        } => {
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            Ok((changes, kept))
        }
        Response::Error { ref message, .. } => bail!("{}", located(message, &r, file, text)),
        other => bail!("unexpected answer {other:?}"),
    }
}

/// `1 change`, `2 changes`.
fn changes_word(n: usize) -> String {
    if n == 1 {
        "1 change".into()
    } else {
        format!("{n} changes")
    }
}

impl ApplyArgs {
    /// Shows the changes that make the daemon's state match the file, then
    /// (without `--dry-run`) makes them: all of them, or none.
    ///
    /// # Errors
    /// A file that does not parse (its line named), a change the daemon
    /// refuses (nothing is applied), no daemon.
    pub async fn run(self, socket: &Path, timeout: std::time::Duration) -> anyhow::Result<()> {
        let (desired, text) = read(&self.file)?;
        let request = |dry_run| Request::Apply {
            config: desired.clone(),
            dry_run,
            allow_empty: self.allow_empty,
            exact: self.exact,
            source: Some(config::source_name(&self.file)),
        };
        let (plan, kept) = applied(
            client::call_with_timeout(socket, &request(true), timeout).await?,
            &self.file,
            &text,
        )?;
        for line in &kept {
            println!("{line}");
        }
        let nothing = || {
            println!(
                "nothing to change: the running state matches {}{}",
                self.file.display(),
                if kept.is_empty() {
                    ""
                } else {
                    " but for the runtime values kept above (`--exact` undoes them)"
                }
            )
        };
        if plan.is_empty() && self.dry_run {
            nothing();
            return Ok(());
        }
        for line in &plan {
            println!("{line}");
        }
        if self.dry_run {
            println!("{} (dry run: nothing applied)", changes_word(plan.len()));
            return Ok(());
        }
        let (done, _) = applied(
            client::call_with_timeout(socket, &request(false), timeout).await?,
            &self.file,
            &text,
        )?;
        if done.is_empty() {
            // Applied all the same: the file becomes the base of the next
            // apply's merge.
            nothing();
            return Ok(());
        }
        if done != plan {
            // The state changed between the two requests: say what was
            // really done.
            println!("the running state changed meanwhile; applied instead:");
            for line in &done {
                println!("{line}");
            }
        }
        println!("applied {}", changes_word(done.len()));
        Ok(())
    }
}

impl ExportArgs {
    /// Writes the daemon's running state in the configuration's form.
    ///
    /// # Errors
    /// No daemon; the output file cannot be written.
    pub async fn run(self, socket: &Path, timeout: std::time::Duration) -> anyhow::Result<()> {
        let c = match client::call_with_timeout(socket, &Request::Export, timeout).await? {
            Response::Config { config } => config,
            Response::Error { message, .. } => bail!("{message}"),
            other => bail!("unexpected answer {other:?}"),
        };
        let text = config::to_toml(&c)?;
        match &self.output {
            None => print!("{text}"),
            Some(path) => {
                let dir = path
                    .parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .unwrap_or(Path::new("."));
                let mut tmp = tempfile::NamedTempFile::new_in(dir)
                    .with_context(|| format!("creating a file in {}", dir.display()))?;
                std::io::Write::write_all(&mut tmp, text.as_bytes())?;
                tmp.persist(path)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "[[vip]]\naddress = \"10.0.0.10:80\"\n\n[[vip.backend]]\naddress = \"10.0.2.10:80\"\n\n[[vip]]\naddress = \"10.0.0.11:80\"\n\n[[vip.backend]]\naddress = \"10.0.2.10:80\"\nweight = 2\n";

    fn refused(vip: Option<&str>, backend: Option<&str>, field: Option<&str>) -> Response {
        Response::Error {
            message: "change 2 of 4 (+ backend 10.0.2.10:80 of 10.0.0.11:80) refused; nothing \
                      was applied: list of VIPs one backend address serves is full (4 entries)"
                .into(),
            status: 409,
            vip: vip.map(Into::into),
            backend: backend.map(Into::into),
            field: field.map(Into::into),
            reason: None,
        }
    }

    /// The daemon's refusal of a file names the file, and the line of the
    /// table or key it is about, whatever the answer names.
    #[test]
    fn the_daemons_refusal_of_a_file_names_the_file_and_the_line() {
        let file = Path::new("/etc/p2c-balancer/balancer.toml");
        let at = |r: Response| match &r {
            Response::Error { message, .. } => located(message, &r, file, FILE),
            _ => unreachable!(),
        };
        // A VIP's backend: its `[[vip.backend]]` table (line 10).
        let got = at(refused(Some("10.0.0.11:80"), Some("10.0.2.10:80"), None));
        assert!(
            got.starts_with("/etc/p2c-balancer/balancer.toml:10:1: change 2"),
            "{got}"
        );
        // A key of it: the key's line.
        let got = at(refused(
            Some("10.0.0.11:80"),
            Some("10.0.2.10:80"),
            Some("weight"),
        ));
        assert!(
            got.starts_with("/etc/p2c-balancer/balancer.toml:12:1: "),
            "{got}"
        );
        // A backend alone: its first table.
        let got = at(refused(None, Some("10.0.2.10:80"), None));
        assert!(
            got.starts_with("/etc/p2c-balancer/balancer.toml:4:1: "),
            "{got}"
        );
        // Nothing named: the file still is.
        let got = at(refused(None, None, None));
        assert!(
            got.starts_with("/etc/p2c-balancer/balancer.toml: change 2"),
            "{got}"
        );
    }
}
