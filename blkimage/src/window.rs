//! A byte range of a source, as a source of its own: how a part of an
//! image is hashed (`blkmap --range`, a resumed `blksum --checkpoint`)
//! with the same reader, extents and all.

use crate::source::{Extent, Source, pass_through};
use std::io;
use std::sync::Arc;

/// The bytes `offset..offset + len` of `inner`, seen as an image of `len`
/// bytes: extents and reads are moved by `offset`.
///
/// ```
/// use blkimage::{Source, Window};
/// # use blkimage::{Extent, ExtentKind};
/// # struct Ramp;
/// # impl Source for Ramp {
/// #     fn format(&self) -> &str { "ramp" }
/// #     fn size(&self) -> u64 { 1000 }
/// #     fn extents(&self, offset: u64, len: u64) -> std::io::Result<Vec<Extent>> {
/// #         Ok(vec![Extent { offset, len, kind: ExtentKind::Data }])
/// #     }
/// #     fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
/// #         buf.iter_mut().zip(offset..).for_each(|(b, o)| *b = o as u8);
/// #         Ok(())
/// #     }
/// # }
/// let w = Window::new(std::sync::Arc::new(Ramp), 200, 300).unwrap();
/// assert_eq!(w.size(), 300);
/// let mut buf = [0u8; 4];
/// w.read_at(&mut buf, 0).unwrap();
/// assert_eq!(buf, [200, 201, 202, 203]);
/// assert!(Window::new(std::sync::Arc::new(Ramp), 900, 200).is_err());
/// ```
pub struct Window {
    inner: Arc<dyn Source>,
    offset: u64,
    len: u64,
}

impl Window {
    /// The range `offset..offset + len` of `inner`: an error if it ends
    /// past `inner`'s end.
    pub fn new(inner: Arc<dyn Source>, offset: u64, len: u64) -> io::Result<Window> {
        let size = inner.size();
        if offset > size || len > size - offset {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the range {offset}+{len} ends past the end of the image ({size} bytes)"),
            ));
        }
        Ok(Window { inner, offset, len })
    }
}

impl Source for Window {
    fn size(&self) -> u64 {
        self.len
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let mut out = self.inner.extents(self.offset + offset, len)?;
        for e in &mut out {
            e.offset = e.offset.checked_sub(self.offset).ok_or_else(|| {
                io::Error::other(format!("bad extent {e:?} before the range's start"))
            })?;
        }
        Ok(out)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, self.offset + offset)
    }

    fn lendable(&self, offset: u64, len: usize) -> usize {
        self.inner.lendable(self.offset + offset, len)
    }

    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        self.inner.read_in_place(self.offset + offset, len, f)
    }

    pass_through!(inner: format, mapped_bytes, is_direct, default_io_depth, bytes_in_flight, finish,
        origin);
}
