//! libblkhash: the C API of libblkhash 0.11 (`blkhash.h`, `libblkhash.so.0`)
//! over the Rust [`construction`] crate.
//!
//! Every function is a thin translation: C pointers and integers in, the
//! `Pipeline` does the work, errno values out. The contract of each function
//! is the one 0.11's header documents; `include/blkhash.h` and the manual
//! pages in `man/` say it for users, the comments here say how.
//!
//! - Errors are errno values. A handle remembers its first error and every
//!   later call returns it ("sticky"), so a checksum that missed some data
//!   is never produced.
//! - No Rust panic crosses into C: every entry point runs under
//!   [`std::panic::catch_unwind`]; a panic becomes `EIO` and the handle's
//!   sticky error.
//! - The async API hands the caller's buffer to the hasher without copying
//!   (`Pipeline::submit`); a completion is reported when the hasher gives the
//!   buffer back. Workers signal an eventfd after each digested job, so a
//!   caller sleeping in `poll()` wakes and collects what came back.
//!
//! C programs link it as `-lblkhash`; see `libblkhash/README.md`.

#![allow(non_camel_case_types)]

use construction::{Algorithm, Options, Pipeline};
use libc::{EAGAIN, EINVAL, EIO, ENOTSUP, c_char, c_int, c_uint, c_void, size_t};
use std::collections::VecDeque;
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::Arc;

/// The largest digest `blkhash_final` writes, in bytes (sha512's).
pub const BLKHASH_MAX_MD_SIZE: usize = 64;

/// 0.11's defaults: sha256, 64 KiB blocks, 4 threads, async API off.
const DEFAULT_DIGEST: &CStr = c"sha256";
const DEFAULT_BLOCK_SIZE: u32 = 64 << 10;
const DEFAULT_THREADS: u8 = 4;

/// Jobs the hasher may have in flight for an async handle, at most: twice
/// the queue depth (an update can stage a partial block and send a job),
/// but bounded so a huge queue depth does not mean huge staging memory.
const MAX_HASHER_QUEUE: usize = 256;

/// The errno of a caught panic: an internal failure the caller can only
/// report.
const PANIC_ERRNO: c_int = EIO;

/// Options of a hash, as `blkhash_opts_new` makes them.
pub struct blkhash_opts {
    /// Our own copy of the name: 0.11 kept the caller's pointer.
    digest_name: CString,
    block_size: u32,
    threads: u8,
    queue_depth: c_uint,
}

/// One finished async update, as `blkhash_aio_completions` reports it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct blkhash_completion {
    /// The `user_data` given to `blkhash_aio_update`.
    pub user_data: *mut c_void,
    /// 0, or the errno value the update failed with.
    pub error: c_int,
}

/// A caller's buffer handed to the hasher in place. The caller promises
/// (blkhash_aio_update's contract) not to touch or free it until its
/// completion is reported, or the handle is freed.
struct CallerBuf {
    ptr: *const u8,
    len: usize,
    user_data: *mut c_void,
}

// SAFETY: the bytes are only read, by one worker at a time, while the
// caller keeps them alive and unchanged (see above); user_data is never
// dereferenced, only given back.
unsafe impl Send for CallerBuf {}

impl AsRef<[u8]> for CallerBuf {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: non-null (checked in blkhash_aio_update) and valid for
        // len bytes while in flight, by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// The completion fd: an eventfd, non-blocking, shared with the workers that
/// signal it.
struct Event {
    fd: OwnedFd,
}

impl Event {
    fn new() -> Result<Self, c_int> {
        // SAFETY: plain system call; the fd is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: fd is a new descriptor nobody else owns.
        Ok(Event {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Make the fd readable. The counter cannot overflow in practice (2^64
    /// signals), and a failed write would at worst leave a poll waiting for
    /// the next job, so the result is not checked.
    fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our own fd.
        unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&one as *const u64).cast::<c_void>(),
                8,
            );
        }
    }
}

/// The async state of a handle made with a queue depth.
struct Aio {
    event: Arc<Event>,
    queue_depth: usize,
    /// Updates started and not yet reported by blkhash_aio_completions.
    inflight: usize,
    /// Completions ready to report.
    ready: VecDeque<blkhash_completion>,
}

/// A hash, as `blkhash_new` makes it.
pub struct blkhash {
    /// None once finalized (or after a panic left it unusable).
    hasher: Option<Pipeline<CallerBuf>>,
    out_len: usize,
    /// The first error; every later call returns it.
    error: c_int,
    finalized: bool,
    aio: Option<Aio>,
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(EIO)
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Run `f`, turning a panic into `PANIC_ERRNO`.
fn guard<T>(f: impl FnOnce() -> Result<T, c_int>) -> Result<T, c_int> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(PANIC_ERRNO))
}

