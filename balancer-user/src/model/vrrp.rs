//! VRRP roles as keepalived reports them (docs/cluster.md, "A NAT pair
//! with keepalived"): its notify script (`contrib/keepalived/
//! balancer-vrrp-notify`) writes each instance's state (`MASTER`,
//! `BACKUP`, `FAULT`, `STOP`) to a file named after the instance in one
//! directory (`run --vrrp-state-dir DIR`), renamed into place, so the
//! file's modification time is when the state changed. The daemon reads
//! the directory when asked (`cluster status`, `/v1/cluster`, a scrape):
//! a few small files, no polling. A file it cannot read or parse shows as
//! `unknown`, with why.

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use serde::{Deserialize, Serialize};

/// Instances read from one directory at most (files past these are
/// left out, and said so).
pub const MAX_INSTANCES: usize = 64;

/// Bytes of a state file read at most (a state is one word).
const MAX_FILE_BYTES: u64 = 256;

/// A VRRP instance's state.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum VrrpState {
    /// It holds the instance's addresses: this balancer carries the
    /// traffic.
    Master,
    /// Another router holds them.
    Backup,
    /// keepalived sees a fault (an interface down, a tracked script
    /// failing): it holds nothing.
    Fault,
    /// keepalived stopped the instance.
    Stop,
    /// No state, or one that could not be read or parsed.
    #[default]
    Unknown,
}

impl VrrpState {
    /// The state keepalived names `word` (as its notify script passes it:
    /// `MASTER`, `BACKUP`, `FAULT`, `STOP`; `DELETED` is an instance
    /// removed by a reload, shown as stopped), case and surrounding
    /// white space ignored; `None` for anything else.
    pub fn parse(word: &str) -> Option<VrrpState> {
        match word.trim().to_ascii_uppercase().as_str() {
            "MASTER" => Some(VrrpState::Master),
            "BACKUP" => Some(VrrpState::Backup),
            "FAULT" => Some(VrrpState::Fault),
            "STOP" | "DELETED" => Some(VrrpState::Stop),
            _ => None,
        }
    }

    /// Its name as the API and the metrics write it (`master`, ...).
    pub fn name(self) -> &'static str {
        match self {
            VrrpState::Master => "master",
            VrrpState::Backup => "backup",
            VrrpState::Fault => "fault",
            VrrpState::Stop => "stop",
            VrrpState::Unknown => "unknown",
        }
    }

    /// Every state, in the order the metrics list them.
    pub const ALL: [VrrpState; 5] = [
        VrrpState::Master,
        VrrpState::Backup,
        VrrpState::Fault,
        VrrpState::Stop,
        VrrpState::Unknown,
    ];
}

/// One VRRP instance as the daemon read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VrrpView {
    /// The instance's name (its file's name).
    pub instance: String,
    /// Its state.
    pub state: VrrpState,
    /// Time since the state was written (the file's modification time),
    /// ms; none when the file could not be read.
    pub since_ms: Option<u64>,
    /// Why the state is unknown (the file's text, or the error reading
    /// it); none otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// The state a file's text names: its first line's word, or why it names
/// none.
///
/// # Errors
/// The text as found (shortened, control characters escaped) when it is
/// not a state.
pub fn parse_file(text: &[u8]) -> Result<VrrpState, String> {
    let text = String::from_utf8_lossy(text);
    let first = text.lines().next().unwrap_or("");
    VrrpState::parse(first).ok_or_else(|| {
        let shown: String = first
            .chars()
            .take(40)
            .flat_map(char::escape_default)
            .collect();
        if first.trim().is_empty() {
            "empty".to_string()
        } else {
            format!("not a state: \"{shown}\"")
        }
    })
}

/// Every instance recorded in `dir`, by name, as of `now`. Files whose
/// names start with `.` (the notify script's temporary files) are left
/// out, and so is anything that is not a regular file; at most
/// [`MAX_INSTANCES`]. A directory that cannot be read gives one entry of
/// state unknown named after the problem (`-`), so that an operator sees
/// why nothing is reported.
pub fn read_dir(dir: &Path, now: SystemTime) -> Vec<VrrpView> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            return vec![VrrpView {
                instance: "-".into(),
                state: VrrpState::Unknown,
                since_ms: None,
                problem: Some(format!("reading {}: {e}", dir.display())),
            }]
        }
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names.truncate(MAX_INSTANCES);
    names
        .into_iter()
        .map(|name| read_one(&dir.join(&name), name, now))
        .collect()
}

