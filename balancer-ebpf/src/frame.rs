//! The frame behind an XDP context, and the clock.

use aya_ebpf::{
    helpers::generated::{bpf_ktime_get_coarse_ns, bpf_ktime_get_ns, bpf_xdp_get_buff_len},
    programs::XdpContext,
};
use balancer_common::{parse::Frame, Addr};

/// A 32-bit word at an even address: every address in a frame starts at an
/// even offset (Ethernet 14 bytes, VLAN tags 4, IP headers whole multiples
/// of 4) and XDP frames start at least 2-aligned. Loaded and stored as one
/// value: the BPF backend splits every access it cannot prove aligned into
/// bytes, and the bytes of an address each took a register, or a stack
/// slot, until they were put together (16 of them for an IPv6 address).
#[repr(C, packed(2))]
struct Word(u32);

/// An IPv6 address's four words at an even address.
#[repr(C, packed(2))]
struct Words4([u32; 4]);

/// `p` (a frame address), with what the compiler knows of it hidden by an
/// empty `asm!` (libbpf's `barrier_var`): each access's check against
/// `data_end` is then made on the very pointer the access uses. Left to
/// itself, the compiler drops a check that an earlier one implies and
/// reaches the bytes from that earlier access's pointer plus a constant,
/// which the verifier rejects (it relates no two pointers computed from
/// different offsets).
#[inline(always)]
fn at(p: usize) -> usize {
    let mut p = p;
    // SAFETY: an empty instruction sequence; `p` comes back unchanged.
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) p, options(pure, nomem, nostack)) };
    p
}

/// `off` masked to 16,383 (the verifier marks no range on a pointer that may be past 65,535 once its access size is added): an
/// offset that came back through memory (a parse of another function, a
/// plan) is unbounded for the verifier, which refuses a packet access at
/// it; every offset of a header the parser finds is far below it, so the
/// mask changes none.
#[inline(always)]
fn bounded(off: usize) -> usize {
    off & 0x3fff
}

/// `p` with what the compiler knows of it hidden (as [`at`]): a null
/// check of a global function's pointer argument is then kept (the
/// compiler would drop it for a reference).
#[inline(always)]
#[expect(
    clippy::pointers_in_nomem_asm_block,
    reason = "the asm reads no memory: it only hides the pointer's value"
)]
pub fn opaque<T>(p: *const T) -> *const T {
    let mut p = p;
    // SAFETY: an empty instruction sequence; `p` comes back unchanged.
    unsafe { core::arch::asm!("{0} = {0}", inout(reg) p, options(pure, nomem, nostack)) };
    p
}

/// The frame behind an XDP context. Every access compares against
/// `data_end` with pointer arithmetic the verifier can follow.
pub struct XdpFrame<'a>(pub &'a XdpContext);

impl Frame for XdpFrame<'_> {
    /// The first buffer's length: with a multi-buffer program (every
    /// program here is one, `xdp.frags`, so that jumbo frames reach it in
    /// native mode) a frame larger than a page has its tail in fragments
    /// past `data_end`, which reads never reach (the headers are in the
    /// first buffer).
    #[inline(always)]
    fn len(&self) -> usize {
        self.0.data_end() - self.0.data()
    }

    /// The whole frame's length (`bpf_xdp_get_buff_len`, kernel 5.18): a
    /// helper call, made only when the first buffer falls short (measured:
    /// calling it on every frame cost the frame-not-for-a-VIP path about
    /// half of what the balancer adds there).
    #[inline(always)]
    fn total_len(&self) -> usize {
        // SAFETY: valid context.
        unsafe { bpf_xdp_get_buff_len(self.0.ctx) as usize }
    }

    #[inline(always)]
    fn read<const N: usize>(&self, off: usize) -> Option<[u8; N]> {
        let p = at(self.0.data() + bounded(off));
        if p + N > self.0.data_end() {
            return None;
        }
        // SAFETY: bounds checked against data_end just above.
        Some(unsafe { core::ptr::read_unaligned(p as *const [u8; N]) })
    }

    #[inline(always)]
    fn read_u32(&self, off: usize) -> Option<u32> {
        let p = at(self.0.data() + bounded(off));
        if p + 4 > self.0.data_end() {
            return None;
        }
        // SAFETY: bounds checked just above; an even address (see `Word`).
        Some(unsafe { core::ptr::read(p as *const Word) }.0)
    }

    #[inline(always)]
    fn read_addr6(&self, off: usize) -> Option<Addr> {
        let p = at(self.0.data() + bounded(off));
        if p + 16 > self.0.data_end() {
            return None;
        }
        // SAFETY: bounds checked just above; an even address (see `Word`).
        Some(Addr(unsafe { core::ptr::read(p as *const Words4) }.0))
    }
}

