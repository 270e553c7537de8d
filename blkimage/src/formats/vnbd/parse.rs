//! One virtnbdbackup stream read once, frame headers only, into ranges.
//!
//! The format (virtnbdbackup's `sparsestream`, after oVirt imageio's
//! examples): frames, each a 40-byte header `KIND %016x %016x\r\n`
//! (kind, guest offset, length), in this order:
//!
//! - `meta 0 LEN`, then LEN bytes of JSON (`virtualSize`, `dataSize`,
//!   `diskName`, `checkpointName`, `parentCheckpoint`, `incremental`,
//!   `compressed`, ...) and `\r\n`;
//! - `data START LEN`, then the payload and `\r\n`: LEN guest bytes, or, in
//!   a compressed stream, lz4 frames holding them (one, or one per request
//!   of the backup's NBD client for a long extent);
//! - `zero START LEN`: no payload (full backups only; an incremental one
//!   leaves out what did not change, so its gaps are its parent's);
//! - `stop 0 0`.
//!
//! A compressed stream then ends with a trailer: JSON listing each data
//! frame's compressed size (a number, or `{"TOTAL": [SIZE, ...]}` for one
//! cut in several lz4 frames), `\r\n`, and `comp 0 LEN` (LEN: the JSON's).
//!
//! Ranges, not blocks, are kept (a frame, or an lz4 frame, each), and at
//! most [`MAX_RANGES`] of them: the index of any stream stays within
//! 64 MiB. Frames must come in guest order without overlapping, within
//! the virtual size; the data frames must hold `dataSize` bytes, and a
//! trailer must describe exactly the stream's payloads.

use super::memory::{grow, push};
use super::{lz4frame, trailer};
use crate::storage::Storage;
use serde_json::Value;
use std::io;

/// Bytes of a frame header.
pub const FRAME_LEN: u64 = 40;
const TERM: &[u8] = b"\r\n";
/// The first bytes of every stream: a meta frame at offset 0.
pub const MAGIC: &[u8] = b"meta 0000000000000000 ";
/// The largest metadata accepted (virtnbdbackup writes about 400 bytes):
/// its JSON values, some 32 bytes for each 2 of its bytes, stay small.
const MAX_META: u64 = 64 << 10;
/// The largest virtual size accepted: QEMU's (an `int64_t`).
pub const MAX_VIRTUAL_SIZE: u64 = i64::MAX as u64;
/// The largest compression trailer accepted: some 8 bytes per data frame.
const MAX_TRAILER: u64 = 64 << 20;
/// The most guest bytes one lz4 frame may hold: virtnbdbackup cuts longer
/// extents at its NBD client's request size, 32 MiB (QEMU's limit). This
/// bounds the memory a decompressed frame takes.
pub const MAX_LZ4_FRAME: u64 = 32 << 20;
/// The most ranges a stream (or a chain) is indexed in: 64 MiB of them.
pub const MAX_RANGES: usize = (64 << 20) / std::mem::size_of::<Range>();
/// The bytes of a file read at once while walking its headers: frames
/// with short payloads are then found in memory.
const WINDOW: u64 = 64 << 10;

/// What a stream's metadata says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meta {
    /// The disk's size in bytes when it was backed up.
    pub virtual_size: u64,
    /// Bytes in the data frames.
    pub data_size: u64,
    /// The disk's target name in the domain (`sda`).
    pub disk: String,
    /// The checkpoint the backup made (or would have made).
    pub checkpoint: String,
    /// The checkpoint an incremental backup starts from ("" for a full one).
    pub parent: String,
    /// Only what changed since `parent`.
    pub incremental: bool,
    /// Payloads are lz4 frames.
    pub compressed: bool,
    /// When the backup was taken (ISO 8601, as virtnbdbackup writes it).
    pub date: String,
}

/// Where a range's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A zero frame: no bytes.
    Zero,
    /// Plain bytes from `pos` in the file.
    Data {
        /// File offset of the range's first byte.
        pos: u64,
    },
    /// In lz4 frame `frame` of the stream, from `skip` of its content.
    Lz4 {
        /// Index in [`Parsed::frames`].
        frame: u32,
        /// Offset of the range's first byte in the frame's content.
        skip: u32,
    },
}

