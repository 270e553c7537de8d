//! blksum against an NBD server that misbehaves on purpose
//! (`common::hostile`): every scenario ends with exit status 1, the URL and
//! the reason on standard error, no checksum, in bounded time and memory.

mod common;

use common::hostile::{Hostile, Misbehave};
use common::*;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// One blksum run: how it ended, what it printed, how long and how much
/// memory it took.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
    /// The peak resident set size (wait4's ru_maxrss), in KiB.
    max_rss_kib: i64,
}

/// Run blksum with `args`, killed after `limit` (the run then fails the
/// test, with what it printed so far).
// The child is reaped by wait4 (for its rusage), not by Child::wait.
#[allow(clippy::zombie_processes)]
fn run_limited(args: &[&str], limit: Duration) -> Run {
    let mut child = blksum()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("blksum runs");
    let pid = child.id() as libc::pid_t;
    let collect = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = collect(Box::new(child.stdout.take().unwrap()));
    let err = collect(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let mut killed = false;
    loop {
        let mut status = 0;
        // SAFETY: plain system call on our own child, into local memory.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        assert!(r >= 0, "wait4: {}", std::io::Error::last_os_error());
        if r == pid {
            let run = Run {
                status: ExitStatus::from_raw(status),
                stdout: out.join().unwrap(),
                stderr: err.join().unwrap(),
                elapsed: start.elapsed(),
                max_rss_kib: usage.ru_maxrss,
            };
            assert!(
                !killed,
                "blksum {args:?} still running after {limit:?} (killed; peak RSS {} MiB); \
                 stderr: {}",
                run.max_rss_kib >> 10,
                run.stderr
            );
            return run;
        }
        if !killed && start.elapsed() > limit {
            // SAFETY: plain system call on our own (not yet reaped) child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
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

/// The run failed as a hostile server should make it fail: exit status 1,
/// no checksum, no panic, the URL and every word of `reason` in the
/// message, within `within`.
fn assert_refused(run: &Run, url: &str, reason: &[&str], within: Duration) {
    let err = &run.stderr;
    assert_eq!(run.status.code(), Some(1), "{err}");
    assert!(run.stdout.is_empty(), "checksum printed: {}", run.stdout);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains(url), "no URL in: {err}");
    for r in reason {
        assert!(err.contains(r), "no '{r}' in: {err}");
    }
    assert!(
        run.elapsed < within,
        "took {:?} (limit {within:?}): {err}",
        run.elapsed
    );
}

/// Peak memory allowed to a run against a hostile server: the program and
/// its buffers, nothing that grows with what the server sends.
const RSS_LIMIT_KIB: i64 = 256 << 10;

#[test]
fn the_harness_serves_a_correct_export() {
    let data = content(3 << 20);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.raw");
    std::fs::write(&file, &data).unwrap();
    let srv = Hostile::start(data, Misbehave::Nothing);
    let run = run_limited(&[&srv.url], Duration::from_secs(60));
    assert!(run.status.success(), "{}", run.stderr);
    let expect = common::nbd::nbd_sum(&[file.to_str().unwrap()]);
    assert_eq!(run.stdout.split_once("  ").unwrap().0, expect);
}

#[test]
fn one_byte_block_sizes_are_refused() {
    // min = preferred = max = 1 would mean a request per byte.
    let srv = Hostile::start(content(4 << 20), Misbehave::BlockSizes(1, 1, 1));
    let run = run_limited(&[&srv.url], Duration::from_secs(30));
    assert_refused(
        &run,
        &srv.url,
        &["block size", "maximum"],
        Duration::from_secs(10),
    );
    assert!(run.max_rss_kib < RSS_LIMIT_KIB, "{} KiB", run.max_rss_kib);
}

#[test]
fn small_block_sizes_keep_requests_in_flight_bounded() {
    // 512-byte requests are legal: the export is read right, with a
    // bounded number of requests waiting at once (2048 per MiB otherwise).
    let data = content(2 << 20);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.raw");
    std::fs::write(&file, &data).unwrap();
    let srv = Hostile::start(data, Misbehave::BlockSizes(512, 512, 512));
    let run = run_limited(&[&srv.url], Duration::from_secs(120));
    assert!(run.status.success(), "{}", run.stderr);
    let expect = common::nbd::nbd_sum(&[file.to_str().unwrap()]);
    assert_eq!(run.stdout.split_once("  ").unwrap().0, expect);
    let requests = srv.stats.requests.load(std::sync::atomic::Ordering::SeqCst);
    let in_flight = srv
        .stats
        .max_in_flight
        .load(std::sync::atomic::Ordering::SeqCst);
    assert!(requests >= 4096, "{requests} requests");
    assert!(in_flight <= 64, "{in_flight} requests in flight at once");
}

#[test]
fn endless_info_replies_are_an_error() {
    let srv = Hostile::start(content(1 << 20), Misbehave::EndlessInfo);
    let run = run_limited(&[&srv.url], Duration::from_secs(30));
    assert_refused(
        &run,
        &srv.url,
        &["NBD_OPT_GO", "replies"],
        Duration::from_secs(10),
    );
    assert!(run.max_rss_kib < RSS_LIMIT_KIB, "{} KiB", run.max_rss_kib);
}

#[test]
fn endless_meta_context_replies_are_an_error() {
    let srv = Hostile::start(content(1 << 20), Misbehave::EndlessMetaContext);
    let run = run_limited(&[&srv.url], Duration::from_secs(30));
    assert_refused(
        &run,
        &srv.url,
        &["NBD_OPT_SET_META_CONTEXT", "replies"],
        Duration::from_secs(10),
    );
    assert!(run.max_rss_kib < RSS_LIMIT_KIB, "{} KiB", run.max_rss_kib);
}

#[test]
fn a_silent_handshake_times_out_naming_the_stage() {
    let srv = Hostile::start(content(1 << 20), Misbehave::SilentHandshake);
    let run = run_limited(&["--timeout", "2", &srv.url], Duration::from_secs(30));
    assert_refused(
        &run,
        &srv.url,
        &["timed out after 2 s", "NBD_OPT_STRUCTURED_REPLY"],
        Duration::from_secs(8),
    );
}

#[test]
fn a_trickling_handshake_times_out() {
    // One byte a second never leaves the socket silent for 2 s.
    let srv = Hostile::start(content(1 << 20), Misbehave::TrickleGo);
    let run = run_limited(&["--timeout", "2", &srv.url], Duration::from_secs(40));
    assert_refused(
        &run,
        &srv.url,
        &["timed out after 2 s", "NBD_OPT_GO"],
        Duration::from_secs(8),
    );
}

#[test]
fn a_trickling_reply_times_out() {
    let srv = Hostile::start(content(1 << 20), Misbehave::TrickleRead);
    let run = run_limited(&["--timeout", "2", &srv.url], Duration::from_secs(40));
    assert_refused(
        &run,
        &srv.url,
        &["timed out after 2 s", "reply"],
        Duration::from_secs(8),
    );
}

#[test]
fn a_silent_reply_times_out() {
    let srv = Hostile::start(content(1 << 20), Misbehave::SilentRead);
    let run = run_limited(&["--timeout", "2", &srv.url], Duration::from_secs(40));
    assert_refused(
        &run,
        &srv.url,
        &["timed out after 2 s", "reply"],
        Duration::from_secs(8),
    );
}

#[test]
fn a_malformed_reply_is_an_error() {
    let srv = Hostile::start(content(1 << 20), Misbehave::BadReplyMagic);
    let run = run_limited(&[&srv.url], Duration::from_secs(30));
    assert_refused(
        &run,
        &srv.url,
        &["malformed", "magic"],
        Duration::from_secs(10),
    );
}
