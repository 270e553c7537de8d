//! Maps: round trips, damage refused, checksums derived, diffs against a
//! byte-by-byte model; as streams (written while hashing, spliced, read
//! where they lie, diffed as pieces), byte for byte the map in memory.

use blkhash::{Algorithm, Hasher, Options, Pipeline, checksum_of};
use blkmap::{
    Block, Checked, Map, MapBuilder, MapError, MapFile, MapReader, Range, SizeRule, Splice, diff,
    diff_pieces, splice,
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
    prop::collection::vec((any::<bool>(), 0usize..5000, any::<u8>()), 0..8)
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(vec![
        Algorithm::Sha256,
        Algorithm::Blake3,
        Algorithm::Md5,
        Algorithm::Sha512,
    ])
}

/// Re-sign a map after editing it: the trailer is SHA-256 of the rest.
fn resign(bytes: &mut Vec<u8>) {
    let n = bytes.len() - 32;
    let mut d = [0u8; 32];
    Algorithm::Sha256.digest_into(&bytes[..n], &mut d);
    bytes.truncate(n);
    bytes.extend_from_slice(&d);
}

/// The differing ranges the slow way: compare the bytes of each block.
fn model_diff(a: &[u8], b: &[u8], bs: usize) -> Vec<Range> {
    let common = a.len().min(b.len());
    let mut out: Vec<Range> = Vec::new();
    let mut i = 0;
    while i < common {
        let end = (i + bs).min(common);
        let (ea, eb) = ((i + bs).min(a.len()), (i + bs).min(b.len()));
        if a[i..ea] != b[i..eb] {
            match out.last_mut() {
                Some(r) if r.end() == i as u64 => r.len = (end as u64) - r.offset,
                _ => out.push(Range {
                    offset: i as u64,
                    len: (end - i) as u64,
                }),
            }
        }
        i += bs;
    }
    out
}

