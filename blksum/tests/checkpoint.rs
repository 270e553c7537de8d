//! `blksum --checkpoint FILE`: runs killed with SIGKILL at random moments
//! (some while saving), each started again with the same FILE, end with the
//! checksum of one whole run, having read little more than the image once;
//! Ctrl-C keeps the progress; a FILE of another image, digest or block
//! size, a changed image, or a damaged or foreign FILE is refused, saying
//! why and how to start over.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use testkit::Rng;
use testkit::nbd::{Listen, nbdkit};

fn spawn(args: &[&str]) -> Child {
    blksum()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Kill `child` with SIGKILL after `after`, unless it ended first: whether
/// it was killed.
fn kill_after(mut child: Child, after: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < after {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    true
}

/// The checksum on a successful run's output.
fn sum_of(args: &[&str]) -> String {
    let out = run(args, None);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout(&out).split_whitespace().next().unwrap().to_string()
}

/// Bytes of the Read requests an nbdkit log filter logged.
fn bytes_read(log: &Path) -> u64 {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter(|l| l.contains(" Read id="))
        .map(|l| {
            let count = l.split("count=0x").nth(1).unwrap();
            let hex: String = count.chars().take_while(char::is_ascii_hexdigit).collect();
            u64::from_str_radix(&hex, 16).unwrap()
        })
        .sum()
}

#[test]
fn killed_ten_times_over_nbd_ends_right_having_read_the_image_about_once() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let log = dir.path().join("log");
    let size: u64 = 2 << 30;
    // Random data (every byte is data) served slowly enough that a run
    // takes a few seconds: 4 ms per read request.
    let srv = nbdkit(
        Listen::Unix(&sock),
        &[
            "--filter=log",
            "--filter=delay",
            "random",
            "size=2G",
            "seed=7",
            &format!("logfile={}", log.display()),
            "rdelay=4ms",
        ],
    );
    let want = sum_of(&[&srv.url]);
    let before = bytes_read(&log);
    assert_eq!(before, size, "one run reads the image once");

    let ck = dir.path().join("ck");
    let args = [
        "--checkpoint",
        ck.to_str().unwrap(),
        "--checkpoint-interval",
        "0.01",
        &srv.url,
    ];
    let mut rng = Rng(0x5eed_1234_abcd);
    let mut killed = 0;
    let mut progress = Vec::new();
    for _ in 0..10 {
        let after = Duration::from_millis(200 + rng.below(400));
        killed += kill_after(spawn(&args), after) as u32;
        let covered = blkmap::MapReader::new(std::fs::File::open(&ck).unwrap())
            .map(|r| r.header().range.len)
            .unwrap_or(0);
        progress.push(covered);
    }
    assert_eq!(killed, 10, "every run was killed before it ended");
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "{progress:?}");
    assert!(progress[9] > 0, "the runs made progress: {progress:?}");
    let out = run(&args, None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{want}  {}\n", srv.url));
    assert!(
        stderr(&out).contains(&format!("resumed at byte {}", progress[9])),
        "{}",
        stderr(&out)
    );
    assert!(!ck.exists(), "the checkpoint is removed on success");
    let read = bytes_read(&log) - before;
    let ratio = read as f64 / size as f64;
    eprintln!(
        "11 runs (10 killed) read {read} bytes: {ratio:.3}x the image; progress {progress:?}"
    );
    assert!(ratio <= 1.1, "read {ratio:.3}x the image's data");
}

#[test]
fn sigkill_at_any_moment_leaves_a_checkpoint_the_next_run_finishes() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.qcow2");
    testkit::tools::image_with(
        &img,
        "qcow2",
        96 << 20,
        &[
            "write -P 1 0 30M",
            "write -z 30M 2M",
            "write -P 2 40M 30M",
            "write -P 3 95M 64k",
        ],
    );
    let want = sum_of(&["--block-size", "4k", img.to_str().unwrap()]);
    let ck = dir.path().join("ck");
    // Saves as often as they can: kills land in saves too.
    let args = [
        "--block-size",
        "4k",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--checkpoint-interval",
        "0.001",
        img.to_str().unwrap(),
    ];
    let mut rng = Rng(99);
    let mut killed = 0;
    for _ in 0..25 {
        killed += kill_after(spawn(&args), Duration::from_millis(rng.below(60))) as u32;
    }
    assert!(killed >= 20, "only {killed} of 25 runs were killed");
    let out = run(&args, None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).split_whitespace().next(), Some(want.as_str()));
    // Nothing left behind: no checkpoint, no temporary file of a killed save.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "disk.qcow2")
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn ctrl_c_keeps_the_progress_and_keep_checkpoint_leaves_the_map() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let srv = nbdkit(
        Listen::Unix(&sock),
        &[
            "--filter=delay",
            "random",
            "size=256M",
            "seed=3",
            "rdelay=10ms",
        ],
    );
    let want = sum_of(&[&srv.url]);
    let ck = dir.path().join("ck");
    let ck_s = ck.to_str().unwrap();
    let args = [
        "--checkpoint",
        ck_s,
        "--checkpoint-interval",
        "60",
        &srv.url,
    ];
    let child = spawn(&args);
    std::thread::sleep(Duration::from_millis(700));
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert_eq!(stdout(&out), "", "no checksum for an interrupted run");
    let saved = std::fs::File::open(&ck).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
    let covered = blkmap::MapReader::new(saved).unwrap().header().range.len;
    assert!(
        covered > 0,
        "Ctrl-C saved what was hashed (no save was due for 60 s)"
    );

    let mut keep = args.to_vec();
    keep.insert(0, "--keep-checkpoint");
    let out = run(&keep, None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{want}  {}\n", srv.url));
    assert!(stderr(&out).contains(&format!("resumed at byte {covered} of 268435456")));
    // The kept file is the whole map: blkmap reads it, and a run given it
    // again finishes without hashing (and removes it).
    let map = blkmap::Map::load(&ck).unwrap();
    assert_eq!(map.checksum_hex(), want);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_blksum"))
        .args([&args[..], &["--json"]].concat())
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let input = &doc["inputs"][0];
    assert_eq!(input["checksum"], want.as_str(), "{doc}");
    assert_eq!(input["data-bytes"], 0, "nothing read: {doc}");
    assert!(!ck.exists());
}

