//! The async API: the caller's buffers hashed in place, completions
//! reported through an eventfd the workers signal.

use crate::hash::blkhash;
use crate::{errno, guard};
use libc::{EAGAIN, EINVAL, ENOTSUP, c_int, c_uint, c_void, size_t};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// Jobs the hasher may have in flight for an async handle, at most: twice
/// the queue depth (an update can stage a partial block and send a job),
/// but bounded so a huge queue depth does not mean huge staging memory.
pub(crate) const MAX_HASHER_QUEUE: usize = 256;

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
pub(crate) struct CallerBuf {
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
    pub(crate) user_data: *mut c_void,
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
pub(crate) struct Event {
    fd: OwnedFd,
}

impl Event {
    pub(crate) fn new() -> Result<Self, c_int> {
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
    pub(crate) fn signal(&self) {
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
pub(crate) struct Aio {
    pub(crate) event: Arc<Event>,
    pub(crate) queue_depth: usize,
    /// Updates started and not yet reported by blkhash_aio_completions.
    pub(crate) inflight: usize,
    /// Completions ready to report.
    pub(crate) ready: VecDeque<blkhash_completion>,
}
impl blkhash {
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
