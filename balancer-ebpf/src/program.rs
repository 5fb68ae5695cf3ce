use core::{ffi::c_void, intrinsics::AtomicOrdering};

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibParams, xdp_action, BPF_NOEXIST},
    helpers::generated::{
        bpf_fib_lookup, bpf_get_prandom_u32, bpf_ktime_get_coarse_ns, bpf_loop, bpf_redirect,
    },
    macros::{map, xdp},
    maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray},
    programs::XdpContext,
};
use balancer_common::{
    choice::{self, Chooser},
    csum,
    flow::{self, Direction, Verdict},
    flow_kind,
    parse::{self, Frame, Parsed, Tcp4, IPV4_CSUM_OFF, IPV4_DST_OFF, IPV4_SRC_OFF, TCP_CSUM_OFF},
    Backend, BackendKey, BackendVips, Counter, FlowEntry, FlowKey, GlobalStats, Settings,
    TrafficStats, VipInfo, VipKey, BACKEND_F_IN_USE, BACKEND_SLOTS, COUNTER_COUNT,
    DEFAULT_FLOW_TABLE_SIZE, IPPROTO_TCP, MAX_VIPS, MAX_VIPS_PER_BACKEND, PORT_BITMAP_WORDS,
    VIP_BACKENDS_LEN,
};

#[map]
static VIPS: HashMap<VipKey, VipInfo> = HashMap::with_max_entries(MAX_VIPS, 0);
#[map]
static VIP_BACKENDS: Array<u32> = Array::with_max_entries(VIP_BACKENDS_LEN, 0);
#[map]
static BACKENDS: Array<Backend> = Array::with_max_entries(BACKEND_SLOTS, 0);
#[map]
static BACKEND_CONNS: Array<u64> = Array::with_max_entries(BACKEND_SLOTS, 0);
#[map]
static BACKEND_CONN_ADJUST: Array<u64> = Array::with_max_entries(BACKEND_SLOTS, 0);
/// Bitmap of VIP ports (bit p of word p / 64, p in host byte order): frames
/// to any other port skip every hash lookup.
#[map]
static VIP_PORTS: Array<u64> = Array::with_max_entries(PORT_BITMAP_WORDS, 0);
/// Bitmap of the low 16 bits of VIP addresses: with [`VIP_PORTS`], frames to
/// other addresses on a VIP port skip the flow table too.
#[map]
static VIP_ADDRS: Array<u64> = Array::with_max_entries(PORT_BITMAP_WORDS, 0);
/// Bitmap of backend ports: only frames from one of them can be replies.
#[map]
static BACKEND_PORTS: Array<u64> = Array::with_max_entries(PORT_BITMAP_WORDS, 0);
#[map]
static BACKEND_VIPS: HashMap<BackendKey, BackendVips> = HashMap::with_max_entries(BACKEND_SLOTS, 0);
#[map]
static FLOWS: LruHashMap<FlowKey, FlowEntry> =
    LruHashMap::with_max_entries(DEFAULT_FLOW_TABLE_SIZE, 0);
#[map]
static STATS: PerCpuArray<GlobalStats> = PerCpuArray::with_max_entries(1, 0);
#[map]
static BACKEND_STATS: PerCpuArray<TrafficStats> = PerCpuArray::with_max_entries(BACKEND_SLOTS, 0);
#[map]
static VIP_STATS: PerCpuArray<TrafficStats> = PerCpuArray::with_max_entries(MAX_VIPS, 0);
#[map]
static SETTINGS: Array<Settings> = Array::with_max_entries(1, 0);
/// State of the deterministic test generator (per CPU), used only when
/// `Settings::test_seed` is non-zero.
#[map]
static RNG_STATE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Key of the next-hop cache: destination address (network byte order) and
/// the interface the frame came in on.
#[repr(C)]
#[derive(Clone, Copy)]
struct HopKey {
    dst: u32,
    ingress: u32,
}

