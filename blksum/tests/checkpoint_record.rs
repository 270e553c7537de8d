//! What a checkpoint must not resume into: an image whose backing file,
//! external data file or vmdk extent changed since it was saved; another
//! NBD export of the same size, or one whose data moved; a second run on
//! the same FILE. And what a save that fails does: said once, naming FILE
//! and the reason, the run going on until the unsaved digests would grow
//! past their bound.

use crate::common;

use common::*;
use std::path::Path;
use std::process::{Child, Stdio};
use testkit::nbd::{Listen, nbdkit};
use testkit::tools::run_ok;

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The checksum of a successful run.
fn sum_of(args: &[&str]) -> String {
    let out = run(args, None);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    stdout(&out).split_whitespace().next().unwrap().to_string()
}

/// A run that must be refused: its standard error.
fn refused(args: &[&str]) -> String {
    let out = run(args, None);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stdout(&out));
    assert!(stdout(&out).is_empty(), "{}", stdout(&out));
    stderr(&out)
}

fn qemu_io(args: &[&str]) {
    run_ok("qemu-io", args, None);
}

/// A checkpoint left whole (`--keep-checkpoint`) is resumed at once by the
/// next run: whatever the record lets through is printed as the checksum.
/// A change to any file the image reads must be refused instead, naming
/// that file; an image left alone resumes to its checksum.
fn refuses_after_changing(image: &Path, format: &str, changed: &Path, dir: &Path) {
    let ck = dir.join(format!("{format}.ck"));
    let args = ["--checkpoint", s(&ck), "--keep-checkpoint", s(image)];
    let first = sum_of(&args);
    // Resumed from a checkpoint of the image as it is: the same checksum.
    assert_eq!(sum_of(&args), first);
    qemu_io(&["-f", "raw", "-c", "write -P 0x5a 65536 65536", s(changed)]);
    let e = refused(&args);
    let name = std::fs::canonicalize(changed).unwrap();
    assert!(
        e.contains(&format!(
            "{} changed after the checkpoint was saved (its times",
            name.display()
        )),
        "{e}"
    );
    assert!(e.contains("remove it to start over"), "{e}");
    // Started over, the new content's checksum.
    std::fs::remove_file(&ck).unwrap();
    let now = sum_of(&args);
    assert_ne!(now, first);
    assert_eq!(now, sum_of(&[s(image)]));
}

#[test]
fn a_changed_backing_file_is_refused() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = d.join("base.raw");
    let overlay = d.join("overlay.qcow2");
    run_ok(
        "qemu-img",
        &["create", "-q", "-f", "raw", s(&base), "4M"],
        None,
    );
    qemu_io(&["-f", "raw", "-c", "write -P 0x11 0 1M", s(&base)]);
    let b = format!("backing_file={},backing_fmt=raw", s(&base));
    run_ok(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-o", &b, s(&overlay)],
        None,
    );
    qemu_io(&["-f", "qcow2", "-c", "write -P 0x22 2M 1M", s(&overlay)]);
    refuses_after_changing(&overlay, "qcow2", &base, d);
}

#[test]
fn a_changed_external_data_file_is_refused() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = d.join("ext.qcow2");
    let data = d.join("ext.data");
    let o = format!("data_file={}", s(&data));
    run_ok(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-o", &o, s(&img), "4M"],
        None,
    );
    qemu_io(&["-f", "qcow2", "-c", "write -P 0x33 0 1M", s(&img)]);
    refuses_after_changing(&img, "qcow2-data", &data, d);
}