/// The digest a C name stands for: our names, matched without regard to
/// case as OpenSSL does, and OpenSSL's other spellings of the same digests
/// (a program written for 0.11 may pass any name EVP_MD_fetch knows).
fn algorithm(name: &str) -> Option<Algorithm> {
    if let Ok(a) = name.parse() {
        return Some(a);
    }
    let alias = match name.to_ascii_lowercase().as_str() {
        "sha-1" => "sha1",
        "sha2-224" | "sha-224" => "sha224",
        "sha2-256" | "sha-256" => "sha256",
        "sha2-384" | "sha-384" => "sha384",
        "sha2-512" | "sha-512" => "sha512",
        "sha2-512/224" | "sha-512/224" | "sha512/224" => "sha512-224",
        "sha2-512/256" | "sha-512/256" | "sha512/256" => "sha512-256",
        "blake2b-512" => "blake2b512",
        "blake2s-256" => "blake2s256",
        "ripemd-160" | "ripemd" | "rmd160" => "ripemd160",
        "shake-128" => "shake128",
        "shake-256" => "shake256",
        _ => return None,
    };
    alias.parse().ok()
}

/// Our digest names as C strings, in `ALGORITHMS` order (a test checks).
static DIGEST_NAMES: [&CStr; 21] = [
    c"md5",
    c"sha1",
    c"sha224",
    c"sha256",
    c"sha384",
    c"sha512",
    c"sha512-224",
    c"sha512-256",
    c"sha3-224",
    c"sha3-256",
    c"sha3-384",
    c"sha3-512",
    c"blake2b512",
    c"blake2s256",
    c"sm3",
    c"ripemd160",
    c"md5-sha1",
    c"shake128",
    c"shake256",
    c"blake3",
    c"null",
];

// ---------------------------------------------------------------- options

/// Allocate options for the digest `digest_name` with 0.11's defaults.
/// The name is checked by `blkhash_new_opts`, as in 0.11.
///
/// # Safety
///
/// `digest_name` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_opts_new(digest_name: *const c_char) -> *mut blkhash_opts {
    if digest_name.is_null() {
        set_errno(EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let name = unsafe { CStr::from_ptr(digest_name) }.to_owned();
    match guard(|| {
        Ok(Box::into_raw(Box::new(blkhash_opts {
            digest_name: name,
            block_size: DEFAULT_BLOCK_SIZE,
            threads: DEFAULT_THREADS,
            queue_depth: 0,
        })))
    }) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            ptr::null_mut()
        }
    }
}

/// Set the block size: EINVAL unless a multiple of 512 from 512 B to 64 MiB.
///
/// # Safety
///
/// `o` comes from `blkhash_opts_new` and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_opts_set_block_size(
    o: *mut blkhash_opts,
    block_size: u32,
) -> c_int {
    // The construction's own limits: every power of two disk images use.
    let bs = block_size as usize;
    if !(construction::MIN_BLOCK_SIZE..=construction::MAX_BLOCK_SIZE).contains(&bs)
        || !bs.is_multiple_of(512)
    {
        return EINVAL;
    }
    // SAFETY: a live options object by the caller's contract.
    unsafe { (*o).block_size = block_size };
    0
}

/// Set the number of threads: EINVAL unless 1 to 128.
///
/// # Safety
///
/// `o` comes from `blkhash_opts_new` and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_opts_set_threads(o: *mut blkhash_opts, threads: u8) -> c_int {
    if threads < 1 || threads as usize > construction::MAX_THREADS {
        return EINVAL;
    }
    // SAFETY: a live options object by the caller's contract.
    unsafe { (*o).threads = threads };
    0
}

/// Set the async queue depth (0, the default, leaves the async API off).
/// Every value is valid, as in 0.11.
///
/// # Safety
///
/// `o` comes from `blkhash_opts_new` and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_opts_set_queue_depth(
    o: *mut blkhash_opts,
    queue_depth: c_uint,
) -> c_int {
    // SAFETY: a live options object by the caller's contract.
    unsafe { (*o).queue_depth = queue_depth };
    0
}

/// The digest name, owned by the options.
///
/// # Safety
///
/// `o` comes from `blkhash_opts_new` and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_opts_get_digest_name(o: *mut blkhash_opts) -> *const c_char {
    // SAFETY: a live options object by the caller's contract.
    unsafe { (*o).digest_name.as_ptr() }
}

