//! A hash's life: made from options, fed bytes and zeros, finalized into
//! its digest, freed; its first error sticks.

use crate::completion::{Aio, CallerBuf, Event, MAX_HASHER_QUEUE, blkhash_completion};
use crate::digests::algorithm;
use crate::options::{DEFAULT_BLOCK_SIZE, DEFAULT_DIGEST, DEFAULT_THREADS, blkhash_opts};
use crate::{BLKHASH_MAX_MD_SIZE, PANIC_ERRNO, guard, set_errno};
use construction::{Options, OptionsError, Pipeline};
use libc::{EAGAIN, EINVAL, EIO, c_int, c_uint, c_void, size_t};
use std::collections::VecDeque;
use std::ffi::CStr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::Arc;

/// A hash, as `blkhash_new` makes it.
pub struct blkhash {
    /// None once finalized (or after a panic left it unusable).
    pub(crate) hasher: Option<Pipeline<CallerBuf>>,
    pub(crate) out_len: usize,
    /// The first error; every later call returns it.
    pub(crate) error: c_int,
    pub(crate) finalized: bool,
    pub(crate) aio: Option<Aio>,
}
/// A hash with 0.11's default options (sha256, 64 KiB blocks, 4 threads).
#[unsafe(no_mangle)]
pub extern "C" fn blkhash_new() -> *mut blkhash {
    new_hash(DEFAULT_DIGEST, DEFAULT_BLOCK_SIZE, DEFAULT_THREADS, 0)
}

/// A hash with the given options; NULL and errno (EINVAL for an unknown
/// digest or NULL options, EAGAIN when a thread cannot start) on error.
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
        // A worker that cannot start is the system's limit, EAGAIN as
        // pthread_create says (blkhash.3); anything else is the options'.
        let hasher = Pipeline::new(opts).map_err(|e| match e {
            OptionsError::ThreadStart { errno } => errno.unwrap_or(EAGAIN),
            _ => EINVAL,
        })?;
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
    pub(crate) fn call(&mut self, f: impl FnOnce(&mut Self) -> Result<(), c_int>) -> c_int {
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

    pub(crate) fn fail(&mut self, e: c_int) -> c_int {
        if self.error == 0 {
            self.error = e;
        }
        if e == PANIC_ERRNO {
            // A panic may have left the hasher half-updated: never use it again.
            self.hasher = None;
        }
        self.error
    }

    /// Move the buffers the hasher gave back into the ready completions, and
    /// keep the completion fd readable while any are ready.
    pub(crate) fn collect_completions(&mut self) {
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

    pub(crate) fn hasher(&mut self) -> Result<&mut Pipeline<CallerBuf>, c_int> {
        self.hasher.as_mut().ok_or(EINVAL)
    }

    /// The hasher, if `len` more bytes fit in the length a checksum records
    /// (a le64: at most 2^64 - 1 bytes in all); else EINVAL, which
    /// [`call`](Self::call) makes sticky: a checksum that missed the bytes
    /// refused must not be produced, even for a caller that ignores the
    /// error (0.11 wrapped the length instead).
    pub(crate) fn hasher_for(&mut self, len: usize) -> Result<&mut Pipeline<CallerBuf>, c_int> {
        let h = self.hasher()?;
        match h.len().checked_add(len as u64) {
            Some(_) => Ok(h),
            None => Err(EINVAL),
        }
    }
}

/// Hash `len` bytes at `buf` (copied; whole zero blocks detected); EINVAL
/// past 2^64 - 1 bytes in all.
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
        h.hasher_for(len)?.update(data);
        h.collect_completions();
        Ok(())
    })
}

/// Hash `len` zero bytes without reading or digesting them; EINVAL past
/// 2^64 - 1 bytes in all.
///
/// # Safety
///
/// `h` is a live hash.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn blkhash_zero(h: *mut blkhash, len: size_t) -> c_int {
    // SAFETY: a live hash by the caller's contract.
    let h = unsafe { &mut *h };
    h.call(|h| {
        h.hasher_for(len)?.update_zeros(len as u64);
        h.collect_completions();
        Ok(())
    })
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
    use crate::BLKHASH_MAX_MD_SIZE;
    use libc::EIO;

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