/// One instance's file.
fn read_one(path: &Path, instance: String, now: SystemTime) -> VrrpView {
    use std::io::Read as _;
    let read = std::fs::File::open(path).and_then(|f| {
        let modified = f.metadata()?.modified()?;
        let mut text = Vec::new();
        f.take(MAX_FILE_BYTES).read_to_end(&mut text)?;
        Ok((text, modified))
    });
    match read {
        Ok((text, modified)) => {
            let since = now.duration_since(modified).unwrap_or(Duration::ZERO);
            let (state, problem) = match parse_file(&text) {
                Ok(s) => (s, None),
                Err(why) => (VrrpState::Unknown, Some(why)),
            };
            VrrpView {
                instance,
                state,
                since_ms: Some(u64::try_from(since.as_millis()).unwrap_or(u64::MAX)),
                problem,
            }
        }
        Err(e) => VrrpView {
            instance,
            state: VrrpState::Unknown,
            since_ms: None,
            problem: Some(e.to_string()),
        },
    }
}

/// The balancer's role over its instances: the one state they all share,
/// else unknown (none read, or a sync group caught between two states).
pub fn role(instances: &[VrrpView]) -> VrrpState {
    let mut states = instances.iter().map(|v| v.state);
    match states.next() {
        Some(first) if states.all(|s| s == first) => first,
        _ => VrrpState::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_parse_as_keepalived_writes_them() {
        for (text, want) in [
            ("MASTER\n", VrrpState::Master),
            ("BACKUP", VrrpState::Backup),
            ("  fault \n", VrrpState::Fault),
            ("STOP\n", VrrpState::Stop),
            ("DELETED\n", VrrpState::Stop),
            ("MASTER\nleft over\n", VrrpState::Master),
        ] {
            assert_eq!(parse_file(text.as_bytes()), Ok(want), "{text:?}");
        }
        assert_eq!(parse_file(b""), Err("empty".into()));
        assert_eq!(parse_file(b"\n\n"), Err("empty".into()));
        assert_eq!(
            parse_file(b"MAST"),
            Err("not a state: \"MAST\"".into()),
            "a half-written word is no state"
        );
        let garbled = parse_file(b"\x1b[31mMASTER\xff").unwrap_err();
        assert!(
            garbled.starts_with("not a state: \"\\u{1b}[31mMASTER"),
            "{garbled}"
        );
        assert!(!garbled.contains('\x1b'), "control characters escaped");
        let long = parse_file("X".repeat(1000).as_bytes()).unwrap_err();
        assert!(long.len() < 60, "shortened: {long}");
    }

    #[test]
    fn a_directory_reads_as_its_instances() {
        let dir = std::env::temp_dir().join(format!("vrrp-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("subdir")).unwrap();
        std::fs::write(dir.join("VI_CLIENT"), "MASTER\n").unwrap();
        std::fs::write(dir.join("VI_BACKEND"), "MASTER\n").unwrap();
        std::fs::write(dir.join(".VI_CLIENT.123"), "BACKUP\n").unwrap();
        std::fs::write(dir.join("VI_OTHER"), "garbage").unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        let got = read_dir(&dir, later);
        let names: Vec<&str> = got.iter().map(|v| v.instance.as_str()).collect();
        assert_eq!(names, ["VI_BACKEND", "VI_CLIENT", "VI_OTHER"]);
        assert_eq!(got[1].state, VrrpState::Master);
        assert!(got[1]
            .since_ms
            .is_some_and(|ms| (4000..=6000).contains(&ms)));
        assert_eq!(got[1].problem, None);
        assert_eq!(got[2].state, VrrpState::Unknown);
        assert!(got[2].problem.is_some());
        assert_eq!(role(&got), VrrpState::Unknown, "one instance unknown");
        assert_eq!(role(&got[..2]), VrrpState::Master);
        assert_eq!(role(&[]), VrrpState::Unknown);
        // A clock behind the file's time is no negative age.
        let earlier = SystemTime::now() - Duration::from_secs(60);
        assert_eq!(read_dir(&dir, earlier)[1].since_ms, Some(0));
        std::fs::remove_dir_all(&dir).unwrap();
        let gone = read_dir(&dir, later);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].state, VrrpState::Unknown);
        assert!(gone[0]
            .problem
            .as_deref()
            .is_some_and(|p| p.contains("reading")));
    }
}
