//! Errors of the balancer library: [`BalancerError`], everything an
//! operation can refuse or fail with, and the model's refusal of a value,
//! [`Refusal`]: where the value is ([`Field`]: the VIP, the backend, the
//! key path) and why it is refused ([`Reason`]), as data; a configuration
//! file's refusal adds the file and the line ([`ConfigError`]). The data
//! path's failures are [`DatapathError`]s.

use std::{fmt, net::SocketAddr};

use serde::{Deserialize, Serialize};

/// Where a refused value is: the VIP and the backend it belongs to (either
/// may be absent: a value of the request as a whole, a VIP's own) and its
/// key path within them, outermost first: a VIP setting by its table name
/// (`crate::model::state::Setting::name`), then the keys inside its value (`health.interval`);
/// a backend's `weight`; `timeouts.half_open`; `address`. Empty: the VIP or
/// backend as a whole.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Field {
    /// The VIP.
    pub vip: Option<SocketAddr>,
    /// The backend of the VIP.
    pub backend: Option<SocketAddr>,
    /// The key path, outermost first.
    pub path: Vec<&'static str>,
}

impl Field {
    /// The field of a key outside the settings' table (`address`, a
    /// backend's `weight`, a health check's `interval`).
    pub fn key(k: &'static str) -> Field {
        Field {
            path: vec![k],
            ..Field::default()
        }
    }

    /// The key path as written in the file and the API (`health.interval`);
    /// `None` when empty.
    pub fn path_text(&self) -> Option<String> {
        (!self.path.is_empty()).then(|| self.path.join("."))
    }
}

/// `VIP 10.0.0.1:80 backend 10.1.0.1:80: health.interval`, each part left
/// out when absent.
impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        match (self.vip, self.backend) {
            (Some(v), Some(b)) => parts.push(format!("VIP {v} backend {b}")),
            (Some(v), None) => parts.push(format!("VIP {v}")),
            (None, Some(b)) => parts.push(format!("backend {b}")),
            (None, None) => {}
        }
        if let Some(p) = self.path_text() {
            parts.push(p);
        }
        f.write_str(&parts.join(": "))
    }
}

/// Why a value is refused: the kinds of refusal, with their values as data
/// (numbers and durations in the form they are written in, `5ms`, `1000`).
/// In JSON an object tagged by `kind` (`{"kind":"out_of_range","got":"5ms",
/// "min":"10ms","max":"1h"}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// A value outside its bounds (both inclusive; an absent one is open).
    OutOfRange {
        /// The value given.
        got: String,
        /// The least allowed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        min: Option<String>,
        /// The most allowed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max: Option<String>,
    },
    /// A value not of the form it must have.
    Malformed {
        /// The value given.
        got: String,
        /// What it must be.
        expected: String,
    },
    /// A value that another field's value rules out.
    Conflicts {
        /// The other field's key path (`mode`, `protocol`).
        with: String,
        /// Why the two cannot go together.
        why: String,
    },
    /// A value that needs another field set.
    Requires {
        /// The field it needs (`encap_source`, `agent_port`).
        field: String,
        /// What for.
        why: String,
    },
    /// A value listed twice.
    Duplicate {
        /// The value.
        got: String,
    },
    /// More values than allowed.
    TooMany {
        /// How many were given.
        count: u64,
        /// The most allowed.
        max: u64,
    },
    /// An address the balancer would forward to itself or to a VIP.
    ForwardingLoop {
        /// The address.
        got: String,
        /// What it is the address of.
        is: String,
    },
    /// A name that is not one of those allowed.
    Unknown {
        /// The name given.
        got: String,
        /// The names allowed.
        expected: Vec<String>,
    },
    /// A text that does not parse (the parser's message).
    Syntax {
        /// The parser's message.
        message: String,
    },
}

impl Reason {
    /// `got` outside `min..=max`.
    pub fn range(got: impl fmt::Display, min: impl fmt::Display, max: impl fmt::Display) -> Reason {
        Reason::OutOfRange {
            got: got.to_string(),
            min: Some(min.to_string()),
            max: Some(max.to_string()),
        }
    }

    /// `got` above `max`.
    pub fn above(got: impl fmt::Display, max: impl fmt::Display) -> Reason {
        Reason::OutOfRange {
            got: got.to_string(),
            min: None,
            max: Some(max.to_string()),
        }
    }

    /// `got` not of the form `expected`.
    pub fn malformed(got: impl fmt::Display, expected: impl Into<String>) -> Reason {
        Reason::Malformed {
            got: got.to_string(),
            expected: expected.into(),
        }
    }

    /// Ruled out by the value of `with`.
    pub fn conflicts(with: impl Into<String>, why: impl Into<String>) -> Reason {
        Reason::Conflicts {
            with: with.into(),
            why: why.into(),
        }
    }

    /// Needs `field` set.
    pub fn requires(field: impl Into<String>, why: impl Into<String>) -> Reason {
        Reason::Requires {
            field: field.into(),
            why: why.into(),
        }
    }

