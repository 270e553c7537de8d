//! Maps as streams of pieces in block order, from any map-like source: a
//! saved map or part read from its file ([`MapReader`]), a map in memory
//! ([`Map::pieces`]), or another format that keeps a digest per block.
//! Whatever reads a map through (a diff, an update) reads it as
//! [`Pieces`], in memory bounded by a piece, never the map.

use crate::format::{Header, MapReader, Piece};
use crate::{Map, MapError, Outer, zero_digest};
use blkhash::Checksum;
use std::io::Read;

/// A map-like source read in block order: what it says of itself, then
/// its blocks as pieces (runs of zero blocks, or data blocks' digests).
///
/// ```
/// use blkhash::Options;
/// use blkmap::{Map, MapReader, Piece, Pieces};
/// let map = Map::compute(Options::new().block_size(512), &[1u8; 1024]).unwrap();
/// let bytes = map.to_bytes();
/// // A saved map and the map in memory give the same pieces.
/// let sources: [Box<dyn Pieces>; 2] = [
///     Box::new(MapReader::new(&bytes[..]).unwrap()),
///     Box::new(map.pieces()),
/// ];
/// for mut p in sources {
///     assert_eq!(p.header().size, 1024);
///     assert!(matches!(p.next_piece().unwrap(), Some(Piece::Data(d)) if d.len() == 64));
///     assert_eq!(p.next_piece().unwrap(), None);
/// }
/// ```
pub trait Pieces {
    /// What the source says of itself: digest, block size, size, range
    /// covered, checksum.
    fn header(&self) -> &Header;
    /// The next piece in block order, or `None` once every block was
    /// given and every check the source makes of itself passed.
    fn next_piece(&mut self) -> Result<Option<Piece<'_>>, MapError>;
}

impl<R: Read> Pieces for MapReader<R> {
    fn header(&self) -> &Header {
        MapReader::header(self)
    }
    fn next_piece(&mut self) -> Result<Option<Piece<'_>>, MapError> {
        MapReader::next_piece(self)
    }
}

impl<P: Pieces + ?Sized> Pieces for Box<P> {
    fn header(&self) -> &Header {
        (**self).header()
    }
    fn next_piece(&mut self) -> Result<Option<Piece<'_>>, MapError> {
        (**self).next_piece()
    }
}

/// A map in memory as [`Pieces`]: [`Map::pieces`].
pub struct MapPieces<'a> {
    map: &'a Map,
    header: Header,
    run: usize,
}

impl Map {
    /// The map as [`Pieces`], a run at a time.
    pub fn pieces(&self) -> MapPieces<'_> {
        MapPieces {
            map: self,
            header: self.header(),
            run: 0,
        }
    }
}

impl Pieces for MapPieces<'_> {
    fn header(&self) -> &Header {
        &self.header
    }
    fn next_piece(&mut self) -> Result<Option<Piece<'_>>, MapError> {
        let Some(r) = self.map.body.runs.get(self.run) else {
            return Ok(None);
        };
        self.run += 1;
        Ok(Some(match self.map.run(r).digests {
            None => Piece::Zeros(r.count),
            Some(d) => Piece::Data(d),
        }))
    }
}

/// [`Pieces`] whose checksum is derived as they pass and, at the end,
/// checked against the header's (a complete map's; a part has none): with
/// a [`MapReader`], every check [`Map::read`] makes, streamed.
pub struct Checked<P> {
    inner: P,
    /// The source's name, for errors.
    name: Option<String>,
    outer: Option<Outer>,
    /// The size and the checksum the header claims.
    claimed: Option<(u64, Checksum)>,
}

impl<P: Pieces> Checked<P> {
    /// Check `inner` as it is read, its errors said of `name`.
    pub fn named(inner: P, name: &str) -> Checked<P> {
        Checked {
            name: Some(name.to_string()),
            ..Checked::new(inner)
        }
    }

    /// Check `inner` as it is read.
    pub fn new(inner: P) -> Checked<P> {
        let h = inner.header();
        let claimed = h.checksum.clone().map(|c| (h.size, c));
        let outer = claimed
            .is_some()
            .then(|| Outer::new(h.algorithm, &zero_digest(h.algorithm, h.block_size)));
        Checked {
            inner,
            name: None,
            outer,
            claimed,
        }
    }
}

impl<P: Pieces> Pieces for Checked<P> {
    fn header(&self) -> &Header {
        self.inner.header()
    }
    fn next_piece(&mut self) -> Result<Option<Piece<'_>>, MapError> {
        let of = |e: MapError| match &self.name {
            Some(name) => e.of(name),
            None => e,
        };
        match self.inner.next_piece().map_err(of)? {
            None => {
                if let (Some(outer), Some((size, claimed))) = (self.outer.take(), &self.claimed)
                    && outer.checksum(*size) != *claimed
                {
                    return Err(of(MapError::Checksum));
                }
                Ok(None)
            }
            Some(p) => {
                if let Some(o) = &mut self.outer {
                    match p {
                        Piece::Zeros(n) => o.zeros(n),
                        Piece::Data(d) => o.data(d),
                    }
                }
                Ok(Some(p))
            }
        }
    }
}

/// A source's blocks taken a count at a time, to walk it beside another
/// source or a list of ranges. Holds at most one piece.
pub(crate) struct Blocks<P> {
    src: P,
    len: usize,
    buf: Vec<u8>,
    pos: usize,
    zeros: u64,
    end: bool,
}

impl<P: Pieces> Blocks<P> {
    pub(crate) fn new(src: P) -> Blocks<P> {
        let len = src.header().algorithm.output_len();
        Blocks {
            src,
            len,
            buf: Vec::new(),
            pos: 0,
            zeros: 0,
            end: false,
        }
    }

    pub(crate) fn header(&self) -> &Header {
        self.src.header()
    }

    /// The blocks ready to take: whether they are data, and how many
    /// (at least 1); `None` at the end (the source's checks passed).
    pub(crate) fn ready(&mut self) -> Result<Option<(bool, u64)>, MapError> {
        loop {
            if self.zeros > 0 {
                return Ok(Some((false, self.zeros)));
            }
            if self.pos < self.buf.len() {
                return Ok(Some((
                    true,
                    ((self.buf.len() - self.pos) / self.len) as u64,
                )));
            }
            if self.end {
                return Ok(None);
            }
            match self.src.next_piece()? {
                None => self.end = true,
                Some(Piece::Zeros(n)) => self.zeros = n,
                Some(Piece::Data(d)) => {
                    self.buf.clear();
                    self.buf.extend_from_slice(d);
                    self.pos = 0;
                }
            }
        }
    }

    /// Take `n` of the blocks [`ready`](Blocks::ready) said are there.
    pub(crate) fn take(&mut self, n: u64) -> Piece<'_> {
        if self.zeros > 0 {
            debug_assert!(n <= self.zeros);
            self.zeros -= n;
            return Piece::Zeros(n);
        }
        let start = self.pos;
        self.pos += n as usize * self.len;
        Piece::Data(&self.buf[start..self.pos])
    }

    /// Read to the end, so that the source's checks are made.
    pub(crate) fn drain(&mut self) -> Result<(), MapError> {
        while let Some((_, n)) = self.ready()? {
            self.take(n);
        }
        Ok(())
    }
}
