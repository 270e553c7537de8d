//! The async state a hash made with a queue depth carries: the caller's
//! buffers in flight, the completions ready to report, and the eventfd the
//! workers signal. The hash (`hash.rs`) owns it; the async API (`aio.rs`)
//! drives it.

use crate::errno;
use libc::{c_int, c_void};
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

    /// The fd to poll.
    pub(crate) fn raw_fd(&self) -> c_int {
        self.fd.as_raw_fd()
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
