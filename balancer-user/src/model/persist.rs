//! The state file as the daemon keeps it: written after every change,
//! watched while the daemon runs, and owed (retried) when a write fails.
//!
//! What the running daemon holds is the truth; the file is its copy for
//! the next start. So:
//! - a file deleted or replaced while the daemon runs is noticed by
//!   [`StateFile::check`] (called every second) and written again, and the
//!   file is written once more at a clean stop;
//! - a write that fails (a full or read-only disk) leaves the write owed:
//!   [`StateFile::check`] retries it until it succeeds, and the failure is
//!   logged at error level and shown by `balancer stats`
//!   ([`StateFile::owed`]). Whether the change that could not be written
//!   stays applied is the caller's choice (`control::handle`: changes that
//!   take traffic away from a backend stay; others are rolled back).

use std::{
    collections::BTreeMap,
    io::Write as _,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::model::{
    config::Config,
    error::{BalancerError, Result},
    retired::RetiredRecord,
    state::{dir_of, State},
};

/// What the state file holds: the [`State`] (its fields at the top level
/// of the JSON object, as before the other two were added), the
/// configuration file as last applied (key `applied`), and what is
/// remembered of removed VIPs and backends (key `retired`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Persisted {
    /// VIPs, backends, slots, servers, timeouts.
    pub state: State,
    /// Each configuration file as it was last applied (`run --config`,
    /// `apply`), by its absolute path (`-`: standard input): the base of
    /// that file's next three-way merge ([`crate::model::config::merge`]), so
    /// that what the file does not change keeps its running value.
    pub applied: BTreeMap<String, Config>,
    /// What was removed and is still remembered for its flows (VIP
    /// tombstones, backends that left a VIP), with when: kept across a
    /// restart so the maps' entries for them are expected, and expire on
    /// time ([`crate::model::retired::Retired`]).
    pub retired: RetiredRecord,
}

/// The JSON keys of [`Persisted`] beside the state's own.
const APPLIED: &str = "applied";
const RETIRED: &str = "retired";

impl Persisted {
    /// The JSON object of the state file. (Not serde's `flatten`: through
    /// it, maps keyed by numbers do not read back.)
    fn to_json(&self) -> serde_json::Result<serde_json::Value> {
        let mut v = serde_json::to_value(&self.state)?;
        if let Some(o) = v.as_object_mut() {
            if !self.applied.is_empty() {
                o.insert(APPLIED.into(), serde_json::to_value(&self.applied)?);
            }
            if !self.retired.is_empty() {
                o.insert(RETIRED.into(), serde_json::to_value(&self.retired)?);
            }
            // Daemons before the one transaction (b634ad5 and older) need
            // each VIP's `list` (which eligible list was active); this one
            // ignores it (the maps say), so a downgrade still starts.
            if let Some(vips) = o.get_mut("vips").and_then(|v| v.as_object_mut()) {
                for vip in vips.values_mut().filter_map(|v| v.as_object_mut()) {
                    vip.entry("list").or_insert(serde_json::json!(0));
                }
            }
        }
        Ok(v)
    }

    fn from_json(mut v: serde_json::Value) -> serde_json::Result<Persisted> {
        let (applied, retired) = match v.as_object_mut() {
            Some(o) => (o.remove(APPLIED), o.remove(RETIRED)),
            None => (None, None),
        };
        Ok(Persisted {
            state: serde_json::from_value(v)?,
            applied: applied
                .map(serde_json::from_value)
                .transpose()?
                .unwrap_or_default(),
            retired: retired
                .map(serde_json::from_value)
                .transpose()?
                .unwrap_or_default(),
        })
    }
}

/// Reads a persisted state file; a missing file is an empty state.
///
/// # Errors
/// Unreadable or unparsable file.
pub fn read_state(path: &Path) -> Result<Option<Persisted>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .and_then(Persisted::from_json)
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
pub fn write_state(path: &Path, state: &Persisted) -> Result<()> {
    let json = state.to_json();
    let bytes = json
        .and_then(|j| serde_json::to_vec_pretty(&j))
        .map_err(|e| BalancerError::Invalid {
            what: "state",
            reason: e.to_string(),
        })?;
    let io = |action: String| move |source| BalancerError::Io { action, source };
    let dir = dir_of(path);
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

/// The state file of a running daemon.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    /// Why the last write failed, while a write is owed.
    owed: Option<String>,
    /// Device, inode, length and modification time (ns) of the file last
    /// written: anything else there (another file, the same file written
    /// over in place, none) means it was deleted or changed behind the
    /// daemon's back.
    written: Option<(u64, u64, u64, i128)>,
}

/// What [`StateFile::check`] found and did, for the log.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked {
    /// Nothing to do.
    Fine,
    /// The file was missing or replaced and has been written again.
    Rewritten(String),
    /// An owed write succeeded.
    Caught,
    /// A write was owed or needed and failed again (the reason).
    StillOwed(String),
}