/// A guest range of one stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// Guest offset of its first byte.
    pub start: u64,
    /// Bytes (more than 0).
    pub len: u64,
    /// Where they are.
    pub kind: Kind,
}

impl Range {
    /// Just past its last byte.
    pub fn end(&self) -> u64 {
        self.start + self.len
    }

    /// The part `[from, to)` of it (within it).
    pub fn slice(&self, from: u64, to: u64) -> Range {
        let d = from - self.start;
        let kind = match self.kind {
            Kind::Zero => Kind::Zero,
            Kind::Data { pos } => Kind::Data { pos: pos + d },
            // d < the frame's content, at most MAX_LZ4_FRAME.
            Kind::Lz4 { frame, skip } => Kind::Lz4 {
                frame,
                skip: skip + d as u32,
            },
        };
        Range {
            start: from,
            len: to - from,
            kind,
        }
    }
}

/// An lz4 frame of a compressed stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lz4Frame {
    /// File offset of its first byte.
    pub pos: u64,
    /// Its compressed bytes.
    pub comp: u32,
    /// The guest bytes it holds.
    pub len: u32,
}

/// A stream's metadata and index.
#[derive(Debug)]
pub struct Parsed {
    /// Its metadata.
    pub meta: Meta,
    /// Its frames' ranges, in guest order, not overlapping.
    pub ranges: Vec<Range>,
    /// Its lz4 frames (compressed streams).
    pub frames: Vec<Lz4Frame>,
}

pub(super) fn bad(off: u64, msg: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{msg} (offset {off:#x})"),
    )
}

/// Reads of a storage through a window, so that the headers of frames
/// with short payloads cost no read each.
struct Cursor<'a> {
    st: &'a dyn Storage,
    len: u64,
    at: u64,
    buf: Vec<u8>,
}

