//! QUIC-LB routing (docs/udp.md): the backend a QUIC VIP's datagram of
//! no flow goes to by the server ID in its connection ID. Called by the
//! new-flow stage (`client::new_flow`) for a datagram the UDP stage
//! (`udp`) sent there.

use balancer_common::{
    parse::{Tcp, UDP_HLEN},
    quic, Backend, QuicServerKey, VipInfo, BACKEND_F_IN_USE,
};

use crate::{
    frame::XdpFrame,
    maps::{BACKENDS, QUIC_SERVERS},
};

/// The backend a QUIC VIP's datagram of no flow goes to by its
/// connection ID (`balancer_common::quic::server_id`, its server ID looked
/// up in `QUIC_SERVERS`), when the ID names one in use; `None` for any
/// other VIP or datagram (placed by the choice rule).
#[inline(always)]
pub fn backend(frame: &XdpFrame, seg: &Tcp, vip: &VipInfo) -> Option<(&'static Backend, u32)> {
    let sid_len = vip.quic_sid_len();
    if sid_len == 0 {
        return None;
    }
    let sid = quic::server_id(frame, seg.l4_off + UDP_HLEN, sid_len)?;
    let key = QuicServerKey {
        vip_index: vip.index,
        server_id: sid,
    };
    // SAFETY: copied out at once.
    let slot = *unsafe { QUIC_SERVERS.get(&key) }?;
    let b = BACKENDS.get(slot)?;
    if b.flags & BACKEND_F_IN_USE == 0 {
        return None;
    }
    Some((b, slot))
}
