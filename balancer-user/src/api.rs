//! The control API between the CLI and the daemon: one JSON request per line
//! on the daemon's unix socket, one JSON response line back.

use std::net::SocketAddrV4;

use serde::{Deserialize, Serialize};

/// How many flows `Flows` returns at most, whatever the request asks.
pub const MAX_FLOWS_LISTED: usize = 10_000;

/// A request to the daemon.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Add a VIP with `choices` (1..=16, or `u32::MAX` for a full scan).
    AddVip {
        /// VIP address and port.
        vip: SocketAddrV4,
        /// Choices per new flow.
        choices: u32,
    },
    /// Change the choices of an existing VIP.
    SetChoices {
        /// VIP address and port.
        vip: SocketAddrV4,
        /// Choices per new flow.
        choices: u32,
    },
    /// Remove a VIP, its backends and its flows.
    RemoveVip {
        /// VIP address and port.
        vip: SocketAddrV4,
    },
    /// List VIPs.
    ListVips,
    /// Add backends to a VIP: all of them, or none on any error.
    AddBackends {
        /// VIP address and port.
        vip: SocketAddrV4,
        /// Backend addresses and ports.
        backends: Vec<SocketAddrV4>,
    },
    /// Stop sending new flows to a backend; its flows continue.
    DrainBackend {
        /// VIP address and port.
        vip: SocketAddrV4,
        /// Backend address and port.
        backend: SocketAddrV4,
    },
    /// Put a drained backend back into service.
    UndrainBackend {
        /// VIP address and port.
        vip: SocketAddrV4,
        /// Backend address and port.
        backend: SocketAddrV4,
    },
    /// Remove a backend; its flows are dropped.
    RemoveBackend {
        /// VIP address and port.
        vip: SocketAddrV4,
        /// Backend address and port.
        backend: SocketAddrV4,
    },
    /// List the backends of a VIP (all VIPs when `None`).
    ListBackends {
        /// VIP address and port.
        vip: Option<SocketAddrV4>,
    },
    /// Counters.
    Stats,
    /// Live flows, at most `limit` (and at most [`MAX_FLOWS_LISTED`]).
    Flows {
        /// Maximum number of flows returned.
        limit: usize,
    },
}

/// The daemon's answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Response {
    /// Done.
    Ok,
    /// Refused or failed; nothing was changed.
    Error {
        /// What went wrong, for a person.
        message: String,
    },
    /// VIPs.
    Vips {
        /// The VIPs.
        vips: Vec<VipView>,
    },
    /// Backends.
    Backends {
        /// The backends.
        backends: Vec<BackendView>,
    },
    /// Counters.
    Stats(Box<StatsView>),
    /// Flows.
    Flows {
        /// The flows listed.
        flows: Vec<FlowView>,
        /// `true` when more flows exist than were listed.
        truncated: bool,
    },
}

/// A VIP as shown to operators.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VipView {
    /// Address and port.
    pub vip: SocketAddrV4,
    /// Choices per new flow (`u32::MAX`: full scan).
    pub choices: u32,
    /// Backends (active and draining).
    pub backends: usize,
    /// Backends receiving new flows.
    pub eligible: usize,
}

/// Backend lifecycle state.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BackendState {
    /// Receives new flows.
    Active,
    /// Receives no new flows; existing flows continue.
    Draining,
}

/// A backend with its counters.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackendView {
    /// The VIP it serves.
    pub vip: SocketAddrV4,
    /// Address and port.
    pub backend: SocketAddrV4,
    /// Lifecycle state.
    pub state: BackendState,
    /// Slot in the backend arrays.
    pub slot: u32,
    /// Connections it holds now.
    pub active_connections: u64,
    /// Connections ever placed on it.
    pub total_connections: u64,
    /// Frames forwarded to or from it.
    pub packets: u64,
    /// Bytes of those frames.
    pub bytes: u64,
}

/// Per-VIP counters.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VipStatsView {
    /// Address and port.
    pub vip: SocketAddrV4,
    /// Choices per new flow.
    pub choices: u32,
    /// Frames forwarded (both directions).
    pub packets: u64,
    /// Bytes of those frames.
    pub bytes: u64,
    /// Connections placed.
    pub new_flows: u64,
    /// Non-SYN segments matching no flow (passed).
    pub misses: u64,
    /// Sum of the backends' active connections.
    pub active_connections: u64,
}

/// All counters.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatsView {
    /// Global counters by name (summed over CPUs).
    pub counters: Vec<(String, u64)>,
    /// Per-VIP counters.
    pub vips: Vec<VipStatsView>,
    /// Per-backend counters.
    pub backends: Vec<BackendView>,
    /// Entries in the flow table at the last expiry pass (all kinds).
    pub flow_table_entries: u64,
    /// Live flows at the last expiry pass.
    pub live_flows: u64,
    /// Flows the daemon has expired.
    pub expired_flows: u64,
    /// Active-connection corrections applied by reconciliation.
    pub reconciled: u64,
}

impl StatsView {
    /// A global counter by name, 0 when absent.
    pub fn counter(&self, name: &str) -> u64 {
        self.counters
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }
}

/// One live flow.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct FlowView {
    /// Client address and port.
    pub client: SocketAddrV4,
    /// VIP address and port.
    pub vip: SocketAddrV4,
    /// Backend address and port (`None` when its slot was since reused).
    pub backend: Option<SocketAddrV4>,
    /// `live` or `closed`.
    pub kind: String,
    /// Idle time, ms.
    pub idle_ms: u64,
    /// FINs seen: `client`, `server`, `both` or `none`.
    pub fins: String,
}
