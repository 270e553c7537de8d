//! The command as a user runs it: several inputs, standard input, errors,
//! exit statuses, signals, a huge sparse file, a block device.

use crate::common;

use common::*;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const DATA: &str = "1m:r 1m:- 1m:0 1m:t 100000:r";

fn sum_of(path: &std::path::Path, extra: &[&str]) -> String {
    let mut args = extra.to_vec();
    args.push(path.to_str().unwrap());
    let out = run(&args, None);
    assert!(out.status.success(), "{}", stderr(&out));
    stdout(&out)
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

#[test]
fn several_inputs_in_order_with_stdin() {
    let dir = tempfile::tempdir().unwrap();
    // Sizes that are multiples of 512: a pipe and a path agree.
    let a = image(dir.path(), "a.img", "1m:r 1m:- 1m:t 1536:B");
    let b = image(dir.path(), "b.img", "64k:A 64k:-");
    let (sa, sb) = (sum_of(&a, &[]), sum_of(&b, &[]));
    assert_ne!(sa, sb);
    let (pa, pb) = (a.to_str().unwrap(), b.to_str().unwrap());
    // "-" is standard input, wherever it stands.
    let out = run(&[pb, "-", pa], Some(&b));
    assert!(out.status.success());
    assert_eq!(stdout(&out), format!("{sb}  {pb}\n{sb}  -\n{sa}  {pa}\n"));
    // No FILE: standard input.
    let out = run(&[], Some(&a));
    assert_eq!(stdout(&out), format!("{sa}  -\n"));
    // Otherwise a pipe has the exact length, a file QEMU's (rounded up to 512).
    let odd = image(dir.path(), "odd.img", "1000:r");
    let piped = stdout(&run(&[], Some(&odd)));
    assert_ne!(piped.split_whitespace().next().unwrap(), sum_of(&odd, &[]));
}

#[test]
fn errors_name_the_input_and_the_others_are_still_hashed() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", DATA);
    let pa = a.to_str().unwrap();
    let missing = dir.path().join("missing.img");
    let pm = missing.to_str().unwrap();
    let pd = dir.path().to_str().unwrap();
    let out = run(&[pm, pa, pd], None);
    assert_eq!(out.status.code(), Some(1));
    let sa = sum_of(&a, &[]);
    assert_eq!(stdout(&out), format!("{sa}  {pa}\n"));
    let err = stderr(&out);
    assert!(
        err.contains(&format!("blksum: {pm}: No such file or directory")),
        "{err}"
    );
    assert!(
        err.contains(&format!("blksum: {pd}: Is a directory")),
        "{err}"
    );
}

#[test]
fn unreadable_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", "4k:A");
    let mut perms = std::fs::metadata(&a).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o000);
    std::fs::set_permissions(&a, perms).unwrap();
    // Root reads anything: run as nobody then, where setpriv can.
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let mut cmd = if root {
        assert!(
            have("setpriv"),
            "setpriv (util-linux) is needed to drop root"
        );
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        c.arg(env!("CARGO_BIN_EXE_blksum"));
        c
    } else {
        blksum()
    };
    let out = cmd.arg(&a).stdin(Stdio::null()).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).is_empty());
    assert!(
        stderr(&out).contains(&format!("blksum: {}: Permission denied", a.display())),
        "{}",
        stderr(&out)
    );
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &["-d", "sha257", "x"][..],
        &["--block-size", "1000", "x"],
        &["--block-size", "128m", "x"],
        &["--block-size", "lots", "x"],
        &["-t", "0", "x"],
        &["-t", "129", "x"],
        &["--read-size", "100", "x"],
        &["--no-such-option"],
    ] {
        let out = run(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(stdout(&out).is_empty());
        assert!(!stderr(&out).is_empty());
    }
}

#[test]
fn options_do_not_change_the_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", DATA);
    let want = sum_of(&a, &[]);
    for extra in [
        &["--cache"][..],
        &["-t", "1"],
        &["-t", "7", "--queue-depth", "1"],
        &["--read-size", "4k"],
        &["--read-size", "8m", "--queue-depth", "16"],
        &["--block-size", "64k", "--cache", "-p"],
    ] {
        assert_eq!(sum_of(&a, extra), want, "{extra:?}");
    }
    // Block sizes larger than a read still work.
    let big = sum_of(&a, &["--block-size", "4m", "--read-size", "64k"]);
    assert_eq!(big, sum_of(&a, &["--block-size", "4m"]));
}

#[test]
fn list_digests_and_version() {
    let out = run(&["--list-digests"], None);
    assert!(out.status.success());
    let names = stdout(&out);
    for d in ["sha256", "blake3", "md5-sha1", "shake256", "null"] {
        assert!(names.lines().any(|l| l == d), "{d}");
    }
    let out = run(&["--version"], None);
    assert!(stdout(&out).starts_with("blksum "));
    let out = run(&["--help"], None);
    assert!(stdout(&out).contains("--block-size"));
}