impl<'a> Cursor<'a> {
    fn new(st: &'a dyn Storage) -> Cursor<'a> {
        Cursor {
            st,
            len: st.len(),
            at: 0,
            buf: Vec::new(),
        }
    }

    /// The `n` bytes at `off` (`n` at most [`WINDOW`], or read alone);
    /// `what` names them if the file ends first.
    fn bytes(&mut self, off: u64, n: u64, what: &str) -> io::Result<&[u8]> {
        match off.checked_add(n) {
            Some(end) if end <= self.len => {}
            _ => {
                return Err(bad(
                    off,
                    format!("truncated: the file ends before the {what} ({n} bytes)"),
                ));
            }
        }
        let inside = off >= self.at && off + n <= self.at + self.buf.len() as u64;
        if !inside {
            let want = n.max(WINDOW).min(self.len - off);
            grow(&mut self.buf, want as usize, "the stream's headers")?;
            self.st.read_exact_at(&mut self.buf, off)?;
            self.at = off;
        }
        let s = (off - self.at) as usize;
        Ok(&self.buf[s..s + n as usize])
    }

    fn header(&mut self, off: u64, what: &str) -> io::Result<([u8; 4], u64, u64)> {
        let b = self.bytes(off, FRAME_LEN, what)?;
        header(b).ok_or_else(|| {
            bad(
                off,
                format!(
                    "bad frame header '{}' (want 'KIND %016x %016x\\r\\n')",
                    b.escape_ascii()
                ),
            )
        })
    }

    fn term(&mut self, off: u64, what: &str) -> io::Result<()> {
        if self.bytes(off, 2, what)? != TERM {
            return Err(bad(off, format!("no \\r\\n after the {what}")));
        }
        Ok(())
    }
}

/// A frame header's kind, offset and length, if `b` is one.
fn header(b: &[u8]) -> Option<([u8; 4], u64, u64)> {
    if b.len() != FRAME_LEN as usize || b[4] != b' ' || b[21] != b' ' || &b[38..] != TERM {
        return None;
    }
    let hex = |s: &[u8]| {
        s.iter().try_fold(0u64, |v, &c| {
            Some((v << 4) | (c as char).to_digit(16)? as u64)
        })
    };
    Some((b[..4].try_into().ok()?, hex(&b[5..21])?, hex(&b[22..38])?))
}

/// True if `head`, a file's first bytes, starts a virtnbdbackup stream.
pub fn probe(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

fn kind_name(k: &[u8; 4]) -> String {
    k.escape_ascii().to_string()
}

/// The metadata frame at the start of `c`'s storage, and the offset past it.
fn read_meta(c: &mut Cursor) -> io::Result<(Meta, u64)> {
    let (kind, start, len) = c.header(0, "metadata frame header")?;
    if &kind != b"meta" || start != 0 {
        return Err(bad(0, "not a virtnbdbackup stream: no metadata frame"));
    }
    if len > MAX_META {
        return Err(bad(
            0,
            format!("metadata of {len} bytes (at most {MAX_META})"),
        ));
    }
    let json = c.bytes(FRAME_LEN, len, "metadata")?;
    let meta = parse_meta(json).map_err(|e| bad(FRAME_LEN, format!("bad metadata: {e}")))?;
    c.term(FRAME_LEN + len, "metadata")?;
    Ok((meta, FRAME_LEN + len + 2))
}

/// Only the metadata of the stream in `st` (to find a chain's streams).
pub fn meta(st: &dyn Storage) -> io::Result<Meta> {
    read_meta(&mut Cursor::new(st)).map(|(m, _)| m)
}

fn parse_meta(json: &[u8]) -> Result<Meta, String> {
    let v: Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let o = v.as_object().ok_or("not a JSON object")?;
    // Version 1 streams spelt some keys with dashes.
    let get = |a: &str, b: &str| o.get(a).or_else(|| o.get(b));
    let num = |a: &str, b: &str| {
        get(a, b)
            .ok_or(format!("no '{a}'"))?
            .as_u64()
            .ok_or(format!("'{a}' is not a size in bytes"))
    };
    let text = |a: &str| match o.get(a) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("'{a}' is not a string")),
    };
    // `compressed` is false, or the lz4 level (or true).
    let compressed = match o.get("compressed") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) | Some(Value::Number(_)) => true,
        Some(_) => return Err("'compressed' is neither false nor a level".into()),
    };
    if compressed {
        match o.get("compressionMethod").and_then(Value::as_str) {
            Some("lz4") | None => {}
            Some(m) => return Err(format!("compression method '{m}' is not supported (lz4)")),
        }
    }
    let incremental = match o.get("incremental") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("'incremental' is not true or false".into()),
    };
    let virtual_size = num("virtualSize", "virtual-size")?;
    if virtual_size > MAX_VIRTUAL_SIZE {
        return Err(format!(
            "a virtual size of {virtual_size} bytes, over QEMU's limit ({MAX_VIRTUAL_SIZE}: \
             2^63-1)"
        ));
    }
    Ok(Meta {
        virtual_size,
        data_size: num("dataSize", "data-size")?,
        disk: text("diskName")?,
        checkpoint: text("checkpointName")?,
        parent: text("parentCheckpoint")?,
        incremental,
        compressed,
        date: text("date")?,
    })
}