/// Where the larger of `a` and `b` holds data past the other's end: the
/// first whole block after the blocks both have that is not all zeros.
fn model_tail_data(a: &[u8], b: &[u8], bs: usize) -> Option<u64> {
    let larger = if a.len() > b.len() { a } else { b };
    let start = a.len().min(b.len()).div_ceil(bs) * bs;
    (start..larger.len())
        .step_by(bs)
        .find(|&i| {
            larger[i..(i + bs).min(larger.len())]
                .iter()
                .any(|&x| x != 0)
        })
        .map(|i| i as u64)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Built while hashing, saved and loaded: the same map, whose derived
    /// checksum is the hasher's, with the right digest for every block.
    #[test]
    fn round_trip(segs in segments(), alg in algorithm(), bs in prop::sample::select(vec![512usize, 1024, 4096])) {
        let data = build(&segs);
        let map = Map::compute(opts(alg, bs), &data).unwrap();
        let want = checksum_of(alg, bs, &data);
        prop_assert_eq!(map.checksum().as_bytes(), want.as_bytes());
        prop_assert_eq!(&map.derive_checksum(), &want);
        prop_assert_eq!(map.size(), data.len() as u64);
        prop_assert_eq!(map.blocks(), data.len().div_ceil(bs) as u64);
        for (i, block) in data.chunks(bs).enumerate() {
            let mut d = vec![0u8; alg.output_len()];
            alg.digest_into(block, &mut d);
            prop_assert_eq!(map.block_digest(i as u64).unwrap(), &d[..]);
            let zero = block.len() == bs && block.iter().all(|&b| b == 0);
            prop_assert_eq!(map.block(i as u64) == Some(Block::Zero), zero);
        }
        prop_assert_eq!(map.block(map.blocks()), None);
        let bytes = map.to_bytes();
        prop_assert_eq!(bytes.len() as u64, map.encoded_len());
        let loaded = Map::from_bytes(&bytes).unwrap();
        prop_assert_eq!(&loaded, &map);
        // Canonical: the same content always gives the same bytes.
        prop_assert_eq!(loaded.to_bytes(), bytes);
    }

    /// Any one flipped bit, any truncation, anything appended: refused.
    #[test]
    fn damage_refused(segs in segments(), at in any::<prop::sample::Index>(), bit in 0u8..8, cut in any::<prop::sample::Index>()) {
        let data = build(&segs);
        let bytes = Map::compute(opts(Algorithm::Sha256, 512), &data).unwrap().to_bytes();
        let mut flipped = bytes.clone();
        flipped[at.index(bytes.len())] ^= 1 << bit;
        prop_assert!(Map::from_bytes(&flipped).is_err());
        let short = &bytes[..cut.index(bytes.len())];
        prop_assert!(Map::from_bytes(short).is_err());
        let mut long = bytes.clone();
        long.push(0);
        prop_assert!(Map::from_bytes(&long).is_err());
    }

    /// The diff of two maps is the block-by-block comparison of the bytes.
    #[test]
    fn diff_matches_model(segs in segments(), edits in prop::collection::vec((0usize..20000, 0usize..3000, any::<u8>()), 0..4),
                          extra in -3000isize..3000, bs in prop::sample::select(vec![512usize, 4096]),
                          junk in prop::option::of((any::<prop::sample::Index>(), 1u8..))) {
        let a = build(&segs);
        let mut b = a.clone();
        for (off, len, byte) in edits {
            if off < b.len() {
                let end = (off + len).min(b.len());
                b[off..end].fill(byte);
            }
        }
        let new_len = (b.len() as isize + extra).max(0) as usize;
        b.resize(new_len, 0);
        // A grown disk's tail that holds something (a block device's old bytes).
        if let Some((at, byte)) = junk.filter(|_| b.len() > a.len()) {
            let i = a.len() + at.index(b.len() - a.len());
            b[i] = byte;
        }
        let ma = Map::compute(opts(Algorithm::Blake3, bs), &a).unwrap();
        let mb = Map::compute(opts(Algorithm::Blake3, bs), &b).unwrap();
        let d = diff(&ma, &mb).unwrap();
        prop_assert_eq!(&d.ranges, &model_diff(&a, &b, bs));
        prop_assert_eq!(d.is_same(), a == b);
        prop_assert_eq!(d.tail().is_some(), a.len() != b.len());
        prop_assert_eq!(d.tail_data, model_tail_data(&a, &b, bs));
        // qemu-img compare's rule: the common blocks the same, the rest of the
        // larger zeros (the block both share in part compared as a whole).
        let common = a.len().min(b.len());
        let larger = if a.len() > b.len() { &a } else { &b };
        let model_same = model_diff(&a, &b, bs).is_empty() && model_tail_data(&a, &b, bs).is_none();
        prop_assert_eq!(d.same(SizeRule::ZeroTail), model_same);
        // Never the same content unless the larger's rest is zeros.
        prop_assert!(!d.same(SizeRule::ZeroTail) || larger[common..].iter().all(|&x| x == 0));
        prop_assert_eq!(d.same(SizeRule::Strict), a == b);
        let back = diff(&mb, &ma).unwrap();
        prop_assert_eq!(back.ranges, d.ranges);
        prop_assert_eq!(back.tail_data, d.tail_data);
    }
}

#[test]
fn builder_sees_every_way_of_feeding() {
    let o = opts(Algorithm::Sha256, 4096);
    let mut h = Pipeline::new(o.clone()).unwrap();
    let builder = MapBuilder::attach(&mut h).unwrap();
    let mut data = Vec::new();
    h.update([1u8; 5000]);
    data.extend([1u8; 5000]);
    h.update_zeros(3 << 20);
    data.extend(vec![0u8; 3 << 20]);
    h.submit(vec![0u8; 1 << 20]); // zeros read and digested: still zero blocks
    data.extend(vec![0u8; 1 << 20]);
    h.submit_with(
        1 << 20,
        Box::new(|b| {
            b.fill(9);
            Ok(())
        }),
    )
    .unwrap();
    data.extend(vec![9u8; 1 << 20]);
    h.update([3u8; 100]);
    data.extend([3u8; 100]);
    let map = builder.finalize(h).unwrap();
    assert_eq!(map, Map::compute(o, &data).unwrap());
    assert_eq!(
        map.checksum().as_bytes(),
        checksum_of(Algorithm::Sha256, 4096, &data).as_bytes()
    );
    // Runs merged: data (5000 bytes: 2 blocks), zeros (from update_zeros
    // and read zeros alike), data (the 9s and the 3s, off block boundaries).
    let runs: Vec<_> = map.runs().map(|r| (r.digests.is_some(), r.count)).collect();
    assert_eq!(runs, [(true, 2), (false, 1023), (true, 257)]);
}

