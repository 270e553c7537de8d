//! Maps as streams: written while hashing, spliced, read where they lie
//! and diffed as pieces, each byte for byte what the map in memory gives.

use blkhash::{Algorithm, Hasher, Options};
use blkmap::{
    Block, Checked, Map, MapBuilder, MapError, MapFile, MapReader, Splice, diff, diff_pieces,
    splice,
};
use proptest::prelude::*;
use std::io::{Read, Seek};

fn opts(alg: Algorithm, bs: usize) -> Options {
    Options::new().algorithm(alg).block_size(bs).threads(2)
}

/// Image content from segments: (zeros?, length, byte).
fn build(segments: &[(bool, usize, u8)]) -> Vec<u8> {
    let mut v = Vec::new();
    for &(zero, len, byte) in segments {
        v.extend(std::iter::repeat_n(if zero { 0 } else { byte | 1 }, len));
    }
    v
}

fn segments() -> impl Strategy<Value = Vec<(bool, usize, u8)>> {
    prop::collection::vec((any::<bool>(), 0usize..5000, any::<u8>()), 0..10)
}

/// The map of `data` written as it is built: the bytes written.
fn written(o: &Options, data: &[u8], identity: Option<Vec<u8>>) -> Vec<u8> {
    let mut file = tempfile::tempfile().unwrap();
    let out = Box::new(file.try_clone().unwrap());
    let mut h = Hasher::with_options(o.clone()).unwrap();
    let builder = MapBuilder::writing(h.algorithm(), h.block_size(), out, false, identity).unwrap();
    h.set_observer(builder.observer());
    h.update(data);
    let done = builder.finalize_written(h).unwrap();
    file.rewind().unwrap();
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).unwrap();
    assert_eq!(done.header, Map::from_bytes(&bytes).unwrap().header());
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Written while hashing: the bytes of the map built in memory.
    #[test]
    fn written_is_the_map_in_memory(segs in segments(), bs in prop::sample::select(vec![512usize, 4096])) {
        let data = build(&segs);
        let o = opts(Algorithm::Blake3, bs);
        let map = Map::compute(o.clone(), &data).unwrap();
        let id = Some(b"disk".to_vec());
        prop_assert!(written(&o, &data, id.clone()) == map.with_identity(id).unwrap().to_bytes());
    }

    /// Spliced as a stream: the bytes of the splice in memory; the blocks
    /// compared are those whose digests differ.
    #[test]
    fn splice_is_the_splice_in_memory(segs in segments(), edits in prop::collection::vec((0usize..40000, 0usize..3000, any::<u8>()), 0..4)) {
        let bs = 512;
        let o = opts(Algorithm::Sha256, bs);
        let old = build(&segs);
        let mut new = old.clone();
        for (off, len, byte) in edits {
            if off < new.len() {
                let end = (off + len).min(new.len());
                new[off..end].fill(byte);
            }
        }
        let blocks = old.len().div_ceil(bs) as u64;
        let ranges: Vec<_> = (0..blocks).filter(|i| i % 3 == 1).map(|i| i..i + 1).collect();
        let mut h = Hasher::with_options(o.clone()).unwrap();
        let builder = MapBuilder::attach(&mut h).unwrap();
        h.update(&new);
        let fresh = builder.finalize_part(h, new.len() as u64, 0).unwrap();
        let old_map = Map::compute(o, &old).unwrap();
        let want = old_map.splice_part(&fresh, &ranges).unwrap();
        let how = Splice { fresh: &fresh, ranges: &ranges, compare: &ranges, identity: None };
        let (done, out) = splice(old_map.pieces(), how, std::io::Cursor::new(Vec::new())).unwrap();
        prop_assert!(out.into_inner() == want.to_bytes());
        let differ: Vec<u64> = done.differ.iter().flat_map(|r| r.clone()).collect();
        let model: Vec<u64> = ranges.iter().map(|r| r.start)
            .filter(|&i| old_map.block(i) != want.block(i)).collect();
        prop_assert_eq!(differ, model);
    }

    /// Read where it lies: every block, the runs and the diff are the
    /// map's in memory.
    #[test]
    fn map_file_reads_what_the_map_holds(segs in segments(), other in segments()) {
        let o = opts(Algorithm::Blake3, 512);
        let map = Map::compute(o.clone(), &build(&segs)).unwrap();
        let other = Map::compute(o, &build(&other)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (pa, pb) = (dir.path().join("a.map"), dir.path().join("b.map"));
        map.save(&pa).unwrap();
        other.save(&pb).unwrap();
        let (fa, fb) = (MapFile::open(&pa).unwrap(), MapFile::open(&pb).unwrap());
        for i in 0..map.blocks() {
            let want = match map.block(i).unwrap() {
                Block::Zero => None,
                Block::Data(d) => Some(d.to_vec()),
            };
            prop_assert_eq!(fa.block(i).unwrap(), want);
        }
        prop_assert!(fa.block(map.blocks()).is_err());
        let runs: Vec<_> = fa.runs().map(Result::unwrap).collect();
        let want: Vec<_> = map.runs().map(|r| (r.first..r.first + r.count, r.digests.is_some())).collect();
        prop_assert_eq!(runs, want);
        let d = diff_pieces(fa.pieces().unwrap(), fb.pieces().unwrap()).unwrap();
        prop_assert_eq!(d, diff(&map, &other).unwrap());
    }
}