/// The reference's contract (its test_list_digests): every name
/// `--list-digests` prints but `null` and `blake3` is one Python's
/// `hashlib.new()` takes, for a digest of the same length; the other
/// spellings blksum takes (hashlib's, blake2b-256) are not printed but
/// taken, and give the same checksum as the listed name.
#[test]
fn listed_digests_are_hashlib_names() {
    if !require(&["python3"]) {
        return;
    }
    let listed = stdout(&run(&["--list-digests"], None));
    let names: Vec<&str> = listed
        .lines()
        .filter(|n| !["null", "blake3"].contains(n))
        .collect();
    let script = "import hashlib, sys\n\
                  for n in sys.argv[1:]:\n    \
                  print(n, hashlib.new(n).digest_size)";
    let py = Command::new("python3")
        .args(["-c", script])
        .args(&names)
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    for line in String::from_utf8_lossy(&py.stdout).lines() {
        let (name, len) = line.split_once(' ').unwrap();
        let alg: blkhash::Algorithm = name.parse().unwrap();
        // SHAKE's length is the caller's there (0).
        assert!(len == "0" || len == alg.output_len().to_string(), "{line}");
    }
    assert!(!listed.lines().any(|n| n == "blake2b-256"), "{listed}");
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.img", DATA);
    for (other, listed) in [
        ("shake_128", "shake128"),
        ("shake_256", "shake256"),
        ("sha512_224", "sha512-224"),
        ("SHA2-256", "sha256"),
    ] {
        assert_eq!(sum_of(&img, &["-d", other]), sum_of(&img, &["-d", listed]));
    }
    assert_eq!(sum_of(&img, &["-d", "blake2b-256"]).len(), 64);
}

/// `--construction imageio` takes only the digests imageio computes: a
/// checksum of another would be one imageio never gives.
#[test]
fn imageio_refuses_digests_imageio_does_not_compute() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.img", DATA);
    let p = img.to_str().unwrap();
    for d in [
        "md5-sha1",
        "ripemd160",
        "sm3",
        "sha512_224",
        "shake_128",
        "blake3",
    ] {
        let out = run(&["--construction", "imageio", "-d", d, p], None);
        assert_eq!(out.status.code(), Some(2), "{d}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("oVirt imageio computes (md5, sha1, "), "{err}");
        assert_eq!(stdout(&out), "");
    }
    // The blkhash construction takes them all; imageio its own names.
    assert_eq!(sum_of(&img, &["-d", "md5-sha1"]).len(), 72);
    let ours = sum_of(&img, &["--construction", "imageio", "-d", "sha3_256"]);
    assert_eq!(
        ours,
        sum_of(&img, &["--construction", "imageio", "-d", "sha3-256"])
    );
}

/// `-h` is a summary (at most 40 lines, pointing at `--help`); `--help`
/// has every option, those `-h` leaves out included.
#[test]
fn short_help_is_a_summary_and_long_help_complete() {
    let short = stdout(&run(&["-h"], None));
    let long = stdout(&run(&["--help"], None));
    assert!(short.lines().count() <= 40, "{short}");
    assert!(short.contains("--help (all of them)"), "{short}");
    for opt in ["--digest", "--check", "--json", "--progress"] {
        assert!(short.contains(opt), "{opt} in -h:\n{short}");
    }
    for opt in [
        "--read-size",
        "--io-depth",
        "--secret-file",
        "--tls-certificates",
    ] {
        assert!(!short.contains(opt), "{opt} in -h:\n{short}");
        assert!(long.contains(opt), "{opt} not in --help:\n{long}");
    }
    assert!(
        long.contains("Image format: raw (the bytes whatever they hold"),
        "{long}"
    );
}

#[test]
fn null_digest_prints_an_empty_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", DATA);
    let out = run(&["-d", "null", a.to_str().unwrap()], None);
    assert_eq!(stdout(&out), format!("  {}\n", a.display()));
}

#[test]
fn names_with_newlines_and_backslashes_are_escaped() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a\\b\nc.img", "4k:A");
    let out = run(&[a.to_str().unwrap()], None);
    let line = stdout(&out);
    assert!(line.starts_with('\\'), "{line:?}");
    assert!(line.ends_with("a\\\\b\\nc.img\n"), "{line:?}");
    assert_eq!(line.lines().count(), 1);
}

#[test]
fn one_tib_sparse_file_in_seconds_with_small_memory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(1 << 40).unwrap();
    // A little data at both ends, so it is not all one hole.
    f.write_all_at_helper(b"start", 0);
    f.write_all_at_helper(b"end", (1 << 40) - 3);
    let start = Instant::now();
    // GNU time's figure: the wait4 of a child spawned from this process
    // counts this process's own peak (the kernel keeps the peak of the
    // memory it replaced at exec: 106 MB seen when other tests ran).
    let (rss_kib, out) = crate::limits::peak_rss(&["-d", "blake3", path.to_str().unwrap()]);
    let took = start.elapsed();
    assert_eq!(out.split_whitespace().count(), 2);
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(
        rss_kib < 64 * 1024,
        "peak RSS {rss_kib} KiB (took {took:?})"
    );
}

