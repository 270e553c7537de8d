//! What must never happen to a user's data: an output written over an
//! input, two runs writing one DST, a state that claims blocks DST does not
//! hold because SRC was written during the run.

use crate::common;

use blkmap::Map;
use common::*;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// A command that must fail, leaving `keep` as it was; its stderr.
fn refused(bin: &str, args: &[&str], keep: &Path) -> String {
    let before = std::fs::symlink_metadata(keep).ok();
    let content = before.as_ref().filter(|m| m.is_file()).map(|_| bytes(keep));
    let out = run(bin, args);
    assert_eq!(out.code, 1, "{bin} {args:?} must fail: {}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    let after = std::fs::symlink_metadata(keep).ok();
    match (&before, &after) {
        (Some(b), Some(a)) => {
            assert_eq!(b.ino(), a.ino(), "{keep:?} replaced");
            assert_eq!(b.file_type(), a.file_type(), "{keep:?} replaced");
        }
        (None, None) => {}
        _ => panic!("{keep:?} created or removed"),
    }
    if let Some(c) = content {
        assert_eq!(bytes(keep), c, "{keep:?} written");
    }
    out.stderr
}

#[test]
fn outputs_never_replace_inputs() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let a = image(d, "a.raw", "raw", 4 * MIB, &["write -P 0x11 0 1M"]);
    let dst = image(d, "d.raw", "raw", 4 * MIB, &["write -P 0x22 0 1M"]);

    let e = refused(BLKMAP, &[s(&a), s(&a)], &a);
    assert!(e.contains("is the image"), "{e}");

    // A state named as DST, missing (it would be created) or not.
    let new = d.join("new.raw");
    let e = refused(BLKSYNC, &[s(&a), s(&new), "--state", s(&new)], &new);
    assert!(e.contains("is DST"), "{e}");
    let e = refused(
        BLKSYNC,
        &[s(&a), s(&dst), "--state", s(&dst), "--force-rescan"],
        &dst,
    );
    assert!(e.contains("is DST"), "{e}");
    // A state, or its side record, named as SRC.
    let e = refused(
        BLKSYNC,
        &[s(&a), s(&dst), "--state", s(&a), "--force-rescan"],
        &a,
    );
    assert!(e.contains("is SRC"), "{e}");
    let y_dst = image(d, "y.dst", "raw", 4 * MIB, &["write -P 0x33 0 1M"]);
    let e = refused(
        BLKSYNC,
        &[s(&y_dst), s(&dst), "--state", s(&d.join("y"))],
        &y_dst,
    );
    assert!(e.contains("side record") && e.contains("is SRC"), "{e}");
    // SRC given as DST.
    let e = refused(BLKSYNC, &[s(&a), s(&d.join(".").join("a.raw"))], &a);
    assert!(e.contains("is SRC"), "{e}");

    // Not regular files: a FIFO (refused at once, not opened), a link, a
    // device node, a directory.
    let fifo = d.join("fifo");
    sh("mkfifo", &[s(&fifo)]);
    let t = Instant::now();
    let e = refused(BLKMAP, &[s(&a), s(&fifo)], &fifo);
    assert!(e.contains("a FIFO"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10));
    let e = refused(BLKSYNC, &[s(&a), s(&dst), "--state", s(&fifo)], &fifo);
    assert!(e.contains("a FIFO"), "{e}");
    let link = d.join("link");
    std::os::unix::fs::symlink(d.join("elsewhere"), &link).unwrap();
    let e = refused(BLKMAP, &[s(&a), s(&link)], &link);
    assert!(e.contains("symbolic link"), "{e}");
    let e = refused(BLKMAP, &[s(&a), s(d)], d);
    assert!(e.contains("a directory"), "{e}");
    // As root, a device node of our own (the kernel's "full" device).
    let full = d.join("full");
    if run("mknod", &[s(&full), "c", "1", "7"]).code == 0 {
        let e = refused(BLKMAP, &[s(&a), s(&full)], &full);
        assert!(e.contains("a character device"), "{e}");
        assert!(
            std::fs::symlink_metadata(&full)
                .unwrap()
                .file_type()
                .is_char_device()
        );
    }

    // A file the command reads without being named: the backing file of
    // the image (and any other file that is not a map) is not replaced.
    let overlay = d.join("overlay.qcow2");
    sh(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-F",
            "raw",
            "-b",
            s(&a),
            s(&overlay),
        ],
    );
    let e = refused(BLKMAP, &[s(&overlay), s(&a)], &a);
    assert!(e.contains("is not a block map"), "{e}");

    // What may be replaced: a map, an empty file, a missing name.
    let m = d.join("a.map");
    sh(BLKMAP, &[s(&a), s(&m)]);
    sh(BLKMAP, &[s(&dst), s(&m)]);
    assert_eq!(Map::load(&m).unwrap().size(), 4 * MIB);
    let empty = d.join("empty");
    std::fs::write(&empty, b"").unwrap();
    sh(BLKMAP, &[s(&a), s(&empty)]);
    assert!(Map::load(&empty).is_ok());
    // A state and its side record next to it, and a rerun; the lock file
    // is gone once the run ends.
    let state = d.join("d.map");
    sh(BLKSYNC, &[s(&a), s(&dst), "--state", s(&state)]);
    sh(BLKSYNC, &[s(&a), s(&dst), "--state", s(&state)]);
    assert!(d.join("d.map.dst").exists());
    assert!(!d.join("d.map.lock").exists());
    check_state(d, &dst, &state);
}

