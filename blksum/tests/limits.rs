//! blksum at the system's limits: threads that cannot start are an error
//! naming the input and the reason (exit 1, no panic), and memory stays
//! within its budget whatever the depths and read size asked for.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BLKSUM: &str = env!("CARGO_BIN_EXE_blksum");

/// A scratch directory another user can read (the thread-limited runs are
/// not root), with `name`: `size` bytes, `data` of them written at the
/// start (random, so nothing in it is a zero block) and the rest a hole.
fn image(dir: &Path, name: &str, size: u64, data: usize) -> PathBuf {
    use std::io::Write;
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = data;
    while left > 0 {
        for b in buf.chunks_exact_mut(8) {
            // xorshift64: cheap bytes that never make a zero block.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len());
        f.write_all(&buf[..n]).unwrap();
        left -= n;
    }
    f.set_len(size).unwrap();
    p
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// blksum `args` as user `uid` allowed `nproc` tasks (threads included);
/// None when not root (skipped).
fn limited(uid: u32, nproc: u32, args: &[&str]) -> Option<Output> {
    let mut cmd = testkit::tools::thread_limited(BLKSUM, uid, nproc)?;
    Some(cmd.args(args).stdin(Stdio::null()).output().unwrap())
}

/// Exit 1, nothing on standard output, `want` for every image on standard
/// error, and no panic.
fn assert_refused(out: &Output, images: &[&Path], want: &str) {
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    for img in images {
        let line = format!(
            "blksum: {}: {want}: Resource temporarily unavailable\n",
            img.display()
        );
        assert!(stderr.contains(&line), "want {line:?} in:\n{stderr}");
    }
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

/// No thread at all may start: the digest threads cannot, and blksum says
/// so for the image and exits 1.
#[test]
fn digest_threads_that_cannot_start() {
    let dir = testkit::tools::open_scratch(false);
    let img = image(dir.path(), "a.img", 4 << 20, 1 << 20);
    let s = img.to_str().unwrap();
    let Some(out) = limited(64_201, 1, &[s]) else {
        return;
    };
    assert_refused(&out, &[&img], "cannot start a digest thread");
    // Some start (the signal thread, a worker), the next does not.
    let out = limited(64_202, 3, &["-t", "4", s]).unwrap();
    assert_refused(&out, &[&img], "cannot start a digest thread");
}

/// The digest thread starts, the reading threads (`--io-depth`) cannot.
#[test]
fn reading_threads_that_cannot_start() {
    let dir = testkit::tools::open_scratch(false);
    let img = image(dir.path(), "a.img", 4 << 20, 1 << 20);
    let s = img.to_str().unwrap();
    // blksum, its signal thread and one digest thread.
    let Some(out) = limited(64_203, 3, &["-t", "1", "--io-depth", "8", s]) else {
        return;
    };
    assert_refused(&out, &[&img], "cannot start a reading thread");
}

/// `--jobs`: threads for inputs that cannot start leave the inputs to
/// the main thread, where each fails on its own digest threads.
#[test]
fn job_threads_that_cannot_start() {
    let dir = testkit::tools::open_scratch(false);
    let a = image(dir.path(), "a.img", 4 << 20, 1 << 20);
    let b = image(dir.path(), "b.img", 4 << 20, 1 << 20);
    let args = ["-j", "4", a.to_str().unwrap(), b.to_str().unwrap()];
    // blksum and its signal thread.
    let Some(out) = limited(64_204, 2, &args) else {
        return;
    };
    assert_refused(&out, &[&a, &b], "cannot start a digest thread");
}

/// An NBD export (qemu-nbd over TCP: no socket file permissions for the
/// other user) whose reader thread cannot start.
#[test]
fn nbd_reader_thread_that_cannot_start() {
    if !testkit::tools::require(&["qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.img", 4 << 20, 1 << 20);
    let srv = testkit::nbd::qemu_nbd(&img, "raw", testkit::nbd::Listen::Tcp, None);
    // blksum and its signal thread.
    let Some(out) = limited(64_205, 2, &[&srv.url]) else {
        return;
    };
    assert_refused(
        &out,
        &[Path::new(&srv.url)],
        "cannot start an NBD reader thread",
    );
}

/// Peak RSS in KiB and standard output of blksum `args`, from GNU time.
pub(crate) fn peak_rss(args: &[&str]) -> (u64, String) {
    let out = Command::new("/usr/bin/time")
        .args(["-f", "%M", BLKSUM])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("GNU time at /usr/bin/time (scripts/setup.sh installs it)");
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let kib = stderr
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no RSS from time: {stderr}"));
    (kib, text(&out.stdout))
}

/// `--io-depth 256 --read-size 64m` would be 2 × 256 reads of 64 MiB in
/// flight, and 16 digest threads reading 64 MiB each would hold a buffer
/// of 64 MiB apiece: the bytes in flight are held to the library's budget
/// (256 MiB) instead, so a 1 GiB image with 768 MiB of data stays far
/// below that in memory (775 MiB before), and its checksum is the default
/// run's.
#[test]
fn deep_queues_of_large_reads_stay_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "big.img", 1 << 30, 768 << 20);
    let s = img.to_str().unwrap();
    let (default_rss, default_sum) = peak_rss(&[s]);
    for args in [
        &["--io-depth", "256", "--read-size", "64m", s][..],
        &["--io-depth", "256", "--read-size", "64m", "--cache", s],
        // Reads on the digest workers: each running read holds a buffer.
        &[
            "--io-depth",
            "0",
            "--read-size",
            "64m",
            "--queue-depth",
            "128",
            "-t",
            "16",
            s,
        ],
    ] {
        let (rss, sum) = peak_rss(args);
        assert_eq!(sum, default_sum, "{args:?}");
        assert!(
            rss < 400 << 10,
            "{args:?}: peak RSS {} MiB (default run: {} MiB)",
            rss >> 10,
            default_rss >> 10
        );
    }
}

/// A sweep of memory limits (`ulimit -v`, 12 to 64 MB) over the ways
/// blksum reads: direct I/O with reading threads, the page cache with
/// `--cache` (copied, not mapped, under such a limit:
/// `RawFile::map_reads`) and `--no-mmap` (workers' buffers), qcow2, and a
/// virtnbdbackup lz4 stream (written by virtnbdbackup's writer; skipped
/// without it). Every run succeeds or fails with the buffer or thread it
/// could not have; the aborts "memory allocation of 1048576 bytes failed"
/// (direct I/O), "of 1052672 bytes" (`--no-mmap --cache`) and "of 54
/// bytes" (mapped reads, at 20 MB only, in about half the runs) were exit
/// 134: hence every megabyte, twice. The lz4 stream aborted at 24 to
/// 48 MB ("of 8389655 bytes": an lz4 frame's compressed bytes; "of 4194304
/// bytes": the lz4 decoder's own block buffer).
#[test]
fn memory_limits_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let raw = image(dir.path(), "disk.raw", 24 << 20, 16 << 20);
    let qcow2 = dir.path().join("disk.qcow2");
    let (r, q) = (raw.to_str().unwrap(), qcow2.to_str().unwrap());
    let made = Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2", r, q])
        .status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("qemu-img missing: test skipped");
        return;
    }
    let want = checksum(r);
    let mut runs: Vec<(Vec<&str>, &str)> = vec![
        (vec![r], &want),
        (vec!["--cache", r], &want),
        (vec!["--cache", "--no-mmap", r], &want),
        (vec![q], &want),
        (vec!["--cache", "--no-mmap", q], &want),
    ];
    let lz4 = lz4_stream(dir.path());
    if let Some((stream, want)) = &lz4 {
        runs.push((vec![stream.to_str().unwrap()], want));
    }
    for mb in 12..=64 {
        for (args, want) in runs.iter().chain(&runs) {
            testkit::tools::assert_clean_under_memory_limit(BLKSUM, mb * 1000, args, want);
        }
    }
}

/// The checksum blksum prints for `image`.
fn checksum(image: &str) -> String {
    let out = Command::new(BLKSUM).arg(image).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)[..64].to_string()
}

/// An lz4-compressed virtnbdbackup stream of 24 MiB holding 16 MiB of
/// data (one lz4 frame of 16 MiB: 8 MiB of text in compressed blocks, then
/// 8 MiB of random bytes stored as they are), in `dir`, and the checksum
/// of the raw file it holds; `None` without virtnbdbackup's writer.
fn lz4_stream(dir: &Path) -> Option<(PathBuf, String)> {
    let py = testkit::vnbd::writer()?;
    let raw = dir.join("text.raw");
    testkit::Recipe::parse("8m:t 8m:r 8m:-")
        .unwrap()
        .write_image(&raw)
        .unwrap();
    let stream = dir.join("sda.full.data");
    testkit::vnbd::write_stream(&py, &raw, &stream, &["--compress", "2"]);
    Some((stream, checksum(raw.to_str().unwrap())))
}