/// Read the stream in `st`: its metadata and the ranges of its frames.
pub fn parse(st: &dyn Storage) -> io::Result<Parsed> {
    let mut c = Cursor::new(st);
    let (meta, mut pos) = read_meta(&mut c)?;
    // A compressed stream's trailer, read first: it sizes the payloads.
    let (sizes, end) = match meta.compressed {
        true => read_trailer(&mut c, pos)?,
        false => (trailer::Sizes::default(), c.len),
    };
    let mut index = Index {
        ranges: Vec::new(),
        frames: Vec::new(),
    };
    let mut prev_end = 0u64;
    let mut data_frames = 0usize;
    let mut data_bytes = 0u64;
    loop {
        if pos + FRAME_LEN > end {
            return Err(bad(pos, "truncated: the stream ends without a stop frame"));
        }
        let (kind, start, flen) = c.header(pos, "frame header")?;
        if &kind == b"stop" {
            check_stop(pos, start, flen, end, meta.compressed)?;
            break;
        }
        prev_end = check_frame(pos, &kind, start, flen, prev_end, meta.virtual_size)?;
        index.room(pos)?;
        let header_at = pos;
        pos += FRAME_LEN;
        if &kind == b"zero" {
            index.zeros(start, flen)?;
            continue;
        }
        let frame = DataFrame {
            header_at,
            start,
            len: flen,
        };
        pos = match meta.compressed {
            false => index.data(frame, pos, end)?,
            true => {
                let entry = sizes.get(data_frames).ok_or_else(|| {
                    let n = sizes.len();
                    let why = format!(
                        "the compression trailer lists {n} data frames, the stream has more"
                    );
                    bad(header_at, why)
                })?;
                index.lz4_frames(&mut c, frame, entry, pos, end)?
            }
        };
        c.term(pos, "data frame's payload")?;
        pos += 2;
        data_frames += 1;
        data_bytes += flen;
    }
    if meta.compressed && data_frames != sizes.len() {
        return Err(bad(
            end,
            format!(
                "the compression trailer lies: it lists {} data frames, the stream has {data_frames}",
                sizes.len()
            ),
        ));
    }
    if data_bytes != meta.data_size {
        return Err(bad(
            0,
            format!(
                "the data frames hold {data_bytes} bytes, the metadata says {} (dataSize)",
                meta.data_size
            ),
        ));
    }
    Ok(Parsed {
        meta,
        ranges: index.ranges,
        frames: index.frames,
    })
}

/// A compressed stream's trailer (after the frames, from `pos`): the
/// compressed sizes of each data frame's lz4 frames, and where the frames
/// end.
fn read_trailer(c: &mut Cursor, pos: u64) -> io::Result<(trailer::Sizes, u64)> {
    let len = c.len;
    let at = len
        .checked_sub(FRAME_LEN)
        .filter(|&a| a >= pos)
        .ok_or_else(|| bad(len, "truncated: no compression trailer at the end"))?;
    let (kind, _, tlen) = c.header(at, "compression trailer header")?;
    if &kind != b"comp" {
        return Err(bad(
            at,
            "truncated: the stream is compressed, but does not end with its trailer",
        ));
    }
    let json_at = at
        .checked_sub(2)
        .and_then(|a| a.checked_sub(tlen))
        .filter(|&a| a >= pos && tlen <= MAX_TRAILER)
        .ok_or_else(|| {
            bad(
                at,
                format!("a compression trailer of {tlen} bytes does not fit"),
            )
        })?;
    let json = c.bytes(json_at, tlen, "compression trailer")?;
    let sizes = trailer::parse(json, MAX_RANGES)?
        .map_err(|e| bad(json_at, format!("bad compression trailer: {e}")))?;
    c.term(json_at + tlen, "compression trailer")?;
    Ok((sizes, json_at))
}

/// The stop frame at `pos`: empty, and the last thing before `end`.
fn check_stop(pos: u64, start: u64, len: u64, end: u64, compressed: bool) -> io::Result<()> {
    if start != 0 || len != 0 {
        return Err(bad(pos, "a stop frame with an offset or a length"));
    }
    if pos + FRAME_LEN != end {
        return Err(bad(
            pos + FRAME_LEN,
            match compressed {
                true => "bytes between the stop frame and the compression trailer",
                false => "bytes after the stop frame",
            },
        ));
    }
    Ok(())
}