#[test]
fn empty_and_sparse_maps_are_small() {
    let empty = Map::compute(Options::new(), &[]).unwrap();
    assert_eq!(empty.blocks(), 0);
    assert_eq!(Map::from_bytes(&empty.to_bytes()).unwrap(), empty);

    // 1 TiB of zeros: a header, one run, a trailer.
    let mut h = Hasher::with_options(Options::new()).unwrap();
    let b = MapBuilder::attach(&mut h).unwrap();
    h.update_zeros(1 << 40);
    let map = b.finalize(h).unwrap();
    assert_eq!(map.zero_blocks(), (1 << 40) / 65536);
    assert_eq!(map.encoded_len(), 48 + 32 + 9 + 32);

    // Data: 32 bytes per 64 KiB block, about 0.05%.
    let data = vec![5u8; 64 << 20];
    let m = Map::compute(Options::new(), &data).unwrap();
    assert!(m.encoded_len() < (data.len() as u64) / 2000 + 200);
}

fn sample() -> Vec<u8> {
    let mut data = vec![0u8; 10 * 512 + 100];
    data[..1024].fill(1);
    data[4096..4600].fill(2);
    Map::compute(opts(Algorithm::Sha256, 512), &data)
        .unwrap()
        .to_bytes()
}

#[test]
fn damage_gives_clear_errors() {
    let bytes = sample();
    let err = |b: &[u8]| Map::from_bytes(b).unwrap_err();
    assert!(matches!(err(b"QFI\xfb\0\0\0\x03rest"), MapError::NotAMap));
    assert!(matches!(err(b""), MapError::NotAMap));
    assert!(matches!(err(&bytes[..60]), MapError::Truncated));
    assert!(matches!(
        err(&bytes[..bytes.len() - 1]),
        MapError::Truncated
    ));
    let mut b = bytes.clone();
    b[100] ^= 0x10;
    assert!(matches!(err(&b), MapError::Damaged | MapError::Invalid(_)));
    assert!(err(&b).to_string().contains("block map"));

    // Re-signed edits are caught by the field checks.
    let mut v = bytes.clone();
    v[8] = 2;
    resign(&mut v);
    assert!(matches!(err(&v), MapError::Version(2)));
    let mut f = bytes.clone();
    f[12] = 4; // 1 and 2 are the partial and identity flags
    resign(&mut f);
    assert!(err(&f).to_string().contains("flags"));
    let mut n = bytes.clone();
    n[16..22].copy_from_slice(b"sha999");
    resign(&mut n);
    assert!(err(&n).to_string().contains("unknown digest"));
    let mut c = bytes.clone();
    c[48] ^= 1; // the checksum in the header
    resign(&mut c);
    assert!(matches!(err(&c), MapError::Checksum));
    let mut d = bytes.clone();
    let last_digest = d.len() - 33;
    d[last_digest] ^= 1; // a block digest: the checksum no longer follows
    resign(&mut d);
    assert!(matches!(err(&d), MapError::Checksum));
}

#[test]
fn lengths_are_bounded_before_allocating() {
    let bytes = sample();
    // First record at 48 + 32: 'D', count 2.
    assert_eq!(bytes[80], b'D');
    // A run claiming more blocks than the size allows.
    let mut more = bytes.clone();
    more[81..89].copy_from_slice(&1000u64.to_le_bytes());
    resign(&mut more);
    assert!(matches!(Map::from_bytes(&more), Err(MapError::Invalid(_))));
    let mut zero = bytes.clone();
    zero[81..89].copy_from_slice(&0u64.to_le_bytes());
    resign(&mut zero);
    assert!(matches!(Map::from_bytes(&zero), Err(MapError::Invalid(_))));
    // A header claiming an exabyte image of data, then nothing: truncated,
    // without allocating what it claims.
    let mut huge = bytes[..89].to_vec();
    huge[40..48].copy_from_slice(&(1u64 << 60).to_le_bytes());
    huge[81..89].copy_from_slice(&(1u64 << 51).to_le_bytes());
    huge.extend_from_slice(&[7u8; 4096]);
    assert!(matches!(Map::from_bytes(&huge), Err(MapError::Truncated)));
    // An unknown record tag.
    let mut tag = bytes.clone();
    tag[80] = b'X';
    resign(&mut tag);
    assert!(
        Map::from_bytes(&tag)
            .unwrap_err()
            .to_string()
            .contains("tag")
    );
}