#[test]
fn a_changed_vmdk_extent_is_refused() {
    if !require(&["qemu-img", "qemu-io", "qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = d.join("disk.vmdk");
    run_ok(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "vmdk",
            "-o",
            "subformat=monolithicFlat",
            s(&img),
            "4M",
        ],
        None,
    );
    qemu_io(&["-f", "vmdk", "-c", "write -P 0x44 0 1M", s(&img)]);
    let extent = d.join("disk-flat.vmdk");
    assert!(extent.exists());
    refuses_after_changing(&img, "vmdk", &extent, d);
}

/// `nbdkit data` exports of 16 MiB, zeros but for a few bytes at `at`.
fn thin_export(sock: &Path, at: u64) -> testkit::nbd::Server {
    nbdkit(
        Listen::Unix(sock),
        &["data", &format!("data=@{at} 1 2 3 4 5 6 7 8"), "size=16M"],
    )
}

#[test]
fn another_export_or_moved_data_is_refused() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ck = d.join("nbd.ck");
    let (sock_a, sock_b) = (d.join("a.sock"), d.join("b.sock"));
    // Data in block 18 only: none of the 16 blocks sampled evenly over the
    // 256 (0, 16, 32...) holds it.
    let a = thin_export(&sock_a, 18 * 65536 + 100);
    let b = thin_export(&sock_b, 40 * 65536 + 100);
    let sum_a = sum_of(&[&a.url]);
    assert_ne!(sum_a, sum_of(&[&b.url]));
    let (url_a, url_b) = (a.url.clone(), b.url.clone());
    let on_a = ["--checkpoint", s(&ck), "--keep-checkpoint", &url_a];
    let on_b = ["--checkpoint", s(&ck), "--keep-checkpoint", &url_b];
    assert_eq!(sum_of(&on_a), sum_a);
    // Another export of the same size: refused by its address.
    let e = refused(&on_b);
    assert!(e.contains("the checkpoint is of the export"), "{e}");
    assert!(e.contains(s(&sock_a)) && e.contains(s(&sock_b)), "{e}");
    // The same address serving other data: refused by a sampled data block.
    drop(a);
    let moved = thin_export(&sock_a, 40 * 65536 + 100);
    let e = refused(&on_a);
    assert!(
        e.contains("block 18 of the image is not the block the checkpoint recorded"),
        "{e}"
    );
    drop(moved);
    // Served again as it was: resumed.
    let _a = thin_export(&sock_a, 18 * 65536 + 100);
    assert_eq!(sum_of(&on_a), sum_a);
}

fn spawn(args: &[&str]) -> Child {
    blksum()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_second_run_on_one_checkpoint_fails_at_once_naming_the_first() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (sock, ck) = (d.join("slow.sock"), d.join("slow.ck"));
    // Slow enough that the first run is still reading when the second
    // starts: 64 MiB at 50 ms per read is over 3 s with 16 reads at a time.
    let srv = nbdkit(
        Listen::Unix(&sock),
        &["--filter=delay", "random", "size=64M", "rdelay=50ms"],
    );
    let first = spawn(&["--checkpoint", s(&ck), &srv.url]);
    let lock = d.join("slow.ck.lock");
    // The first run holds the lock once its lock file exists.
    let start = std::time::Instant::now();
    while !lock.exists() {
        assert!(start.elapsed().as_secs() < 60, "no lock file");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let e = refused(&["--checkpoint", s(&ck), &srv.url]);
    assert!(
        e.contains(&format!("slow.ck: in use by blksum (pid {})", first.id())),
        "{e}"
    );
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!lock.exists(), "the lock file is removed at the end");
    assert!(!ck.exists());
}

/// Run `script` as root in a mount namespace of its own, with a tmpfs of
/// `size` bytes at `dir` (read-only with `ro`): a full or read-only file
/// system for this command alone, gone when it ends.
fn in_small_fs(dir: &Path, opts: &str, script: &str) -> std::process::Output {
    std::process::Command::new("unshare")
        .args(["-m", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o {opts} blkhash-test {} && {script}",
            s(dir)
        ))
        .output()
        .unwrap()
}

fn can_mount() -> bool {
    let dir = tempfile::tempdir().unwrap();
    let ok = in_small_fs(dir.path(), "size=64k", "true").status.success();
    if !ok {
        eprintln!("skipped: cannot mount a tmpfs in a mount namespace here");
    }
    ok
}

