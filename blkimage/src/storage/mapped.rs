//! Files read in place from memory maps, and a file that shrinks under one.
//!
//! From the page cache every `pread` is a memory copy that costs about as
//! much as digesting the bytes; a digest worker reading a memory map of the
//! file digests the cached pages where they are. Each lent range is mapped
//! on the worker that digests it, its page tables filled in one call
//! (`MADV_POPULATE_READ`, which also reads in what is not cached), and
//! unmapped as soon as it is digested: the memory a run holds stays that of
//! the ranges in flight, and page tables never grow with the file.
//!
//! A file truncated under a mapping makes the next touch of a page past its
//! new end raise SIGBUS, which kills the process by default. The handler
//! here ([`install`]) looks the faulting address up among the ranges being
//! digested; if it is one of them it maps anonymous zero pages over the rest
//! of that range (`mmap` is async-signal-safe) and marks the range cut, so
//! the worker finishes its digest of zeros and the lend then fails with
//! "the file shrank while it was read": never a checksum, never a crash.
//! Faults anywhere else go to the handler that was there before (or to the
//! default action, which then kills the process as it would have).
//!
//! The handler is process-wide, so only a program that owns its signals
//! installs it (the commands, through [`crate::OpenOptions::map`]); a
//! library inside a host program (the Python package) keeps the copying
//! path, since the host may install its own SIGBUS handler after ours.
//!
//! Hand-written on purpose: signal-hook registers handlers for signals
//! that are delivered, not for faults (its registry cannot resume a fault
//! or fall back to the default action), and memmap2, used for the maps
//! themselves, leaves SIGBUS to its caller.

use memmap2::{Advice, MmapOptions};
use std::fs::File;
use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Ranges digested at once: one per digest worker (at most 128), with room
/// to spare; a lend finding none free reads with a copy instead.
const SLOTS: usize = 256;

/// A mapped range being digested: `start..end` of the address space, and
/// whether the handler cut it short. `start` is 0 while the slot is free.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    cut: AtomicBool,
}

static RANGES: [Slot; SLOTS] = [const {
    Slot {
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        cut: AtomicBool::new(false),
    }
}; SLOTS];

/// The SIGBUS action before ours, saved once when ours is installed.
struct Previous(libc::sigaction);
// SAFETY: plain data (a handler address, a mask, flags), written once
// before the handler that reads it is installed.
unsafe impl Sync for Previous {}
unsafe impl Send for Previous {}

static PREVIOUS: OnceLock<Previous> = OnceLock::new();
static PAGE: AtomicUsize = AtomicUsize::new(4096);

/// Install the SIGBUS handler, once per process; later calls return what
/// the first one did. Afterwards a [`crate::RawFile`] read through the page
/// cache may be mapped ([`crate::RawFile::map_reads`]).
pub fn install() -> io::Result<()> {
    static RESULT: OnceLock<Result<(), i32>> = OnceLock::new();
    let r = RESULT.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if page > 0 {
            PAGE.store(page as usize, Ordering::SeqCst);
        }
        // SAFETY: a zeroed sigaction is valid; sigaction reads `new` and
        // fills `old`. PREVIOUS is set before our handler can run.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            let _ = PREVIOUS.set(Previous(old));
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut new.sa_mask);
            if libc::sigaction(libc::SIGBUS, &new, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    r.map_err(io::Error::from_raw_os_error)
}

/// True once [`install`] succeeded.
pub(crate) fn installed() -> bool {
    PREVIOUS.get().is_some()
}

/// The SIGBUS handler: async-signal-safe (atomics, mmap, sigaction, write,
/// _exit only).
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR {
        for slot in &RANGES {
            let start = slot.start.load(Ordering::SeqCst);
            if start == 0 || addr < start || addr >= slot.end.load(Ordering::SeqCst) {
                continue;
            }
            let page = PAGE.load(Ordering::SeqCst);
            let from = addr & !(page - 1);
            let to = slot.end.load(Ordering::SeqCst).next_multiple_of(page);
            // SAFETY: `from..to` lies inside the mapping this thread is
            // reading (a slot is only set while its mapping exists, by the
            // thread that touches it); zero pages replace its pages.
            let r = unsafe {
                libc::mmap(
                    from as *mut libc::c_void,
                    to - from,
                    libc::PROT_READ,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if r == libc::MAP_FAILED {
                const MSG: &[u8] =
                    b"error: the file shrank while it was read (its pages could not be replaced)\n";
                // SAFETY: write and _exit are async-signal-safe.
                unsafe {
                    libc::write(2, MSG.as_ptr().cast(), MSG.len());
                    libc::_exit(1);
                }
            }
            slot.cut.store(true, Ordering::SeqCst);
            return;
        }
    }
    chain(sig, info, ctx);
}

/// Pass a SIGBUS that is not ours to the action that was there before.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(Previous(prev)) = PREVIOUS.get() else {
        return;
    };
    let handler = prev.sa_sigaction;
    // SAFETY: the previous action as it was installed; calling it as the
    // kernel would (with siginfo if it asked for it).
    unsafe {
        if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
            // Restore it: a fault then happens again on return and takes
            // the default action (a core dump, as without us); a SIGBUS
            // sent by kill() is raised again, to be delivered on return.
            libc::sigaction(libc::SIGBUS, prev, std::ptr::null_mut());
            if (*info).si_code <= 0 {
                libc::raise(sig);
            }
        } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(sig);
        }
    }
}

