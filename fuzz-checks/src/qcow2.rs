//! A qcow2 image in memory (no backing file, no data file): open it, walk
//! its extents, read some of its data (copied, and lent in place where its
//! clusters lie contiguously: the same bytes), list its dirty bitmaps and
//! read each one's ranges. Errors are fine; panics, hangs and unbounded
//! allocations are not.

use blkimage::{ExtentKind, Qcow2, Source};
use std::sync::Arc;

/// Bytes read per input, at most.
const READ_BUDGET: u64 = 4 << 20;
/// extents() calls per input, at most.
const EXTENT_CALLS: usize = 2000;

/// The target's check of one input.
pub fn check(data: &[u8]) {
    let Ok(q) = Qcow2::from_storage(Arc::new(data.to_vec())) else {
        return;
    };
    walk(&q);
    bitmaps(&q, q.size());
    let _ = q.finish();
}

/// Walk the extents of `q` and read some of its data (the checks every
/// image format's target makes: the `Source` contract, reads copied and
/// lent alike).
pub(crate) fn walk(q: &dyn Source) {
    let size = q.size();
    let mut buf = vec![0u8; 256 << 10];
    let mut budget = READ_BUDGET;
    let mut pos = 0u64;
    for _ in 0..EXTENT_CALLS {
        if pos >= size {
            break;
        }
        let Ok(exts) = q.extents(pos, size - pos) else {
            break;
        };
        // The Source contract: a non-empty, contiguous prefix.
        assert!(!exts.is_empty());
        let mut p = pos;
        for e in &exts {
            assert_eq!(e.offset, p);
            assert!(e.len > 0);
            p = e.end();
        }
        assert!(p <= size);
        let e = exts[0];
        if e.kind == ExtentKind::Data && budget > 0 {
            let n = e.len.min(buf.len() as u64).min(budget);
            budget -= n;
            // An odd start inside the extent, too.
            let copied = q.read_at(&mut buf[..n as usize], e.offset).is_ok();
            // What is lent is a prefix, and the bytes a read copies.
            let lent = q.lendable(e.offset, n as usize);
            assert!(lent as u64 <= n);
            if lent > 0 && copied {
                let mut same = false;
                let r = q.read_in_place(e.offset, lent, &mut |b| same = b == &buf[..lent]);
                assert!(r.is_err() || same, "lent bytes differ from a read's");
            }
            if n > 1 {
                let _ = q.read_at(&mut buf[..(n / 2) as usize], e.offset + n / 3);
            }
        }
        pos = e.end();
    }
    // Reads ignore extents: any range must work or fail cleanly.
    if size > 0 {
        let n = size.min(4096) as usize;
        let _ = q.read_at(&mut buf[..n], size - n as u64);
        let _ = q.read_at(&mut buf[..n], size / 2 - (size / 2).min(n as u64 / 2));
    }
}

/// Every bitmap listed, read: a `Dirty` that comes back keeps its contract
/// (ranges in order, non-empty, neither overlapping nor adjacent, within
/// the size) and names the bitmap asked for.
fn bitmaps(q: &Qcow2, size: u64) {
    let Ok(list) = q.bitmaps() else {
        return;
    };
    for b in &list {
        let Ok(d) = q.dirty(&b.name) else {
            continue;
        };
        assert_eq!(d.bitmap.name, b.name);
        assert_eq!(d.bitmap.granularity, b.granularity);
        let mut prev_end = None;
        for r in &d.ranges {
            assert!(r.start < r.end && r.end <= size, "{r:?} of {size}");
            if let Some(e) = prev_end {
                assert!(e < r.start, "{:?}", d.ranges);
            }
            prev_end = Some(r.end);
        }
    }
}