/// A cached `bpf_fib_lookup` result.
#[repr(C)]
#[derive(Clone, Copy)]
struct NextHop {
    /// Egress interface.
    ifindex: u32,
    /// Largest IPv4 total length the lookup accepted (MTU check), bytes.
    max_len: u16,
    /// Destination then source MAC, as written into the frame.
    macs: [u8; 12],
    _pad: u16,
    /// When the entry stops being used, CLOCK_MONOTONIC_COARSE ns.
    expires_ns: u64,
}

/// Next hop towards a backend slot, shared by all CPUs (indexed, no hashing).
/// CPUs refreshing it at once write the same bytes.
#[repr(C)]
#[derive(Clone, Copy)]
struct SlotHop {
    hop: NextHop,
    /// Generation of the slot the hop was looked up for.
    generation: u32,
    /// Interface the frames came in on when it was looked up.
    ingress: u32,
}

#[map]
static BACKEND_HOPS: Array<SlotHop> = Array::with_max_entries(BACKEND_SLOTS, 0);

/// Where [`forward`] caches the next hop.
#[derive(Clone, Copy)]
enum HopCache {
    /// Per backend slot and generation (client to backend).
    Slot(u32, u32),
    /// Per destination address, LRU (backend to client).
    Dst,
}

/// How long a next hop is reused before it is looked up again (ns): a
/// neighbour's new MAC or a route change takes effect within this time.
const NEXT_HOP_TTL_NS: u64 = 1_000_000_000;

/// Next-hop cache towards clients, by destination: a FIB lookup costs about
/// as much as the rest of the forwarding path together (measured with
/// `cargo xtask bench`). Shared by all CPUs, which write the same entry.
#[map]
static NEXT_HOPS: LruHashMap<HopKey, NextHop> = LruHashMap::with_max_entries(65536, 0);

const AF_INET: u8 = 2;
const BPF_FIB_LKUP_RET_SUCCESS: i64 = 0;
const BPF_FIB_LKUP_RET_NO_NEIGH: i64 = 7;
const BPF_FIB_LKUP_RET_FRAG_NEEDED: i64 = 8;

/// The frame behind an XDP context. Every access compares against
/// `data_end` with pointer arithmetic the verifier can follow.
struct XdpFrame<'a>(&'a XdpContext);

impl Frame for XdpFrame<'_> {
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.data_end() - self.0.data()
    }

    #[inline(always)]
    fn read<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let start = self.0.data();
        if start + off + N > self.0.data_end() {
            return None;
        }
        // SAFETY: bounds checked against data_end just above.
        Some(unsafe { core::ptr::read_unaligned((start + off) as *const [u8; N]) })
    }
}

impl XdpFrame<'_> {
    #[inline(always)]
    fn write<const N: usize>(&self, off: usize, bytes: [u8; N]) -> Option<()> {
        let start = self.0.data();
        if start + off + N > self.0.data_end() {
            return None;
        }
        // SAFETY: bounds checked against data_end just above.
        unsafe { core::ptr::write_unaligned((start + off) as *mut [u8; N], bytes) };
        Some(())
    }
}

#[xdp]
pub fn balancer(ctx: XdpContext) -> u32 {
    let frame = XdpFrame(&ctx);
    if let Some(p) = STATS.get_ptr_mut(0) {
        // SAFETY: per-CPU value, no concurrent writer.
        unsafe {
            (*p).counters[Counter::RxPackets as usize] += 1;
            (*p).counters[Counter::RxBytes as usize] += frame.len() as u64;
        }
    }
    match parse::parse(&frame) {
        Parsed::Tcp4(seg) => tcp(&ctx, &frame, &seg),
        Parsed::Fragment { .. } => {
            count(Counter::PassFragment, 1);
            xdp_action::XDP_PASS
        }
        Parsed::Malformed => {
            count(Counter::PassMalformed, 1);
            xdp_action::XDP_PASS
        }
        Parsed::OtherIpv4 | Parsed::Ipv6 | Parsed::OtherL2 => {
            count(Counter::PassNotVip, 1);
            xdp_action::XDP_PASS
        }
    }
}

