//! virtnbdbackup's backup streams (`sda.full.data`, `sda.inc.virtnbdbackup.1.data`,
//! `sda.copy.data`), plain or lz4-compressed, read as the disk they hold.
//!
//! A full or copy stream is the disk at its backup; an incremental one
//! holds only what changed since its parent checkpoint, so the disk as of
//! its checkpoint is its frames over its parent's, over the parent's
//! parent's..., down to the full backup: a chain, read as a qcow2 backing
//! chain is (newer frames over older, the newest stream's size). The
//! chain's streams are found by whoever opens (see [`crate::open`]); this
//! module checks that they link, merges their ranges, and reads.
//!
//! Ranges come from the frame headers alone, each header read once (the
//! payloads are skipped); plain payloads are read (or lent from a memory
//! map) where they lie, lz4 frames decompressed by the thread that asks
//! for their bytes (a digest worker), from the compressed bytes' pages
//! where the file lends them, the last few kept for the reads that follow
//! (an lz4 frame holds up to 32 MiB, a read 1 MiB) and lent from there to
//! the digest workers, not copied.

mod lz4;
mod lz4frame;
mod memory;
pub mod parse;
mod trailer;

use crate::source::{Extent, ExtentKind, Source};
use crate::storage::Storage;
use parse::{Kind, Lz4Frame, Meta, Range};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use parse::{MAX_RANGES, probe};

/// One stream of a chain: where it is, and what it holds.
pub struct Stream {
    /// Its name, for messages and [`Source::origin`].
    pub name: PathBuf,
    /// Its bytes.
    pub storage: Arc<dyn Storage>,
    meta: Meta,
    frames: Vec<Lz4Frame>,
}

impl Stream {
    /// The stream in `storage`, named `name` in messages: its metadata and
    /// frame headers read and checked.
    pub fn parse(name: PathBuf, storage: Arc<dyn Storage>) -> io::Result<(Stream, Vec<Range>)> {
        let p = parse::parse(&*storage).map_err(|e| named(&name, e))?;
        Ok((
            Stream {
                name,
                storage,
                meta: p.meta,
                frames: p.frames,
            },
            p.ranges,
        ))
    }

    /// Its metadata.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }
}

/// True if `file` starts as a virtnbdbackup stream does.
pub fn probe_file(file: &dyn Source) -> io::Result<bool> {
    let mut head = [0u8; parse::MAGIC.len()];
    if file.size() < head.len() as u64 {
        return Ok(false);
    }
    file.read_at(&mut head, 0)?;
    Ok(probe(&head))
}

/// True if the bytes of `st` start as a virtnbdbackup stream does.
pub fn probe_storage(st: &dyn Storage) -> io::Result<bool> {
    let mut head = [0u8; parse::MAGIC.len()];
    if st.len() < head.len() as u64 {
        return Ok(false);
    }
    st.read_exact_at(&mut head, 0)?;
    Ok(probe(&head))
}

/// Only the metadata of the stream in `storage` (named `name`).
pub fn meta(name: &std::path::Path, storage: &dyn Storage) -> io::Result<Meta> {
    parse::meta(storage).map_err(|e| named(name, e))
}

/// `e` said of the stream `name`.
pub(crate) fn named(name: &std::path::Path, e: io::Error) -> io::Error {
    let msg = format!("virtnbdbackup stream '{}': {e}", name.display());
    crate::with_file(e, msg, name)
}

/// A range of the merged chain: whose, and where.
#[derive(Clone, Copy, Debug)]
struct Seg {
    range: Range,
    /// Index of the stream in [`Vnbd::streams`].
    stream: u32,
}

/// What the chain's index is called when it cannot grow.
const INDEX: &str = "the index of a chain of streams";

/// The most ranges a chain is indexed in: 64 MiB of them.
const MAX_SEGS: usize = (64 << 20) / std::mem::size_of::<Seg>();

/// A disk as virtnbdbackup streams hold it: one full or copy stream, or an
/// incremental one over its chain.
pub struct Vnbd {
    /// The newest first.
    streams: Vec<Stream>,
    segs: Vec<Seg>,
    size: u64,
    cache: lz4::Cache,
    compressed: bool,
}