/// The state is DST's map, as blkmap computes it.
fn check_state(dir: &Path, dst: &Path, state: &Path) {
    let m = dir.join("check.map");
    sh(BLKMAP, &[s(dst), s(&m)]);
    assert_eq!(Map::load(&m).unwrap(), Map::load(state).unwrap());
}

/// Whether a process other than this one holds a flock on `p`.
fn locked_by_another(p: &Path) -> bool {
    let meta = std::fs::metadata(p).unwrap();
    let id = format!(
        "{:02x}:{:02x}:{}",
        libc::major(meta.dev()),
        libc::minor(meta.dev()),
        meta.ino()
    );
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .any(|l| l.contains("FLOCK") && l.split_whitespace().nth(5) == Some(id.as_str()))
}

#[test]
fn one_run_at_a_time_on_a_dst() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    // The first run, from a slow SRC (each read delayed by its server), is
    // stopped (SIGSTOP: it keeps its locks) once it holds DST, until the
    // second run has tried DST: it cannot end first, however the runs are
    // scheduled.
    let sock = d.join("slow.sock");
    let Some(slow) = nbdkit(&sock, &["--filter=delay", "pattern", "16M", "rdelay=300ms"]) else {
        return;
    };
    let other = image(d, "other.raw", "raw", 16 * MIB, &["write -P 0x44 0 16M"]);
    let dst = d.join("dst.raw");
    let state = d.join("dst.map");

    for wait in [false, true] {
        for p in [&dst, &state, &d.join("dst.map.dst")] {
            let _ = std::fs::remove_file(p);
        }
        let first = Command::new(BLKSYNC)
            .args([&slow.url, s(&dst), "--state", s(&state)])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while !(dst.exists() && locked_by_another(&dst)) {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "the first run never locked DST"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(first.id() as i32, libc::SIGSTOP) };
        let mut args = vec![s(&other), s(&dst), "--state", s(&state)];
        if wait {
            args.push("--wait");
        }
        let t = Instant::now();
        let second = if wait {
            let second = Command::new(BLKSYNC)
                .args(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            // It opened the state's lock file or DST (to lock it): its first
            // try, which fails, follows at once; the pause lets it land while
            // the first run is stopped (were it later, the test would only
            // prove less, never fail).
            let fd_dir = format!("/proc/{}/fd", second.id());
            let held = [dst.clone(), d.join("dst.map.lock")].map(|p| p.canonicalize().ok());
            let start = Instant::now();
            while !std::fs::read_dir(&fd_dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| held.contains(&Some(l))))
            {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "the second run never opened DST or the state's lock file"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(200));
            // SAFETY: as above.
            unsafe { libc::kill(first.id() as i32, libc::SIGCONT) };
            let out = second.wait_with_output().unwrap();
            Out {
                code: out.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            }
        } else {
            let out = run(BLKSYNC, &args);
            // SAFETY: as above.
            unsafe { libc::kill(first.id() as i32, libc::SIGCONT) };
            out
        };
        let first = first.wait_with_output().unwrap();
        assert!(
            first.status.success(),
            "{}",
            String::from_utf8_lossy(&first.stderr)
        );
        if wait {
            // It waited for the first run, then made DST its SRC.
            assert_eq!(second.code, 0, "{}", second.stderr);
            assert_eq!(checksum(d, &dst), checksum(d, &other));
        } else {
            assert_eq!(second.code, 1, "{}", second.stderr);
            assert!(
                second.stderr.contains("in use by blksync (pid")
                    && second.stderr.contains("--wait"),
                "{}",
                second.stderr
            );
            assert!(t.elapsed() < Duration::from_secs(5));
            assert_eq!(checksum(d, &dst), checksum(d, Path::new(&slow.url)));
        }
        check_state(d, &dst, &state);
    }
}

#[test]
fn src_written_during_a_run_never_leaves_a_false_state() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    const SIZE: u64 = 64 * MIB;
    let src = image(d, "src.raw", "raw", SIZE, &["write -P 0x11 0 64M"]);
    let dst = d.join("dst.raw");
    let state = d.join("dst.map");
    sh(BLKSYNC, &[s(&src), s(&dst), "--state", s(&state)]);
    let mut failed = 0;
    for trial in 0..3u8 {
        // Every block differs from DST's state, so every block is copied
        // after it was hashed, while a writer keeps changing SRC.
        write(&src, "raw", &[&format!("write -P {} 0 64M", 0x60 + trial)]);
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (stop, src) = (stop.clone(), src.clone());
            std::thread::spawn(move || {
                let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let block = (n * 7919) % (SIZE / 65536);
                    f.write_all_at(&[(n % 200) as u8 + 1; 4096], block * 65536)
                        .unwrap();
                }
            })
        };
        let out = run(BLKSYNC, &[s(&src), s(&dst), "--state", s(&state)]);
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        if out.code == 0 {
            check_state(d, &dst, &state);
        } else {
            failed += 1;
            assert_eq!(out.code, 1, "{}", out.stderr);
            assert!(
                out.stderr.contains("SRC changed while it was copied"),
                "{}",
                out.stderr
            );
            assert!(!state.exists(), "a failed run left a state");
        }
    }
    // Quiet again: the next run converges.
    sh(BLKSYNC, &[s(&src), s(&dst), "--state", s(&state)]);
    check_state(d, &dst, &state);
    assert_eq!(checksum(d, &src), checksum(d, &dst));
    eprintln!("{failed} of 3 runs saw SRC change");
}
