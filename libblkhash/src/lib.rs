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
//! C programs link it as `-lblkhash`; see `docs/guide/libraries.md`.
//!
//! One module a part of the header: [`options`] (`blkhash_opts_*`),
//! [`digests`] (names and `blkhash_digests`), [`hash`] (a hash's life:
//! new, update, zero, final, free) and [`aio`] (the async API), over
//! `completion` (the async state a hash carries: buffers in flight,
//! completions, the eventfd).

#![allow(non_camel_case_types)]

mod aio;
mod completion;
mod digests;
mod hash;
mod options;

pub use completion::blkhash_completion;
pub use hash::blkhash;
pub use options::blkhash_opts;

use libc::{EIO, c_int};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The largest digest `blkhash_final` writes, in bytes (sha512's).
pub const BLKHASH_MAX_MD_SIZE: usize = 64;

/// The errno of a caught panic: an internal failure the caller can only
/// report.
pub(crate) const PANIC_ERRNO: c_int = EIO;

/// This thread's errno after a failed system call.
pub(crate) fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(EIO)
}

/// Set this thread's errno, as a C function that returns NULL does.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Run `f`, turning a panic into `PANIC_ERRNO`.
pub(crate) fn guard<T>(f: impl FnOnce() -> Result<T, c_int>) -> Result<T, c_int> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(PANIC_ERRNO))
}