impl Vnbd {
    /// The disk a chain of streams holds: `chain[0]` the stream asked for,
    /// each next one its parent (with the ranges [`Stream::parse`] gave),
    /// the last a full backup. An error names the link that does not hold:
    /// a stream of another disk, a parent whose checkpoint is not the one
    /// named, a parent newer than its child, an incremental stream at the
    /// bottom (its parent is missing).
    pub fn new(chain: Vec<(Stream, Vec<Range>)>) -> io::Result<Vnbd> {
        let mut streams = Vec::with_capacity(chain.len());
        let mut all = Vec::with_capacity(chain.len());
        for (s, r) in chain {
            streams.push(s);
            all.push(r);
        }
        let top = streams
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no stream"))?;
        for w in streams.windows(2) {
            check_link(&w[0], &w[1])?;
        }
        let last = streams.last().expect("not empty");
        if last.meta.incremental {
            return Err(named(
                &last.name,
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "an incremental backup of disk '{}' whose parent checkpoint '{}' was \
                         not found",
                        last.meta.disk, last.meta.parent
                    ),
                ),
            ));
        }
        let size = top.meta.virtual_size;
        let oom = |e: io::Error| named(&top.name, e);
        // Oldest first, each newer stream over what is below it.
        let mut segs: Vec<Seg> = Vec::new();
        for (i, ranges) in all.into_iter().enumerate().rev() {
            let incremental = streams[i].meta.incremental;
            let mut newer = Vec::new();
            memory::reserve(&mut newer, ranges.len(), INDEX).map_err(oom)?;
            // A zero frame of an incremental stream (virtnbdbackup writes
            // none) leaves its parents' bytes, as virtnbdrestore, which
            // skips zero frames, leaves them on the disk it restores to.
            let kept = ranges
                .into_iter()
                .filter(|r| !(incremental && r.kind == Kind::Zero));
            newer.extend(kept.map(|range| Seg {
                range,
                stream: i as u32,
            }));
            segs = overlay(segs, newer).map_err(oom)?;
            if segs.len() > MAX_SEGS {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "virtnbdbackup stream '{}': its chain has more than {MAX_SEGS} ranges \
                         (an index within 64 MiB)",
                        top.name.display()
                    ),
                ));
            }
        }
        // The newest stream's size: a disk shrunk since, cut; grown, zeros.
        segs.retain(|s| s.range.start < size);
        if let Some(s) = segs.last_mut()
            && s.range.end() > size
        {
            s.range = s.range.slice(s.range.start, size);
        }
        let compressed = streams.iter().any(|s| s.meta.compressed);
        Ok(Vnbd {
            streams,
            segs,
            size,
            cache: lz4::Cache::default(),
            compressed,
        })
    }

    /// The single stream in `storage` (a full or copy backup: an
    /// incremental one needs its chain, [`crate::open`] finds it). For
    /// streams in memory (tests, fuzzing).
    ///
    /// ```
    /// use blkimage::{Source, formats::vnbd::Vnbd};
    /// use std::sync::Arc;
    /// let json = r#"{"virtualSize": 4096, "dataSize": 3, "incremental": false}"#;
    /// let mut s = format!("meta {:016x} {:016x}\r\n{json}\r\n", 0, json.len());
    /// s += &format!("data {:016x} {:016x}\r\nabc\r\n", 512, 3);
    /// s += &format!("stop {:016x} {:016x}\r\n", 0, 0);
    /// let disk = Vnbd::from_storage(Arc::new(s.into_bytes())).unwrap();
    /// assert_eq!((disk.format(), disk.size()), ("virtnbdbackup", 4096));
    /// let mut buf = [0xffu8; 5];
    /// disk.read_at(&mut buf, 511).unwrap();
    /// assert_eq!(&buf, b"\0abc\0");
    /// ```
    pub fn from_storage(storage: Arc<dyn Storage>) -> io::Result<Vnbd> {
        Vnbd::new(vec![Stream::parse(PathBuf::from("(memory)"), storage)?])
    }

    /// The streams, the one asked for first.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    /// The segment holding `offset`, or the first one after it.
    fn seg_at(&self, offset: u64) -> usize {
        self.segs.partition_point(|s| s.range.end() <= offset)
    }

    /// The decompressed frame of lz4 segment `seg`, and where the byte
    /// `d` bytes into the segment is in it.
    fn lz4_at(&self, seg: &Seg, d: u64) -> io::Result<(Arc<lz4::Frame>, usize)> {
        let Kind::Lz4 { frame, skip } = seg.range.kind else {
            unreachable!("an lz4 segment");
        };
        let st = &self.streams[seg.stream as usize];
        let f = st.frames[frame as usize];
        let after = st.frames.get(frame as usize + 1).copied();
        let load_after = move || lz4::decompress(&*st.storage, after.expect("a next frame"));
        let next = after.map(|_| {
            let l: lz4::Load = &load_after;
            ((seg.stream, frame + 1), l)
        });
        let bytes = self
            .cache
            .get(
                (seg.stream, frame),
                || lz4::decompress(&*st.storage, f),
                next,
            )
            .map_err(|e| named(&st.name, e))?;
        Ok((bytes, (skip as u64 + d) as usize))
    }

    fn read_seg(&self, seg: &Seg, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let st = &self.streams[seg.stream as usize];
        let d = offset - seg.range.start;
        match seg.range.kind {
            Kind::Zero => buf.fill(0),
            Kind::Data { pos } => st
                .storage
                .read_exact_at(buf, pos + d)
                .map_err(|e| named(&st.name, e))?,
            Kind::Lz4 { .. } => {
                let (bytes, at) = self.lz4_at(seg, d)?;
                buf.copy_from_slice(&bytes[at..at + buf.len()]);
            }
        }
        Ok(())
    }
}

