//! Compressed files (gzip, xz, zstd) read forward: a [`Decoder`] over any
//! reader (a file, a URL read as a stream, a pipe) hands out the bytes
//! the file holds, in order, as standard input does; and [`spill`] writes
//! them into an unnamed sparse temporary file for a format that needs
//! random access ([`Spilled`], a [`Storage`](super::Storage)).
//!
//! What the command-line tools accept, and nothing else: several gzip
//! members one after the other (and zero bytes after the last, which
//! `gzip -d` ignores), several xz streams (with their stream padding,
//! zeros in multiples of 4), several zstd frames (skippable ones among
//! them). A stream that ends inside a member, a bad CRC or check, bytes
//! that are no member after the last, are errors: never bytes passed on
//! as if they were the whole.

mod codec;
mod spill;

pub use spill::{Spilled, spill};

use codec::Codec;
use std::io::{self, BufRead, Read};

/// A compression a file is probed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// gzip (RFC 1952), one member or several.
    Gzip,
    /// xz (the .xz container of LZMA2), one stream or several.
    Xz,
    /// Zstandard (RFC 8878), one frame or several.
    Zstd,
}

/// Bytes [`Compression::probe`] needs to tell them all apart.
pub const PROBE_LEN: usize = 6;

impl Compression {
    /// The compression `head` (a file's first bytes, [`PROBE_LEN`] or
    /// more) starts with, from its magic number.
    ///
    /// ```
    /// use blkimage::compressed::Compression;
    /// assert_eq!(Compression::probe(b"\x1f\x8b\x08\0\0\0"), Some(Compression::Gzip));
    /// assert_eq!(Compression::probe(b"\xfd7zXZ\0"), Some(Compression::Xz));
    /// assert_eq!(Compression::probe(b"\x28\xb5\x2f\xfd\0\0"), Some(Compression::Zstd));
    /// assert_eq!(Compression::probe(b"QFI\xfb\0\0"), None);
    /// ```
    pub fn probe(head: &[u8]) -> Option<Compression> {
        // gzip's magic and its one compression method (deflate); xz's
        // six bytes; a zstd frame's magic (a file that starts with a
        // skippable frame is not taken: the CLIs never write one first).
        if head.starts_with(&[0x1f, 0x8b, 0x08]) {
            Some(Compression::Gzip)
        } else if head.starts_with(b"\xfd7zXZ\0") {
            Some(Compression::Xz)
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Some(Compression::Zstd)
        } else {
            None
        }
    }

    /// Its name, as its command is called: "gzip", "xz", "zstd".
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Xz => "xz",
            Compression::Zstd => "zstd",
        }
    }

    /// What its parts are called in messages.
    fn part(self) -> &'static str {
        match self {
            Compression::Gzip => "member",
            Compression::Xz => "stream",
            Compression::Zstd => "frame",
        }
    }
}

/// A compressed file's bytes as they were before compression, checked as
/// they are decoded (see the module's doc). Errors say what was wrong and
/// at which compressed byte, and are [`io::ErrorKind::InvalidData`] (or
/// `UnexpectedEof` for a file cut short).
///
/// ```
/// use blkimage::compressed::{Compression, Decoder};
/// use std::io::Read;
/// // `printf hello | gzip -n`
/// let gz = b"\x1f\x8b\x08\0\0\0\0\0\0\x03\xcbH\xcd\xc9\xc9\x07\0\x86\xa6\x106\x05\0\0\0";
/// let mut out = String::new();
/// Decoder::new(Compression::Gzip, &gz[..], 1).unwrap().read_to_string(&mut out).unwrap();
/// assert_eq!(out, "hello");
/// let e = Decoder::new(Compression::Gzip, &gz[..20], 1).unwrap().read_to_string(&mut out);
/// assert!(e.unwrap_err().to_string().contains("truncated"));
/// ```
pub struct Decoder<R> {
    input: R,
    kind: Compression,
    codec: Codec,
    threads: u32,
    /// Inside a member (stream, frame): its end not seen yet.
    in_part: bool,
    /// Members (streams, frames) decoded to their end.
    parts: u64,
    /// Output of the member being decoded.
    part_out: u64,
    /// Compressed bytes consumed, for messages.
    pos: u64,
    /// Zero bytes seen after the last member (xz's stream padding; zeros
    /// after the last gzip member).
    zeros: u64,
    out: u64,
}

impl<R: BufRead> Decoder<R> {
    /// A decoder of `input`, compressed with `kind`; xz streams written
    /// in several blocks are decoded on `threads` threads.
    pub fn new(kind: Compression, input: R, threads: u32) -> io::Result<Decoder<R>> {
        Ok(Decoder {
            input,
            kind,
            codec: Codec::new(kind, threads)?,
            threads,
            in_part: false,
            parts: 0,
            part_out: 0,
            pos: 0,
            zeros: 0,
            out: 0,
        })
    }

    /// Bytes decoded so far.
    pub fn total_out(&self) -> u64 {
        self.out
    }

