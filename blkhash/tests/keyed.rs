//! Keyed block digests (`Options::block_key`): every block, zeros given
//! as data, zeros skipped and a short last block, digested as
//! `H(block || key)` on the multi-buffer path and the one-at-a-time one
//! alike, the outer digest unkeyed.

use blkhash::{Algorithm, BlockEvent, Construction, Hasher, Options};
use std::sync::{Arc, Mutex};

/// The model: each block of `data` keyed, the outer digest of them (and
/// the length, for blkhash 0.11's construction).
fn model(c: Construction, alg: Algorithm, bs: usize, key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut outer = alg.streaming();
    for block in data.chunks(bs) {
        let mut d = vec![0u8; alg.output_len()];
        alg.digest_keyed_into(block, key, &mut d);
        outer.update(&d);
    }
    if c.appends_length() {
        outer.update(&(data.len() as u64).to_le_bytes());
    }
    outer.finalize()
}

#[test]
fn keyed_blocks_match_the_model() {
    let bs = 4096;
    let key = [0x5au8; 32];
    // 40 blocks: data, zeros given as data, zeros skipped, a short end.
    let mut data: Vec<u8> = (0..40 * bs).map(|i| (i * 13 % 251) as u8).collect();
    data[5 * bs..9 * bs].fill(0);
    data[20 * bs..30 * bs].fill(0);
    data.truncate(39 * bs + 1000);
    for alg in [Algorithm::Sha256, Algorithm::Blake3, Algorithm::Sha1] {
        for c in [Construction::Blkhash, Construction::Pbs] {
            let opts = Options::new()
                .construction(c)
                .algorithm(alg)
                .block_size(bs)
                .threads(2)
                .block_key(key);
            let mut h = Hasher::with_options(opts).unwrap();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let s = seen.clone();
            h.set_observer(move |e| {
                if let BlockEvent::Data { index, digest } = e {
                    s.lock().unwrap().push((index, digest.to_vec()));
                }
            });
            h.update(&data[..20 * bs]);
            h.update_zeros(10 * bs as u64);
            h.update(&data[30 * bs..]);
            let zero = h.zero_digest().to_vec();
            assert_eq!(zero, alg.digest_zeros_keyed(bs, &key), "{alg} {c}");
            let sum = h.finalize();
            assert_eq!(sum.as_bytes(), model(c, alg, bs, &key, &data), "{alg} {c}");
            // The blocks seen are keyed too.
            let seen = seen.lock().unwrap();
            let (i, d) = seen.iter().find(|(i, _)| *i == 3).unwrap();
            let mut want = vec![0u8; alg.output_len()];
            alg.digest_keyed_into(&data[3 * bs..4 * bs], &key, &mut want);
            assert_eq!((*i, d), (3, &want));
        }
    }
}

/// An empty key is no key: the checksum of the unkeyed hasher.
#[test]
fn an_empty_key_is_none() {
    let data = vec![3u8; 100_000];
    let mut a = Hasher::with_options(Options::new().block_key([])).unwrap();
    a.update(&data);
    let mut b = Hasher::new();
    b.update(&data);
    assert_eq!(a.finalize(), b.finalize());
    let mut k = Hasher::with_options(Options::new().block_key([1])).unwrap();
    k.update(&data);
    assert_ne!(k.finalize(), blkhash::hash(&data));
}
