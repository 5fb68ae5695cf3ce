//! The cluster's services: the flow sync with the peers
//! ([`crate::cluster::sync::run`]) and the announcements with the
//! cluster's view ([`crate::cluster::sync::keep_announced`]); their loops
//! live with the sync and stop at the signal after the step they are in.

use std::sync::Arc;

use tokio::{net::UdpSocket, sync::Mutex};
use tokio_util::sync::CancellationToken;

use super::Service;
use crate::{
    balancer::Balancer,
    cluster::{
        bgp::BgpConfig,
        sync::{ClusterConfig, Sync},
    },
};

/// The flow sync and shared load with the peers.
pub struct ClusterSync {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
    /// The sync's state.
    pub sync: Arc<Mutex<Sync>>,
    /// The cluster's settings.
    pub cfg: ClusterConfig,
    /// The sync's socket, bound at start.
    pub sock: UdpSocket,
}

impl Service for ClusterSync {
    fn name(&self) -> &'static str {
        "cluster sync"
    }

    async fn run(self, shutdown: CancellationToken) {
        crate::cluster::sync::run(self.lb, self.sync, self.cfg, self.sock, shutdown).await;
    }
}

/// The BGP announcements and the cluster's view.
pub struct Announcements {
    /// The balancer.
    pub lb: Arc<Mutex<Balancer>>,
    /// The sync's state (none: BGP only).
    pub sync: Option<Arc<Mutex<Sync>>>,
    /// The cluster's settings (none: BGP only).
    pub cfg: Option<ClusterConfig>,
    /// The BGP speaker (none: the view only).
    pub bgp: Option<BgpConfig>,
}

impl Service for Announcements {
    fn name(&self) -> &'static str {
        "announcements"
    }

    async fn run(self, shutdown: CancellationToken) {
        crate::cluster::sync::keep_announced(self.lb, self.sync, self.cfg, self.bgp, shutdown)
            .await;
    }
}