    /// Between members: skip the zeros the format allows there, then
    /// start the next member. `Ok(false)` at the end of the input.
    fn next_part(&mut self) -> io::Result<bool> {
        loop {
            let input = self.input.fill_buf()?;
            let zeros = match self.kind {
                Compression::Zstd => 0,
                _ if self.parts > 0 => input.iter().take_while(|b| **b == 0).count(),
                _ => 0,
            };
            if zeros > 0 {
                self.input.consume(zeros);
                self.zeros += zeros as u64;
                self.pos += zeros as u64;
                continue;
            }
            let end = input.is_empty();
            if self.kind == Compression::Xz && !self.zeros.is_multiple_of(4) {
                return Err(self.bad("stream padding that is not a multiple of 4 bytes"));
            }
            if end {
                return Ok(false);
            }
            if self.kind == Compression::Gzip && self.zeros > 0 {
                // gzip -d ignores zeros after the last member, and only
                // those: anything after them is garbage.
                return Err(self.bad("garbage after the compressed data"));
            }
            if self.parts > 0 {
                self.codec.restart(self.threads)?;
            }
            self.zeros = 0;
            self.in_part = true;
            self.part_out = 0;
            return Ok(true);
        }
    }

    /// The error `why`, at the current compressed byte.
    fn bad(&self, why: &str) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: {why} (at compressed byte {})",
                self.kind.name(),
                self.pos
            ),
        )
    }

    /// The error the decoder gave: after a complete member, bytes that
    /// do not start one are garbage after the data.
    fn decode_error(&self, e: io::Error) -> io::Error {
        if e.kind() == io::ErrorKind::OutOfMemory {
            return io::Error::new(e.kind(), format!("{}: {e}", self.kind.name()));
        }
        if self.parts > 0 && self.part_out == 0 {
            return self.bad(&format!(
                "garbage after the compressed data (not a {} {}: {e})",
                self.kind.name(),
                self.kind.part()
            ));
        }
        self.bad(&e.to_string())
    }

    fn truncated(&self) -> io::Error {
        if self.parts > 0 && self.part_out == 0 {
            return self.bad(&format!(
                "garbage after the compressed data (too short for a {} {})",
                self.kind.name(),
                self.kind.part()
            ));
        }
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "{}: truncated: the data ends inside a {} (after {} compressed bytes)",
                self.kind.name(),
                self.kind.part(),
                self.pos
            ),
        )
    }
}

impl<R: BufRead> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_part && !self.next_part()? {
                return Ok(0);
            }
            let input = self.input.fill_buf()?;
            let eof = input.is_empty();
            let step = match self.codec.run(input, buf, eof) {
                Ok(s) => s,
                Err(e) => return Err(self.decode_error(e)),
            };
            self.input.consume(step.consumed);
            self.pos += step.consumed as u64;
            self.part_out += step.produced as u64;
            self.out += step.produced as u64;
            if step.end {
                self.in_part = false;
                self.parts += 1;
            }
            if step.produced > 0 {
                return Ok(step.produced);
            }
            if step.end {
                continue;
            }
            if eof {
                return Err(self.truncated());
            }
            if step.consumed == 0 {
                return Err(self.bad("the decoder made no progress"));
            }
        }
    }
}

/// A [`Decoder`] of `input` if its first bytes are compressed (with
/// `head`, already read from it, put back in front); else `input` as it
/// is, `head` in front. xz decodes on `threads` threads.
pub fn decode_if_compressed(
    head: Vec<u8>,
    input: Box<dyn Read + Send>,
    threads: u32,
) -> io::Result<(Option<Compression>, Box<dyn Read + Send>)> {
    let kind = Compression::probe(&head);
    let whole = io::Cursor::new(head).chain(input);
    match kind {
        None => Ok((None, Box::new(whole))),
        Some(k) => {
            let buffered = io::BufReader::with_capacity(INPUT_BUFFER, whole);
            Ok((Some(k), Box::new(Decoder::new(k, buffered, threads)?)))
        }
    }
}

/// Compressed bytes read at once: large enough that the decoder seldom
/// waits on a read.
pub const INPUT_BUFFER: usize = 1 << 20;

/// Up to `n` first bytes of `input` (fewer only at its end).
pub fn read_head(input: &mut dyn Read, n: usize) -> io::Result<Vec<u8>> {
    let mut head = Vec::with_capacity(n);
    input.take(n as u64).read_to_end(&mut head)?;
    Ok(head)
}

/// The number of threads xz decodes on: one per core this process may
/// use.
pub fn default_threads() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// A storage read forward from its first byte, as a stream (a compressed
/// file over HTTP(S) with ranges: each read one range).
pub struct Forward<S> {
    storage: S,
    pos: u64,
}

impl<S: super::Storage> Forward<S> {
    /// `storage` from its first byte.
    pub fn new(storage: S) -> Forward<S> {
        Forward { storage, pos: 0 }
    }
}

impl<S: super::Storage> Read for Forward<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.storage.len().saturating_sub(self.pos);
        let n = (buf.len() as u64).min(left) as usize;
        if n > 0 {
            self.storage.read_exact_at(&mut buf[..n], self.pos)?;
            self.pos += n as u64;
        }
        Ok(n)
    }
}
