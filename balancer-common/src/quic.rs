//! QUIC connection IDs (RFC 9000) routed by the server ID their server
//! encoded in them, as the plaintext algorithm of the IETF QUIC-LB draft
//! (draft-ietf-quic-load-balancers, section 5.2 "Plaintext CID Algorithm")
//! lays them out: the CID's first octet holds the config rotation bits
//! (its top three; `0b111` marks a CID no balancer may route), then come
//! the server ID's octets, then the server's nonce.
//!
//! Which packets are read:
//! * a short-header packet (RFC 9000 section 17.3: the first bit 0): its
//!   destination CID starts right after the first byte, its length known
//!   only to the endpoints (the server ID's position does not need it);
//! * a long-header Handshake packet of QUIC version 1 (section 17.2.4):
//!   its destination CID is the server's, after the version and the CID
//!   length.
//!
//! Initial and 0-RTT packets carry a destination CID the client chose at
//! random: they are never routed by it (a new connection is placed by the
//! choice rule). Anything else (another version, a CID too short, the
//! unroutable config) yields no server ID: the datagram is placed as any
//! other, by its 5-tuple.
//!
//! The server ID of a backend is the last [`VipInfo`]-configured number of
//! octets of its address (1 to [`MAX_SERVER_ID_LEN`]), so a server encodes
//! its own address and needs no ID from the balancer (docs/udp.md).
//!
//! [`VipInfo`]: crate::VipInfo

use crate::parse::Frame;

/// The most octets a server ID may have here.
pub const MAX_SERVER_ID_LEN: u32 = 4;
/// QUIC version 1 (RFC 9000).
pub const QUIC_V1: u32 = 1;
/// Long-header packet type of a Handshake packet in version 1.
pub const LONG_TYPE_HANDSHAKE: u8 = 2;
/// Config rotation bits that mark a CID as not routable by any balancer
/// (QUIC-LB section 3).
pub const UNROUTABLE_CONFIG: u8 = 0b111;

/// Bytes of the UDP payload read: a long header's first byte, version,
/// CID length, the CID's first octet and a server ID of
/// [`MAX_SERVER_ID_LEN`].
pub const READ_LEN: usize = 7 + MAX_SERVER_ID_LEN as usize;

/// The server ID (its octets as a big-endian number) of the QUIC packet
/// whose UDP payload starts at `off` in `frame`, for a server ID of
/// `sid_len` octets (1..=[`MAX_SERVER_ID_LEN`]); `None` for a packet not
/// routed by its CID (see the module's text).
#[inline(always)]
pub fn server_id<F: Frame + ?Sized>(frame: &F, off: usize, sid_len: u32) -> Option<u32> {
    if sid_len == 0 || sid_len > MAX_SERVER_ID_LEN {
        return None;
    }
    let h = frame.read::<READ_LEN>(off)?;
    // Where the CID's first octet is.
    let cid = if h[0] & 0x80 == 0 {
        1
    } else {
        let version = u32::from_be_bytes([h[1], h[2], h[3], h[4]]);
        let kind = (h[0] >> 4) & 0x3;
        if version != QUIC_V1 || kind != LONG_TYPE_HANDSHAKE || (h[5] as u32) < 1 + sid_len {
            return None;
        }
        6
    };
    if h[cid] >> 5 == UNROUTABLE_CONFIG {
        return None;
    }
    let mut sid = 0u32;
    let mut i = 0;
    while i < MAX_SERVER_ID_LEN as usize {
        if i as u32 >= sid_len {
            break;
        }
        sid = (sid << 8) | h[cid + 1 + i] as u32;
        i += 1;
    }
    Some(sid)
}

