//! qcow2 images (versions 2 and 3), read natively.
//!
//! Supported: clusters of 512 B to 2 MiB; zero clusters (with or without a
//! preallocated offset); compressed clusters (zlib or zstd), inflated in
//! [`Source::read_at`], so on the reader's threads; extended L2 entries
//! (subclusters); external data files (with or without `data_file_raw`);
//! backing chains of qcow2 or raw images. Internal snapshots are ignored:
//! the active layer is what is read. The dirty bit is ignored (reading does
//! not need the refcounts).
//!
//! Refused with a message: encryption (AES, LUKS), unknown incompatible
//! features, the corrupt bit, and what QEMU refuses on open (its limits on
//! the refcount and snapshot tables, malformed header extensions), in its
//! words. The virtual size is rounded down to whole 512-byte sectors, as
//! QEMU's guest sees it. Every offset taken from the image is checked
//! (alignment, inside the file, no overflow) before use, memory stays
//! bounded (L2 tables go through a bounded cache; the L1 table is at most 32
//! MiB, as QEMU allows, and inside the file), and every loop advances.
//!
//! Persistent dirty bitmaps ([`Source::bitmaps`], [`Source::dirty`]) are
//! read from the qcow2 file itself, the image's own (not its backing
//! file's, whose bitmaps record writes to the backing file).

mod bitmaps;
mod compressed;
mod header;
mod l2cache;
mod mapping;

pub use crate::storage::{ImageFile, Storage};
pub use header::{BitmapsExt, Compression, Header};

use crate::source::{Extent, ExtentKind, Origin, Role, Source};
use mapping::{Map, Mapper};
use std::io;
use std::sync::Arc;

/// The deepest backing chain opened: the top image and 63 backing images.
/// (QEMU itself sets no fixed limit; a chain this deep is a mistake or an attack.)
pub const MAX_CHAIN_DEPTH: usize = 64;

pub(crate) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("qcow2: {msg}"))
}

pub(crate) fn unsupported(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::Unsupported, format!("qcow2: {msg}"))
}

/// True if `file` starts with a qcow2 header (the magic and version 2 or later).
pub fn probe(file: &dyn Source) -> io::Result<bool> {
    let mut head = [0u8; 8];
    if file.size() < head.len() as u64 {
        return Ok(false);
    }
    file.read_at(&mut head, 0)?;
    Ok(header::probe(&head))
}

/// True if `head`, a file's first bytes, starts with a qcow2 header.
pub(crate) fn probe_bytes(head: &[u8]) -> bool {
    header::probe(head)
}

/// The most bytes a qcow2 file can hold whose header starts `head` (at
/// least its first 64 bytes; a shorter head, no bound): what a
/// decompressed file is allowed to grow to before it is taken for a
/// decompression bomb. Generous: for the active image and each internal
/// snapshot, every cluster of the virtual size allocated and its L2 entries
/// extended (16 bytes); refcounts of 64 bits for all of it; 64 persistent
/// bitmaps of the finest granularity (512 bytes); and 256 MiB for the
/// rest (the header and its extensions, and the snapshot table and the
/// bitmap directory, which QEMU bounds at 64 MiB each).
pub(crate) fn max_file_len(head: &[u8]) -> u64 {
    if head.len() < 64 || !probe_bytes(head) {
        return u64::MAX;
    }
    let be32 = |at: usize| u32::from_be_bytes(head[at..at + 4].try_into().expect("4 bytes"));
    let size = u64::from_be_bytes(head[24..32].try_into().expect("8 bytes"));
    let cluster = 1u64 << be32(20).clamp(9, 21);
    let clusters = size.div_ceil(cluster);
    let image = (clusters.saturating_mul(cluster))
        .saturating_add(clusters.saturating_mul(16))
        .saturating_add(4 * cluster);
    let images = image.saturating_mul(1 + u64::from(be32(60)));
    let refcounts = (images / cluster).saturating_mul(16);
    let bitmaps = (size / 512 / 8).saturating_mul(64);
    images
        .saturating_add(refcounts)
        .saturating_add(bitmaps)
        .saturating_add(256 << 20)
}

/// Extents calls that load an L2 table or ask the backing image: at most
/// this many per call (once something was found), to keep calls short.
const MAX_WORK_PER_EXTENTS: usize = 64;

