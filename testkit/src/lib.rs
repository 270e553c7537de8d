//! Test support: the vector recipes' image generator, the reference vectors,
//! and the helpers every crate's tests share: QEMU's tools ([`tools`]),
//! NBD servers ([`nbd`]) and one that misbehaves on purpose ([`hostile`]),
//! HTTP servers (nginx, Python's, and a hostile one: [`http`]),
//! qemu-storage-daemon driven over QMP ([`qsd`]), a SOCKS proxy ([`socks`]),
//! virtnbdbackup's streams written and restored by its own code ([`vnbd`]).
//! Proxmox Backup Server datastores written from the published format
//! ([`pbs`]).
//!
//! A recipe is segments separated by spaces, each `SIZE:KIND` (see
//! `vectors.json`'s README in the shared vectors): `-` a hole, `0` written
//! zeros, `r` pseudo-random bytes, `t` compressible text, any other character
//! that byte repeated. `SIZE` takes the suffixes k, m, g, t (powers of 1024).

// Every public item says what it is (cargo doc is part of the API).
#![warn(missing_docs)]

pub mod hostile;
pub mod http;
pub mod libvirt;
pub mod nbd;
pub mod pbs;
pub mod qsd;
pub mod socks;
pub mod tools;
pub mod vnbd;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};
use std::path::Path;

/// The reference vectors, as shipped in `data/vectors.json`.
pub const VECTORS_JSON: &str = include_str!("../data/vectors.json");

#[derive(Debug, Clone, Deserialize)]
/// One reference vector: an image recipe and its checksums.
pub struct Vector {
    /// The image's content (see [`Recipe`]).
    pub recipe: String,
    /// Image size in bytes.
    pub size: u64,
    /// Digest name.
    pub digest: String,
    /// Block size in bytes.
    pub block_size: usize,
    /// The checksum of the image opened by path (size rounded up to 512).
    pub file: String,
    /// The checksum of the exact bytes from a pipe, where it differs.
    pub pipe: Option<String>,
    /// The image format, when not raw.
    pub format: Option<String>,
    /// `qemu-img create -o` options for the format.
    pub options: Option<String>,
    /// The guest size, when it differs from `size`.
    pub virtual_size: Option<u64>,
}

impl Vector {
    /// The checksum of the exact bytes (a pipe).
    pub fn pipe_checksum(&self) -> &str {
        self.pipe.as_deref().unwrap_or(&self.file)
    }
}

#[derive(Deserialize)]
struct VectorFile {
    vectors: Vec<Vector>,
}

/// Every reference vector.
pub fn vectors() -> Vec<Vector> {
    serde_json::from_str::<VectorFile>(VECTORS_JSON)
        .expect("vectors.json parses")
        .vectors
}

/// What a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Unallocated.
    Hole,
    /// Written zeros.
    Zeros,
    /// Pseudo-random bytes.
    Random,
    /// Compressible text lines.
    Text,
    /// One byte repeated.
    Byte(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
/// A range of a recipe and what it holds.
pub struct Segment {
    /// Offset in the image.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// What it holds.
    pub kind: Kind,
}

/// A parsed recipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    /// In order, without gaps.
    pub segments: Vec<Segment>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c.to_ascii_lowercase()),
        _ => (s, ' '),
    };
    let mul: u64 = match unit {
        ' ' => 1,
        'k' => 1 << 10,
        'm' => 1 << 20,
        'g' => 1 << 30,
        't' => 1 << 40,
        _ => return Err(format!("bad size suffix in {s:?}")),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("bad size {s:?}"))
}

impl Recipe {
    /// Parse a recipe: whitespace-separated `SIZE:KIND` segments.
    pub fn parse(recipe: &str) -> Result<Recipe, String> {
        let mut segments = Vec::new();
        let mut offset = 0u64;
        for word in recipe.split_whitespace() {
            let (size, kind) = word
                .split_once(':')
                .ok_or_else(|| format!("bad segment {word:?}"))?;
            let len = parse_size(size)?;
            let mut chars = kind.chars();
            let kind = match (chars.next(), chars.next()) {
                (Some('-'), None) => Kind::Hole,
                (Some('0'), None) => Kind::Zeros,
                (Some('r'), None) => Kind::Random,
                (Some('t'), None) => Kind::Text,
                (Some(c), None) if c.is_ascii() => Kind::Byte(c as u8),
                _ => return Err(format!("bad segment kind in {word:?}")),
            };
            segments.push(Segment { offset, len, kind });
            offset += len;
        }
        Ok(Recipe { segments })
    }