/// The server ID of a backend at `addr` for a server ID of `sid_len`
/// octets: the address's last `sid_len` octets, big-endian.
pub fn server_id_of(addr: &crate::Addr, sid_len: u32) -> u32 {
    let b = addr.v6_bytes();
    let n = sid_len.min(MAX_SERVER_ID_LEN) as usize;
    b[16 - n..]
        .iter()
        .fold(0u32, |acc, x| (acc << 8) | *x as u32)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// A short-header packet whose destination CID is `cid`.
    fn short(cid: &[u8]) -> Vec<u8> {
        let mut p = std::vec![0x40 | 0x01];
        p.extend_from_slice(cid);
        p.extend_from_slice(&[0xaa; 24]);
        p
    }

    /// A long-header packet of `kind` and `version` whose destination CID
    /// is `cid`.
    fn long(kind: u8, version: u32, cid: &[u8]) -> Vec<u8> {
        let mut p = std::vec![0xc0 | (kind << 4)];
        p.extend_from_slice(&version.to_be_bytes());
        p.push(cid.len() as u8);
        p.extend_from_slice(cid);
        p.push(8);
        p.extend_from_slice(&[0x55; 8]);
        p.extend_from_slice(&[0xaa; 24]);
        p
    }

    #[test]
    fn short_and_handshake_packets_give_the_server_id() {
        // Config 0, server ID 0x0a0b, nonce.
        let cid = [0x08, 0x0a, 0x0b, 1, 2, 3, 4, 5];
        assert_eq!(server_id(&short(&cid)[..], 0, 2), Some(0x0a0b));
        assert_eq!(server_id(&short(&cid)[..], 0, 1), Some(0x0a));
        assert_eq!(server_id(&short(&cid)[..], 0, 4), Some(0x0a0b_0102));
        assert_eq!(
            server_id(&long(LONG_TYPE_HANDSHAKE, QUIC_V1, &cid)[..], 0, 2),
            Some(0x0a0b)
        );
        // At an offset (the UDP payload inside a frame).
        let mut f = std::vec![0u8; 42];
        f.extend_from_slice(&short(&cid));
        assert_eq!(server_id(&f[..], 42, 2), Some(0x0a0b));
    }

    #[test]
    fn client_chosen_cids_and_the_rest_give_none() {
        let cid = [0x08, 0x0a, 0x0b, 1, 2, 3, 4, 5];
        // Initial (0) and 0-RTT (1): the client's random CID.
        for kind in [0, 1] {
            assert_eq!(server_id(&long(kind, QUIC_V1, &cid)[..], 0, 2), None);
        }
        // Another version, a CID shorter than the server ID needs.
        assert_eq!(
            server_id(&long(LONG_TYPE_HANDSHAKE, 0x6b33_43cf, &cid)[..], 0, 2),
            None
        );
        assert_eq!(
            server_id(&long(LONG_TYPE_HANDSHAKE, QUIC_V1, &cid[..2])[..], 0, 2),
            None
        );
        // The unroutable config.
        let mut unroutable = cid;
        unroutable[0] = 0b1110_0000;
        assert_eq!(server_id(&short(&unroutable)[..], 0, 2), None);
        // Server ID length out of range; a datagram too short.
        assert_eq!(server_id(&short(&cid)[..], 0, 0), None);
        assert_eq!(server_id(&short(&cid)[..], 0, 5), None);
        assert_eq!(server_id(&[0x40u8, 8, 10][..], 0, 2), None);
    }

    #[test]
    fn a_backend_server_id_is_its_address_tail() {
        let a = crate::Addr::v4(u32::from_ne_bytes([10, 0, 2, 11]));
        assert_eq!(server_id_of(&a, 1), 11);
        assert_eq!(server_id_of(&a, 2), 0x020b);
        assert_eq!(server_id_of(&a, 4), 0x0a00_020b);
        let mut v6 = [0u8; 16];
        v6[0] = 0x20;
        v6[14] = 0x12;
        v6[15] = 0x34;
        assert_eq!(server_id_of(&crate::Addr::from_v6_bytes(&v6), 2), 0x1234);
    }
}