/// A qcow2 image, as a [`Source`].
pub struct Qcow2 {
    header: Header,
    file: Arc<dyn Storage>,
    /// The external data file, if any.
    data: Option<Arc<dyn Storage>>,
    mapper: Mapper,
    backing: Option<Box<dyn Source>>,
    /// Its data looks compressed ([`Mapper::looks_compressed`]).
    compressed: bool,
}

impl Qcow2 {
    /// A qcow2 image in `file` that refers to no other file: an image with a
    /// backing file or an external data file is an error. For images in
    /// memory (tests, fuzzing); [`crate::open()`] opens files and their chains.
    pub fn from_storage(file: Arc<dyn Storage>) -> io::Result<Qcow2> {
        let header = Header::parse(&*file)?;
        if header.backing_file.is_some() {
            return Err(unsupported("the image has a backing file".into()));
        }
        if header.external_data {
            return Err(unsupported("the image has an external data file".into()));
        }
        Qcow2::new(header, file, None, None)
    }

    /// An image from its validated header, its file, its data file (if
    /// the header asks for one) and its backing image.
    pub(crate) fn new(
        header: Header,
        file: Arc<dyn Storage>,
        data: Option<Arc<dyn Storage>>,
        backing: Option<Box<dyn Source>>,
    ) -> io::Result<Qcow2> {
        let data_len = data.as_ref().map_or(file.len(), |d| d.len());
        let mapper = Mapper::new(&header, &*file, data_len)?;
        let compressed = mapper.looks_compressed(&*file);
        Ok(Qcow2 {
            header,
            file,
            data,
            mapper,
            backing,
            compressed,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The backing image, if any.
    pub fn backing(&self) -> Option<&dyn Source> {
        self.backing.as_deref()
    }

    fn data_file(&self) -> &dyn Storage {
        match &self.data {
            Some(d) => &**d,
            None => &*self.file,
        }
    }

    fn backing_size(&self) -> u64 {
        self.backing.as_ref().map_or(0, |b| b.size())
    }

    /// Bytes of the backing image (zeros past its end, or without one).
    fn read_backing(&self, out: &mut [u8], g: u64) -> io::Result<()> {
        let blen = match &self.backing {
            Some(b) if g < b.size() => {
                let blen = (out.len() as u64).min(b.size() - g) as usize;
                b.read_at(&mut out[..blen], g)?;
                blen
            }
            _ => 0,
        };
        out[blen..].fill(0);
        Ok(())
    }

    fn read_compressed(
        &self,
        out: &mut [u8],
        g: u64,
        host: u64,
        len: u64,
        cluster: u64,
    ) -> io::Result<()> {
        let cs = self.header.cluster_size() as usize;
        // At most two clusters (the descriptor's sector count is bounded).
        let mut input = blkhash::try_zeroed(len as usize, "a compressed cluster")?;
        self.file.read_exact_at(&mut input, host)?;
        let at = (g - cluster) as usize;
        let err = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("{e} (host offset {host:#x}, guest offset {cluster:#x})"),
            )
        };
        if at == 0 && out.len() == cs {
            return compressed::decompress(self.header.compression, &input, out).map_err(err);
        }
        let mut whole = blkhash::try_zeroed(cs, "a decompressed cluster")?;
        compressed::decompress(self.header.compression, &input, &mut whole).map_err(err)?;
        out.copy_from_slice(&whole[at..at + out.len()]);
        Ok(())
    }
}

impl Qcow2 {
    /// The extents of the `n` unallocated bytes from `pos`, pushed to
    /// `out`: the backing image's, zeros past its end (or without one).
    /// False if the backing gave only a prefix (the caller comes back for
    /// the rest).
    fn backing_extents(&self, out: &mut Extents, pos: u64, n: u64) -> io::Result<bool> {
        let bsize = self.backing_size();
        let b = match &self.backing {
            Some(b) if pos < bsize => b,
            _ => {
                out.push(pos, n, ExtentKind::Hole);
                return Ok(true);
            }
        };
        let blen = n.min(bsize - pos);
        let mut p = pos;
        for e in b.extents(pos, blen)? {
            if e.offset != p || e.len == 0 || e.end() > pos + blen {
                return Err(io::Error::other(format!(
                    "backing image returned a bad extent {e:?} at offset {p}"
                )));
            }
            out.push(e.offset, e.len, e.kind);
            p = e.end();
        }
        if p == pos {
            return Err(io::Error::other(format!(
                "backing image returned no extent at offset {pos}"
            )));
        }
        if p < pos + blen {
            return Ok(false);
        }
        if blen < n {
            // Past the end of a shorter backing: zeros.
            out.push(pos + blen, n - blen, ExtentKind::Hole);
        }
        Ok(true)
    }
}

/// Extents, merged by kind.
struct Extents(Vec<Extent>);

impl Extents {
    fn push(&mut self, offset: u64, len: u64, kind: ExtentKind) {
        if let Some(last) = self.0.last_mut()
            && last.kind == kind
            && last.end() == offset
        {
            last.len += len;
            return;
        }
        self.0.push(Extent { offset, len, kind });
    }
}

impl Source for Qcow2 {
    fn format(&self) -> &str {
        "qcow2"
    }