/// An error unless `parent` is the backup `child` was taken over.
fn check_link(child: &Stream, parent: &Stream) -> io::Result<()> {
    let (c, p) = (&child.meta, &parent.meta);
    let why = if !c.incremental {
        Some("it is not an incremental backup".to_string())
    } else if p.disk != c.disk {
        Some(format!("is of disk '{}', not '{}'", p.disk, c.disk))
    } else if p.checkpoint != c.parent {
        Some(format!(
            "its checkpoint is '{}', not the parent '{}'",
            p.checkpoint, c.parent
        ))
    } else if !p.date.is_empty() && !c.date.is_empty() && p.date > c.date {
        Some(format!(
            "out of order: it was taken at {}, after its child ({})",
            p.date, c.date
        ))
    } else {
        None
    };
    match why {
        None => Ok(()),
        Some(why) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "virtnbdbackup stream '{}' cannot be the parent of '{}': {why}",
                parent.name.display(),
                child.name.display()
            ),
        )),
    }
}

/// `newer` laid over `older` (each sorted, not overlapping): what `newer`
/// covers is its, the rest `older`'s, cut where they meet.
fn overlay(older: Vec<Seg>, newer: Vec<Seg>) -> io::Result<Vec<Seg>> {
    if older.is_empty() {
        return Ok(newer);
    }
    // Each range of `newer` cuts at most one of `older` in two.
    let mut out = Vec::new();
    memory::reserve(&mut out, older.len() + 2 * newer.len(), INDEX)?;
    let mut old = older.into_iter();
    let mut head = old.next();
    for n in newer {
        let (ns, ne) = (n.range.start, n.range.end());
        while let Some(o) = head {
            let (os, oe) = (o.range.start, o.range.end());
            if oe <= ns {
                out.push(o);
                head = old.next();
                continue;
            }
            if os >= ne {
                break;
            }
            if os < ns {
                out.push(Seg {
                    range: o.range.slice(os, ns),
                    ..o
                });
            }
            if oe > ne {
                head = Some(Seg {
                    range: o.range.slice(ne, oe),
                    ..o
                });
                break;
            }
            head = old.next();
        }
        out.push(n);
    }
    out.extend(head);
    out.extend(old);
    Ok(out)
}

/// Extents, merged by kind.
fn push(out: &mut Vec<Extent>, offset: u64, len: u64, kind: ExtentKind) {
    if let Some(last) = out.last_mut()
        && last.kind == kind
        && last.end() == offset
    {
        last.len += len;
        return;
    }
    out.push(Extent { offset, len, kind });
}

/// The most segments one [`Source::extents`] call looks at.
const MAX_SEGS_PER_EXTENTS: usize = 4096;

