//! One lz4 frame (the LZ4 Frame Format, v1.6.x) decoded into a buffer
//! of the caller's: its blocks by `lz4_flex`'s block decoder, each straight
//! into its place, a linked block reading the 64 KiB before it there.
//!
//! Written here, not taken from a crate: `lz4_flex`'s frame decoder
//! decodes each block into a buffer of its own, copies it out and hashes
//! every byte twice (block and content checksums); liblz4's frame API
//! (`lz4-sys`) writes in place but took more CPU than this on machine D
//! (512 MiB of executables in virtnbdbackup's frames: 0.51 to 0.57 s
//! against 0.33 to 0.40 s for this, 0.41 to 0.53 s for `lz4_flex`'s frame
//! decoder; docs/performance.md, virtnbdbackup). Only the frame's walk is
//! here: the block decoder is the crate's.
//!
//! Checksums are verified once: the content checksum (xxHash32 of every
//! byte decoded, computed as each block is decoded, while its bytes are
//! in the cache) where the frame has one, as virtnbdbackup's have; a
//! block whose bytes were damaged decodes to other bytes (or fails), which
//! that checksum finds. The block checksums are verified only in a frame
//! without a content checksum.

use std::hash::Hasher;
use twox_hash::XxHash32;

/// The first bytes of every lz4 frame.
const MAGIC: [u8; 4] = [0x04, 0x22, 0x4d, 0x18];
/// How far back a match of a linked block reaches.
const WINDOW: usize = 64 << 10;

/// An error: where in the frame (bytes from its start), and why.
pub type Error = (usize, String);

/// What a frame's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Its bytes.
    pub len: usize,
    /// Blocks read the 64 KiB decoded before them.
    pub linked: bool,
    /// Each block followed by its checksum.
    pub block_checksum: bool,
    /// The frame ends with the checksum of its content.
    pub content_checksum: bool,
    /// The bytes the frame holds, if the header says.
    pub content_size: Option<u64>,
    /// The most bytes a block holds (64 KiB to 4 MiB).
    pub block_max: usize,
}

/// The header at the start of `b` (all of it, or an error), its checksum
/// verified. A frame that needs a dictionary is refused: python-lz4, which
/// virtnbdbackup writes with, makes none.
pub fn header(b: &[u8]) -> Result<Header, Error> {
    let err = |at: usize, why: &str| Err((at, why.to_string()));
    if b.len() < 7 {
        return err(0, "a truncated lz4 frame header");
    }
    if b[..4] != MAGIC {
        return err(0, "not an lz4 frame");
    }
    let (flg, bd) = (b[4], b[5]);
    if flg >> 6 != 1 {
        return err(4, "an lz4 frame of an unknown version");
    }
    if flg & 0x01 != 0 {
        return err(4, "an lz4 frame that needs a dictionary");
    }
    let id = (bd >> 4) & 7;
    if flg & 0x02 != 0 || bd & 0x8f != 0 || id < 4 {
        return err(5, "an lz4 frame header with reserved bits set");
    }
    let sized = flg & 0x08 != 0;
    let len = if sized { 15 } else { 7 };
    let Some(head) = b.get(..len) else {
        return err(0, "a truncated lz4 frame header");
    };
    // The header checksum: the second byte of the descriptor's xxHash32.
    if (XxHash32::oneshot(0, &head[4..len - 1]) >> 8) as u8 != head[len - 1] {
        return err(len - 1, "the lz4 frame header's checksum does not match");
    }
    let content_size = sized.then(|| u64::from_le_bytes(head[6..14].try_into().expect("8")));
    Ok(Header {
        len,
        linked: flg & 0x20 == 0,
        block_checksum: flg & 0x10 != 0,
        content_checksum: flg & 0x04 != 0,
        content_size,
        block_max: 1 << (8 + 2 * id),
    })
}

/// The little-endian word at `at` of `b`, if it is there.
fn word(b: &[u8], at: usize) -> Option<u32> {
    let w = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(w.try_into().expect("4")))
}

/// Decode the frame `comp` (exactly one frame, nothing after it) into
/// `out`, which it must fill exactly.
pub fn decode(comp: &[u8], out: &mut [u8]) -> Result<(), Error> {
    let h = header(comp)?;
    let truncated = |at| Err((at, "a truncated lz4 frame".to_string()));
    // The content checksum when there is one, else each block's.
    let mut content = h.content_checksum.then(|| XxHash32::with_seed(0));
    let mut at = h.len;
    let mut done = 0;
    loop {
        let Some(w) = word(comp, at) else {
            return truncated(at);
        };
        if w == 0 {
            at += 4;
            break;
        }
        let len = (w & 0x7fff_ffff) as usize;
        let start = at + 4;
        let end = start + len;
        if len > h.block_max {
            return Err((
                at,
                format!(
                    "an lz4 block of {len} bytes, over the frame's block size ({})",
                    h.block_max
                ),
            ));
        }
        let Some(block) = comp.get(start..end) else {
            return truncated(at);
        };
        let next = end + 4 * h.block_checksum as usize;
        if h.block_checksum {
            let Some(sum) = word(comp, end) else {
                return truncated(end);
            };
            if content.is_none() && XxHash32::oneshot(0, block) != sum {
                return Err((at, "an lz4 block's checksum does not match".to_string()));
            }
        }
        let n = block_into(block, w & 0x8000_0000 != 0, out, done, &h).map_err(|why| (at, why))?;
        if let Some(c) = &mut content {
            c.write(&out[done..done + n]);
        }
        done += n;
        at = next;
    }
    if done != out.len() {
        return Err((
            at,
            format!("the lz4 frame holds {done} bytes, not {}", out.len()),
        ));
    }
    if let Some(c) = content {
        let Some(sum) = word(comp, at) else {
            return truncated(at);
        };
        if c.finish_32() != sum {
            return Err((
                at,
                "the lz4 frame's content checksum does not match".to_string(),
            ));
        }
        at += 4;
    }
    if at != comp.len() {
        return Err((
            at,
            format!("{} bytes after the end of the lz4 frame", comp.len() - at),
        ));
    }
    Ok(())
}