impl StateFile {
    /// The state file at `path` (not read or written).
    pub fn new(path: PathBuf) -> StateFile {
        StateFile {
            path,
            owed: None,
            written: None,
        }
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why the state is not written, while a write is owed.
    pub fn owed(&self) -> Option<&str> {
        self.owed.as_deref()
    }

    /// Writes `state` ([`write_state`]: temporary file,
    /// fsync, rename). A failure leaves the write owed.
    ///
    /// # Errors
    /// The file system's error (the old file is intact).
    pub fn save(&mut self, state: &Persisted) -> Result<()> {
        match write_state(&self.path, state) {
            Ok(()) => {
                self.owed = None;
                self.written = identity(&self.path);
                Ok(())
            }
            Err(e) => {
                self.owed = Some(crate::model::error::error_chain(&e));
                Err(e)
            }
        }
    }

    /// Forgets an owed write: what is on disk is the state again (a change
    /// that could not be written was rolled back).
    pub fn forgive(&mut self) {
        self.owed = None;
    }

    /// Retries an owed write; writes the file again when it was deleted
    /// or replaced since this daemon wrote it.
    pub fn check(&mut self, state: &Persisted) -> Checked {
        let was_owed = self.owed.is_some();
        let gone = match (self.written, identity(&self.path)) {
            (Some(w), Some(now)) if w == now => None,
            (Some(w), Some(now)) if (w.0, w.1) == (now.0, now.1) => Some("written over"),
            (Some(_), Some(_)) => Some("replaced by another file"),
            (Some(_), None) => Some("deleted"),
            (None, _) => None,
        };
        if !was_owed && gone.is_none() {
            return Checked::Fine;
        }
        match self.save(state) {
            Ok(()) => match gone {
                Some(how) => Checked::Rewritten(how.to_string()),
                None => Checked::Caught,
            },
            Err(e) => Checked::StillOwed(crate::model::error::error_chain(&e)),
        }
    }
}

fn identity(path: &Path) -> Option<(u64, u64, u64, i128)> {
    std::fs::metadata(path).ok().map(|m| {
        (
            m.dev(),
            m.ino(),
            m.len(),
            i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(read_state(&path).unwrap(), None);
        let s = Persisted {
            state: State {
                next_slot: 7,
                slot_generations: [(0, 1), (3, 2)].into_iter().collect(),
                ..Default::default()
            },
            applied: [("/etc/b.toml".to_string(), Config::default())]
                .into_iter()
                .collect(),
            retired: RetiredRecord {
                vips: vec![("10.0.0.1:80".parse().unwrap(), 3, 1_000)],
                backends: Vec::new(),
            },
        };
        write_state(&path, &s).unwrap();
        assert_eq!(read_state(&path).unwrap(), Some(s));
        // Only the state file is left: no temporary files beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        std::fs::write(&path, b"{not json").unwrap();
        assert!(read_state(&path).is_err());
    }

    #[test]
    fn each_vip_keeps_the_list_key_older_daemons_require() {
        let mut state = State::default();
        let vip: std::net::SocketAddr = "10.0.0.1:80".parse().unwrap();
        state
            .apply(
                &crate::model::command::Command::AddVip(
                    vip,
                    crate::model::state::VipSettings::default(),
                ),
                &crate::model::command::Rules::default(),
            )
            .unwrap();
        let p = Persisted {
            state,
            ..Persisted::default()
        };
        let v = p.to_json().unwrap();
        assert_eq!(v["vips"][vip.to_string()]["list"], serde_json::json!(0));
        // And it reads back as it was.
        assert_eq!(Persisted::from_json(v).unwrap(), p);
    }

    #[test]
    fn a_deleted_file_is_written_again_and_a_failed_write_is_owed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut f = StateFile::new(path.clone());
        let s = Persisted::default();
        f.save(&s).unwrap();
        assert_eq!(f.check(&s), Checked::Fine);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(f.check(&s), Checked::Rewritten("deleted".into()));
        assert!(path.exists());
        // Replaced by another file (an editor's save, a restore).
        std::fs::write(dir.path().join("other"), b"{}").unwrap();
        std::fs::rename(dir.path().join("other"), &path).unwrap();
        assert_eq!(
            f.check(&s),
            Checked::Rewritten("replaced by another file".into())
        );
        // The directory gone: the write fails and is owed until it works.
        let mut g = StateFile::new(dir.path().join("file-not-dir").join("state.json"));
        std::fs::write(dir.path().join("file-not-dir"), b"x").unwrap();
        assert!(g.save(&s).is_err());
        assert!(g.owed().is_some());
        assert!(matches!(g.check(&s), Checked::StillOwed(_)));
        std::fs::remove_file(dir.path().join("file-not-dir")).unwrap();
        assert_eq!(g.check(&s), Checked::Caught);
        assert!(g.owed().is_none());
    }
}