    /// Its data clusters read with direct I/O (the external data file's,
    /// if any; a backing file's reads are the backing source's business),
    /// unless they look compressed: then a read is mostly decompression,
    /// CPU work best done by the digest worker that digests what it
    /// inflates (reading threads made a compressed 1 GiB image 1.29× slower
    /// on 2 cores, where a raw image was 0.86× faster).
    fn is_direct(&self) -> bool {
        !self.compressed && self.data.as_ref().unwrap_or(&self.file).is_direct()
    }

    /// What its data clusters' storage wants, if it says (a file over
    /// HTTP(S): many reads in flight, compressed or not, since latency
    /// bounds it), else as for any source (see [`Qcow2::is_direct`]).
    fn default_io_depth(&self, read_size: usize) -> usize {
        match self.data_file().default_io_depth(read_size) {
            Some(depth) => depth,
            None if self.is_direct() => crate::source::direct_io_depth(read_size),
            None => 0,
        }
    }

    fn bytes_in_flight(&self) -> Option<usize> {
        self.data_file().bytes_in_flight()
    }

    /// The virtual size rounded down to a multiple of 512, as QEMU does
    /// (it counts whole sectors): the guest sees no partial last sector.
    fn size(&self) -> u64 {
        self.header.size & !511
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = offset.saturating_add(len);
        let mut out = Extents(Vec::new());
        let mut pos = offset;
        let mut work = 0;
        let mut last_l1 = None;
        // Stop once the first extent is complete (a different kind follows),
        // or enough work was done: callers come back for the rest.
        while pos < end && out.0.len() < 2 {
            if !out.0.is_empty() && work >= MAX_WORK_PER_EXTENTS {
                break;
            }
            if self.mapper.has_table(pos) && last_l1 != Some(self.mapper.l1_index(pos)) {
                last_l1 = Some(self.mapper.l1_index(pos));
                work += 1;
            }
            let (map, mut n) = self.mapper.map(&*self.file, pos, end - pos)?;
            match map {
                // Data clusters over a hole of their file (preallocated
                // metadata, a sparse raw data file) read as zeros.
                Map::Data { host } => match self.data_file().data_at(host, n)? {
                    (false, m) => {
                        n = m.clamp(1, n);
                        out.push(pos, n, ExtentKind::Zero)
                    }
                    (true, m) => {
                        n = m.clamp(1, n);
                        out.push(pos, n, ExtentKind::Data)
                    }
                },
                Map::Compressed { .. } => out.push(pos, n, ExtentKind::Data),
                Map::Zero => out.push(pos, n, ExtentKind::Zero),
                Map::Unallocated => {
                    // Take the whole unallocated run, then ask the backing once.
                    while pos + n < end && work < MAX_WORK_PER_EXTENTS {
                        let next = pos + n;
                        if self.mapper.has_table(next)
                            && last_l1 != Some(self.mapper.l1_index(next))
                        {
                            last_l1 = Some(self.mapper.l1_index(next));
                            work += 1;
                        }
                        match self.mapper.map(&*self.file, next, end - next)? {
                            (Map::Unallocated, m) => n += m,
                            _ => break,
                        }
                    }
                    if pos < self.backing_size() {
                        work += 1;
                    }
                    if !self.backing_extents(&mut out, pos, n)? {
                        break; // the backing gave a prefix: come back for the rest
                    }
                }
            }
            pos += n;
        }
        Ok(out.0)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0usize;
        while done < buf.len() {
            let g = offset
                .checked_add(done as u64)
                .ok_or_else(|| invalid("read past the largest offset".into()))?;
            let (map, n) = self.mapper.map(&*self.file, g, (buf.len() - done) as u64)?;
            let out = &mut buf[done..done + n as usize];
            match map {
                Map::Data { host } => self.data_file().read_exact_at(out, host)?,
                Map::Zero => out.fill(0),
                Map::Unallocated => self.read_backing(out, g)?,
                Map::Compressed { host, len, cluster } => {
                    self.read_compressed(out, g, host, len, cluster)?
                }
            }
            done += n as usize;
        }
        Ok(())
    }