/// The block size.
///
/// # Safety
///
/// `o` comes from `blkhash_opts_new` and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_opts_get_block_size(o: *mut blkhash_opts) -> u32 {
    // SAFETY: a live options object by the caller's contract.
    unsafe { (*o).block_size }
}

/// The number of threads.
///
/// # Safety
///
/// `o` comes from `blkhash_opts_new` and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_opts_get_threads(o: *mut blkhash_opts) -> u8 {
    // SAFETY: a live options object by the caller's contract.
    unsafe { (*o).threads }
}

/// The async queue depth.
///
/// # Safety
///
/// `o` comes from `blkhash_opts_new` and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_opts_get_queue_depth(o: *mut blkhash_opts) -> c_uint {
    // SAFETY: a live options object by the caller's contract.
    unsafe { (*o).queue_depth }
}

/// Free options; NULL is allowed.
///
/// # Safety
///
/// `o` is NULL or comes from `blkhash_opts_new` and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_opts_free(o: *mut blkhash_opts) {
    if !o.is_null() {
        // SAFETY: made by Box::into_raw in blkhash_opts_new, freed once.
        drop(unsafe { Box::from_raw(o) });
    }
}

// ---------------------------------------------------------------- digests

/// Fill `names` with up to `count` digest names (static strings) and return
/// how many were written; with NULL `names` or a zero `count`, return how
/// many there are.
///
/// # Safety
///
/// `names` is NULL or has room for `count` pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_digests(names: *mut *const c_char, count: size_t) -> size_t {
    if names.is_null() || count == 0 {
        return DIGEST_NAMES.len();
    }
    let n = count.min(DIGEST_NAMES.len());
    for (i, name) in DIGEST_NAMES.iter().take(n).enumerate() {
        // SAFETY: i < count, and the caller gave room for count pointers.
        unsafe { *names.add(i) = name.as_ptr() };
    }
    n
}

// ---------------------------------------------------------------- hashes

/// A hash with 0.11's default options (sha256, 64 KiB blocks, 4 threads).
#[unsafe(no_mangle)]
pub extern "C" fn blkhash_new() -> *mut blkhash {
    new_hash(DEFAULT_DIGEST, DEFAULT_BLOCK_SIZE, DEFAULT_THREADS, 0)
}

/// A hash with the given options; NULL and errno (EINVAL for an unknown
/// digest or NULL options) on error.
///
/// # Safety
///
/// `opts` is NULL or comes from `blkhash_opts_new` and was not freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_new_opts(opts: *const blkhash_opts) -> *mut blkhash {
    if opts.is_null() {
        set_errno(EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: a live options object by the caller's contract.
    let o = unsafe { &*opts };
    new_hash(&o.digest_name, o.block_size, o.threads, o.queue_depth)
}

fn new_hash(name: &CStr, block_size: u32, threads: u8, queue_depth: c_uint) -> *mut blkhash {
    let made = guard(|| {
        let alg = name.to_str().ok().and_then(algorithm).ok_or(EINVAL)?;
        let mut opts = Options::new()
            .algorithm(alg)
            .block_size(block_size as usize)
            .threads(threads as usize);
        let mut aio = None;
        if queue_depth > 0 {
            let qd = queue_depth as usize;
            let event = Arc::new(Event::new()?);
            let signal = event.clone();
            opts = opts
                .queue_depth((2 * qd + 2).clamp(16, MAX_HASHER_QUEUE))
                .on_job_done(move || signal.signal());
            aio = Some(Aio {
                event,
                queue_depth: qd,
                inflight: 0,
                ready: VecDeque::new(),
            });
        }
        let hasher = Pipeline::new(opts).map_err(|_| EINVAL)?;
        Ok(Box::into_raw(Box::new(blkhash {
            hasher: Some(hasher),
            out_len: alg.output_len(),
            error: 0,
            finalized: false,
            aio,
        })))
    });
    match made {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            ptr::null_mut()
        }
    }
}

impl blkhash {
    /// Run `f` on the hasher unless an earlier call failed; a failure
    /// (or a panic) becomes the sticky error.
    fn call(&mut self, f: impl FnOnce(&mut Self) -> Result<(), c_int>) -> c_int {
        if self.error != 0 {
            return self.error;
        }
        if self.finalized {
            return EINVAL;
        }
        match guard(|| f(self)) {
            Ok(()) => 0,
            Err(e) => self.fail(e),
        }
    }

    fn fail(&mut self, e: c_int) -> c_int {
        if self.error == 0 {
            self.error = e;
        }
        if e == PANIC_ERRNO {
            // A panic may have left the hasher half-updated: never use it again.
            self.hasher = None;
        }
        self.error
    }

