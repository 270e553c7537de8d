//! A hostile compressed file (gzip, xz or zstd, probed from its magic;
//! bytes with none are taken as the kind their first byte picks, the rest
//! the data): decoded to its end through `blkimage::compressed::Decoder`
//! (members, streams and frames one after the other, padding, checks),
//! twice, with reads of two sizes, which must give the same bytes or both
//! fail; a qcow2 image that comes out is then opened and walked as the
//! `qcow2` target does. Errors are fine; panics, hangs and unbounded
//! allocations are not (xz's decoder is limited to 512 MiB, zstd's window
//! to 128 MiB; the output read here to 16 MiB).

use blkimage::Qcow2;
use blkimage::compressed::{Compression, Decoder};
use std::io::Read;
use std::sync::Arc;

/// Decoded bytes read per input, at most.
const OUTPUT_BUDGET: usize = 16 << 20;

/// The target's check of one input.
pub fn check(data: &[u8]) {
    let (kind, data) = match Compression::probe(data) {
        Some(k) => (k, data),
        None => match data.split_first() {
            Some((b, rest)) => {
                let k = [Compression::Gzip, Compression::Xz, Compression::Zstd];
                (k[usize::from(*b) % 3], rest)
            }
            None => return,
        },
    };
    // One thread or two for xz, and two read sizes: the bytes must not
    // depend on how they are asked for.
    let a = decode(kind, data, 1, 1 << 16);
    let b = decode(kind, data, 2, 4093);
    match (&a, &b) {
        (Ok(x), Ok(y)) => assert!(x == y, "{kind:?}: two decodings differ"),
        // Past the budget, one may stop where the other fails.
        (Ok(x), Err(_)) | (Err(_), Ok(x)) => {
            assert!(x.len() >= OUTPUT_BUDGET, "{kind:?}: one decoding failed")
        }
        (Err(_), Err(_)) => {}
    }
    if let Ok(out) = a
        && let Ok(q) = Qcow2::from_storage(Arc::new(out))
    {
        crate::qcow2::walk(&q);
    }
}

/// `data` decoded as `kind` on `threads`, `chunk` bytes at a time, up to
/// [`OUTPUT_BUDGET`].
fn decode(kind: Compression, data: &[u8], threads: u32, chunk: usize) -> std::io::Result<Vec<u8>> {
    let mut d = Decoder::new(kind, data, threads)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; chunk];
    while out.len() < OUTPUT_BUDGET {
        let n = d.read(&mut buf)?;
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    Ok(out)
}
