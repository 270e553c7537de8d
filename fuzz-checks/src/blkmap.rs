//! Block maps and parts from untrusted bytes: `Map::from_bytes` must refuse
//! or give a map that is consistent (its checksum follows from its blocks,
//! it saves and loads back the same); `Part::from_bytes`, a merge of the
//! bytes (streamed), the bytes read as checked pieces and as a `MapFile`
//! (read where they lie) must agree with it. Errors are fine; panics, hangs and
//! unbounded allocations are not.
//!
//! Random bytes rarely carry a valid trailer (SHA-256 of the rest), so each
//! input is also parsed re-signed: the trailer replaced by the digest of
//! the bytes before it, which takes the parser past the self-digest check
//! into the records, the lengths and the derived checksum.

use blkhash::Algorithm;
use blkmap::{Checked, Map, MapFile, MapReader, Part, Pieces, diff, merge};
use std::io::Write;

/// Header bytes before the checksum, and the trailer.
const HEADER: usize = 48;
const TRAILER: usize = 32;
/// Blocks a re-signed input may claim: deriving the checksum hashes one
/// digest per block, zero blocks included, so a huge claimed size is slow
/// by design (as slow as hashing that many zero blocks).
const MAX_BLOCKS: u64 = 1 << 20;

fn check_one(bytes: &[u8]) {
    // Streamed: a merge of the bytes alone, into memory.
    let mut out = std::io::Cursor::new(Vec::new());
    let input = Box::new(std::io::Cursor::new(bytes));
    let merged = merge(vec![("fuzz".into(), input)], Some(&mut out), None, true);
    let partial = blkmap::MapReader::new(bytes).is_ok_and(|r| r.header().is_partial());
    if let Ok(part) = Part::from_bytes(bytes) {
        assert_eq!(Part::from_bytes(&part.to_bytes()).unwrap(), part);
        // A whole map's checksum is checked by the merge, not by Part.
        if partial {
            let h = merged.as_ref().expect("a part that loads merges");
            assert_eq!(h.range, part.range());
        }
    }
    let streamed = streamed(bytes);
    let file = as_file(bytes);
    let Ok(map) = Map::from_bytes(bytes) else {
        assert!(
            partial || streamed.is_err(),
            "a map refused whole, read as pieces"
        );
        return;
    };
    streamed.expect("a map that loads reads as pieces");
    let file = file.expect("a map that loads opens where it lies");
    for (i, r) in file.runs().enumerate().take(64) {
        let (blocks, data) = r.expect("the runs of a map that loads");
        let run = map.run_at(blocks.start).expect("a run of the map");
        assert_eq!(
            (run.first, run.count, run.digests.is_some()),
            (blocks.start, blocks.end - blocks.start, data),
            "run {i}"
        );
        let got = file
            .block(blocks.start)
            .expect("a block of a map that loads");
        let len = map.algorithm().output_len();
        assert_eq!(got.as_deref(), run.digests.map(|d| &d[..len]), "run {i}");
    }
    // A whole map merged alone is itself, byte for byte.
    assert_eq!(merged.unwrap().checksum.as_ref(), Some(map.checksum()));
    assert_eq!(out.into_inner(), map.to_bytes());
    assert_eq!(&map.derive_checksum(), map.checksum());
    assert_eq!(map.blocks(), map.size().div_ceil(map.block_size() as u64));
    let again = Map::from_bytes(&map.to_bytes()).expect("a saved map loads");
    assert_eq!(again, map);
    assert!(diff(&map, &again).unwrap().is_same());
    let mut n = 0;
    for r in map.runs() {
        assert_eq!(r.first, n);
        n += r.count;
    }
    assert_eq!(n, map.blocks());
}

/// The bytes read to their end as pieces, the checksum checked as they
/// pass (what an update and blkdiff read).
fn streamed(bytes: &[u8]) -> Result<(), blkmap::MapError> {
    let mut r = Checked::new(MapReader::new(bytes)?);
    while r.next_piece()?.is_some() {}
    Ok(())
}

/// The bytes opened as a `MapFile` from an unnamed temporary file.
fn as_file(bytes: &[u8]) -> Result<MapFile, blkmap::MapError> {
    let mut f = tempfile::tempfile()?;
    f.write_all(bytes)?;
    MapFile::from_file(f)
}

/// The target's check of one input.
pub fn check(data: &[u8]) {
    check_one(data);
    if data.len() < HEADER + TRAILER {
        return;
    }
    let bs = u32::from_le_bytes(data[36..40].try_into().unwrap()).max(1) as u64;
    let size = u64::from_le_bytes(data[40..48].try_into().unwrap());
    if size.div_ceil(bs) > MAX_BLOCKS {
        return;
    }
    let n = data.len() - TRAILER;
    let signed = sign(&data[..n]);
    check_one(&signed);
    // Two parts, as `blkhash.merge()` and `blkmap merge` take them: the
    // bytes cut where their last byte says, each half signed (a merge of
    // untrusted parts refuses or merges; it never panics or hangs).
    let cut = (HEADER + data[n - 1] as usize).min(n);
    let (a, b) = (sign(&data[..cut]), sign(&data[cut..n]));
    let parts: Vec<blkmap::Named<'_>> = vec![
        ("a".into(), Box::new(std::io::Cursor::new(&a[..]))),
        ("b".into(), Box::new(std::io::Cursor::new(&b[..]))),
    ];
    let _ = merge(parts, None, None, true);
}

/// `body` followed by its SHA-256, as a map's trailer is.
fn sign(body: &[u8]) -> Vec<u8> {
    let mut signed = body.to_vec();
    let mut d = [0u8; 32];
    Algorithm::Sha256.digest_into(&signed, &mut d);
    signed.extend_from_slice(&d);
    signed
}