#[test]
fn null_digest_and_bad_block_sizes_refused() {
    assert!(MapBuilder::new(Algorithm::Null, 65536).is_err());
    assert!(MapBuilder::new(Algorithm::Sha256, 1000).is_err());
    assert!(MapBuilder::new(Algorithm::Sha256, 128 << 20).is_err());
}

#[test]
fn mismatched_maps_do_not_compare() {
    let a = Map::compute(opts(Algorithm::Sha256, 512), &[1u8; 2000]).unwrap();
    let b = Map::compute(opts(Algorithm::Blake3, 512), &[1u8; 2000]).unwrap();
    let c = Map::compute(opts(Algorithm::Sha256, 1024), &[1u8; 2000]).unwrap();
    assert!(diff(&a, &b).unwrap_err().to_string().contains("digests"));
    assert!(
        diff(&a, &c)
            .unwrap_err()
            .to_string()
            .contains("block sizes")
    );
}

#[test]
fn save_is_atomic_and_loads_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.map");
    let map = Map::compute(Options::new().block_size(4096), &[4u8; 100_000]).unwrap();
    map.save(&path).unwrap();
    let again = Map::compute(Options::new().block_size(4096), &[5u8; 100_000]).unwrap();
    again.save(&path).unwrap();
    assert_eq!(Map::load(&path).unwrap(), again);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["disk.map"]);
    assert!(matches!(
        Map::load(dir.path().join("missing")),
        Err(MapError::Io(_))
    ));
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
    let e = damaged_read_fails(&mut r);
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

/// A map's blocks looked up forward (only those asked for read), and its
/// pieces read without the trailer's check once it is known intact; a
/// write to the file since it was opened is told.
#[test]
fn map_file_lookup_and_pieces_known_intact() {
    let bs = 512;
    let data: Vec<u8> = (0..2000 * bs).map(|i| ((i / bs) % 3 % 2) as u8).collect();
    let map = Map::compute(opts(Algorithm::Sha256, bs), &data).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("m.map");
    map.save(&p).unwrap();
    let f = MapFile::open(&p).unwrap();
    let mut lookup = f.lookup().unwrap();
    let mut buf = Vec::new();
    for i in [0, 1, 2, 300, 301, 1200, 1998, 1999] {
        let (end, data) = lookup.run_at(i).unwrap().unwrap();
        assert!(end > i, "block {i}");
        match map.block(i).unwrap() {
            Block::Zero => assert!(!data, "block {i}"),
            Block::Data(d) => {
                lookup.digests(i, 1, &mut buf).unwrap();
                assert_eq!(buf, d, "block {i}");
            }
        }
    }
    assert_eq!(lookup.run_at(2000).unwrap(), None);
    assert!(lookup.run_at(5).is_err(), "a block behind is refused");
    let d = diff_pieces(f.pieces_known_intact().unwrap(), map.pieces()).unwrap();
    assert_eq!(d.ranges, []);
    f.unchanged().unwrap();
    // A byte of a digest changed: the trailer no longer matches, which
    // only a checked read tells; the file's times tell it was written.
    let mut bytes = std::fs::read(&p).unwrap();
    let at = bytes.len() - 40;
    bytes[at] ^= 1;
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .and_then(|mut w| std::io::Write::write_all(&mut w, &bytes))
        .unwrap();
    let e = f.unchanged().unwrap_err().to_string();
    assert!(e.contains("written by another program"), "{e}");
    let mut r = f.pieces_known_intact().unwrap();
    while blkmap::Pieces::next_piece(&mut r).unwrap().is_some() {}
    let mut r = f.pieces().unwrap();
    let e = damaged_read_fails(&mut r);
    assert!(matches!(e, MapError::Damaged), "{e}");
}

/// The error reading `r` (a damaged map's pieces) ends with.
fn damaged_read_fails(r: &mut impl blkmap::Pieces) -> MapError {
    loop {
        match r.next_piece() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a damaged map read to its end"),
            Err(e) => return e,
        }
    }
}
