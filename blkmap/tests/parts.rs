//! Parts and merges: any split of any content, merged in any order, is the
//! map of the whole, byte for byte; gaps, overlaps, mismatches and damage
//! are errors that name the parts.

use blkhash::{Algorithm, Hasher, Options};
use blkmap::{Input, Map, MapBuilder, MapError, MapReader, Named, Part, Range, merge, merge_files};
use proptest::prelude::*;

fn opts(alg: Algorithm, bs: usize) -> Options {
    Options::new().algorithm(alg).block_size(bs).threads(2)
}

/// The part of `image` from `from` to `to`, hashed alone.
fn part(o: &Options, image: &[u8], from: usize, to: usize) -> Part {
    let mut h = Hasher::with_options(o.clone()).unwrap();
    let b = MapBuilder::attach(&mut h).unwrap();
    h.update(&image[from..to]);
    b.finalize_part(h, image.len() as u64, from as u64).unwrap()
}

fn inputs(parts: &[(String, Vec<u8>)]) -> Vec<Named<'_>> {
    parts
        .iter()
        .map(|(n, b)| {
            (
                n.clone(),
                Box::new(std::io::Cursor::new(&b[..])) as Box<dyn Input>,
            )
        })
        .collect()
}

/// Merge named parts into bytes.
fn merged(parts: &[(String, Vec<u8>)]) -> Result<Vec<u8>, MapError> {
    let mut out = std::io::Cursor::new(Vec::new());
    merge(inputs(parts), Some(&mut out), None, false)?;
    Ok(out.into_inner())
}

/// Content with zero runs, data runs and blocks of written zeros.
fn content() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec((any::<bool>(), 0usize..6000, 1u8..), 0..8).prop_map(|segs| {
        let mut v = Vec::new();
        for (zero, len, byte) in segs {
            v.extend(std::iter::repeat_n(if zero { 0 } else { byte }, len));
        }
        v
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_split_in_any_order_is_the_whole(
        image in content(),
        alg in prop::sample::select(vec![Algorithm::Sha256, Algorithm::Blake3, Algorithm::Md5, Algorithm::Sha512]),
        bs in prop::sample::select(vec![512usize, 1024, 4096]),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
        order in any::<prop::sample::Index>(),
    ) {
        let o = opts(alg, bs);
        let blocks = image.len().div_ceil(bs);
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(blocks + 1) * bs).collect();
        points.push(0);
        points.push(image.len());
        points.iter_mut().for_each(|p| *p = (*p).min(image.len()));
        points.sort();
        points.dedup();
        let mut parts: Vec<(String, Vec<u8>)> = points
            .windows(2)
            .map(|w| (format!("p{}", w[0]), part(&o, &image, w[0], w[1]).to_bytes()))
            .collect();
        if parts.is_empty() {
            parts.push(("p0".into(), part(&o, &image, 0, 0).to_bytes()));
        }
        let k = order.index(parts.len());
        parts.rotate_left(k);
        let whole = Map::compute(o, &image).unwrap();
        prop_assert_eq!(merged(&parts).unwrap(), whole.to_bytes());
        let h = merge(inputs(&parts), None, None, false).unwrap();
        prop_assert_eq!(h.checksum.as_ref(), Some(whole.checksum()));
    }
}

#[test]
fn taken_parts_merge_to_the_whole() {
    // A checkpointing run takes what it has every so often.
    let o = opts(Algorithm::Sha256, 4096);
    let image: Vec<u8> = (0..100_000u32).map(|i| (i / 5000 % 3) as u8).collect();
    let mut h = Hasher::with_options(o.clone()).unwrap();
    let b = MapBuilder::attach(&mut h).unwrap();
    let mut parts = Vec::new();
    for chunk in image.chunks(30_000) {
        h.update(chunk);
        let p = b.take_part(image.len() as u64, 0).unwrap();
        parts.push((format!("t{}", parts.len()), p.to_bytes()));
    }
    h.finalize();
    let p = b.take_part(image.len() as u64, 0).unwrap();
    parts.push(("last".into(), p.to_bytes()));
    let whole = Map::compute(o, &image).unwrap();
    assert_eq!(merged(&parts).unwrap(), whole.to_bytes());
}