    fn hasher(&mut self) -> Result<&mut Pipeline<CallerBuf>, c_int> {
        self.hasher.as_mut().ok_or(EINVAL)
    }

    /// Move the buffers the hasher gave back into the ready completions, and
    /// keep the completion fd readable while any are ready.
    fn collect_completions(&mut self) {
        let (Some(hasher), Some(aio)) = (self.hasher.as_mut(), self.aio.as_mut()) else {
            return;
        };
        while let Some(b) = hasher.reclaim() {
            aio.ready.push_back(blkhash_completion {
                user_data: b.user_data,
                error: 0,
            });
        }
        if !aio.ready.is_empty() {
            aio.event.signal();
        }
    }
}

/// Hash `len` bytes at `buf` (copied; whole zero blocks detected).
///
/// # Safety
///
/// `h` is a live hash; `buf` is valid for `len` bytes (or NULL with 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_update(h: *mut blkhash, buf: *const c_void, len: size_t) -> c_int {
    // SAFETY: a live hash by the caller's contract.
    let h = unsafe { &mut *h };
    h.call(|h| {
        if len == 0 {
            return Ok(());
        }
        if buf.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: valid for len bytes by the caller's contract.
        let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
        h.hasher()?.update(data);
        h.collect_completions();
        Ok(())
    })
}

/// Hash `len` zero bytes without reading or digesting them.
///
/// # Safety
///
/// `h` is a live hash.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_zero(h: *mut blkhash, len: size_t) -> c_int {
    // SAFETY: a live hash by the caller's contract.
    let h = unsafe { &mut *h };
    h.call(|h| {
        h.hasher()?.update_zeros(len as u64);
        h.collect_completions();
        Ok(())
    })
}

/// Start hashing `len` bytes at `buf` in place; the completion carrying
/// `user_data` is reported once the buffer is no longer used. ENOTSUP
/// without a queue depth, EAGAIN when `queue_depth` updates are in flight.
///
/// # Safety
///
/// `h` is a live hash; `buf` is valid for `len` bytes (or NULL with 0) and
/// stays unchanged until its completion is reported or `h` is freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_aio_update(
    h: *mut blkhash,
    buf: *const c_void,
    len: size_t,
    user_data: *mut c_void,
) -> c_int {
    // SAFETY: a live hash by the caller's contract.
    let h = unsafe { &mut *h };
    if h.error != 0 {
        return h.error;
    }
    match &h.aio {
        None => return ENOTSUP,
        // A full queue is the caller's pacing, not a failure of the hash.
        Some(aio) if aio.inflight >= aio.queue_depth => return EAGAIN,
        Some(_) => {}
    }
    h.call(|h| {
        if buf.is_null() && len > 0 {
            return Err(EINVAL);
        }
        let b = CallerBuf {
            ptr: buf.cast::<u8>(),
            len,
            user_data,
        };
        h.hasher()?.submit(b);
        if let Some(aio) = h.aio.as_mut() {
            aio.inflight += 1;
        }
        h.collect_completions();
        Ok(())
    })
}

/// The completion fd (an eventfd, O_NONBLOCK), or -ENOTSUP without a queue
/// depth.
///
/// # Safety
///
/// `h` is a live hash.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_aio_completion_fd(h: *mut blkhash) -> c_int {
    // SAFETY: a live hash by the caller's contract.
    let h = unsafe { &*h };
    match &h.aio {
        Some(aio) => aio.event.fd.as_raw_fd(),
        None => -ENOTSUP,
    }
}

/// Copy up to `count` ready completions to `out`; the number copied, or a
/// negative errno value.
///
/// # Safety
///
/// `h` is a live hash; `out` has room for `count` completions.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_aio_completions(
    h: *mut blkhash,
    out: *mut blkhash_completion,
    count: c_uint,
) -> c_int {
    // SAFETY: a live hash by the caller's contract.
    let h = unsafe { &mut *h };
    if h.error != 0 {
        return -h.error;
    }
    if h.aio.is_none() {
        return -ENOTSUP;
    }
    if count > 0 && out.is_null() {
        return -EINVAL;
    }
    let r = guard(|| {
        h.collect_completions();
        let Some(aio) = h.aio.as_mut() else {
            return Ok(0);
        };
        let n = (count as usize).min(aio.ready.len());
        for (i, c) in aio.ready.drain(..n).enumerate() {
            // SAFETY: i < count, and out has room for count completions.
            unsafe { out.add(i).write(c) };
        }
        aio.inflight -= n;
        if aio.ready.is_empty() {
            // The caller was told to drain the fd first; nothing more to say.
        } else {
            aio.event.signal();
        }
        Ok(n as c_int)
    });
    match r {
        Ok(n) => n,
        Err(e) => -h.fail(e),
    }
}

