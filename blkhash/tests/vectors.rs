//! Every reference vector, through the library: from the exact bytes (what a
//! pipe gives) and with the size rounded up to 512 as QEMU sees a file, fed
//! both as plain bytes and with holes and zeros given as `update_zeros`.

use blkhash::{Algorithm, Hasher, Options};
use testkit::{Kind, Recipe, fill, vectors};

fn opts(v: &testkit::Vector) -> Options {
    let alg: Algorithm = v.digest.parse().expect("known digest");
    Options::new().algorithm(alg).block_size(v.block_size)
}

/// Feed the recipe's segments, zeros as `update_zeros`, data in odd-sized pieces.
fn hash_segments(v: &testkit::Vector, pad_to_512: bool) -> String {
    let recipe = Recipe::parse(&v.recipe).unwrap();
    let mut h = Hasher::with_options(opts(v)).unwrap();
    let mut buf = Vec::new();
    for seg in &recipe.segments {
        match seg.kind {
            Kind::Hole | Kind::Zeros => h.update_zeros(seg.len),
            kind => {
                let mut off = 0;
                while off < seg.len {
                    let n = (seg.len - off).min(777_777);
                    buf.resize(n as usize, 0);
                    fill(kind, seg.offset + off, &mut buf);
                    h.update(&buf);
                    off += n;
                }
            }
        }
    }
    if pad_to_512 {
        h.update_zeros(recipe.size().next_multiple_of(512) - recipe.size());
    }
    h.finalize().to_hex()
}

#[test]
fn all_raw_vectors() {
    let mut checked = 0;
    for v in vectors().iter().filter(|v| v.format.is_none()) {
        let recipe = Recipe::parse(&v.recipe).unwrap();
        assert_eq!(recipe.size(), v.size, "{}", v.recipe);
        let what = format!("{} {} {}", v.recipe, v.digest, v.block_size);
        assert_eq!(hash_segments(v, false), v.pipe_checksum(), "pipe: {what}");
        assert_eq!(hash_segments(v, true), v.file, "file: {what}");
        if v.size <= 1 << 20 {
            let bytes = recipe.bytes();
            let mut h = Hasher::with_options(opts(v)).unwrap();
            h.update(&bytes);
            assert_eq!(h.finalize().to_hex(), v.pipe_checksum(), "bytes: {what}");
        }
        checked += 1;
    }
    assert!(checked >= 500, "only {checked} vectors");
}