/// A data or zero frame's header at `pos`: a known kind, not empty, after
/// the previous frame's end and within the disk. Its end.
fn check_frame(
    pos: u64,
    kind: &[u8; 4],
    start: u64,
    len: u64,
    prev_end: u64,
    virtual_size: u64,
) -> io::Result<u64> {
    if kind != b"data" && kind != b"zero" {
        return Err(bad(
            pos,
            format!("unknown frame kind '{}'", kind_name(kind)),
        ));
    }
    if len == 0 {
        return Err(bad(pos, format!("an empty {} frame", kind_name(kind))));
    }
    if start < prev_end {
        return Err(bad(
            pos,
            format!(
                "frames out of order or overlapping: guest offset {start:#x} is before the \
                 end of the previous frame ({prev_end:#x})"
            ),
        ));
    }
    match start.checked_add(len) {
        Some(e) if e <= virtual_size => Ok(e),
        _ => Err(bad(
            pos,
            format!(
                "a frame of {len:#x} bytes at guest offset {start:#x} is past the \
                 virtual size ({virtual_size:#x})"
            ),
        )),
    }
}

/// A data frame: where its header is, and the guest bytes it holds.
#[derive(Clone, Copy)]
struct DataFrame {
    header_at: u64,
    start: u64,
    len: u64,
}

/// What the index's lists are called when they cannot grow.
const INDEX: &str = "the stream's index";

/// The index being built.
struct Index {
    ranges: Vec<Range>,
    frames: Vec<Lz4Frame>,
}

impl Index {
    /// Room for one more range (the index stays within 64 MiB).
    fn room(&self, pos: u64) -> io::Result<()> {
        if self.ranges.len() >= MAX_RANGES {
            return Err(bad(
                pos,
                format!("more than {MAX_RANGES} frames (an index within 64 MiB)"),
            ));
        }
        Ok(())
    }

    /// A zero frame, merged with a zero range it follows.
    fn zeros(&mut self, start: u64, len: u64) -> io::Result<()> {
        match self.ranges.last_mut() {
            Some(r) if r.kind == Kind::Zero && r.end() == start => r.len += len,
            _ => self.range(start, len, Kind::Zero)?,
        }
        Ok(())
    }

    /// One more range.
    fn range(&mut self, start: u64, len: u64, kind: Kind) -> io::Result<()> {
        push(&mut self.ranges, Range { start, len, kind }, INDEX)
    }

    /// The payload of the data frame `f` (plain), from `pos`: where it ends.
    fn data(&mut self, f: DataFrame, pos: u64, end: u64) -> io::Result<u64> {
        if pos.checked_add(f.len).is_none_or(|e| e > end) {
            return Err(bad(
                f.header_at,
                format!(
                    "truncated: the data frame's {} bytes are not all there",
                    f.len
                ),
            ));
        }
        self.range(f.start, f.len, Kind::Data { pos })?;
        Ok(pos + f.len)
    }

