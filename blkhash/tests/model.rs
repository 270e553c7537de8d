//! Property tests: however the same bytes are cut into `update`, `submit`,
//! `submit_with`, `submit_lent` and `update_zeros` calls, the checksum
//! equals the plain model's.

use blkhash::{Algorithm, BlockEvent, CONSTRUCTIONS, Hasher, Options, Pipeline, checksum_with};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
enum Piece {
    Data(Vec<u8>),
    /// Bytes that happen to be zeros, given as data.
    ZeroData(usize),
    Zeros(u64),
    Submit(Vec<u8>),
    /// Bytes produced by a fill on a worker.
    Fill(Vec<u8>),
    /// Bytes lent in place to a worker.
    Lend(Vec<u8>),
}

fn piece() -> impl Strategy<Value = Piece> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..5000).prop_map(Piece::Data),
        (0usize..9000).prop_map(Piece::ZeroData),
        (0u64..20000).prop_map(Piece::Zeros),
        prop::collection::vec(any::<u8>(), 0..9000).prop_map(Piece::Submit),
        // Multiples of the block size go to the workers, others are copied.
        (0usize..6, any::<u8>(), any::<bool>())
            .prop_map(|(n, b, odd)| { Piece::Fill(vec![b; n * 1024 + if odd { 100 } else { 0 }]) }),
        // Random bytes with runs of zeros, whole blocks or not.
        (
            prop::collection::vec(any::<u8>(), 0..6000),
            0usize..4,
            any::<bool>()
        )
            .prop_map(|(mut d, zero_blocks, odd)| {
                d.resize(d.len() / 1024 * 1024 + if odd { 100 } else { 0 }, 7);
                d.extend(std::iter::repeat_n(0, zero_blocks * 1024));
                Piece::Lend(d)
            }),
    ]
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop::sample::select(vec![
        Algorithm::Sha256,
        Algorithm::Blake3,
        Algorithm::Md5,
        Algorithm::Shake128,
        Algorithm::Blake2b256,
        // No digest at all: every path must cope with empty block digests.
        Algorithm::Null,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn any_split_matches_model(
        pieces in prop::collection::vec(piece(), 0..12),
        alg in algorithm(),
        bs in prop::sample::select(vec![512usize, 1024, 4096]),
        threads in 1usize..4,
        depth in 1usize..5,
        construction in prop::sample::select(CONSTRUCTIONS),
    ) {
        // imageio's takes only the digests imageio computes: the others are
        // refused (Construction::takes), not hashed.
        let opts = Options::new().construction(construction).algorithm(alg).block_size(bs).threads(threads).queue_depth(depth);
        if !construction.takes(alg) {
            prop_assert!(Pipeline::<Vec<u8>>::new(opts).is_err());
            return Ok(());
        }
        let mut h = Pipeline::new(opts).unwrap();
        let mut all = Vec::new();
        for p in &pieces {
            match p {
                Piece::Data(d) => { h.update(d); all.extend_from_slice(d); }
                Piece::ZeroData(n) => { h.update(vec![0; *n]); all.resize(all.len() + n, 0); }
                Piece::Zeros(n) => { h.update_zeros(*n); all.resize(all.len() + *n as usize, 0); }
                Piece::Submit(d) => { h.submit(d.clone()); all.extend_from_slice(d); }
                Piece::Fill(d) => {
                    let bytes = d.clone();
                    h.submit_with(d.len(), Box::new(move |b| { b.copy_from_slice(&bytes); Ok(()) })).unwrap();
                    all.extend_from_slice(d);
                }
                Piece::Lend(d) => {
                    let bytes = d.clone();
                    h.submit_lent(d.len(), Box::new(move |f| { f(&bytes); Ok(()) })).unwrap();
                    all.extend_from_slice(d);
                }
            }
            // Interleave reclaiming as a zero-copy caller would.
            while let Some(b) = h.reclaim() { drop(b); }
        }
        prop_assert_eq!(h.len(), all.len() as u64);
        prop_assert_eq!(h.finalize().unwrap(), checksum_with(construction, alg, bs, &all));
    }

    #[test]
    fn observer_sees_every_block_in_order(
        pieces in prop::collection::vec(piece(), 0..8),
    ) {
        let bs = 512;
        let events = Arc::new(Mutex::new(Vec::new()));
        let log = events.clone();
        let mut h = Hasher::with_options(Options::new().block_size(bs).threads(2)).unwrap();
        h.set_observer(move |e| log.lock().unwrap().push(match e {
            BlockEvent::Data { index, digest } => (index, 1, Some(digest.to_vec())),
            BlockEvent::Zeros { index, count } => (index, count, None),
        }));
        let mut all = Vec::new();
        for p in &pieces {
            match p {
                Piece::Data(d) | Piece::Submit(d) | Piece::Fill(d) | Piece::Lend(d) => { h.update(d); all.extend_from_slice(d); }
                Piece::ZeroData(n) => { h.update(vec![0; *n]); all.resize(all.len() + n, 0); }
                Piece::Zeros(n) => { h.update_zeros(*n); all.resize(all.len() + *n as usize, 0); }
            }
        }
        h.finalize();
        let mut next = 0u64;
        for (index, count, digest) in events.lock().unwrap().iter() {
            prop_assert_eq!(*index, next);
            let start = index * bs as u64;
            for b in 0..*count {
                let off = (start + b * bs as u64) as usize;
                let block = &all[off..(off + bs).min(all.len())];
                let mut want = vec![0; 32];
                Algorithm::Sha256.digest_into(block, &mut want);
                match digest {
                    Some(d) => prop_assert_eq!(d, &want),
                    None => prop_assert!(block.len() == bs && block.iter().all(|&x| x == 0)),
                }
            }
            next += count;
        }
        prop_assert_eq!(next, all.len().div_ceil(bs) as u64);
    }
}

#[test]
fn huge_zero_range_is_cheap() {
    // 8 TiB of zeros: no allocation or digest per block, only the outer
    // digest over 128 Mi constant digests (blake3 takes large updates fast).
    let mut h = Hasher::with_options(Options::new().algorithm(Algorithm::Blake3)).unwrap();
    let start = std::time::Instant::now();
    h.update_zeros(8 << 40);
    let c = h.finalize();
    assert_eq!(c.as_bytes().len(), 32);
    assert!(start.elapsed().as_secs() < 60);
}

#[test]
fn invalid_options() {
    for bs in [0, 511, 513, 1000, (64 << 20) + 512, 128 << 20] {
        assert!(
            Hasher::with_options(Options::new().block_size(bs)).is_err(),
            "{bs}"
        );
    }
    for t in [0, 129] {
        assert!(
            Hasher::with_options(Options::new().threads(t)).is_err(),
            "{t}"
        );
    }
    assert!(Hasher::with_options(Options::new().block_size(64 << 20).threads(128)).is_ok());
}

#[test]
fn a_panicking_fill_is_an_error_not_a_hang() {
    for threads in [1, 2, 4] {
        let mut h: Pipeline =
            Pipeline::new(Options::new().block_size(4096).threads(threads)).unwrap();
        let mut result = Ok(());
        for i in 0..16u64 {
            let fill: blkhash::Fill = if i == 5 {
                Box::new(|_| panic!("a fill that panics"))
            } else {
                Box::new(|b| {
                    b.fill(1);
                    Ok(())
                })
            };
            result = result.and(h.submit_with(64 << 10, fill));
        }
        let end = h.finalize();
        let err = result.err().or(end.err()).expect("an error");
        assert!(err.to_string().contains("panicked"), "{err}");
    }
}

#[test]
fn a_failed_fill_fails_the_checksum() {
    for threads in [1, 2, 4] {
        let mut h: Pipeline =
            Pipeline::new(Options::new().block_size(4096).threads(threads)).unwrap();
        let mut result = Ok(());
        for i in 0..64u64 {
            let fill: blkhash::Fill = if i == 40 {
                Box::new(|_| Err(std::io::Error::other("read failed at chunk 40")))
            } else {
                Box::new(|b| {
                    b.fill(1);
                    Ok(())
                })
            };
            result = result.and(h.submit_with(64 << 10, fill));
            h.update_zeros(1 << 20);
        }
        // The error comes back from a later call or from finalize.
        let end = h.finalize();
        let err = result.err().or(end.err()).expect("an error");
        assert!(err.to_string().contains("chunk 40"), "{err}");
    }
}

/// A lend that fails after lending its bytes (a mapping cut short while a
/// worker read it): no checksum, and no observer sees its blocks or any
/// after them, whether the lend ran on a worker or, off block boundaries,
/// on the caller's thread.
#[test]
fn a_lend_cut_short_fails_the_checksum_and_reports_no_block_of_it() {
    for (threads, len) in [(1, 64 << 10), (2, 64 << 10), (4, 64 << 10), (2, 5000)] {
        let mut h: Pipeline =
            Pipeline::new(Options::new().block_size(4096).threads(threads)).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        h.set_observer(move |e| {
            if let BlockEvent::Data { index, .. } = e {
                log.lock().unwrap().push(index);
            }
        });
        let mut result = Ok(());
        let per = (len / 4096) as u64;
        for i in 0..32u64 {
            let lend: blkhash::Lend = Box::new(move |f| {
                let d = vec![1u8; len];
                f(&d);
                if i == 20 {
                    return Err(std::io::Error::other("the file shrank while it was read"));
                }
                Ok(())
            });
            result = result.and(h.submit_lent(len, lend));
        }
        let end = h.finalize();
        let err = result.err().or(end.err()).expect("an error");
        assert!(err.to_string().contains("shrank"), "{err}");
        if len % 4096 == 0 {
            let seen = seen.lock().unwrap();
            assert!(
                seen.iter().all(|&b| b < 20 * per),
                "threads {threads}: {:?}",
                seen.last()
            );
        }
    }
}

/// A lend that lends the wrong number of bytes, or none: an error.
#[test]
fn a_lend_of_the_wrong_length_is_an_error() {
    for len in [65536, 5000] {
        let mut h: Pipeline = Pipeline::new(Options::new().block_size(4096)).unwrap();
        let r = h.submit_lent(
            len,
            Box::new(|f| {
                f(&[1u8; 100]);
                Ok(())
            }),
        );
        assert!(r.is_err() || h.finalize().is_err(), "len {len}");
        let mut h: Pipeline = Pipeline::new(Options::new().block_size(4096)).unwrap();
        let r = h.submit_lent(len, Box::new(|_| Ok(())));
        assert!(r.is_err() || h.finalize().is_err(), "len {len}");
    }
}