trait WriteAt {
    fn write_all_at_helper(&self, data: &[u8], offset: u64);
}

impl WriteAt for std::fs::File {
    fn write_all_at_helper(&self, data: &[u8], offset: u64) {
        std::os::unix::fs::FileExt::write_all_at(self, data, offset).unwrap();
    }
}

#[test]
fn sparse_and_dense_files_with_equal_content_agree() {
    let dir = tempfile::tempdir().unwrap();
    let sparse = image(dir.path(), "s.img", "1m:A 3m:- 1m:B");
    let dense = image(dir.path(), "d.img", "1m:A 3m:0 1m:B");
    assert_eq!(sum_of(&sparse, &[]), sum_of(&dense, &[]));
}

#[test]
fn interrupt_stops_promptly_without_a_checksum() {
    for (sig, code) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let mut child = blksum()
            .args(["-d", "sha3-512"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        // An endless stream of data: only the signal ends the run.
        let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = written.clone();
        let writer = std::thread::spawn(move || {
            let chunk = vec![0x5au8; 1 << 20];
            while stdin.write_all(&chunk).is_ok() {
                count.fetch_add(1 << 20, std::sync::atomic::Ordering::SeqCst);
            }
        });
        // The signal comes once blksum is hashing (it took more than a pipe
        // holds, 1 MiB at most), not after a sleep a slow start outlasts.
        let start = Instant::now();
        while written.load(std::sync::atomic::Ordering::SeqCst) < 8 << 20 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "blksum read nothing"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, sig) };
        let start = Instant::now();
        let out = child.wait_with_output().unwrap();
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
        assert!(stdout(&out).is_empty());
        assert!(stderr(&out).contains("interrupted"));
        writer.join().unwrap();
    }
}

#[test]
fn block_device_equals_its_file() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 || !have("losetup") {
        eprintln!("skipped: needs root and losetup");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", "1m:r 2m:- 1m:t");
    let out = Command::new("losetup")
        .args(["--find", "--show", "--read-only"])
        .arg(&a)
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!("skipped: losetup failed: {}", stderr(&out));
        return;
    }
    let dev = stdout(&out).trim().to_string();
    // Direct I/O with the default reads in flight, none apart from the
    // digest threads, many; and the page cache.
    let runs: Vec<Output> = [
        &[][..],
        &["--io-depth", "0"],
        &["--io-depth", "64", "--read-size", "64k"],
        &["--cache"],
    ]
    .iter()
    .map(|args| run(&[args, &[dev.as_str()][..]].concat(), None))
    .collect();
    let _ = Command::new("losetup").args(["-d", &dev]).status();
    let want = sum_of(&a, &[]);
    for got in runs {
        assert!(got.status.success(), "{}", stderr(&got));
        assert_eq!(stdout(&got), format!("{want}  {dev}\n"));
    }
}

/// `-f virtnbdbackup` names the format `--json` reports for a stream: the
/// stream read as the disk it holds (what probing gives), an error for a
/// file that is no stream or for standard input; `--help` lists it, and
/// blksync does not write it.
#[test]
fn virtnbdbackup_is_a_format_to_name() {
    let dir = tempfile::tempdir().unwrap();
    let seeds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/vnbd");
    let stream = dir.path().join("sda.full.data");
    std::fs::copy(seeds.join("seed-plain"), &stream).unwrap();
    let sp = stream.to_str().unwrap();
    let probed = sum_of(&stream, &[]);
    assert_eq!(sum_of(&stream, &["-f", "virtnbdbackup"]), probed);
    assert_ne!(sum_of(&stream, &["-f", "raw"]), probed);
    let out = run(&["--json", "-f", "virtnbdbackup", sp], None);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["inputs"][0]["format"], "virtnbdbackup");

    let raw = image(dir.path(), "disk.raw", DATA);
    let out = run(&["-f", "virtnbdbackup", raw.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not a virtnbdbackup stream"),
        "{}",
        stderr(&out)
    );
    let out = run(&["-f", "virtnbdbackup"], Some(&stream));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("virtnbdbackup needs random access, not a stream"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&run(&["--help"], None)).contains("virtnbdbackup"));
    let blksync = std::path::Path::new(env!("CARGO_BIN_EXE_blksum")).with_file_name("blksync");
    if blksync.exists() {
        let copy = dir.path().join("copy.data");
        let out = Command::new(&blksync)
            .args(["-O", "virtnbdbackup", sp, copy.to_str().unwrap()])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(!copy.exists());
    }
}