#[test]
fn a_checkpoint_of_something_else_is_refused_saying_why() {
    if !require(&["qemu-img", "qemu-io", "nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = d.join("a.raw");
    testkit::tools::image_with(&img, "raw", 8 << 20, &["write -P 1 0 8M"]);
    let img_s = img.to_str().unwrap();
    let ck = d.join("ck");
    let ck_s = ck.to_str().unwrap();
    // A complete checkpoint of a.raw, kept.
    let out = run(&["--checkpoint", ck_s, "--keep-checkpoint", img_s], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let good = std::fs::read(&ck).unwrap();
    let refused = |args: &[&str], why: &str| {
        let out = run(args, None);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(why), "{args:?}: {err}\nwant: {why}");
        assert!(err.contains("remove it to start over"), "{err}");
        assert_eq!(stdout(&out), "");
        assert_eq!(std::fs::read(&ck).unwrap(), good, "FILE left as it was");
    };
    refused(
        &["--checkpoint", ck_s, "-d", "blake3", img_s],
        "a checkpoint of sha256 digests of 65536-byte blocks, not blake3 of 65536-byte blocks",
    );
    refused(
        &["--checkpoint", ck_s, "--block-size", "4k", img_s],
        "not sha256 of 4096-byte blocks",
    );
    let other = d.join("b.raw");
    std::fs::copy(&img, &other).unwrap();
    refused(
        &["--checkpoint", ck_s, other.to_str().unwrap()],
        "it is another file or device than the one the checkpoint was saved for",
    );
    // Damage.
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 40] ^= 1;
    std::fs::write(&ck, &bad).unwrap();
    let out = run(&["--checkpoint", ck_s, img_s], None);
    assert!(
        stderr(&out).contains("not a usable checkpoint: damaged block map"),
        "{}",
        stderr(&out)
    );
    std::fs::write(&ck, &good).unwrap();
    testkit::tools::qemu_io(&img, "raw", &["write -P 9 1M 4k"]);
    refused(
        &["--checkpoint", ck_s, img_s],
        "it was written after the checkpoint was saved",
    );
    // A map without a record of its image, a file that is no map.
    std::fs::remove_file(&ck).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_blksum"))
        .args(["--checkpoint", ck_s, "--keep-checkpoint", img_s])
        .output()
        .unwrap();
    assert!(out.status.success());
    let map = d.join("plain.map");
    let plain = blkmap::Map::load(&ck).unwrap();
    plain.save(&map).unwrap();
    let out = run(&["--checkpoint", map.to_str().unwrap(), img_s], None);
    assert!(
        stderr(&out).contains("a block map with no record of its image"),
        "{}",
        stderr(&out)
    );
    let text = d.join("notes.txt");
    std::fs::write(&text, b"my notes").unwrap();
    let out = run(&["--checkpoint", text.to_str().unwrap(), img_s], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("is not a checkpoint: not replaced"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read(&text).unwrap(), b"my notes");

    // An export is known by its size and sampled blocks: another export
    // of the same size fails the samples.
    let sock = d.join("nbd.sock");
    let a = nbdkit(Listen::Unix(&sock), &["random", "size=16M", "seed=1"]);
    let nck = d.join("nck");
    let nck_s = nck.to_str().unwrap();
    let out = run(&["--checkpoint", nck_s, "--keep-checkpoint", &a.url], None);
    assert!(out.status.success(), "{}", stderr(&out));
    drop(a);
    let sock2 = d.join("nbd2.sock");
    let b = nbdkit(Listen::Unix(&sock2), &["random", "size=16M", "seed=2"]);
    let out = run(&["--checkpoint", nck_s, &b.url], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("block 0 of the image is not the block the checkpoint recorded"),
        "{}",
        stderr(&out)
    );
    // Usage: one image, not standard input.
    for args in [
        &["--checkpoint", ck_s][..],
        &["--checkpoint", ck_s, img_s, img_s],
        &["--checkpoint", ck_s, "-"],
    ] {
        let out = run(args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&out).contains("--checkpoint takes one image"),
            "{}",
            stderr(&out)
        );
    }
}