impl Source for Vnbd {
    fn format(&self) -> &str {
        "virtnbdbackup"
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let end = offset.saturating_add(len).min(self.size);
        let mut out = Vec::new();
        let mut pos = offset;
        let mut i = self.seg_at(offset);
        while pos < end && i < self.segs.len() && out.len() < MAX_SEGS_PER_EXTENTS {
            let r = self.segs[i].range;
            if r.start >= end {
                break;
            }
            if r.start > pos {
                push(&mut out, pos, r.start - pos, ExtentKind::Hole);
                pos = r.start;
            }
            let stop = r.end().min(end);
            let kind = match r.kind {
                Kind::Zero => ExtentKind::Zero,
                _ => ExtentKind::Data,
            };
            push(&mut out, pos, stop - pos, kind);
            pos = stop;
            i += 1;
        }
        if pos < end && (i >= self.segs.len() || self.segs[i].range.start >= end) {
            push(&mut out, pos, end - pos, ExtentKind::Hole);
        }
        Ok(out)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.size)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {} bytes at offset {offset:#x} is past the end ({:#x} bytes)",
                        buf.len(),
                        self.size
                    ),
                )
            })?;
        let mut pos = offset;
        let mut i = self.seg_at(offset);
        while pos < end {
            let at = (pos - offset) as usize;
            match self.segs.get(i) {
                Some(s) if s.range.start <= pos => {
                    let stop = s.range.end().min(end);
                    self.read_seg(s, &mut buf[at..(stop - offset) as usize], pos)?;
                    pos = stop;
                    i += 1;
                }
                next => {
                    let stop = next.map_or(end, |s| s.range.start.min(end));
                    buf[at..(stop - offset) as usize].fill(0);
                    pos = stop;
                }
            }
        }
        Ok(())
    }

    /// The prefix of a plain data frame's bytes its file lends, or of an
    /// lz4 frame's: lent from the decompressed frame (by the digest worker
    /// that decompresses it, or from the frames kept), not copied.
    fn lendable(&self, offset: u64, len: usize) -> usize {
        let Some(s) = self.segs.get(self.seg_at(offset)) else {
            return 0;
        };
        let n = || (s.range.end() - offset).min(len as u64) as usize;
        match s.range.kind {
            _ if s.range.start > offset => 0,
            Kind::Data { pos } => self.streams[s.stream as usize]
                .storage
                .lendable(pos + offset - s.range.start, n()),
            Kind::Lz4 { .. } => n(),
            Kind::Zero => 0,
        }
    }

    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        let s = self.segs[self.seg_at(offset)];
        let d = offset - s.range.start;
        match s.range.kind {
            Kind::Data { pos } => {
                let st = &self.streams[s.stream as usize];
                st.storage
                    .read_in_place(pos + d, len, f)
                    .map_err(|e| named(&st.name, e))
            }
            Kind::Lz4 { .. } => {
                let (bytes, at) = self.lz4_at(&s, d)?;
                f(&bytes[at..at + len]);
                Ok(())
            }
            Kind::Zero => Err(io::Error::other("read_in_place of bytes not lent")),
        }
    }

    /// Plain streams read with direct I/O where it was asked for; lz4
    /// ones are mostly decompression, best done by the digest workers.
    fn is_direct(&self) -> bool {
        !self.compressed && self.streams.iter().all(|s| s.storage.is_direct())
    }

    fn default_io_depth(&self, read_size: usize) -> usize {
        match self.streams[0].storage.default_io_depth(read_size) {
            Some(depth) => depth,
            None if self.is_direct() => crate::direct_io_depth(read_size),
            None => 0,
        }
    }

    fn finish(&self) -> io::Result<()> {
        for s in &self.streams {
            s.storage.finish().map_err(|e| named(&s.name, e))?;
        }
        Ok(())
    }

    /// The stream asked for is the image; the streams below it (earlier
    /// backups it builds on) are below it, as a backing chain is.
    fn origin(&self) -> Vec<crate::source::Origin> {
        use crate::source::{Origin, Role};
        (self.streams.iter().enumerate())
            .flat_map(|(i, s)| {
                s.storage.origin().into_iter().map(move |o| match o {
                    Origin::File { path, .. } if i > 0 => Origin::File {
                        path,
                        role: Role::Below,
                    },
                    o => o,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start: u64, len: u64, stream: u32) -> Seg {
        Seg {
            range: Range {
                start,
                len,
                kind: Kind::Data { pos: start * 10 },
            },
            stream,
        }
    }

    fn shape(v: &[Seg]) -> Vec<(u64, u64, u32, u64)> {
        v.iter()
            .map(|s| {
                let Kind::Data { pos } = s.range.kind else {
                    panic!()
                };
                (s.range.start, s.range.len, s.stream, pos)
            })
            .collect()
    }

    #[test]
    fn newer_ranges_cover_older() {
        let old = vec![seg(0, 100, 1), seg(200, 100, 1)];
        let new = vec![seg(50, 10, 0), seg(90, 120, 0), seg(290, 20, 0)];
        assert_eq!(
            shape(&overlay(old, new).unwrap()),
            vec![
                (0, 50, 1, 0),
                (50, 10, 0, 500),
                (60, 30, 1, 60),
                (90, 120, 0, 900),
                (210, 80, 1, 2010),
                (290, 20, 0, 2900),
            ]
        );
        let old = vec![seg(0, 100, 1)];
        assert_eq!(
            shape(&overlay(old, vec![seg(200, 5, 0)]).unwrap()),
            vec![(0, 100, 1, 0), (200, 5, 0, 2000)]
        );
    }

    /// The seeds of the fuzz target, written by virtnbdbackup's own stream
    /// writer and lz4 framing (fuzz/seeds/vnbd/).
    fn seed(name: &str) -> Vec<u8> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fuzz/seeds/vnbd")
            .join(name);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"))
    }

    fn content(v: &Vnbd) -> Vec<u8> {
        let mut buf = vec![0xffu8; v.size() as usize];
        v.read_at(&mut buf, 0).unwrap();
        // Reads at odd offsets and lengths agree.
        for (off, len) in [(1, 4095), (4000, 200), (5000, 4000)] {
            if off + len <= buf.len() {
                let mut part = vec![0xffu8; len];
                v.read_at(&mut part, off as u64).unwrap();
                assert_eq!(part, buf[off..off + len]);
            }
        }
        buf
    }

    #[test]
    fn plain_and_lz4_streams_hold_the_same_disk() {
        let mut want = vec![0u8; 16384];
        for (i, b) in want[4096..5120].iter_mut().enumerate() {
            *b = i as u8;
        }
        want[8192..8704].fill(5);
        for name in ["seed-plain", "seed-lz4"] {
            let v = Vnbd::from_storage(Arc::new(seed(name))).unwrap();
            assert_eq!(content(&v), want, "{name}");
            let kinds: Vec<_> = v
                .extents(0, 16384)
                .unwrap()
                .iter()
                .map(|e| (e.offset, e.len, e.kind))
                .collect();
            assert_eq!(
                kinds,
                [
                    (0, 4096, ExtentKind::Zero),
                    (4096, 1024, ExtentKind::Data),
                    (5120, 3072, ExtentKind::Zero),
                    (8192, 1024, ExtentKind::Data),
                    (9216, 7168, ExtentKind::Hole),
                ],
                "{name}"
            );
        }
        let v = Vnbd::from_storage(Arc::new(seed("seed-lz4-chunked"))).unwrap();
        let mut want = vec![0u8; 65536];
        for (i, b) in want[..10240].iter_mut().enumerate() {
            *b = i as u8;
        }
        assert_eq!(content(&v), want);
    }

    /// A stream of `virtual_size` bytes, no data.
    fn empty(virtual_size: u64) -> Vec<u8> {
        let json = format!(r#"{{"virtualSize": {virtual_size}, "dataSize": 0}}"#);
        let mut s = format!("meta {:016x} {:016x}\r\n{json}\r\n", 0, json.len());
        s += &format!("stop {:016x} {:016x}\r\n", 0, 0);
        s.into_bytes()
    }

    #[test]
    fn sizes_over_qemus_limit_are_refused() {
        let v = Vnbd::from_storage(Arc::new(empty(i64::MAX as u64))).unwrap();
        assert_eq!(v.size(), i64::MAX as u64);
        for size in [1 << 63, u64::MAX] {
            let e = Vnbd::from_storage(Arc::new(empty(size))).err().unwrap();
            assert!(e.to_string().contains("over QEMU's limit"), "{e}");
        }
    }

    #[test]
    fn an_incremental_stream_alone_is_refused() {
        let e = Vnbd::from_storage(Arc::new(seed("seed-inc")))
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("parent checkpoint 'virtnbdbackup.0'"),
            "{e}"
        );
    }

    /// `s` with the bytes `from` (there once) replaced by `to`.
    fn replace(s: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
        let at = s.windows(from.len()).position(|w| w == from).unwrap();
        [&s[..at], to, &s[at + from.len()..]].concat()
    }

    #[test]
    fn every_truncation_and_a_lying_trailer_are_errors() {
        for name in ["seed-plain", "seed-lz4", "seed-lz4-chunked"] {
            let s = seed(name);
            for cut in 0..s.len() {
                let e = Vnbd::from_storage(Arc::new(s[..cut].to_vec()));
                assert!(e.is_err(), "{name} cut at {cut} opens");
            }
        }
        // One compressed size one byte off, kept the same length.
        let lie = replace(
            &seed("seed-lz4-chunked"),
            b"[312, 312, 304]",
            b"[313, 311, 304]",
        );
        let e = Vnbd::from_storage(Arc::new(lie)).err().unwrap();
        assert!(e.to_string().contains("offset"), "{e}");
        // A frame past the virtual size.
        let past = replace(
            &seed("seed-plain"),
            b"\"virtualSize\": 16384",
            b"\"virtualSize\":  9000",
        );
        let e = Vnbd::from_storage(Arc::new(past)).err().unwrap();
        assert!(e.to_string().contains("past the virtual size"), "{e}");
    }
}