/// Block `block` (stored as it is if `raw`) decoded into `out` from
/// `done`, after the bytes of the blocks before it: how many it holds.
fn block_into(
    block: &[u8],
    raw: bool,
    out: &mut [u8],
    done: usize,
    h: &Header,
) -> Result<usize, String> {
    let total = out.len();
    let more = || format!("the lz4 frame holds more than {total} bytes");
    let (before, room) = out.split_at_mut(done);
    if raw {
        let Some(dst) = room.get_mut(..block.len()) else {
            return Err(more());
        };
        dst.copy_from_slice(block);
        return Ok(block.len());
    }
    let (full, most) = (room.len() >= h.block_max, h.block_max.min(room.len()));
    let room = &mut room[..most];
    let decoded = match h.linked {
        true => {
            let dict = &before[done.saturating_sub(WINDOW)..];
            lz4_flex::block::decompress_into_with_dict(block, room, dict)
        }
        false => lz4_flex::block::decompress_into(block, room),
    };
    decoded.map_err(|e| match e {
        lz4_flex::block::DecompressError::OutputTooSmall { .. } if !full => more(),
        e => format!("a bad lz4 block: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A frame with the given flags and blocks (`(raw, bytes)`), its
    /// checksums right.
    fn frame(flg: u8, content: &[u8], blocks: &[(bool, &[u8])]) -> Vec<u8> {
        let mut f = MAGIC.to_vec();
        f.extend([flg, 0x40]);
        if flg & 0x08 != 0 {
            f.extend((content.len() as u64).to_le_bytes());
        }
        f.push((XxHash32::oneshot(0, &f[4..]) >> 8) as u8);
        for (raw, b) in blocks {
            f.extend((b.len() as u32 | (*raw as u32) << 31).to_le_bytes());
            f.extend(*b);
            if flg & 0x10 != 0 {
                f.extend(XxHash32::oneshot(0, b).to_le_bytes());
            }
        }
        f.extend([0; 4]);
        if flg & 0x04 != 0 {
            f.extend(XxHash32::oneshot(0, content).to_le_bytes());
        }
        f
    }

    fn decoded(comp: &[u8], len: usize) -> Result<Vec<u8>, String> {
        let mut out = vec![0xee; len];
        decode(comp, &mut out)
            .map(|()| out)
            .map_err(|(at, why)| format!("{why} at {at}"))
    }

    #[test]
    fn blocks_linked_and_not_raw_or_compressed() {
        // A second block that repeats the first: a match into the
        // previous block when linked.
        let content: Vec<u8> = (0..3000u32).flat_map(|i| (i * 7).to_le_bytes()).collect();
        let first = &content[..6000];
        let second = &content[6000..];
        let a = lz4_flex::block::compress(first);
        let b = lz4_flex::block::compress_with_dict(second, first);
        let f = frame(0x5c, &content, &[(false, &a), (false, &b)]);
        assert_eq!(decoded(&f, content.len()).unwrap(), content);
        // Independent blocks, one stored raw, only block checksums.
        let b = lz4_flex::block::compress(second);
        let f = frame(0x70, &content, &[(true, first), (false, &b)]);
        assert_eq!(decoded(&f, content.len()).unwrap(), content);
    }

    #[test]
    fn damage_is_found() {
        let content = vec![7u8; 60_000];
        let c = lz4_flex::block::compress(&content);
        let good = frame(0x5c, &content, &[(false, &c)]);
        assert!(decoded(&good, content.len()).is_ok());
        let cases: Vec<(Vec<u8>, usize, &str)> = vec![
            (good[..good.len() - 1].to_vec(), content.len(), "truncated"),
            (
                [&good[..], b"x"].concat(),
                content.len(),
                "1 bytes after the end",
            ),
            (
                good.clone(),
                content.len() + 1,
                "holds 60000 bytes, not 60001",
            ),
            (
                good.clone(),
                content.len() - 1,
                "holds more than 59999 bytes",
            ),
            (
                {
                    let mut f = good.clone();
                    f[4] |= 1;
                    f
                },
                content.len(),
                "dictionary",
            ),
            (
                {
                    let mut f = good.clone();
                    f[6] ^= 1;
                    f
                },
                content.len(),
                "header's checksum",
            ),
            (
                {
                    let mut f = good.clone();
                    let n = f.len();
                    f[n - 1] ^= 1;
                    f
                },
                content.len(),
                "content checksum",
            ),
            (
                {
                    let mut f = good.clone();
                    f[5] = 0x30;
                    f
                },
                content.len(),
                "reserved bits",
            ),
        ];
        for (f, len, want) in cases {
            let e = decoded(&f, len).unwrap_err();
            assert!(e.contains(want), "{want}: {e}");
        }
        // Without a content checksum, a block's checksum is verified.
        let f = frame(0x70, &content, &[(false, &c)]);
        assert!(decoded(&f, content.len()).is_ok());
        let mut bad = f.clone();
        let n = bad.len();
        bad[n - 5] ^= 1;
        assert!(
            decoded(&bad, content.len())
                .unwrap_err()
                .contains("block's checksum")
        );
    }
}
