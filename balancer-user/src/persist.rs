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
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::{error::Result, state::State};

/// The state file of a running daemon.
#[derive(Debug)]
pub struct StateFile {
    path: PathBuf,
    /// Why the last write failed, while a write is owed.
    owed: Option<String>,
    /// Device and inode of the file last written: another file there (or
    /// none) means it was deleted or replaced.
    written: Option<(u64, u64)>,
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

    /// Writes `state` ([`crate::state::write_state`]: temporary file,
    /// fsync, rename). A failure leaves the write owed.
    ///
    /// # Errors
    /// The file system's error (the old file is intact).
    pub fn save(&mut self, state: &State) -> Result<()> {
        match crate::state::write_state(&self.path, state) {
            Ok(()) => {
                self.owed = None;
                self.written = identity(&self.path);
                Ok(())
            }
            Err(e) => {
                self.owed = Some(crate::control::error_chain(&e));
                Err(e)
            }
        }
    }

    /// Retries an owed write; writes the file again when it was deleted
    /// or replaced since this daemon wrote it.
    pub fn check(&mut self, state: &State) -> Checked {
        let was_owed = self.owed.is_some();
        let gone = match (self.written, identity(&self.path)) {
            (Some(w), Some(now)) if w == now => None,
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
            Err(e) => Checked::StillOwed(crate::control::error_chain(&e)),
        }
    }
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_file_is_written_again_and_a_failed_write_is_owed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let mut f = StateFile::new(path.clone());
        let s = State::default();
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
