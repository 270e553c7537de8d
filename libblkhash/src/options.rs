//! `blkhash_opts`: what a hash is made with, 0.11's defaults, and the
//! setters that check each value as 0.11 does.

use crate::{guard, set_errno};
use libc::{EINVAL, c_char, c_int, c_uint};
use std::ffi::{CStr, CString};
use std::ptr;

/// 0.11's defaults: sha256, 64 KiB blocks, 4 threads, async API off.
pub(crate) const DEFAULT_DIGEST: &CStr = c"sha256";
pub(crate) const DEFAULT_BLOCK_SIZE: u32 = 64 << 10;
pub(crate) const DEFAULT_THREADS: u8 = 4;

/// Options of a hash, as `blkhash_opts_new` makes them.
pub struct blkhash_opts {
    /// Our own copy of the name: 0.11 kept the caller's pointer.
    pub(crate) digest_name: CString,
    pub(crate) block_size: u32,
    pub(crate) threads: u8,
    pub(crate) queue_depth: c_uint,
}
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