    /// The reason's kind, as JSON tags it (`out_of_range`).
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::OutOfRange { .. } => "out_of_range",
            Reason::Malformed { .. } => "malformed",
            Reason::Conflicts { .. } => "conflicts",
            Reason::Requires { .. } => "requires",
            Reason::Duplicate { .. } => "duplicate",
            Reason::TooMany { .. } => "too_many",
            Reason::ForwardingLoop { .. } => "forwarding_loop",
            Reason::Unknown { .. } => "unknown",
            Reason::Syntax { .. } => "syntax",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::OutOfRange { got, min, max } => match (min, max) {
                (Some(lo), Some(hi)) => write!(f, "{got} is outside {lo}..={hi}"),
                (None, Some(hi)) => write!(f, "{got} is above {hi}"),
                (Some(lo), None) => write!(f, "{got} is below {lo}"),
                (None, None) => write!(f, "{got} is out of range"),
            },
            Reason::Malformed { got, expected } => write!(f, "{got} is not {expected}"),
            Reason::Conflicts { with, why } => write!(f, "conflicts with {with}: {why}"),
            Reason::Requires { field, why } => write!(f, "needs {field}: {why}"),
            Reason::Duplicate { got } => write!(f, "{got} is listed twice"),
            Reason::TooMany { count, max } => write!(f, "{count} given, at most {max}"),
            Reason::ForwardingLoop { got, is } => {
                write!(f, "{got} is {is}: a forwarding loop")
            }
            Reason::Unknown { got, expected } => {
                write!(f, "{got} is not one of {}", expected.join(", "))
            }
            Reason::Syntax { message } => f.write_str(message),
        }
    }
}

/// The model's refusal of a value: where it is, why, and advice for a
/// person (what to do instead), if any. Shown as `FIELD: REASON; HINT`:
/// `VIP 10.0.0.1:80: health.interval: 5ms is outside 10ms..=1h`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct Refusal {
    /// Where the value is.
    pub field: Field,
    /// Why it is refused.
    pub reason: Reason,
    /// Advice for a person, prose.
    pub hint: Option<String>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let field = self.field.to_string();
        if !field.is_empty() {
            write!(f, "{field}: ")?;
        }
        write!(f, "{}", self.reason)?;
        if let Some(h) = &self.hint {
            write!(f, "; {h}")?;
        }
        Ok(())
    }
}

impl Refusal {
    /// A refusal of `field` for `reason`.
    pub fn new(field: Field, reason: Reason) -> Refusal {
        Refusal {
            field,
            reason,
            hint: None,
        }
    }

    /// The same with advice for a person.
    pub fn hint(mut self, hint: impl Into<String>) -> Refusal {
        self.hint = Some(hint.into());
        self
    }
}

/// A refusal of a configuration file (or text), where it is: the file
/// (none for a text of no file) and the line and column, from 1, of the
/// offending key or table (none when it cannot be found: a VIP written in
/// another form). Shown as `FILE:LINE:COLUMN: REFUSAL`
/// (`balancer.toml:14:1: VIP 10.0.0.1:80: health.interval: ...`), or
/// `line LINE, column COLUMN: REFUSAL` without a file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file, as the operator named it.
    pub file: Option<String>,
    /// Line and column, from 1.
    pub at: Option<(usize, usize)>,
    /// What is refused.
    pub refusal: Refusal,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.at) {
            (Some(file), Some((l, c))) => write!(f, "{file}:{l}:{c}: ")?,
            (Some(file), None) => write!(f, "{file}: ")?,
            (None, Some((l, c))) => write!(f, "line {l}, column {c}: ")?,
            (None, None) => write!(f, "configuration: ")?,
        }
        write!(f, "{}", self.refusal)
    }
}

/// The VIP and the backend a change is about, as far as it is about one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// The VIP.
    pub vip: Option<SocketAddr>,
    /// The backend of the VIP.
    pub backend: Option<SocketAddr>,
}

