//! A source with only some of its ranges visible: how the blocks a dirty
//! bitmap marks are hashed alone, with the same reader, extents and all,
//! every other range passed over as a hole (never read).

use crate::source::{Extent, ExtentKind, Source, pass_through};
use std::io;
use std::ops::Range;
use std::sync::Arc;

/// `inner` with only the byte ranges `visible` read: elsewhere its extents
/// say "hole", so a reader skips them and a hasher counts them as zeros.
///
/// ```
/// use blkimage::{ExtentKind, Masked, Source};
/// # use blkimage::Extent;
/// # struct Ones;
/// # impl Source for Ones {
/// #     fn format(&self) -> &str { "ones" }
/// #     fn size(&self) -> u64 { 4096 }
/// #     fn extents(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>> {
/// #         Ok(vec![Extent { offset, len, kind: ExtentKind::Data }])
/// #     }
/// #     fn read_at(&self, buf: &mut [u8], _: u64) -> std::io::Result<()> {
/// #         buf.fill(1);
/// #         Ok(())
/// #     }
/// # }
/// let m = Masked::new(std::sync::Arc::new(Ones), vec![1024..2048]).unwrap();
/// let e = m.extents(0, 4096).unwrap();
/// assert_eq!((e[0].len, e[0].kind), (1024, ExtentKind::Hole));
/// let e = m.extents(1024, 3072).unwrap();
/// assert_eq!((e[0].len, e[0].kind), (1024, ExtentKind::Data));
/// ```
pub struct Masked {
    inner: Arc<dyn Source>,
    visible: Vec<Range<u64>>,
}

impl Masked {
    /// `inner` seen only in `visible`: byte ranges in order, non-empty,
    /// not overlapping, within `inner`'s size (else an error).
    pub fn new(inner: Arc<dyn Source>, visible: Vec<Range<u64>>) -> io::Result<Masked> {
        let size = inner.size();
        let mut end = 0;
        for r in &visible {
            if r.start < end || r.end <= r.start || r.end > size {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "range {}..{} out of order, empty or past the end ({size} bytes)",
                        r.start, r.end
                    ),
                ));
            }
            end = r.end;
        }
        Ok(Masked { inner, visible })
    }
}

impl Source for Masked {
    pass_through!(inner: format, size, read_at, lendable, read_in_place, mapped_bytes, is_direct,
        default_io_depth, read_size, bytes_in_flight, finish, origin, bitmaps, dirty);

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = offset + len;
        // The first visible range that ends past `offset`.
        let i = self.visible.partition_point(|r| r.end <= offset);
        match self.visible.get(i) {
            Some(r) if r.start <= offset => self.inner.extents(offset, end.min(r.end) - offset),
            next => {
                let hole_end = next.map_or(end, |r| r.start.min(end));
                Ok(vec![Extent {
                    offset,
                    len: hole_end - offset,
                    kind: ExtentKind::Hole,
                }])
            }
        }
    }
}