    /// The lz4 frames of the data frame `f`, from `pos`, of the compressed
    /// sizes `entry` (its trailer entry), each checked and indexed. Where
    /// they end.
    fn lz4_frames(
        &mut self,
        c: &mut Cursor,
        f: DataFrame,
        entry: &[u64],
        mut pos: u64,
        end: u64,
    ) -> io::Result<u64> {
        let (start, flen) = (f.start, f.len);
        let mut g = start;
        for (i, &comp) in entry.iter().enumerate() {
            let lies = |what: String| {
                bad(
                    f.header_at,
                    format!(
                        "the compression trailer lies: data frame at guest offset {start:#x}: {what}"
                    ),
                )
            };
            if comp > MAX_LZ4_FRAME * 2 || pos.checked_add(comp).is_none_or(|e| e > end) {
                return Err(lies(format!("lz4 frame {i} of {comp} bytes does not fit")));
            }
            // The guest bytes the frame holds, from its header (python-lz4,
            // which virtnbdbackup writes with, stores them).
            let head = c.bytes(pos, comp.min(15), "lz4 frame header")?;
            let n = match lz4frame::header(head) {
                Ok(h) => match h.content_size {
                    Some(n) => n,
                    None if entry.len() == 1 => flen,
                    None => return Err(bad(pos, "an lz4 frame without its content size")),
                },
                Err((_, e)) => return Err(lies(format!("lz4 frame {i} at {pos:#x}: {e}"))),
            };
            if n == 0 || n > MAX_LZ4_FRAME || n > start + flen - g {
                return Err(lies(format!(
                    "lz4 frame {i} says it holds {n} bytes, of the {flen} of the frame"
                )));
            }
            self.room(pos)?;
            let frame = self.frames.len() as u32;
            self.range(g, n, Kind::Lz4 { frame, skip: 0 })?;
            let lz4 = Lz4Frame {
                pos,
                comp: comp as u32,
                len: n as u32,
            };
            push(&mut self.frames, lz4, INDEX)?;
            g += n;
            pos += comp;
        }
        if g != start + flen {
            return Err(bad(
                f.header_at,
                format!(
                    "the compression trailer lies: the lz4 frames of the data frame at \
                     guest offset {start:#x} hold {} of its {flen} bytes",
                    g - start
                ),
            ));
        }
        Ok(pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: &str, start: u64, len: u64) -> Vec<u8> {
        format!("{kind} {start:016x} {len:016x}\r\n").into_bytes()
    }

    fn stream(vsize: u64, body: &[(&str, u64, &[u8])]) -> Vec<u8> {
        let size: u64 = body
            .iter()
            .filter(|f| f.0 == "data")
            .map(|f| f.2.len() as u64)
            .sum();
        let json = format!(
            r#"{{"virtualSize": {vsize}, "dataSize": {size}, "diskName": "sda",
               "checkpointName": "virtnbdbackup.0", "parentCheckpoint": "",
               "incremental": false, "compressed": false, "streamVersion": 2}}"#
        );
        let mut s = frame("meta", 0, json.len() as u64);
        s.extend_from_slice(json.as_bytes());
        s.extend_from_slice(TERM);
        for (kind, start, payload) in body {
            if *kind == "zero" {
                s.extend(frame(kind, *start, payload.len() as u64));
                continue;
            }
            s.extend(frame(kind, *start, payload.len() as u64));
            s.extend_from_slice(payload);
            s.extend_from_slice(TERM);
        }
        s.extend(frame("stop", 0, 0));
        s
    }

    #[test]
    fn frames_become_ranges() {
        let s = stream(
            8192,
            &[
                ("data", 0, &[1; 512]),
                ("zero", 512, &[0; 1024]),
                ("data", 4096, &[2; 100]),
            ],
        );
        let p = parse(&s).unwrap();
        assert_eq!(p.meta.virtual_size, 8192);
        assert_eq!(p.meta.disk, "sda");
        let first = s.windows(5).position(|w| w == b"data ").unwrap() as u64 + FRAME_LEN;
        assert_eq!(
            p.ranges,
            vec![
                Range {
                    start: 0,
                    len: 512,
                    kind: Kind::Data { pos: first }
                },
                Range {
                    start: 512,
                    len: 1024,
                    kind: Kind::Zero
                },
                Range {
                    start: 4096,
                    len: 100,
                    kind: Kind::Data {
                        pos: first + 512 + 2 + 2 * FRAME_LEN
                    },
                },
            ]
        );
    }

    #[test]
    fn bad_streams_are_refused() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                stream(1024, &[("data", 1000, &[1; 100])]),
                "past the virtual size",
            ),
            (
                stream(8192, &[("data", 1024, &[1; 100]), ("data", 0, &[1; 100])]),
                "out of order",
            ),
            (
                stream(8192, &[("data", 0, &[1; 100]), ("zero", 50, &[0; 100])]),
                "overlapping",
            ),
            (
                stream(8192, &[("dat4", 0, &[1; 100])]),
                "unknown frame kind",
            ),
        ];
        for (s, want) in cases {
            let e = parse(&s).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        let good = stream(8192, &[("data", 0, &[1; 100])]);
        for cut in [10, 60, good.len() - 100, good.len() - 1] {
            let e = parse(&good[..cut].to_vec()).unwrap_err().to_string();
            assert!(
                e.contains("truncated") || e.contains("bad frame header"),
                "{cut}: {e}"
            );
        }
        let mut lying = good.clone();
        let at = lying
            .windows(11)
            .position(|w| w == b"\"dataSize\":")
            .unwrap();
        lying[at + 12] = b'7';
        assert!(parse(&lying).unwrap_err().to_string().contains("dataSize"));
    }
}
