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

    pass_through!(inner: format, mapped_bytes, is_direct, default_io_depth, read_size, bytes_in_flight, finish,
        origin);
}

/// A stream's first `size` bytes, the rest left unread: ending before
/// them is an error (never a checksum of fewer bytes than asked for).
pub(crate) struct Prefix<R> {
    inner: R,
    size: u64,
    left: u64,
}

impl<R> Prefix<R> {
    /// The first `size` bytes of `inner`.
    pub(crate) fn new(inner: R, size: u64) -> Prefix<R> {
        Prefix {
            inner,
            size,
            left: size,
        }
    }
}

impl<R: io::Read> io::Read for Prefix<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let n = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let got = self.inner.read(&mut buf[..n])?;
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the stream ended after {} bytes, before the size asked for, {} bytes",
                    self.size - self.left,
                    self.size
                ),
            ));
        }
        self.left -= got as u64;
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn a_stream_cut_or_too_short() {
        let cut = |data: &'static [u8], size| {
            let mut r = Prefix::new(data, size);
            let mut out = Vec::new();
            r.read_to_end(&mut out).map(|_| out)
        };
        assert_eq!(cut(b"abcdef", 4).unwrap(), b"abcd");
        assert_eq!(cut(b"abcdef", 6).unwrap(), b"abcdef");
        assert_eq!(cut(b"abcdef", 0).unwrap(), b"");
        let e = cut(b"abc", 4).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("after 3 bytes"), "{e}");
    }
}