#[inline(always)]
fn count(c: Counter, v: u64) {
    if let Some(p) = STATS.get_ptr_mut(0) {
        // SAFETY: per-CPU value, no concurrent writer; `c` is a Counter, below
        // COUNTER_COUNT.
        unsafe {
            if let Some(slot) = (*p).counters.get_mut(c as usize) {
                *slot += v;
            }
        }
    }
}

#[inline(always)]
fn traffic(map: &PerCpuArray<TrafficStats>, index: u32, bytes: u64, new_flow: bool, miss: bool) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: per-CPU value, no concurrent writer.
        unsafe {
            if miss {
                (*p).misses += 1;
            } else {
                (*p).packets += 1;
                (*p).bytes += bytes;
            }
            if new_flow {
                (*p).new_flows += 1;
            }
        }
    }
}

#[inline(always)]
fn atomic_add(map: &Array<u64>, index: u32, v: u64) {
    if let Some(p) = map.get_ptr_mut(index) {
        // SAFETY: BPF atomic add on a shared array value.
        unsafe { core::intrinsics::atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, v) };
    }
}

#[inline(always)]
fn now_ns() -> u64 {
    // CLOCK_MONOTONIC_COARSE (a tick's resolution, a few ns to read): plenty
    // for idle timeouts of seconds, and the same clock userspace compares
    // against (CLOCK_MONOTONIC runs at most a tick ahead of it).
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_coarse_ns() }
}

#[inline(always)]
fn random() -> u32 {
    if let Some(s) = SETTINGS.get(0) {
        if s.test_seed != 0 {
            if let Some(state) = RNG_STATE.get_ptr_mut(0) {
                // xorshift64* (Vigna, "An experimental exploration of
                // Marsaglia's xorshift generators", 2016): tests only.
                // SAFETY: per-CPU value.
                unsafe {
                    let mut x = *state;
                    if x == 0 {
                        x = s.test_seed;
                    }
                    x ^= x >> 12;
                    x ^= x << 25;
                    x ^= x >> 27;
                    *state = x;
                    return (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 32) as u32;
                }
            }
        }
    }
    // SAFETY: helper without arguments.
    unsafe { bpf_get_prandom_u32() }
}

#[inline(always)]
fn backend_of(entry: &FlowEntry) -> Option<Backend> {
    let b = *BACKENDS.get(entry.backend_slot)?;
    if b.flags & BACKEND_F_IN_USE == 0 || b.generation != entry.backend_generation {
        return None;
    }
    Some(b)
}

/// `true` when `port` (network byte order) is set in a port bitmap.
#[inline(always)]
fn port_listed(map: &Array<u64>, port: u16) -> bool {
    let p = u16::from_be(port) as u32;
    match map.get(p >> 6) {
        Some(w) => *w & (1u64 << (p & 63)) != 0,
        None => false,
    }
}

#[inline(always)]
fn tcp(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp4) -> u32 {
    // Low 16 bits of the address, as a port-sized key (network byte order).
    let addr_key = (u32::from_be(seg.dst_addr) as u16).to_be();
    if port_listed(&VIP_PORTS, seg.dst_port) && port_listed(&VIP_ADDRS, addr_key) {
        let key = FlowKey {
            src_addr: seg.src_addr,
            dst_addr: seg.dst_addr,
            src_port: seg.src_port,
            dst_port: seg.dst_port,
            proto: IPPROTO_TCP,
            kind: flow_kind::LIVE,
            _pad: 0,
        };
        // A pinned flow first: established traffic needs no VIP lookup
        // (only VIP flows are ever pinned). Other traffic rarely gets here:
        // both bitmaps must match.
        if let Some(e) = FLOWS.get_ptr_mut(&key) {
            return pinned(ctx, frame, seg, &key, e);
        }
        let vip_key = VipKey {
            addr: seg.dst_addr,
            port: seg.dst_port,
            proto: IPPROTO_TCP,
            _pad: 0,
        };
        if let Some(vip) = unsafe { VIPS.get(&vip_key) } {
            let vip = *vip;
            return unpinned(ctx, frame, seg, &key, &vip);
        }
    }
    if port_listed(&BACKEND_PORTS, seg.src_port) {
        let bkey = BackendKey {
            addr: seg.src_addr,
            port: seg.src_port,
            _pad: 0,
        };
        if let Some(bv) = unsafe { BACKEND_VIPS.get(&bkey) } {
            let bv = *bv;
            return to_client(ctx, frame, seg, &bv);
        }
    }
    count(Counter::PassNotVip, 1);
    xdp_action::XDP_PASS
}

