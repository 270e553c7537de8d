//! The async API: the caller's buffers hashed in place, completions
//! reported through an eventfd the workers signal.

use crate::completion::{CallerBuf, blkhash_completion};
use crate::guard;
use crate::hash::blkhash;
use libc::{EAGAIN, EINVAL, ENOTSUP, c_int, c_uint, c_void, size_t};

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
        h.hasher_for(len)?.submit(b);
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
        Some(aio) => aio.event.raw_fd(),
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
