//! The NBD client against a server that misbehaves on purpose
//! (`testkit::hostile`), read as blksum reads an image (`read_image` into
//! the hasher): every scenario is an error saying why (the command adds
//! the URL), with no checksum, no panic, in bounded time and memory.
//! Without a misbehaviour, and with legal tiny block sizes, the export is
//! read right.

use crate::common;

use blkhash::{Hasher, Pipeline};
use blkimage::{AlignedBuf, OpenOptions, Source, read_image};
use common::open_with;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use testkit::hostile::{Hostile, Misbehave};

/// One read of an export: its checksum or the error, and how long it took.
struct Run {
    result: io::Result<Vec<u8>>,
    elapsed: Duration,
}

/// The checksum of the export at `url` (sha256, 64 KiB blocks), read as
/// blksum reads it: 1 MiB reads on the digest workers; `timeout`: the
/// client's (blksum's `--timeout`).
fn checksum(url: &str, timeout: Option<Duration>) -> io::Result<Vec<u8>> {
    let mut opts = OpenOptions::default();
    opts.nbd.timeout = timeout;
    let src: Arc<dyn Source> = Arc::from(open_with(url, &opts)?);
    let mut sink: Pipeline<AlignedBuf> =
        Pipeline::new(blkhash::Options::new()).map_err(io::Error::other)?;
    let cancel = AtomicBool::new(false);
    read_image(src.clone(), &mut sink, 1 << 20, None, &cancel, &mut |_| {})?;
    let sum = sink.finalize()?;
    src.finish()?;
    Ok(sum.as_bytes().to_vec())
}

/// Read `url` on a thread of its own; a read still running after `limit`
/// fails the test (the thread is left behind).
fn run_limited(url: &str, timeout: Option<Duration>, limit: Duration) -> Run {
    let (tx, rx) = std::sync::mpsc::channel();
    let url = url.to_string();
    let start = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(checksum(&url, timeout));
    });
    match rx.recv_timeout(limit) {
        Ok(result) => Run {
            result,
            elapsed: start.elapsed(),
        },
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("reading the export: still running after {limit:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("reading the export panicked")
        }
    }
}

/// The peak resident set size of this test process, in KiB.
fn max_rss_kib() -> i64 {
    // SAFETY: getrusage fills a struct we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
    usage.ru_maxrss
}

