//! A virtnbdbackup stream in memory (a full or copy backup: an incremental
//! one needs its chain, refused alone): parse its frame headers, metadata
//! and compression trailer, walk its extents and read some of its data
//! (plain payloads, and lz4 frames decompressed), as the `qcow2` target
//! does. Errors are fine; panics, hangs and unbounded allocations are not.

use blkimage::Source;
use blkimage::formats::vnbd::Vnbd;
use std::sync::Arc;

/// The target's check of one input.
pub fn check(data: &[u8]) {
    let Ok(v) = Vnbd::from_storage(Arc::new(data.to_vec())) else {
        return;
    };
    crate::qcow2::walk(&v);
    let _ = v.finish();
}