impl XdpFrame<'_> {
    /// Writes `w` (native-endian: the wire bytes of an IPv4 address in
    /// the maps' form) at `off` (even) as one word.
    #[inline(always)]
    pub fn write_u32(&self, off: usize, w: u32) -> Option<()> {
        let p = at(self.0.data() + bounded(off));
        if p + 4 > self.0.data_end() {
            return None;
        }
        // SAFETY: bounds checked just above; an even address (see `Word`).
        unsafe { core::ptr::write(p as *mut Word, Word(w)) };
        Some(())
    }

    /// Writes the IPv6 address `a` at `off` (even) as four words.
    #[inline(always)]
    pub fn write_addr6(&self, off: usize, a: &Addr) -> Option<()> {
        let p = at(self.0.data() + bounded(off));
        if p + 16 > self.0.data_end() {
            return None;
        }
        // Four word stores: a store of the 16 bytes at once is a
        // `memmove` call (a byte loop) on the BPF target.
        for (i, w) in a.0.iter().enumerate() {
            // SAFETY: bounds checked just above (16 bytes); an even
            // address (see `Word`).
            unsafe { core::ptr::write_volatile((p + 4 * i) as *mut Word, Word(*w)) };
        }
        Some(())
    }

    /// Writes `bytes` at `off`; `None` (nothing written) when they do not fit.
    #[inline(always)]
    pub fn write<const N: usize>(&self, off: usize, bytes: [u8; N]) -> Option<()> {
        let p = at(self.0.data() + bounded(off));
        if p + N > self.0.data_end() {
            return None;
        }
        // Byte by byte, unrolled (N is a constant): a store of the array
        // at once is a `memmove` call (a byte loop) on the BPF target.
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: bounds checked against data_end just above.
            unsafe { core::ptr::write_volatile((p + i) as *mut u8, *b) };
        }
        Some(())
    }
}

/// CLOCK_MONOTONIC_COARSE, ns: a tick's resolution, a few ns to read; plenty
/// for idle timeouts of seconds, and the clock userspace compares against
/// (CLOCK_MONOTONIC runs at most a tick ahead of it).
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_coarse_ns() }
}

/// CLOCK_MONOTONIC, ns, at full resolution (a few ns dearer than
/// [`now_ns`]): orders flows created within one tick.
#[inline(always)]
pub fn precise_ns() -> u64 {
    // SAFETY: helper without arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// The frame as [`parse`] found it, per CPU.
#[aya_ebpf::macros::map]
static PARSED: aya_ebpf::maps::PerCpuArray<balancer_common::parse::Parsed> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

/// A datagram's [`balancer_common::parse::Tcp`] form
/// (`parse::udp_datagram`), per CPU.
#[aya_ebpf::macros::map]
static DATAGRAM: aya_ebpf::maps::PerCpuArray<balancer_common::parse::Tcp> =
    aya_ebpf::maps::PerCpuArray::with_max_entries(1, 0);

/// `balancer_common::parse::parse` of the frame of `ctx`, made by a BPF
/// function of its own into this CPU's [`PARSED`] and returned by
/// reference: neither the parse's temporaries nor its result take room
/// in the frame of the deciding function that calls it, under which
/// `track`'s or the placement's frame sits (Linux 6.1 rounds each frame
/// of a chain up to 32 bytes and allows 512 in all). The offsets it holds
/// are unbounded for the verifier (read from memory): every packet access
/// here masks its offset ([`bounded`]). `None` never happens (a per-CPU
/// array of one entry).
#[inline(always)]
pub fn parse(ctx: XdpContext) -> Option<&'static balancer_common::parse::Parsed> {
    let p = PARSED.get_ptr_mut(0)?;
    parse_into(ctx, p.cast());
    // SAFETY: this CPU's value, just written, used by this run alone.
    Some(unsafe { &*p })
}

/// The segment [`parse`] last found on this CPU: its TCP segment, or the
/// datagram [`datagram`] last made.
#[inline(always)]
pub fn segment() -> Option<&'static balancer_common::parse::Tcp> {
    match PARSED.get(0)? {
        balancer_common::parse::Parsed::Tcp(seg) => Some(seg),
        balancer_common::parse::Parsed::Udp(_) => DATAGRAM.get(0),
        _ => None,
    }
}

/// The datagram `at` of the frame of `ctx` as a segment
/// (`parse::udp_datagram`), made in this CPU's [`DATAGRAM`] (as
/// [`parse`]).
#[inline(always)]
pub fn datagram(
    frame: &XdpFrame,
    at: &balancer_common::parse::UdpAt,
) -> Option<&'static balancer_common::parse::Tcp> {
    let seg = balancer_common::parse::udp_datagram(frame, at)?;
    let p = DATAGRAM.get_ptr_mut(0)?;
    // SAFETY: this CPU's value, used by this run alone; volatile, as in
    // `parse_into`.
    unsafe {
        core::ptr::write_volatile(p, seg);
        Some(&*p)
    }
}

/// [`parse`]'s BPF function: writes through an untyped pointer (a
/// function that returns the enum, or takes a typed pointer to it, loses
/// the object's BTF function records in the link, and the kernel then
/// refuses every tail call of the program). 0 bytes of its caller's
/// frame.
#[inline(never)]
fn parse_into(ctx: XdpContext, out: *mut core::ffi::c_void) {
    // SAFETY: `out` points to this CPU's `PARSED`. A volatile store (a
    // copy from this frame): a plain one let the compiler pack the enum's
    // first word from a register it never set (its padding), which the
    // verifier refuses ("R7 !read_ok").
    unsafe {
        core::ptr::write_volatile(
            out.cast::<balancer_common::parse::Parsed>(),
            balancer_common::parse::parse(&XdpFrame(&ctx)),
        )
    };
}