/// Moves a flow from LIVE to CLOSED and releases its active connection. The
/// release happens only for the caller whose delete of the LIVE entry
/// succeeds, so racing closers (both directions, the daemon's expiry)
/// release exactly once.
#[inline(always)]
fn close(live_key: &FlowKey, entry: &FlowEntry, verdict: Verdict) {
    let _ = FLOWS.insert(&live_key.with_kind(flow_kind::CLOSED), entry, 0);
    if FLOWS.remove(live_key).is_ok() {
        atomic_add(&BACKEND_CONNS, entry.backend_slot, u64::MAX);
        count(
            if verdict == Verdict::ClosedByRst {
                Counter::ClosedRst
            } else {
                Counter::ClosedFin
            },
            1,
        );
    }
}

/// A segment of a pinned flow, client to VIP.
#[inline(always)]
fn pinned(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp4, key: &FlowKey, e: *mut FlowEntry) -> u32 {
    let now = now_ns();
    // SAFETY: pointer from a successful lookup.
    let entry = unsafe { &mut *e };
    let Some(b) = backend_of(entry) else {
        count(Counter::DropBackendGone, 1);
        return xdp_action::XDP_DROP;
    };
    entry.last_seen_ns = now;
    let (slot, vip_index) = (entry.backend_slot, entry.vip_index);
    let verdict = flow::track(entry, Direction::ToBackend, seg);
    match verdict {
        Verdict::Open => {}
        Verdict::RstOutOfWindow => count(Counter::RstOutOfWindow, 1),
        Verdict::ClosedByFin | Verdict::ClosedByRst => {
            let copy = *entry;
            close(key, &copy, verdict);
        }
    }
    to_backend(ctx, frame, seg, &b, slot, vip_index, false, now)
}

/// A segment to a VIP that matches no live flow: a SYN is placed, a late
/// segment of a closed flow follows it, anything else is passed and counted.
#[inline(always)]
fn unpinned(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp4, key: &FlowKey, vip: &VipInfo) -> u32 {
    let now = now_ns();
    if seg.is_syn() {
        return match new_flow(key, seg, vip, now) {
            Ok((b, slot)) => to_backend(ctx, frame, seg, &b, slot, vip.index, true, now),
            Err(action) => action,
        };
    }
    if let Some(e) = unsafe { FLOWS.get(&key.with_kind(flow_kind::CLOSED)) } {
        let Some(b) = backend_of(e) else {
            count(Counter::DropBackendGone, 1);
            return xdp_action::XDP_DROP;
        };
        count(Counter::ClosedFlowPackets, 1);
        return to_backend(ctx, frame, seg, &b, e.backend_slot, vip.index, false, now);
    }
    count(Counter::FlowMisses, 1);
    traffic(&VIP_STATS, vip.index, 0, false, true);
    xdp_action::XDP_PASS
}

/// Counts and forwards a client segment to its backend (destination NAT).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn to_backend(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp4,
    backend: &Backend,
    slot: u32,
    vip_index: u32,
    new_flow: bool,
    now: u64,
) -> u32 {
    let bytes = frame.len() as u64;
    traffic(&VIP_STATS, vip_index, bytes, new_flow, false);
    traffic(&BACKEND_STATS, slot, bytes, new_flow, false);
    let nat = Nat {
        addr_off: IPV4_DST_OFF,
        port_off: 2,
        addr: backend.addr,
        port: backend.port,
    };
    forward(
        ctx,
        frame,
        seg,
        &nat,
        seg.src_addr,
        backend.addr,
        now,
        HopCache::Slot(slot, backend.generation),
    )
}