#[test]
fn gaps_overlaps_and_mismatches_name_the_parts() {
    let o = opts(Algorithm::Sha256, 4096);
    let image = vec![1u8; 10 * 4096 + 100];
    let p = |from, to| part(&o, &image, from, to).to_bytes();
    let named = |v: &[(&str, Vec<u8>)]| -> Vec<(String, Vec<u8>)> {
        v.iter().map(|(n, b)| (n.to_string(), b.clone())).collect()
    };
    let end = image.len();
    let gap = merged(&named(&[("a", p(0, 4096)), ("b", p(8192, end))])).unwrap_err();
    assert_eq!(
        gap.to_string(),
        "a gap: bytes 4096+4096 are in no part (a ends at 4096, b starts at 8192)"
    );
    let start = merged(&named(&[("b", p(8192, end))])).unwrap_err();
    assert!(
        start
            .to_string()
            .contains("the first part, b, starts at 8192"),
        "{start}"
    );
    let tail = merged(&named(&[("a", p(0, 8192))])).unwrap_err();
    assert!(
        tail.to_string().contains("bytes 8192+32868 are in no part"),
        "{tail}"
    );
    let over = merged(&named(&[("a", p(0, 8192)), ("b", p(4096, end))])).unwrap_err();
    assert_eq!(
        over.to_string(),
        "an overlap: a and b both cover bytes 4096+4096"
    );
    let other = part(&opts(Algorithm::Blake3, 4096), &image, 4096, end).to_bytes();
    let mismatch = merged(&named(&[("a", p(0, 4096)), ("b", other)])).unwrap_err();
    assert!(
        mismatch
            .to_string()
            .starts_with("b is of a 41060-byte image in blake3"),
        "{mismatch}"
    );
    let mut smaller = image.clone();
    smaller.truncate(9 * 4096);
    let short = part(&o, &smaller, 4096, smaller.len()).to_bytes();
    let sized = merged(&named(&[("a", p(0, 4096)), ("b", short)])).unwrap_err();
    assert!(sized.to_string().contains("36864-byte image"), "{sized}");

    // Damage in a part is said of that part.
    let mut bad = p(4096, end);
    let n = bad.len();
    bad[n - 40] ^= 1;
    let damaged = merged(&named(&[("a", p(0, 4096)), ("b", bad)])).unwrap_err();
    assert_eq!(
        damaged.to_string(),
        "b: damaged block map: the digest of its contents does not match its trailer"
    );
    let truncated = merged(&named(&[
        ("a", p(0, 4096)),
        ("b", p(4096, end)[..60].to_vec()),
    ]))
    .unwrap_err();
    assert_eq!(truncated.to_string(), "b: truncated block map");
    assert!(merged(&[]).unwrap_err().to_string().contains("no parts"));
}

#[test]
fn a_part_is_not_a_map_and_ranges_are_checked() {
    let o = opts(Algorithm::Sha256, 4096);
    let image = vec![3u8; 5 * 4096];
    let bytes = part(&o, &image, 4096, image.len()).to_bytes();
    let err = Map::from_bytes(&bytes).unwrap_err();
    assert!(
        err.to_string()
            .contains("bytes 4096+16384 of an image of 20480 bytes"),
        "{err}"
    );
    let r = MapReader::new(&bytes[..]).unwrap();
    assert!(r.header().is_partial());
    assert_eq!(
        r.header().range,
        Range {
            offset: 4096,
            len: 16384
        }
    );
    assert_eq!(Part::from_bytes(&bytes).unwrap().range().offset, 4096);

    let mut h = Hasher::with_options(o.clone()).unwrap();
    let b = MapBuilder::attach(&mut h).unwrap();
    h.update(&image[..4096]);
    let err = b.finalize_part(h, image.len() as u64, 100).unwrap_err();
    assert!(err.to_string().contains("block boundary"), "{err}");
    let err = blkmap::check_range(
        20480,
        4096,
        Range {
            offset: 4096,
            len: 100,
        },
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("neither ends at a block boundary"),
        "{err}"
    );
    let err = blkmap::check_range(
        20480,
        4096,
        Range {
            offset: 16384,
            len: 8192,
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("past the end"), "{err}");
}

#[test]
fn files_merge_atomically_and_a_failed_merge_leaves_out_alone() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(Algorithm::Sha256, 4096);
    let image: Vec<u8> = (0..50_000u32).map(|i| (i % 7) as u8).collect();
    let a = dir.path().join("a.part");
    let b = dir.path().join("b.part");
    part(&o, &image, 0, 8192).save(&a).unwrap();
    part(&o, &image, 8192, image.len()).save(&b).unwrap();
    let out = dir.path().join("out.map");
    // An older map (by its magic) is what a merge may replace: any other
    // file is refused (blkmap::guard), as the next lines show.
    let old = [&blkmap::MAGIC[..], b"old"].concat();
    std::fs::write(&out, b"old").unwrap();
    let e = merge_files(&[&b, &a], Some(&out)).unwrap_err();
    assert!(
        e.to_string().contains("exists and is not a block map"),
        "{e}"
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"old");
    std::fs::write(&out, &old).unwrap();
    let h = merge_files(&[&b, &a], Some(&out)).unwrap();
    let whole = Map::compute(o.clone(), &image).unwrap();
    assert_eq!(h.checksum.as_ref(), Some(whole.checksum()));
    assert_eq!(Map::load(&out).unwrap(), whole);
    // A merge that fails writes nothing.
    std::fs::write(&out, &old).unwrap();
    assert!(merge_files(&[&a], Some(&out)).is_err());
    assert_eq!(std::fs::read(&out).unwrap(), old);
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(left.len(), 3, "no temporary file left");
    // A whole map alone has its checksum checked.
    let mut bytes = whole.to_bytes();
    bytes[48] ^= 1;
    let n = bytes.len() - 32;
    let mut d = [0u8; 32];
    Algorithm::Sha256.digest_into(&bytes[..n], &mut d);
    bytes[n..].copy_from_slice(&d);
    let e = merged(&[("w".into(), bytes)]).unwrap_err();
    assert!(
        e.to_string().starts_with("w: inconsistent block map"),
        "{e}"
    );
}