/// A slot held while its range is digested.
struct Held(&'static Slot);

impl Held {
    fn claim(start: usize, len: usize) -> Option<Held> {
        RANGES.iter().find_map(|slot| {
            slot.start
                .compare_exchange(0, usize::MAX, Ordering::SeqCst, Ordering::SeqCst)
                .ok()?;
            slot.cut.store(false, Ordering::SeqCst);
            slot.end.store(start + len, Ordering::SeqCst);
            slot.start.store(start, Ordering::SeqCst);
            Some(Held(slot))
        })
    }

    /// Free the slot: true if the handler cut the range short.
    fn release(self) -> bool {
        let cut = self.0.cut.load(Ordering::SeqCst);
        self.0.end.store(0, Ordering::SeqCst);
        self.0.start.store(0, Ordering::SeqCst);
        cut
    }
}

/// The error of a mapped range whose pages were gone: the bytes of the
/// range past the file's end now (pages are whole, a cut need not be), or
/// the whole range if the file has grown back since.
pub(crate) fn shrank(file: &File, offset: u64, len: usize) -> io::Error {
    let end = offset + len as u64;
    let msg = match file.metadata().map(|m| m.len()) {
        Ok(size) if size < end => format!(
            "the file shrank while it was read (it ends at {size} bytes: bytes {}..{end} were gone)",
            size.max(offset)
        ),
        _ => format!("the file shrank while it was read (bytes {offset}..{end} were gone)"),
    };
    io::Error::new(io::ErrorKind::UnexpectedEof, msg)
}

/// Map `len` bytes of `file` from `offset`, fill its page tables, and call
/// `f` with them in place; an error (and `f`'s digest worthless) if the
/// file no longer holds them all. Needs [`install`] first: without the
/// handler, or with every slot taken, the bytes are copied with `pread`.
pub(crate) fn with_map(
    file: &File,
    offset: u64,
    len: usize,
    f: &mut dyn FnMut(&[u8]),
) -> io::Result<()> {
    if len == 0 {
        f(&[]);
        return Ok(());
    }
    // SAFETY: the map is read-only and private to this call. Another
    // process may change the file's bytes while it is read (as with
    // pread, the checksum is then of what was read); one that truncates it
    // makes a touch past the end fault, which the handler turns into zero
    // pages and an error below.
    let map =
        unsafe { MmapOptions::new().offset(offset).len(len).map(file) }.map_err(|e| {
            match e.raw_os_error() {
                Some(libc::ENOMEM) => blkhash::out_of_memory(len, "a mapped read"),
                _ => e,
            }
        })?;
    let held = match installed().then(|| Held::claim(map.as_ptr() as usize, len)) {
        Some(Some(h)) => h,
        _ => return copy(file, offset, len, f),
    };
    // Start reading what is not cached as one request: a range alone (the
    // scattered clusters of a qcow2 image, a bitmap's dirty blocks) gets
    // no readahead, and populating it would fault it in 64 KiB at a time
    // (81 scattered MiB from a cold cache: 1.0 s against 0.41 s with
    // pread). Cached pages make this a lookup. Only advice: an error
    // changes nothing that follows.
    let _ = map.advise(Advice::WillNeed);
    // Read in what is not cached and fill the page tables in one call,
    // instead of one fault per 16 pages. EFAULT: pages past the end of the
    // file. EINVAL: a kernel before 5.14, where the pages fault in as
    // they are touched.
    if let Err(e) = map.advise(Advice::PopulateRead)
        && e.raw_os_error() == Some(libc::EFAULT)
    {
        held.release();
        return Err(shrank(file, offset, len));
    }
    f(&map);
    if held.release() {
        return Err(shrank(file, offset, len));
    }
    Ok(())
}

/// The copying path, for a lend that finds no free slot.
fn copy(file: &File, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = blkhash::try_zeroed(len, "a read")?;
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => shrank(file, offset, len),
            _ => e,
        })?;
    f(&buf);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_range_is_lent_in_place_and_a_shrunk_file_is_an_error() {
        install().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        file.write_all(&data).unwrap();
        let mut got = Vec::new();
        with_map(&file, 4096 + 7, 1 << 20, &mut |b| got = b.to_vec()).unwrap();
        assert_eq!(got, &data[4096 + 7..4096 + 7 + (1 << 20)]);
        file.set_len(1 << 20).unwrap();
        let err = with_map(&file, 2 << 20, 1 << 20, &mut |_| {}).unwrap_err();
        assert!(err.to_string().contains("shrank"), "{err}");
        // Cut inside the range, at no page boundary: the bytes past the
        // end are named, not the whole range.
        file.set_len((1 << 20) + 100).unwrap();
        let err = with_map(&file, 4096, 2 << 20, &mut |_| {}).unwrap_err();
        assert!(
            err.to_string()
                .contains("it ends at 1048676 bytes: bytes 1048676..2101248 were gone"),
            "{err}"
        );
        // Every slot is free again.
        assert!(RANGES.iter().all(|s| s.start.load(Ordering::SeqCst) == 0));
    }

    /// Truncated while mapped and populated: the touch faults, the handler
    /// puts zeros there and the lend fails.
    #[test]
    fn a_file_cut_under_the_map_is_an_error_not_a_signal() {
        install().unwrap();
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![1u8; 1 << 20]).unwrap();
        let writer = file.try_clone().unwrap();
        let mut sum = 0u64;
        let err = with_map(&file, 0, 1 << 20, &mut |b| {
            writer.set_len(4096 + 100).unwrap();
            sum = b.iter().map(|&x| u64::from(x)).sum();
        })
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("it ends at 4196 bytes: bytes 4196..1048576 were gone"),
            "{err}"
        );
        // The first two pages were still there (the second in part: the
        // rest of a page past a file's end reads as zeros), the rest read
        // as zeros.
        assert_eq!(sum, 4196);
    }
}