/// State of one choice, passed to [`choose_step`] through `bpf_loop`.
#[repr(C)]
struct ChooseCtx {
    chooser: Chooser,
    /// Index in `VIP_BACKENDS` of the first entry of the active list.
    list_base: u32,
}

/// Active connections of the backend in `VIP_BACKENDS[list_index]`.
#[inline(always)]
fn load_of(list_index: u32) -> Option<u64> {
    let slot = *VIP_BACKENDS.get(list_index)?;
    let conns = *BACKEND_CONNS.get(slot)?;
    let adjust = *BACKEND_CONN_ADJUST.get(slot)?;
    Some(choice::active_connections(conns, adjust))
}

/// One step of the choice rule, called by `bpf_loop` (kernel 5.17+), so the
/// verifier checks the step once whatever the number of backends scanned.
#[inline(never)]
extern "C" fn choose_step(step: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: ctx is the ChooseCtx passed to bpf_loop.
    let c = unsafe { &mut *(ctx as *mut ChooseCtx) };
    let mut rand = random;
    let i = c.chooser.candidate(step as u32, &mut rand);
    if let Some(l) = load_of(c.list_base + i) {
        c.chooser.offer(i, l, &mut rand);
    }
    0
}

/// Places a new flow: choose, pin, count. Returns the backend and its slot,
/// or the XDP action for the SYN when it cannot be placed.
#[inline(always)]
fn new_flow(key: &FlowKey, seg: &Tcp4, vip: &VipInfo, now: u64) -> Result<(Backend, u32), u32> {
    let mut lctx = ChooseCtx {
        chooser: Chooser::new(vip.eligible, vip.choices),
        list_base: vip.list_index(0),
    };
    let steps = lctx.chooser.steps();
    // SAFETY: callback is a static function; the context pointer is a stack
    // object alive for the duration of the call.
    unsafe {
        bpf_loop(
            steps,
            choose_step as *mut c_void,
            &mut lctx as *mut ChooseCtx as *mut c_void,
            0,
        )
    };
    let Some(index) = lctx.chooser.result() else {
        count(Counter::DropNoBackend, 1);
        return Err(xdp_action::XDP_DROP);
    };
    let Some(slot) = VIP_BACKENDS.get(vip.list_index(index)) else {
        count(Counter::DropNoBackend, 1);
        return Err(xdp_action::XDP_DROP);
    };
    let slot = *slot;
    let Some(b) = BACKENDS.get(slot) else {
        count(Counter::DropNoBackend, 1);
        return Err(xdp_action::XDP_DROP);
    };
    let b = *b;
    if b.flags & BACKEND_F_IN_USE == 0 {
        count(Counter::DropNoBackend, 1);
        return Err(xdp_action::XDP_DROP);
    }
    let mut entry = FlowEntry {
        backend_slot: slot,
        backend_generation: b.generation,
        vip_index: vip.index,
        ..FlowEntry::default()
    };
    flow::start(&mut entry, seg, now);
    if FLOWS.insert(key, &entry, BPF_NOEXIST as u64).is_err() {
        // Another CPU placed the same SYN first: follow it.
        if let Some(e) = unsafe { FLOWS.get(key) } {
            if let Some(b) = backend_of(e) {
                return Ok((b, e.backend_slot));
            }
        }
        count(Counter::DropFlowInsert, 1);
        return Err(xdp_action::XDP_DROP);
    }
    atomic_add(&BACKEND_CONNS, slot, 1);
    // A CLOSED entry of an earlier connection on this 5-tuple may remain:
    // the LIVE entry is always looked up first, this connection's own close
    // overwrites it, and the daemon expires it after the closing timeout, so
    // it is not deleted here (that lookup would cost every new flow).
    count(Counter::NewFlows, 1);
    Ok((b, slot))
}

