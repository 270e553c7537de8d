//! `blksum --checkpoint FILE`: runs killed with SIGKILL at random moments
//! (some while saving), each started again with the same FILE, end with the
//! checksum of one whole run, having read little more than the image once;
//! Ctrl-C keeps the progress; a FILE of another image, digest or block
//! size, a changed image, or a damaged or foreign FILE is refused, saying
//! why and how to start over.
//!
//! Runs are stopped at points the test sees them reach (a save on disk, a
//! save's temporary file, a percentage on `--progress=3`), never after a
//! sleep: the same points are hit on a fast machine and on a loaded one.

use crate::common;

use common::progress::{PROGRESS_LIMIT, spawn_with_progress};
use common::*;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Output, Stdio};
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

/// Poll `child` until `now()` holds, then kill it with SIGKILL. A run that
/// ends by itself first (done, or failed) fails the test with its error
/// output, and so does one that never gets to `now()`.
fn kill_when(child: Child, now: impl FnMut() -> bool) {
    if let Err(out) = kill_or_end(child, now) {
        panic!(
            "the run ended by itself ({}) before it was killed: {}",
            out.status,
            stderr(&out)
        );
    }
}

/// [`kill_when`], but a run may also end by itself first: its output
/// then. (On a busy machine the test may be descheduled between seeing
/// the point and sending the signal, while the run goes on.)
fn kill_or_end(mut child: Child, mut now: impl FnMut() -> bool) -> Result<(), Output> {
    let deadline = Instant::now() + PROGRESS_LIMIT;
    while !now() {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the run never reached its kill point"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    // A run that ended is not signalled (std knows it reaped it): its
    // status tells.
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    match out.status.signal() {
        Some(libc::SIGKILL) => Ok(()),
        _ => Err(out),
    }
}

/// Bytes the checkpoint `ck` covers (0 while there is none).
fn covered(ck: &Path) -> u64 {
    match std::fs::File::open(ck) {
        Ok(f) => {
            blkmap::MapReader::new(f)
                .unwrap_or_else(|e| panic!("{}: {e}", ck.display()))
                .header()
                .range
                .len
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => panic!("{}: {e}", ck.display()),
    }
}

/// Whether process `pid` has a save of the checkpoint `ck` in flight: its
/// temporary file (`.NAME.tmp-PID-N`, next to `ck`) exists.
fn saving(ck: &Path, pid: u32) -> bool {
    let prefix = format!(".{}.tmp-{pid}-", ck.file_name().unwrap().to_str().unwrap());
    std::fs::read_dir(ck.parent().unwrap())
        .unwrap()
        .flatten()
        .any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
        })
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
    // takes a few seconds: 4 ms per read request. One server thread per
    // connection: nbdkit 1.32 (Debian 12's) aborts ("raw_send_socket:
    // Assertion `sock >= 0' failed") when a client it serves on several
    // threads is killed - the thread that reads the reset closes the
    // socket while another still sends a reply - and this test kills
    // clients on purpose (reproduced by hand within 2 kills; none in 40
    // with --threads=1).
    let srv = nbdkit(
        Listen::Unix(&sock),
        &[
            "--threads=1",
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
    // Reads on the digest threads, not 16 MiB in flight: what a killed run
    // read after its last save is read again, and the bound below is 10%.
    let args = [
        "--io-depth",
        "0",
        "--checkpoint",
        ck.to_str().unwrap(),
        "--checkpoint-interval",
        "0.01",
        &srv.url,
    ];
    let mut progress = Vec::new();
    let mut at = 0;
    for _ in 0..10 {
        // Killed once a save of its own is on disk (the checkpoint covers
        // more than when it started): each run moves the checkpoint on,
        // and the 2 GiB are far from hashed by 10 such runs, however fast
        // the machine. What it read after that save is read again.
        kill_when(spawn(&args), || covered(&ck) > at);
        at = covered(&ck);
        progress.push(at);
    }
    assert!(
        progress[0] > 0 && progress.windows(2).all(|w| w[0] < w[1]),
        "every run made progress: {progress:?}"
    );
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
    // Saves as often as they can (a save takes at most about a tenth of
    // the time): kills land in saves too.
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
    // 25 runs killed at points of three kinds, then, until one run was
    // killed in the middle of a save, more aimed at saves. Every kill
    // comes before 35% is passed on to the digest workers: the rest, 30
    // MiB of data to read and hash, cannot be done before the kill lands,
    // so no run ends by itself.
    let (mut runs, mut in_save) = (0, 0);
    while runs < 25 || (in_save == 0 && runs < 100) {
        let (child, mut progress) = spawn_with_progress(
            blksum()
                .args(args)
                .arg("--progress=3")
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        let pid = child.id();
        let killed = match if runs < 25 { rng.below(3) } else { 1 } {
            // At once: starting, opening the image, checking the checkpoint.
            0 => kill_or_end(child, || true),
            // In a save: its temporary file is there.
            1 => kill_or_end(child, || {
                saving(&ck, pid) || progress.poll().is_some_and(|p| p >= 35)
            }),
            // Hashing, at a random percentage (at once if the checkpoint
            // already covers it).
            _ => {
                let at = rng.below(35) as u32;
                kill_or_end(child, || progress.poll().is_some_and(|p| p >= at))
            }
        };
        // A run the busy test saw too late to kill ended by itself: then it
        // ended right, and the next run starts over.
        if let Err(out) = killed {
            assert!(out.status.success(), "{}", stderr(&out));
        }
        in_save += saving(&ck, pid) as u32;
        runs += 1;
    }
    assert!(in_save > 0, "none of {runs} runs was killed while saving");
    eprintln!("{runs} runs killed, {in_save} of them in a save");
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
    let (child, mut progress) = spawn_with_progress(
        blksum()
            .args(args)
            .arg("--progress=3")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    // Ctrl-C once 20% is passed on (handlers are installed, and there is
    // something to save), however long that takes: 51 MiB, more than the
    // reads in flight (16 of 1 MiB) and the jobs queued for the digest
    // workers (16) hold, so some blocks are hashed.
    assert!(progress.wait_for(20), "the run ended before 20%");
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
    assert_eq!(map.checksum().to_hex(), want);
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
        "it changed after the checkpoint was saved (its times",
    );
    // A map without a record of its image, a file that is no map.
    std::fs::remove_file(&ck).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_blksum"))
        .args(["--checkpoint", ck_s, "--keep-checkpoint", img_s])
        .output()
        .unwrap();
    assert!(out.status.success());
    let map = d.join("plain.map");
    // As maps were written before they recorded their image.
    let plain = blkmap::Map::load(&ck).unwrap().with_identity(None).unwrap();
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

    // An export is known by its address, name, size and sampled data
    // blocks: other data of the same size at the same address fails the
    // samples (another address is refused as such: checkpoint_record.rs).
    let sock = d.join("nbd.sock");
    let a = nbdkit(Listen::Unix(&sock), &["random", "size=16M", "seed=1"]);
    let nck = d.join("nck");
    let nck_s = nck.to_str().unwrap();
    let out = run(&["--checkpoint", nck_s, "--keep-checkpoint", &a.url], None);
    assert!(out.status.success(), "{}", stderr(&out));
    drop(a);
    let b = nbdkit(Listen::Unix(&sock), &["random", "size=16M", "seed=2"]);
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
