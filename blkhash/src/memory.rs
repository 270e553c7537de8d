//! Buffers a run allocates, allocated so that running out of memory (a
//! `ulimit -v`, a cgroup's limit, overcommit disabled) is an error that
//! names the buffer, not an abort: `Vec`'s own allocation aborts the
//! process with "memory allocation of N bytes failed".

use std::alloc::Layout;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Memory set aside for the way out: when a buffer cannot be had, what is
/// left may not hold the error's own few bytes, its message with the
/// input's name, or the line printed, and a failed allocation of those
/// aborts. Mapped, not allocated: a block malloc frees may stay in one
/// arena's free lists, out of reach of a thread that allocates elsewhere
/// (under a limit, glibc gives a thread that cannot have an arena of its
/// own a mapping of its own for every allocation), while unmapping gives
/// the room back to every thread. Writable, so that it also holds commit
/// charge where overcommit is off; never touched, so it takes no memory.
/// The address, 0 while none is set aside.
static RESERVE: AtomicUsize = AtomicUsize::new(0);
const RESERVE_BYTES: usize = 256 << 10;

/// Set [`RESERVE`] aside if it is not (at the start of a run, when there is
/// room).
fn keep_reserve() {
    if RESERVE.load(Ordering::Acquire) != 0 {
        return;
    }
    // SAFETY: a fresh private anonymous mapping, never touched; unmapped
    // here if another thread set one aside first.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            RESERVE_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p != libc::MAP_FAILED
            && RESERVE
                .compare_exchange(0, p as usize, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            libc::munmap(p, RESERVE_BYTES);
        }
    }
}

/// The error for `len` bytes that could not be had: "cannot allocate N
/// bytes for WHAT" ([`io::ErrorKind::OutOfMemory`]). The memory set aside
/// for the way out is freed first, to build and report it.
pub fn out_of_memory(len: usize, what: &str) -> io::Error {
    let p = RESERVE.swap(0, Ordering::AcqRel);
    if p != 0 {
        // SAFETY: the mapping keep_reserve made, taken out of RESERVE
        // above, so unmapped once.
        unsafe { libc::munmap(p as *mut libc::c_void, RESERVE_BYTES) };
    }
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        format!("cannot allocate {len} bytes for {what}"),
    )
}

/// True if the process runs under an address-space limit (`ulimit -v`,
/// RLIMIT_AS): every mapping counts against it, whether or not it holds
/// memory.
///
/// ```
/// // As blkimage decides whether to map reads.
/// let map_reads = !blkhash::address_space_limited();
/// # let _ = map_reads;
/// ```
pub fn address_space_limited() -> bool {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_AS, &mut limit) == 0 && limit.rlim_cur != libc::RLIM_INFINITY
    }
}

/// For a program that owns its process (the commands, not a library in
/// a host's): under an address-space limit, every thread allocates from
/// the one heap. glibc gives each thread an arena of its own and reserves
/// 64 MiB of address space for it; under a lower limit that fails, and the
/// thread then maps a page of its own for every allocation. Seen with
/// reads mapped under a limit (which `blkimage` no longer does): every job
/// in flight failed, each error a worker built took 8 KiB, until one could
/// not be had and the run aborted instead of exiting 1. Nothing to do
/// without a limit, or with another C library.
///
/// ```
/// blkhash::one_heap_under_a_limit();
/// ```
pub fn one_heap_under_a_limit() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if address_space_limited() {
        // SAFETY: mallopt takes plain integers.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
    }
}

/// Room for one more thread, checked before it is started: its stack
/// (Rust's 2 MiB) and a margin for what the system and std map for it.
/// std maps a thread's signal stack after its stack, and panics where it
/// cannot unwind (an abort) if that fails: under a memory limit
/// (`ulimit -v`) a thread may start, then take the process down. Hold the
/// [`Room`] until the thread runs (see [`room`]).
///
/// ```
/// let room = blkhash::room_for_thread().unwrap();
/// let t = std::thread::spawn(|| 1);
/// drop(room);
/// assert_eq!(t.join().unwrap(), 1);
/// ```
pub fn room_for_thread() -> io::Result<Room> {
    keep_reserve();
    let room = Room::take();
    room_for(3 << 20)?;
    Ok(room)
}

/// Address space a large buffer must leave free under an address-space
/// limit: what follows it allocates small blocks that cannot fail cleanly
/// (a channel's, an error's message), and the heap must be able to grow
/// for them. Without it blkdiff of two 24 MiB files aborted in 7 runs of
/// 325 at 36 to 48 MB ("memory allocation of 3232 bytes failed": a digest
/// worker's send, after the reading threads' buffers took the room).
const HEADROOM: usize = 1 << 20;

/// True if a buffer of `len` bytes leaves 1 MiB of address space free
/// (for what follows it, see `HEADROOM`), or no limit applies. Small
/// buffers come from the heap's room and are not checked. A check only:
/// another thread may take the room before the buffer is allocated;
/// [`room`] holds it.
///
/// ```
/// assert!(blkhash::leaves_headroom(1 << 20));
/// ```
pub fn leaves_headroom(len: usize) -> bool {
    room(len).is_some()
}

/// The address space for a buffer of `len` bytes and 1 MiB beyond it (see
/// `HEADROOM`), held until the [`Room`] is dropped, or `None` if a limit
/// leaves less. Allocate the buffer while holding it: two threads that
/// only checked could each find the same room free, and the second
/// buffer then takes what the first one left for the small blocks after
/// it (blkdiff's two readers at once, under a loaded test run: "memory
/// allocation of 1696 bytes failed"). Without a limit, or for a small
/// buffer, nothing is checked or held.
///
/// ```
/// let room = blkhash::room(1 << 20).expect("no limit here");
/// let buf = vec![0u8; 1 << 20];
/// drop(room);
/// # drop(buf);
/// ```
pub fn room(len: usize) -> Option<Room> {
    let room = if len < (64 << 10) {
        Room { _held: None }
    } else {
        Room::take()
    };
    if room._held.is_none() {
        return Some(room);
    }
    let free = len
        .checked_add(HEADROOM)
        .is_some_and(|n| room_for(n).is_ok());
    free.then_some(room)
}

/// Address space held for a buffer or a thread being mapped (see
/// [`room`]): under an address-space limit, one such mapping at a time.
#[derive(Debug)]
#[must_use = "the room is held only while the Room lives"]
pub struct Room {
    /// Held, not read: the lock is released when it drops.
    _held: Option<MutexGuard<'static, ()>>,
}

impl Room {
    /// The lock under a limit, nothing without one.
    fn take() -> Room {
        static MAPPING: Mutex<()> = Mutex::new(());
        if !address_space_limited() {
            return Room { _held: None };
        }
        // The lock guards no data: a panic while holding it leaves
        // nothing half done.
        Room {
            _held: Some(MAPPING.lock().unwrap_or_else(PoisonError::into_inner)),
        }
    }
}

/// Whether `len` bytes of address space can be had now: mapped
/// (PROT_NONE: address space only) and unmapped at once, or mmap's error.
fn room_for(len: usize) -> io::Result<()> {
    // SAFETY: a fresh anonymous mapping, unmapped below; no memory is
    // touched.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        libc::munmap(p, len);
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
    let Some(_room) = room(len) else {
        return Err(out_of_memory(len, what));
    };
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