/// More runs than one index entry covers: every block still found.
#[test]
fn map_file_index_spans_many_runs() {
    let bs = 512;
    let data: Vec<u8> = (0..2000 * bs).map(|i| ((i / bs) % 2) as u8).collect();
    let map = Map::compute(opts(Algorithm::Sha256, bs), &data).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.map");
    map.save(&p).unwrap();
    let f = MapFile::open(&p).unwrap();
    for i in [0, 1, 255, 256, 257, 511, 512, 1000, 1999] {
        let want = map.block(i).unwrap();
        let got = f.block(i).unwrap();
        assert_eq!(got.is_none(), want == Block::Zero, "block {i}");
        if let Block::Data(d) = want {
            assert_eq!(got.unwrap(), d, "block {i}");
        }
    }
}

/// A damaged map opens (its heads are sound) but its pieces are refused
/// once read to the end; so is a map whose checksum is not its blocks'.
#[test]
fn pieces_are_checked_to_the_end() {
    let map = Map::compute(opts(Algorithm::Sha256, 512), &[5u8; 4096]).unwrap();
    let mut bytes = map.to_bytes();
    let at = bytes.len() - 40;
    bytes[at] ^= 1;
    let mut r = Checked::new(MapReader::new(&bytes[..]).unwrap());
    let e = loop {
        match blkmap::Pieces::next_piece(&mut r) {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a damaged map read to its end"),
            Err(e) => break e,
        }
    };
    assert!(matches!(e, MapError::Damaged), "{e}");
    let other = Map::compute(opts(Algorithm::Sha256, 512), &[6u8; 4096]).unwrap();
    let e = diff_pieces(
        other.pieces(),
        Checked::new(MapReader::new(&bytes[..]).unwrap()),
    );
    assert!(matches!(e, Err(MapError::Damaged)), "{e:?}");
    // The checksum in the header (offset 48) changed, the trailer signed
    // again: sound bytes, a checksum that is not its blocks'.
    let mut bytes = map.to_bytes();
    bytes[48] ^= 1;
    let n = bytes.len() - 32;
    let mut trailer = [0u8; 32];
    Algorithm::Sha256.digest_into(&bytes[..n], &mut trailer);
    bytes[n..].copy_from_slice(&trailer);
    let e = diff_pieces(
        map.pieces(),
        Checked::new(MapReader::new(&bytes[..]).unwrap()),
    );
    assert!(matches!(e, Err(MapError::Checksum)), "{e:?}");
}
