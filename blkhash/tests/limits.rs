//! The limits of the system and of the construction: a worker thread that
//! cannot start, a length past 2^64 bytes. Both are errors the caller can
//! handle, never a hang, an abort or a wrapped length.

use blkhash::{Algorithm, Hasher, Options, OptionsError, Pipeline};

/// Set in the child that [`worker_threads_that_cannot_start`] runs under a
/// thread limit: the test then runs the child's half.
const CHILD: &str = "BLKHASH_TEST_THREAD_LIMIT_CHILD";

/// Under a limit of 4 tasks, a pool of 8 workers cannot start: the
/// constructors return `OptionsError::ThreadStart` (EAGAIN), the workers
/// that did start are stopped, and a hasher that fits the limit then works.
/// The test binary runs itself as the child, as a user of its own (root
/// ignores the limit).
#[test]
fn worker_threads_that_cannot_start() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let exe = std::env::current_exe().unwrap();
    let Some(mut cmd) = testkit::tools::thread_limited(&exe, 64_001, 4) else {
        return;
    };
    let out = cmd
        .args(["--exact", "worker_threads_that_cannot_start", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("child: ok"),
        "{}\n{stdout}\n{stderr}",
        out.status
    );
}

fn child() {
    let opts = Options::new().threads(8);
    match Pipeline::<Vec<u8>>::new(opts.clone()) {
        Err(OptionsError::ThreadStart { errno }) => assert_eq!(errno, Some(libc_eagain())),
        other => panic!("Pipeline::new: {other:?}"),
    }
    let e = Hasher::with_options(opts).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot start a digest thread: Resource temporarily unavailable (os error 11)"
    );
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::WouldBlock);
    // The workers that started were stopped: a hasher of one worker fits.
    // (A thread leaves the count just after it is joined: a moment's grace.)
    let mut tries = 0;
    let mut h = loop {
        match Hasher::with_options(Options::new().threads(1)) {
            Ok(h) => break h,
            Err(e) if tries < 100 => {
                tries += 1;
                eprintln!("retry: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("threads left running: {e}"),
        }
    };
    h.update(b"hello");
    assert_eq!(
        h.finalize(),
        blkhash::checksum_of(Algorithm::Sha256, 65536, b"hello")
    );
    println!("child: ok");
}

/// EAGAIN on Linux, where these tests run.
fn libc_eagain() -> i32 {
    11
}

/// Runs `f` and returns its panic message, if it panicked.
fn panic_message(f: impl FnOnce()) -> Option<String> {
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    r.err().map(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()
    })
}

/// A checksum covers at most 2^64 - 1 bytes (its length is a le64): one
/// more panics with the reason, before anything is added, instead of
/// wrapping to a short length. The null digest with 64 MiB blocks makes
/// 2^64 bytes of zeros quick to hash.
#[test]
fn length_past_two_to_the_64_panics() {
    let opts = Options::new()
        .algorithm(Algorithm::Null)
        .block_size(64 << 20)
        .threads(1);
    let mut h = Hasher::with_options(opts.clone()).unwrap();
    h.update(b"x");
    let msg = panic_message(|| h.update_zeros(u64::MAX)).expect("update_zeros(u64::MAX) panics");
    assert!(msg.contains("2^64"), "{msg}");

    // Up to the limit exactly is fine, not one byte more, however given.
    let mut h = Hasher::with_options(opts.clone()).unwrap();
    h.update(b"x");
    h.update_zeros(u64::MAX - 1);
    assert_eq!(h.len(), u64::MAX);
    assert!(panic_message(|| h.update(b"y")).is_some());
    assert!(panic_message(|| h.update_zeros(1)).is_some());
    assert_eq!(h.len(), u64::MAX);
    h.update_zeros(0);
    h.update(b"");

    let mut p: Pipeline = Pipeline::new(opts).unwrap();
    p.update_zeros(u64::MAX - 4095);
    assert!(panic_message(|| p.submit(vec![1u8; 8192])).is_some());
    assert!(
        panic_message(|| {
            let _ = p.submit_with(
                8192,
                Box::new(|b| {
                    b.fill(1);
                    Ok(())
                }),
            );
        })
        .is_some()
    );
    assert_eq!(p.len(), u64::MAX - 4095);
}