    /// The contiguous prefix of a data cluster run the data file lends (or
    /// the backing image, for unallocated clusters); compressed and zero
    /// clusters are never lent. A mapping error here is left for the read
    /// to report.
    fn lendable(&self, offset: u64, len: usize) -> usize {
        match self.mapper.map(&*self.file, offset, len as u64) {
            Ok((Map::Data { host }, n)) => self.data_file().lendable(host, n as usize),
            Ok((Map::Unallocated, n)) if offset + n <= self.backing_size() => self
                .backing
                .as_ref()
                .map_or(0, |b| b.lendable(offset, n as usize)),
            _ => 0,
        }
    }

    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        match self.mapper.map(&*self.file, offset, len as u64)? {
            (Map::Data { host }, n) if n == len as u64 => {
                self.data_file().read_in_place(host, len, f)
            }
            (Map::Unallocated, n) if n == len as u64 && offset + n <= self.backing_size() => {
                match &self.backing {
                    Some(b) => b.read_in_place(offset, len, f),
                    None => Err(invalid(format!("no backing image at offset {offset}"))),
                }
            }
            // The image changed since `lendable` (it cannot while it is
            // open read-only and locked): copy.
            _ => {
                let mut buf = blkhash::try_zeroed(len, "a read")?;
                self.read_at(&mut buf, offset)?;
                f(&buf);
                Ok(())
            }
        }
    }

    /// The bitmaps of this image's file (never of its backing file). When
    /// the extension's autoclear bit is clear (a program without bitmap
    /// support wrote to the image, and QEMU then drops every bitmap), they
    /// are listed all the same, as in use (`in_use: Some(true)`): the
    /// caller learns their names and that none can be trusted.
    fn bitmaps(&self) -> io::Result<Vec<crate::bitmap::BitmapInfo>> {
        bitmaps::list(
            &*self.file,
            self.header.bitmaps.as_ref(),
            self.header.cluster_size(),
        )
    }

    /// The ranges of the image's own bitmap `name`, over [`Source::size`]
    /// (QEMU's size of the bitmap). Refused when the whole extension is
    /// inconsistent (see [`Source::bitmaps`]), when the bitmap is in use,
    /// or when it is malformed.
    fn dirty(&self, name: &str) -> io::Result<crate::bitmap::Dirty> {
        bitmaps::dirty(
            &*self.file,
            self.header.bitmaps.as_ref(),
            self.header.cluster_size(),
            self.size(),
            name,
        )
    }

    /// The image file's, its data file's (its own data) and its backing
    /// chain's (below it), in that order.
    fn origin(&self) -> Vec<Origin> {
        let mut v = self.file.origin();
        if let Some(d) = &self.data {
            v.extend(as_role(d.origin(), Role::Data));
        }
        if let Some(b) = &self.backing {
            v.extend(as_role(b.origin(), Role::Below));
        }
        v
    }

    fn mapped_bytes(&self) -> u64 {
        let data = self.data.as_ref().map_or(0, |d| d.mapped_bytes());
        let below = self.backing.as_ref().map_or(0, |b| b.mapped_bytes());
        self.file.mapped_bytes() + data + below
    }

    fn finish(&self) -> io::Result<()> {
        self.file.finish()?;
        if let Some(d) = &self.data {
            d.finish()?;
        }
        if let Some(b) = &self.backing {
            b.finish()?;
        }
        Ok(())
    }
}

/// `origin` with every file as `role` to the image that reads it.
fn as_role(origin: Vec<Origin>, role: Role) -> Vec<Origin> {
    (origin.into_iter())
        .map(|o| match o {
            Origin::File { path, .. } => Origin::File { path, role },
            o => o,
        })
        .collect()
}