/// A reply from a backend: finds its flow by trying the client-side key for
/// each VIP the backend serves (one lookup when it serves one VIP), checks
/// the flow is pinned to this very backend, tracks it and rewrites the
/// source back to the VIP. A reply that matches no flow passes untouched.
#[inline(always)]
fn to_client(ctx: &XdpContext, frame: &XdpFrame, seg: &Tcp4, bv: &BackendVips) -> u32 {
    let now = now_ns();
    let mut i = 0;
    while i < MAX_VIPS_PER_BACKEND as usize {
        if i as u32 >= bv.count {
            break;
        }
        let vip = bv.vips[i];
        let live_key = FlowKey {
            src_addr: seg.dst_addr,
            dst_addr: vip.addr,
            src_port: seg.dst_port,
            dst_port: vip.port,
            proto: IPPROTO_TCP,
            kind: flow_kind::LIVE,
            _pad: 0,
        };
        let (slot, vip_index) = if let Some(e) = FLOWS.get_ptr_mut(&live_key) {
            // SAFETY: pointer from a successful lookup.
            let entry = unsafe { &mut *e };
            if !is_from(entry, seg) {
                i += 1;
                continue;
            }
            entry.last_seen_ns = now;
            let verdict = flow::track(entry, Direction::ToClient, seg);
            let (slot, vip_index) = (entry.backend_slot, entry.vip_index);
            match verdict {
                Verdict::Open => {}
                Verdict::RstOutOfWindow => count(Counter::RstOutOfWindow, 1),
                Verdict::ClosedByFin | Verdict::ClosedByRst => {
                    let copy = *entry;
                    close(&live_key, &copy, verdict);
                }
            }
            (slot, vip_index)
        } else if let Some(e) = FLOWS.get_ptr_mut(&live_key.with_kind(flow_kind::CLOSED)) {
            // SAFETY: pointer from a successful lookup.
            let entry = unsafe { &mut *e };
            if !is_from(entry, seg) {
                i += 1;
                continue;
            }
            count(Counter::ClosedFlowPackets, 1);
            (entry.backend_slot, entry.vip_index)
        } else {
            i += 1;
            continue;
        };
        let bytes = frame.len() as u64;
        traffic(&VIP_STATS, vip_index, bytes, false, false);
        traffic(&BACKEND_STATS, slot, bytes, false, false);
        count(Counter::ReplyPackets, 1);
        let nat = Nat {
            addr_off: IPV4_SRC_OFF,
            port_off: 0,
            addr: vip.addr,
            port: vip.port,
        };
        return forward(
            ctx,
            frame,
            seg,
            &nat,
            vip.addr,
            seg.dst_addr,
            now,
            HopCache::Dst,
        );
    }
    count(Counter::PassNotVip, 1);
    xdp_action::XDP_PASS
}

/// `true` when `seg` comes from the backend the flow is pinned to (the same
/// client tuple may be pinned to another backend of another VIP).
#[inline(always)]
fn is_from(entry: &FlowEntry, seg: &Tcp4) -> bool {
    match backend_of(entry) {
        Some(b) => b.addr == seg.src_addr && b.port == seg.src_port,
        None => false,
    }
}

/// A NAT rewrite: the IPv4 address at `addr_off` in the IPv4 header and the
/// TCP port at `port_off` in the TCP header become `addr` and `port`
/// (network byte order).
struct Nat {
    addr_off: usize,
    port_off: usize,
    addr: u32,
    port: u16,
}

