//! Buffers a run allocates, allocated so that running out of memory (a
//! `ulimit -v`, a cgroup's limit, overcommit disabled) is an error that
//! names the buffer, not an abort: `Vec`'s own allocation aborts the
//! process with "memory allocation of N bytes failed".

use std::alloc::Layout;
use std::io;
use std::sync::Mutex;

/// Memory set aside for the way out: when a buffer cannot be had, what is
/// left may not hold the error's own few bytes, its message with the
/// input's name, or the line printed, and a failed allocation of those
/// aborts. Large enough to be mapped on its own (glibc maps blocks of 128
/// KiB and more), so that freeing it gives the room back to every thread.
static RESERVE: Mutex<Vec<u8>> = Mutex::new(Vec::new());
const RESERVE_BYTES: usize = 256 << 10;

/// Set [`RESERVE`] aside if it is not (at the start of a run, when there is
/// room).
fn keep_reserve() {
    let mut r = RESERVE.lock().unwrap_or_else(|p| p.into_inner());
    if r.capacity() == 0 {
        let _ = r.try_reserve_exact(RESERVE_BYTES);
    }
}

/// The error for `len` bytes that could not be had: "cannot allocate N
/// bytes for WHAT" ([`io::ErrorKind::OutOfMemory`]). The memory set aside
/// for the way out is freed first, to build and report it.
pub fn out_of_memory(len: usize, what: &str) -> io::Error {
    *RESERVE.lock().unwrap_or_else(|p| p.into_inner()) = Vec::new();
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        format!("cannot allocate {len} bytes for {what}"),
    )
}

/// Room for one more thread, checked before it is started: its stack
/// (Rust's 2 MiB) and a margin for what the system and std map for it.
/// std maps a thread's signal stack after its stack, and panics where it
/// cannot unwind (an abort) if that fails: under a memory limit
/// (`ulimit -v`) a thread may start, then take the process down. The
/// room is mapped (PROT_NONE: address space only) and unmapped at once.
pub fn room_for_thread() -> io::Result<()> {
    keep_reserve();
    const ROOM: usize = 3 << 20;
    // SAFETY: a fresh anonymous mapping, unmapped below; no memory is
    // touched.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            ROOM,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        libc::munmap(p, ROOM);
    }
    Ok(())
}

/// `len` zero bytes, or the error naming `what` they were for when the
/// memory cannot be had.
///
/// ```
/// let buf = blkhash::try_zeroed(1 << 20, "a read").unwrap();
/// assert!(buf.len() == 1 << 20 && buf.iter().all(|&b| b == 0));
/// let err = blkhash::try_zeroed(usize::MAX / 2, "a read").unwrap_err();
/// assert!(err.to_string().starts_with("cannot allocate "), "{err}");
/// assert!(err.to_string().ends_with(" bytes for a read"), "{err}");
/// ```
pub fn try_zeroed(len: usize, what: &str) -> io::Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    keep_reserve();
    // alloc_zeroed, as `vec![0; len]` does: large buffers come from the
    // kernel already zeroed (no memset of every read's buffer), which
    // `try_reserve` and `resize` would not give.
    let layout = Layout::array::<u8>(len).map_err(|_| out_of_memory(len, what))?;
    // SAFETY: `layout` has a non-zero size.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(out_of_memory(len, what));
    }
    // SAFETY: allocated by the global allocator with the layout of `len`
    // bytes, all initialised (zeroed): what a Vec<u8> of capacity and
    // length `len` owns.
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}