/// Finish the hash: write the digest (at most `BLKHASH_MAX_MD_SIZE` bytes)
/// to `md_value` and its length to `md_len` if not NULL. EINVAL if called
/// twice.
///
/// # Safety
///
/// `h` is a live hash; `md_value` has room for `BLKHASH_MAX_MD_SIZE` bytes;
/// `md_len` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_final(
    h: *mut blkhash,
    md_value: *mut u8,
    md_len: *mut c_uint,
) -> c_int {
    // SAFETY: a live hash by the caller's contract.
    let h = unsafe { &mut *h };
    if h.finalized {
        return EINVAL;
    }
    let err = h.call(|h| {
        if md_value.is_null() && h.out_len > 0 {
            return Err(EINVAL);
        }
        // Every buffer in flight comes back first, so its completion can
        // still be collected (to free it) after the hash is finished.
        let hasher = h.hasher()?;
        let mut back = Vec::new();
        while let Some(b) = hasher.reclaim_wait() {
            back.push(b);
        }
        if let Some(aio) = h.aio.as_mut() {
            aio.ready
                .extend(back.into_iter().map(|b| blkhash_completion {
                    user_data: b.user_data,
                    error: 0,
                }));
            if !aio.ready.is_empty() {
                aio.event.signal();
            }
        }
        let hasher = h.hasher.take().ok_or(EINVAL)?;
        let sum = hasher
            .finalize()
            .map_err(|e| e.raw_os_error().unwrap_or(EIO))?;
        let bytes = sum.as_bytes();
        debug_assert!(bytes.len() <= BLKHASH_MAX_MD_SIZE);
        if !bytes.is_empty() {
            // SAFETY: md_value has room for BLKHASH_MAX_MD_SIZE bytes.
            unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), md_value, bytes.len()) };
        }
        if !md_len.is_null() {
            // SAFETY: writable by the caller's contract.
            unsafe { *md_len = bytes.len() as c_uint };
        }
        Ok(())
    });
    h.finalized = true;
    err
}

/// Free a hash; NULL is allowed. Buffers still in flight are finished with
/// before it returns.
///
/// # Safety
///
/// `h` is NULL or a hash from `blkhash_new*` not yet freed.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_free(h: *mut blkhash) {
    if h.is_null() {
        return;
    }
    // SAFETY: made by Box::into_raw in new_hash, freed once. Dropping the
    // hasher joins its workers, so no caller buffer is read after this.
    let b = unsafe { Box::from_raw(h) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use construction::ALGORITHMS;

    #[test]
    fn digest_names_are_the_algorithms() {
        let ours: Vec<&str> = DIGEST_NAMES.iter().map(|c| c.to_str().unwrap()).collect();
        let theirs: Vec<&str> = ALGORITHMS.iter().map(|a| a.name()).collect();
        assert_eq!(ours, theirs);
    }

    #[test]
    fn openssl_spellings() {
        assert_eq!(algorithm("SHA2-256"), Some(Algorithm::Sha256));
        assert_eq!(algorithm("SHA256"), Some(Algorithm::Sha256));
        assert_eq!(algorithm("sha-512/256"), Some(Algorithm::Sha512_256));
        assert_eq!(algorithm("BLAKE2B-512"), Some(Algorithm::Blake2b512));
        assert_eq!(algorithm("sha257"), None);
    }

    #[test]
    fn max_md_size_fits_every_digest() {
        for a in ALGORITHMS {
            assert!(a.output_len() <= BLKHASH_MAX_MD_SIZE, "{a}");
        }
    }

    #[test]
    fn a_panic_becomes_a_sticky_eio() {
        let h = blkhash_new();
        assert!(!h.is_null());
        // SAFETY: h is live until blkhash_free.
        unsafe {
            let r = (*h).call(|_| panic!("injected"));
            assert_eq!(r, EIO);
            assert_eq!(blkhash_update(h, b"abc".as_ptr().cast(), 3), EIO);
            assert_eq!(blkhash_zero(h, 4096), EIO);
            let mut md = [0u8; BLKHASH_MAX_MD_SIZE];
            assert_eq!(blkhash_final(h, md.as_mut_ptr(), ptr::null_mut()), EIO);
            blkhash_free(h);
        }
    }
}