    /// The image size in bytes.
    pub fn size(&self) -> u64 {
        self.segments.last().map_or(0, |s| s.offset + s.len)
    }

    /// Write the raw image, leaving holes unwritten (sparse).
    pub fn write_image(&self, path: &Path) -> io::Result<()> {
        let mut f = File::create(path)?;
        let mut buf = Vec::new();
        for seg in &self.segments {
            if seg.kind == Kind::Hole {
                continue;
            }
            f.seek(SeekFrom::Start(seg.offset))?;
            let mut done = 0;
            while done < seg.len {
                let n = (seg.len - done).min(1 << 20);
                buf.resize(n as usize, 0);
                fill(seg.kind, seg.offset + done, &mut buf);
                f.write_all(&buf)?;
                done += n;
            }
        }
        f.set_len(self.size())?;
        Ok(())
    }

    /// All the image's bytes in memory (for small recipes).
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.size() as usize];
        for seg in &self.segments {
            let start = seg.offset as usize;
            fill(
                seg.kind,
                seg.offset,
                &mut out[start..start + seg.len as usize],
            );
        }
        out
    }
}

/// Fill `buf` with the content of a segment of `kind` at image offset `offset`.
pub fn fill(kind: Kind, offset: u64, buf: &mut [u8]) {
    match kind {
        Kind::Hole | Kind::Zeros => buf.fill(0),
        Kind::Byte(b) => buf.fill(b),
        Kind::Random => stream(offset, buf, 32, |i, out| {
            let mut h = Sha256::new();
            h.update(b"blkhash-vector");
            h.update(i.to_le_bytes());
            out.copy_from_slice(&h.finalize());
        }),
        Kind::Text => stream(offset, buf, 64, |k, out| {
            let line = format!("{k:016x} the quick brown fox jumps over the lazy dog.");
            out.fill(b' ');
            out[..line.len()].copy_from_slice(line.as_bytes());
            out[63] = b'\n';
        }),
    }
}

/// Copy bytes `[offset, offset + buf.len())` of a stream made of `unit`-byte
/// pieces, piece `i` produced by `piece(i, out)`.
fn stream(offset: u64, buf: &mut [u8], unit: usize, piece: impl Fn(u64, &mut [u8])) {
    let mut tmp = vec![0u8; unit];
    let mut pos = offset;
    let mut out = buf;
    while !out.is_empty() {
        let i = pos / unit as u64;
        let skip = (pos % unit as u64) as usize;
        piece(i, &mut tmp);
        let n = (unit - skip).min(out.len());
        out[..n].copy_from_slice(&tmp[skip..skip + n]);
        out = &mut out[n..];
        pos += n as u64;
    }
}

/// Deterministic random numbers (xorshift64) for tests: split points and
/// kill times are random but the same every run, so a failure replays.
pub struct Rng(pub u64);

impl Rng {
    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_sizes_and_kinds() {
        let r = Recipe::parse("1m:r 2k:- 3:A 1g:0 5:t").unwrap();
        assert_eq!(r.size(), (1 << 20) + 2048 + 3 + (1 << 30) + 5);
        assert_eq!(r.segments[2].kind, Kind::Byte(b'A'));
        assert_eq!(r.segments[1].kind, Kind::Hole);
        assert!(Recipe::parse("1x:A").is_err());
        assert!(Recipe::parse("1:AB").is_err());
        assert!(Recipe::parse("").unwrap().size() == 0);
    }

    #[test]
    fn streams_match_definition() {
        // Piece 0 of the random stream is SHA-256("blkhash-vector" || le64(0)).
        let mut b = [0u8; 40];
        fill(Kind::Random, 0, &mut b);
        let first = Sha256::digest(b"blkhash-vector\0\0\0\0\0\0\0\0");
        assert_eq!(&b[..32], &first[..]);
        // Unaligned reads agree with aligned ones.
        let mut whole = [0u8; 200];
        fill(Kind::Text, 0, &mut whole);
        let mut part = [0u8; 77];
        fill(Kind::Text, 50, &mut part);
        assert_eq!(&whole[50..127], &part[..]);
        assert_eq!(&whole[..17], b"0000000000000000 ");
        assert_eq!(whole[63], b'\n');
    }

    #[test]
    fn vectors_load() {
        let v = vectors();
        assert!(v.len() > 500);
        for x in &v {
            Recipe::parse(&x.recipe).unwrap();
        }
    }
}