/// Deterministic content that is not all zeros.
fn content(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x1234_5678;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// The checksum of `data` as one hasher computes it.
fn expected(data: &[u8]) -> Vec<u8> {
    let mut h = Hasher::new();
    h.update(data);
    h.finalize().as_bytes().to_vec()
}

/// The read failed as a hostile server should make it fail: an error (no
/// checksum, no panic) with every word of `reason` in its message, within
/// `within`.
fn assert_refused(run: &Run, reason: &[&str], within: Duration) {
    let err = match &run.result {
        Ok(sum) => panic!("checksum read: {}", blkhash::to_hex(sum)),
        Err(e) => e.to_string(),
    };
    for r in reason {
        assert!(err.contains(r), "no '{r}' in: {err}");
    }
    assert!(
        run.elapsed < within,
        "took {:?} (limit {within:?}): {err}",
        run.elapsed
    );
}

/// Peak memory allowed to the test process while a hostile server is read:
/// the tests and their buffers, nothing that grows with what the server
/// sends.
const RSS_LIMIT_KIB: i64 = 256 << 10;

#[test]
fn the_harness_serves_a_correct_export() {
    let data = content(3 << 20);
    let want = expected(&data);
    let srv = Hostile::start(data, Misbehave::Nothing);
    let run = run_limited(&srv.url, None, Duration::from_secs(60));
    assert_eq!(run.result.unwrap(), want);
}

#[test]
fn one_byte_block_sizes_are_refused() {
    // min = preferred = max = 1 would mean a request per byte.
    let srv = Hostile::start(content(4 << 20), Misbehave::BlockSizes(1, 1, 1));
    let run = run_limited(&srv.url, None, Duration::from_secs(30));
    assert_refused(&run, &["block size", "maximum"], Duration::from_secs(10));
    assert!(max_rss_kib() < RSS_LIMIT_KIB, "{} KiB", max_rss_kib());
}

#[test]
fn small_block_sizes_keep_requests_in_flight_bounded() {
    // 512-byte requests are legal: the export is read right, with a
    // bounded number of requests waiting at once (2048 per MiB otherwise).
    let data = content(2 << 20);
    let want = expected(&data);
    let srv = Hostile::start(data, Misbehave::BlockSizes(512, 512, 512));
    let run = run_limited(&srv.url, None, Duration::from_secs(120));
    assert_eq!(run.result.unwrap(), want);
    let requests = srv.stats.requests.load(Ordering::SeqCst);
    let in_flight = srv.stats.max_in_flight.load(Ordering::SeqCst);
    assert!(requests >= 4096, "{requests} requests");
    assert!(in_flight <= 64, "{in_flight} requests in flight at once");
}

#[test]
fn endless_info_replies_are_an_error() {
    let srv = Hostile::start(content(1 << 20), Misbehave::EndlessInfo);
    let run = run_limited(&srv.url, None, Duration::from_secs(30));
    assert_refused(&run, &["NBD_OPT_GO", "replies"], Duration::from_secs(10));
    assert!(max_rss_kib() < RSS_LIMIT_KIB, "{} KiB", max_rss_kib());
}

#[test]
fn endless_meta_context_replies_are_an_error() {
    let srv = Hostile::start(content(1 << 20), Misbehave::EndlessMetaContext);
    let run = run_limited(&srv.url, None, Duration::from_secs(30));
    assert_refused(
        &run,
        &["NBD_OPT_SET_META_CONTEXT", "replies"],
        Duration::from_secs(10),
    );
    assert!(max_rss_kib() < RSS_LIMIT_KIB, "{} KiB", max_rss_kib());
}

const TWO_S: Option<Duration> = Some(Duration::from_secs(2));

#[test]
fn a_silent_handshake_times_out_naming_the_stage() {
    let srv = Hostile::start(content(1 << 20), Misbehave::SilentHandshake);
    let run = run_limited(&srv.url, TWO_S, Duration::from_secs(30));
    assert_refused(
        &run,
        &["timed out after 2 s", "NBD_OPT_STRUCTURED_REPLY"],
        Duration::from_secs(8),
    );
}

#[test]
fn a_trickling_handshake_times_out() {
    // One byte a second never leaves the socket silent for 2 s.
    let srv = Hostile::start(content(1 << 20), Misbehave::TrickleGo);
    let run = run_limited(&srv.url, TWO_S, Duration::from_secs(40));
    assert_refused(
        &run,
        &["timed out after 2 s", "NBD_OPT_GO"],
        Duration::from_secs(8),
    );
}

#[test]
fn a_trickling_reply_times_out() {
    let srv = Hostile::start(content(1 << 20), Misbehave::TrickleRead);
    let run = run_limited(&srv.url, TWO_S, Duration::from_secs(40));
    assert_refused(
        &run,
        &["timed out after 2 s", "reply"],
        Duration::from_secs(8),
    );
}

#[test]
fn a_silent_reply_times_out() {
    let srv = Hostile::start(content(1 << 20), Misbehave::SilentRead);
    let run = run_limited(&srv.url, TWO_S, Duration::from_secs(40));
    assert_refused(
        &run,
        &["timed out after 2 s", "reply"],
        Duration::from_secs(8),
    );
}

#[test]
fn a_malformed_reply_is_an_error() {
    let srv = Hostile::start(content(1 << 20), Misbehave::BadReplyMagic);
    let run = run_limited(&srv.url, None, Duration::from_secs(30));
    assert_refused(&run, &["malformed", "magic"], Duration::from_secs(10));
}