#[test]
fn a_save_that_fails_is_said_once_and_bounded() {
    if !require(&["nbdkit", "unshare"]) || !can_mount() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let full = d.join("full");
    std::fs::create_dir(&full).unwrap();
    let sock = d.join("r.sock");
    let blksum = env!("CARGO_BIN_EXE_blksum");
    // 64 MiB of data: 32 KiB of sha256 digests, more than the 16 KiB tmpfs
    // holds; saves every 10 ms fail with ENOSPC, the run goes on.
    let srv = nbdkit(Listen::Unix(&sock), &["random", "size=64M"]);
    let want = sum_of(&[&srv.url]);
    let ck = full.join("ck");
    let cmd = format!(
        "{blksum} --checkpoint {} --checkpoint-interval 0.01 '{}'",
        s(&ck),
        srv.url
    );
    let out = in_small_fs(&full, "size=16k", &cmd);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).split_whitespace().next(), Some(want.as_str()));
    let warned: Vec<&str> = std::str::from_utf8(&out.stderr)
        .unwrap()
        .lines()
        .filter(|l| l.contains("cannot save the checkpoint"))
        .collect();
    assert_eq!(warned.len(), 1, "{}", stderr(&out));
    assert!(
        warned[0].starts_with(&format!(
            "blksum: {}: cannot save the checkpoint: No space left on device",
            s(&ck)
        )),
        "{}",
        warned[0]
    );
    // A read-only file system: no save could ever be made, which the run
    // says at once, before it reads anything.
    let out = in_small_fs(&full, "size=16k,ro", &cmd);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains(&format!(
            "{}: cannot save the checkpoint here: {}.lock: Read-only file system",
            s(&ck),
            s(&ck)
        )),
        "{}",
        stderr(&out)
    );
    // (Reads on the digest threads, which the saves then keep up with on a
    // busy machine: 16 reads in flight can hash the export before a save
    // that fails comes round again.)
    // Digests that could not be saved past 64 MiB: the run fails, saying
    // why, rather than growing without bound (2000 MiB of data in 512-byte
    // blocks: 125 MiB of digests; saves that fail are spaced by 10 times
    // their length, which grows with the digests unsaved, so one comes
    // after 64 MiB and well before 125 MiB however fast the machine).
    let big = d.join("big.sock");
    let srv = nbdkit(Listen::Unix(&big), &["random", "size=2000M"]);
    let cmd = format!(
        "{blksum} --io-depth 0 --block-size 512 --checkpoint {} --checkpoint-interval 0.01 '{}'",
        s(&ck),
        srv.url
    );
    let out = in_small_fs(&full, "size=16k", &cmd);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).is_empty());
    assert!(
        stderr(&out).contains(&format!(
            "{}: cannot save the checkpoint: No space left on device; the run stops: the ",
            s(&ck)
        )) && stderr(&out).contains(" MiB of digests it could not save would keep growing"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_pseudo_file_is_read_as_a_stream() {
    // /proc/version is 0 bytes long by its size, and holds a line of text.
    let text = std::fs::read("/proc/version").unwrap();
    assert!(!text.is_empty());
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("version");
    std::fs::write(&copy, &text).unwrap();
    let piped = run_pipe(&[], &copy);
    assert!(piped.status.success());
    let want = stdout(&piped)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(sum_of(&["/proc/version"]), want);
    let empty = dir.path().join("empty");
    std::fs::write(&empty, b"").unwrap();
    assert_ne!(sum_of(&[s(&empty)]), want);
}

#[test]
fn usage_messages_say_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw", "1m:r");
    let ck = dir.path().join("ck");
    let out = run(&["--checkpoint", s(&ck), s(&img), s(&img)], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("--checkpoint takes one image, not 2"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("standard input"), "{}", stderr(&out));
    let out = run(
        &[
            "--checkpoint",
            s(&ck),
            "--checkpoint-interval",
            "0",
            s(&img),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("the time between saves is seconds, more than 0"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains("timeout"), "{}", stderr(&out));
}
