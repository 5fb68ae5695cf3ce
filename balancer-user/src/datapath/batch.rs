//! Batched reads of the program's hash maps (`BPF_MAP_LOOKUP_BATCH`, Linux
//! 5.6+): one system call copies thousands of entries, where aya's iterator
//! costs two per entry (`BPF_MAP_GET_NEXT_KEY` and `BPF_MAP_LOOKUP_ELEM`).
//! aya 0.14 has no batch operations, so this is the one place the daemon
//! calls bpf(2) itself.
//!
//! The kernel walks a hash map bucket by bucket; the batch token it hands
//! back is the next bucket's index (a `u32` for hash and LRU hash maps:
//! `kernel/bpf/hashtab.c`, `__htab_map_lookup_and_delete_batch`). A walk
//! resumed from a token sees every entry that stayed in its bucket from the
//! start of the walk to its end once; entries added or removed meanwhile
//! may or may not show (as with any walk of a live table). A lookup from
//! the syscall side does not mark an LRU entry as used.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd},
};

use aya::Pod;

/// Entries per batched read where a whole table is read: 8,192 (640 KiB
/// of flow keys and entries per call).
pub const CHUNK: u32 = 8192;

/// `BPF_MAP_LOOKUP_BATCH` (include/uapi/linux/bpf.h, `enum bpf_cmd`).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// `BPF_MAP_UPDATE_BATCH`.
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// `BPF_MAP_DELETE_BATCH`.
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// The `batch` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Runs bpf(2) command `cmd` on `attr`; the raw return value (negative
/// with `errno` set on failure).
///
/// # Safety
/// Every pointer in `attr` must be valid for what `cmd` reads and writes
/// (the keys, values and tokens of `count` entries of the map's sizes).
unsafe fn bpf(cmd: libc::c_long, attr: &mut BatchAttr) -> libc::c_long {
    // SAFETY: the caller's contract; attr itself is a live, sized struct.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut BatchAttr,
            size_of::<BatchAttr>() as u32,
        )
    }
}

/// Where a walk of one hash map stands: the bucket to resume from, or done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Cursor {
    /// Not started: the next read begins at bucket 0.
    #[default]
    Start,
    /// Resume at this bucket (the kernel's token).
    At(u32),
    /// The last read reached the end of the map.
    Done,
}

/// Reads up to `max` entries of the hash map `fd` (key `K`, value `V`, as
/// the map was created: not per-CPU) from `cursor` on, appends them to
/// `out`, and moves the cursor (to [`Cursor::Done`] at the end of the
/// map). A read may return fewer than `max` entries before the end (the
/// kernel stops at a bucket boundary), and more buckets than entries are
/// skipped when the map is sparse.
///
/// # Errors
/// The bpf(2) error (`EINVAL` for a map type without batch operations or
/// sizes that are not the map's; `ENOSPC` cannot happen for `max` of 64 or
/// more with the balancer's tables, whose buckets hold a few entries).
pub fn lookup<K: Pod, V: Pod>(
    fd: BorrowedFd<'_>,
    cursor: &mut Cursor,
    max: u32,
    out: &mut Vec<(K, V)>,
) -> io::Result<()> {
    if *cursor == Cursor::Done || max == 0 {
        return Ok(());
    }
    let n = max as usize;
    let mut keys: Vec<K> = Vec::with_capacity(n);
    let mut values: Vec<V> = Vec::with_capacity(n);
    // The tokens: u64 storage for the kernel's u32 (it reads and writes the
    // first four bytes).
    let mut token_in: u64 = match *cursor {
        Cursor::At(b) => u64::from(b),
        _ => 0,
    };
    let mut token_out: u64 = 0;
    let mut attr = BatchAttr {
        in_batch: match *cursor {
            Cursor::Start => 0,
            _ => (&mut token_in as *mut u64) as u64,
        },
        out_batch: (&mut token_out as *mut u64) as u64,
        keys: keys.as_mut_ptr() as u64,
        values: values.as_mut_ptr() as u64,
        count: max,
        map_fd: fd.as_raw_fd() as u32,
        ..BatchAttr::default()
    };
    // SAFETY: attr points at buffers of `max` keys and values of the map's
    // sizes (the caller's K and V), and at two token words, all alive for
    // the call; the kernel writes at most `count` of each.
    let r = unsafe { bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) };
    let err = (r < 0).then(io::Error::last_os_error);
    let got = (attr.count as usize).min(n);
    match &err {
        Some(e) if e.raw_os_error() == Some(libc::ENOENT) => *cursor = Cursor::Done,
        Some(_) => {}
        None => *cursor = Cursor::At(token_out as u32),
    }
    if let Some(e) = err.filter(|e| e.raw_os_error() != Some(libc::ENOENT)) {
        return Err(e);
    }
    // SAFETY: the kernel filled the first `got` keys and values (plain old
    // data of the map's sizes).
    unsafe {
        keys.set_len(got);
        values.set_len(got);
    }
    out.extend(keys.into_iter().zip(values));
    Ok(())
}

/// Every entry of the hash map `fd`, read `chunk` at a time.
///
/// # Errors
/// As [`lookup`].
pub fn lookup_all<K: Pod, V: Pod>(fd: BorrowedFd<'_>, chunk: u32) -> io::Result<Vec<(K, V)>> {
    let mut out = Vec::new();
    let mut cursor = Cursor::Start;
    while cursor != Cursor::Done {
        lookup(fd, &mut cursor, chunk, &mut out)?;
    }
    Ok(out)
}

/// Writes `keys[i] -> values[i]` into the hash map `fd` in one call
/// (`BPF_ANY`: created or replaced). For tests and benchmarks that fill a
/// table without the data path; returns how many were written.
///
/// # Errors
/// The bpf(2) error (`E2BIG` for more entries than the map holds, with
/// those before written).
pub fn update<K: Pod, V: Pod>(fd: BorrowedFd<'_>, keys: &[K], values: &[V]) -> io::Result<u32> {
    let n = keys.len().min(values.len()).min(u32::MAX as usize) as u32;
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: n,
        map_fd: fd.as_raw_fd() as u32,
        ..BatchAttr::default()
    };
    // SAFETY: attr points at `n` keys and values of the caller's types,
    // alive for the call; the kernel only reads them.
    let r = unsafe { bpf(BPF_MAP_UPDATE_BATCH, &mut attr) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(attr.count)
}

/// Deletes `keys` from the hash map `fd` in as few calls as possible and
/// says, per key, whether this call deleted it (`false`: it was not there,
/// e.g. the data path deleted it first). The kernel's batch delete stops at
/// the first key it cannot delete and reports how many it deleted before
/// it (`generic_map_delete_batch`), so each failure costs one more call.
///
/// # Errors
/// A bpf(2) error other than `ENOENT` (the keys before it are deleted and
/// reported).
pub fn delete<K: Pod>(fd: BorrowedFd<'_>, keys: &[K]) -> io::Result<Vec<bool>> {
    let mut done = Vec::with_capacity(keys.len());
    while done.len() < keys.len() {
        let rest = &keys[done.len()..];
        let mut attr = BatchAttr {
            keys: rest.as_ptr() as u64,
            count: rest.len().min(u32::MAX as usize) as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at `count` keys of the caller's type, alive
        // for the call; the kernel only reads them.
        let r = unsafe { bpf(BPF_MAP_DELETE_BATCH, &mut attr) };
        let deleted = (attr.count as usize).min(rest.len());
        done.extend(std::iter::repeat_n(true, deleted));
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
            // The key after the deleted ones was not there.
            if done.len() < keys.len() {
                done.push(false);
            }
        }
    }
    Ok(done)
}