/// Everything a balancer operation can refuse or fail with. Refusals (bad
/// input, unknown names, full tables) leave the balancer unchanged.
#[derive(Debug, thiserror::Error)]
pub enum BalancerError {
    /// The VIP is not configured.
    #[error("no such VIP {vip}")]
    UnknownVip {
        /// The VIP asked for.
        vip: SocketAddr,
    },
    /// A VIP with this address and port exists already.
    #[error("VIP {vip} exists already")]
    DuplicateVip {
        /// The VIP asked for.
        vip: SocketAddr,
    },
    /// The backend is not a backend of the VIP.
    #[error("{backend} is not a backend of VIP {vip}")]
    UnknownBackend {
        /// The VIP.
        vip: SocketAddr,
        /// The backend asked for.
        backend: SocketAddr,
    },
    /// The backend is already a backend of the VIP.
    #[error("{backend} is already a backend of VIP {vip}")]
    DuplicateBackend {
        /// The VIP.
        vip: SocketAddr,
        /// The backend asked for.
        backend: SocketAddr,
    },
    /// A table is full.
    #[error("{what} is full ({capacity} entries)")]
    Full {
        /// Which table.
        what: &'static str,
        /// Its capacity.
        capacity: u32,
    },
    /// A value the model refuses (out of range, malformed, conflicting):
    /// where it is and why, as data.
    #[error(transparent)]
    Refused(Box<Refusal>),
    /// A configuration file's (or text's) refusal, with the file and line.
    #[error(transparent)]
    Config(Box<ConfigError>),
    /// A change of a configuration refused as the whole was checked:
    /// nothing was applied.
    #[error("change {index} of {count} ({change}) refused; nothing was applied")]
    Apply {
        /// Which change, from 1.
        index: usize,
        /// How many the configuration asked for.
        count: usize,
        /// The change, as `apply` lists it.
        change: String,
        /// The VIP and backend the change is about (boxed: the error stays
        /// small).
        target: Box<Target>,
        /// Why it was refused.
        #[source]
        source: Box<BalancerError>,
    },
    /// An argument of the environment (an interface, a pin, the kernel's
    /// object, privileges) is refused: a refusal not yet typed.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// The data path failed: the object, a program, a map.
    #[error(transparent)]
    Datapath(#[from] DatapathError),
    /// A file or system call failed.
    #[error("{action} failed")]
    Io {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// A failure of the data path: the kernel's answer to loading the object,
/// to a program's load, attach or detach, to a map's read or write (aya's
/// errors, as sources). Declared here, the lowest room, so that
/// [`BalancerError`] can wrap it; built by `datapath/` and `balancer/`.
#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    /// Loading the XDP program or its maps failed.
    #[error("loading the XDP program failed")]
    Load(#[source] aya::EbpfError),
    /// A program operation (load into the kernel, attach) failed.
    #[error("{action} failed")]
    Program {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: aya::programs::ProgramError,
    },
    /// A map read or write failed.
    #[error("map {map}: {action} failed")]
    Map {
        /// Map name.
        map: &'static str,
        /// What was being done.
        action: &'static str,
        /// The underlying error.
        #[source]
        source: aya::maps::MapError,
    },
}

impl From<Refusal> for BalancerError {
    fn from(r: Refusal) -> Self {
        BalancerError::Refused(Box::new(r))
    }
}

impl From<ConfigError> for BalancerError {
    fn from(c: ConfigError) -> Self {
        BalancerError::Config(Box::new(c))
    }
}

impl BalancerError {
    /// A refusal of `field` for `reason`.
    pub fn refused(field: Field, reason: Reason) -> BalancerError {
        Refusal::new(field, reason).into()
    }

    /// The model's refusal this error is or carries, if any.
    pub fn refusal(&self) -> Option<&Refusal> {
        match self {
            BalancerError::Refused(r) => Some(r),
            BalancerError::Config(c) => Some(&c.refusal),
            BalancerError::Apply { source, .. } => source.refusal(),
            _ => None,
        }
    }

    /// The VIP and backend this error is about: its refusal's, else (a
    /// configuration's change refused for another reason: a full table)
    /// its change's.
    pub fn place(&self) -> (Option<SocketAddr>, Option<SocketAddr>) {
        match (self.refusal(), self) {
            (Some(r), _) if r.field.vip.is_some() || r.field.backend.is_some() => {
                (r.field.vip, r.field.backend)
            }
            (_, BalancerError::Apply { target, .. }) => (target.vip, target.backend),
            _ => (None, None),
        }
    }

    fn map_refusal(mut self, f: impl FnOnce(&mut Refusal)) -> BalancerError {
        match &mut self {
            BalancerError::Refused(r) => f(r),
            BalancerError::Config(c) => f(&mut c.refusal),
            _ => {}
        }
        self
    }

    /// The same, a refusal placed in VIP `vip` (unless it names one).
    pub fn in_vip(self, vip: SocketAddr) -> BalancerError {
        self.map_refusal(|r| {
            r.field.vip.get_or_insert(vip);
        })
    }

    /// The same, a refusal placed in backend `backend` (unless it names one).
    pub fn in_backend(self, backend: SocketAddr) -> BalancerError {
        self.map_refusal(|r| {
            r.field.backend.get_or_insert(backend);
        })
    }

    /// The same, a refusal placed in configuration file `file` (the name
    /// the operator gave it).
    pub fn in_file(self, file: impl Into<String>) -> BalancerError {
        match self {
            BalancerError::Config(mut c) => {
                c.file = Some(file.into());
                BalancerError::Config(c)
            }
            BalancerError::Refused(refusal) => ConfigError {
                file: Some(file.into()),
                at: None,
                refusal: *refusal,
            }
            .into(),
            other => other,
        }
    }

    /// The same, a refusal's key path placed under `key` (a health check's
    /// `interval` under `health`).
    pub fn under(self, key: &'static str) -> BalancerError {
        self.map_refusal(|r| r.field.path.insert(0, key))
    }
}

/// Result of balancer operations.
pub type Result<T, E = BalancerError> = std::result::Result<T, E>;

/// The OS error number at the bottom of `e`'s source chain, if any (the
/// kernel's answer to a failed system call, e.g. `libc::EBUSY`).
pub fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut found = None;
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            found = io.raw_os_error().or(found);
        }
        cur = c.source();
    }
    found
}

/// An error with its sources, on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
