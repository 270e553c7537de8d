//! blkmap, blkdiff and blksync when the system will not start a thread
//! (RLIMIT_NPROC, as a user of its own: root ignores the limit): an error
//! naming the input and the reason, their trouble exit status, no panic.

use crate::common;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

/// A file of `data` bytes of 0x5a then a hole up to 4 MiB.
fn image(dir: &Path, name: &str, data: usize) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, vec![0x5au8; data]).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    p
}

/// A scratch directory the other user may read and write in.
fn scratch() -> tempfile::TempDir {
    testkit::tools::open_scratch(true)
}

/// `exe args` as user `uid` with only itself and its signal thread
/// allowed: the first thread it needs beyond them cannot start.
fn limited(exe: &str, uid: u32, args: &[&Path]) -> Option<Output> {
    let mut cmd = testkit::tools::thread_limited(exe, uid, 2)?;
    // The other user's temporary files (blkdiff writes an image's map to
    // one) go to the scratch directory it can write, not to the test's
    // private TMPDIR.
    cmd.env(
        "TMPDIR",
        args[0].parent().expect("in the scratch directory"),
    );
    Some(cmd.args(args).stdin(Stdio::null()).output().unwrap())
}

fn assert_refused(out: &Output, prog: &str, code: i32, name: &Path) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{stderr}");
    assert!(
        stderr.contains(&format!("{prog}: {}: cannot start a", name.display()))
            && stderr.contains("thread: Resource temporarily unavailable"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn blkmap_threads_that_cannot_start() {
    let dir = scratch();
    let a = image(dir.path(), "a.img", 1 << 20);
    let out = dir.path().join("a.map");
    let Some(r) = limited(env!("CARGO_BIN_EXE_blkmap"), 64_401, &[&a, &out]) else {
        return;
    };
    assert_refused(&r, "blkmap", 1, &a);
    assert!(!out.exists());
}

/// Both sides are hashed at once, on a thread of their own for A: when it
/// cannot start, one after the other, each then failing on its digest
/// threads.
#[test]
fn blkdiff_threads_that_cannot_start() {
    let dir = scratch();
    let a = image(dir.path(), "a.img", 1 << 20);
    let b = image(dir.path(), "b.img", 2 << 20);
    let Some(r) = limited(env!("CARGO_BIN_EXE_blkdiff"), 64_402, &[&a, &b]) else {
        return;
    };
    assert_refused(&r, "blkdiff", 2, &a);
}

/// A first copy (DST new) runs on copy workers that cannot start.
#[test]
fn blksync_threads_that_cannot_start() {
    let dir = scratch();
    let src = image(dir.path(), "src.img", 1 << 20);
    let dst = dir.path().join("dst.img");
    let Some(r) = limited(env!("CARGO_BIN_EXE_blksync"), 64_403, &[&src, &dst]) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot start a copy thread: Resource temporarily unavailable"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// blkdiff of two equal files under a sweep of memory limits (`ulimit -v`,
/// 12 to 64 MB, every megabyte), with reading threads and through the page
/// cache: exit 0, or its trouble status with the buffer or thread it could
/// not have, never an abort ("memory allocation of 3232 bytes failed" at
/// 36-48 MB, "of 32768 bytes" at 15 MB: two reads and two digests at once).
#[test]
fn blkdiff_under_memory_limits() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.raw");
    let b = dir.path().join("b.raw");
    let data: Vec<u8> = (0..16u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(&a, &data).unwrap();
    std::fs::write(&b, &data).unwrap();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    for mb in 12..=64 {
        for args in [&[a, b][..], &["--cache", a, b]] {
            testkit::tools::assert_clean_under_memory_limit(common::BLKDIFF, mb * 1000, args, "");
        }
    }
}

/// blkmap under a sweep of memory limits (`ulimit -v`, 12 to 64 MB, every
/// megabyte), with reading threads, through the page cache (`--cache`:
/// copied under such a limit, not mapped) and with workers' buffers
/// (`--cache --no-mmap`): a map written, or exit 1 with the buffer or
/// thread it could not have, never an abort.
#[test]
fn blkmap_under_memory_limits() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("disk.raw");
    std::fs::write(&raw, vec![0x5au8; 16 << 20]).unwrap();
    let map = dir.path().join("disk.map");
    let (r, m) = (raw.to_str().unwrap(), map.to_str().unwrap());
    let out = std::process::Command::new(common::BLKMAP)
        .args([r, m])
        .output()
        .unwrap();
    assert!(out.status.success());
    let want = String::from_utf8_lossy(&out.stdout)[..64].to_string();
    for mb in 12..=64 {
        for args in [
            &[r, m][..],
            &["--cache", r, m],
            &["--cache", "--no-mmap", r, m],
        ] {
            testkit::tools::assert_clean_under_memory_limit(common::BLKMAP, mb * 1000, args, &want);
        }
    }
}