/// Applies `nat`, updating both checksums incrementally (RFC 1624). The TCP
/// checksum covers the address through the pseudo-header. Reads everything
/// before writing anything, so a failed read leaves the frame untouched.
#[inline(always)]
fn rewrite(frame: &XdpFrame, seg: &Tcp4, nat: &Nat) -> Option<()> {
    let (addr_off, port_off, new_addr, new_port) = (nat.addr_off, nat.port_off, nat.addr, nat.port);
    let l3 = seg.l3_off;
    let l4 = seg.l4_off;
    let old_addr = u32::from_ne_bytes(frame.read::<4>(l3 + addr_off)?);
    let old_port = u16::from_ne_bytes(frame.read::<2>(l4 + port_off)?);
    let ip_csum = u16::from_ne_bytes(frame.read::<2>(l3 + IPV4_CSUM_OFF)?);
    let tcp_csum = u16::from_ne_bytes(frame.read::<2>(l4 + TCP_CSUM_OFF)?);
    let ip_csum = csum::replace32(ip_csum, old_addr, new_addr);
    let tcp_csum = csum::replace16(
        csum::replace32(tcp_csum, old_addr, new_addr),
        old_port,
        new_port,
    );
    frame.write(l3 + addr_off, new_addr.to_ne_bytes())?;
    frame.write(l4 + port_off, new_port.to_ne_bytes())?;
    frame.write(l3 + IPV4_CSUM_OFF, ip_csum.to_ne_bytes())?;
    frame.write(l4 + TCP_CSUM_OFF, tcp_csum.to_ne_bytes())?;
    Some(())
}

/// Finds the next hop towards `dst` (from `cache`, or
/// `bpf_fib_lookup` when the cached one is missing, older than
/// [`NEXT_HOP_TTL_NS`] or checked only for smaller frames) and, only when the
/// frame will leave, applies `nat` and sends it: XDP_TX when it leaves
/// through the interface it came in on, XDP_REDIRECT otherwise. With no neighbour entry yet the
/// rewritten frame goes to the kernel, which resolves the neighbour and
/// forwards it. A frame that cannot be forwarded (no route, larger than the
/// egress MTU) is dropped untouched and counted.
#[inline(always)]
fn forward(
    ctx: &XdpContext,
    frame: &XdpFrame,
    seg: &Tcp4,
    nat: &Nat,
    src: u32,
    dst: u32,
    now: u64,
    cache: HopCache,
) -> u32 {
    let ingress = ctx.ingress_ifindex() as u32;
    let key = HopKey { dst, ingress };
    let none = NextHop {
        ifindex: 0,
        max_len: 0,
        macs: [0; 12],
        _pad: 0,
        expires_ns: 0,
    };
    let cached = match cache {
        HopCache::Slot(slot, generation) => match BACKEND_HOPS.get(slot) {
            Some(h) if h.generation == generation && h.ingress == ingress => h.hop,
            _ => none,
        },
        HopCache::Dst => match NEXT_HOPS.get_ptr(&key) {
            // SAFETY: pointer from a successful lookup of a per-CPU value.
            Some(h) => unsafe { *h },
            None => none,
        },
    };
    let hop = if cached.expires_ns > now && seg.ip_total_len <= cached.max_len {
        cached
    } else {
        // SAFETY: plain-old-data struct; all-zero is a valid value.
        let mut p: FibParams = unsafe { core::mem::zeroed() };
        p.family = AF_INET;
        p.l4_protocol = IPPROTO_TCP;
        p.__bindgen_anon_1.tot_len = seg.ip_total_len;
        p.ifindex = ingress;
        p.__bindgen_anon_3.ipv4_src = src;
        p.__bindgen_anon_4.ipv4_dst = dst;
        // SAFETY: valid context and params pointers, size of the params struct.
        let rc = unsafe {
            bpf_fib_lookup(
                ctx.ctx as *mut _,
                &mut p,
                core::mem::size_of::<FibParams>() as i32,
                0,
            )
        };
        if rc == BPF_FIB_LKUP_RET_FRAG_NEEDED {
            count(Counter::DropMtu, 1);
            return xdp_action::XDP_DROP;
        }
        if rc == BPF_FIB_LKUP_RET_NO_NEIGH {
            if rewrite(frame, seg, nat).is_none() {
                count(Counter::PassMalformed, 1);
                return xdp_action::XDP_PASS;
            }
            count(Counter::PassFibNoNeigh, 1);
            return xdp_action::XDP_PASS;
        }
        if rc != BPF_FIB_LKUP_RET_SUCCESS {
            count(Counter::DropFib, 1);
            return xdp_action::XDP_DROP;
        }
        let mut macs = [0u8; 12];
        macs[..6].copy_from_slice(&p.dmac);
        macs[6..].copy_from_slice(&p.smac);
        let same_hop =
            cached.expires_ns > now && cached.ifindex == p.ifindex && cached.macs == macs;
        let fresh = NextHop {
            ifindex: p.ifindex,
            // A larger frame that fit raises what later frames may skip the lookup for.
            max_len: if same_hop && cached.max_len > seg.ip_total_len {
                cached.max_len
            } else {
                seg.ip_total_len
            },
            macs,
            _pad: 0,
            expires_ns: if same_hop {
                cached.expires_ns
            } else {
                now + NEXT_HOP_TTL_NS
            },
        };
        match cache {
            HopCache::Slot(slot, generation) => {
                let _ = BACKEND_HOPS.set(
                    slot,
                    SlotHop {
                        hop: fresh,
                        generation,
                        ingress,
                    },
                    0,
                );
            }
            HopCache::Dst => {
                let _ = NEXT_HOPS.insert(&key, &fresh, 0);
            }
        }
        fresh
    };
    if rewrite(frame, seg, nat).is_none() || frame.write(0, hop.macs).is_none() {
        count(Counter::PassMalformed, 1);
        return xdp_action::XDP_PASS;
    }
    if hop.ifindex == ingress {
        count(Counter::TxPackets, 1);
        return xdp_action::XDP_TX;
    }
    count(Counter::RedirectPackets, 1);
    // SAFETY: plain helper call.
    unsafe { bpf_redirect(hop.ifindex, 0) as u32 }
}

// ---- programs for benchmarks only (never attached by the daemon) ----

/// Frames counted by `bench_count`.
#[map]
static BENCH_COUNT: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Does nothing: the per-call floor of BPF_PROG_TEST_RUN.
#[xdp]
pub fn bench_empty(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// Parses Ethernet/IPv4/TCP like the balancer and returns XDP_TX: the
/// baseline the balancer's added cost is measured against.
#[xdp]
pub fn bench_baseline(ctx: XdpContext) -> u32 {
    match parse::parse(&XdpFrame(&ctx)) {
        Parsed::Tcp4(_) => xdp_action::XDP_TX,
        _ => xdp_action::XDP_PASS,
    }
}

/// Returns XDP_TX: a packet generator under live-frame test runs, and the
/// forwarding ceiling of an interface.
#[xdp]
pub fn bench_tx(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_TX
}

/// Template frame for `bench_gen` (the first 64 bytes of each frame).
#[map]
static BENCH_FRAME: Array<[u8; 64]> = Array::with_max_entries(1, 0);

/// Writes the template frame over the first 64 bytes and returns XDP_TX: a
/// packet generator under live-frame test runs whose frames stay the same
/// even when the receiver rewrites them (live-frame pages are recycled with
/// the receiver's changes in them).
#[xdp]
pub fn bench_gen(ctx: XdpContext) -> u32 {
    let start = ctx.data();
    if start + 64 > ctx.data_end() {
        return xdp_action::XDP_ABORTED;
    }
    if let Some(t) = BENCH_FRAME.get(0) {
        // SAFETY: 64 bytes checked against data_end just above.
        unsafe { core::ptr::write_unaligned(start as *mut [u8; 64], *t) };
    }
    xdp_action::XDP_TX
}

/// Counts frames and drops them: the sink of the packet-rate benchmark.
#[xdp]
pub fn bench_count(_ctx: XdpContext) -> u32 {
    if let Some(p) = BENCH_COUNT.get_ptr_mut(0) {
        // SAFETY: per-CPU value.
        unsafe { *p += 1 };
    }
    xdp_action::XDP_DROP
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
