//! `blksync` exits 1 when SRC is written during the run: DST then holds
//! blocks of more than one state of SRC, which exit 0 would deny. The run
//! is paused (SIGSTOP) at a point the test sees, after SRC was opened and
//! before the copy ends, SRC (or its backing file) written, and resumed.

use crate::common;

use common::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Run blksync SRC DST, write `written` while it is paused once DST
/// exists (made after SRC was opened and recorded), and return its exit
/// code and standard error.
fn sync_writing(src: &Path, dst: &Path, written: &Path, extra: &[&str]) -> (i32, String) {
    let mut child = Command::new(BLKSYNC)
        .args(extra)
        .args([s(src), s(dst)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !dst.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "blksync ended before DST was made"
        );
        assert!(start.elapsed() < Duration::from_secs(120), "no DST");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: signals to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    assert!(
        child.try_wait().unwrap().is_none(),
        "the copy ended before the test could write SRC: make the image larger"
    );
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(written)
        .unwrap();
    f.write_all_at(&[0x77; 4096], 0).unwrap();
    drop(f);
    unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_src_written_during_the_run_exits_1() {
    if !require(&["qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 256 MiB of data read 4 KiB at a time, one read in flight: seconds of
    // copying left when the test pauses the run, on any machine.
    let slow = ["--read-size", "4k", "--io-depth", "1", "--block-size", "4k"];
    let src = d.join("src.raw");
    run_ok_qemu(&["create", "-q", "-f", "raw", s(&src), "256M"]);
    qemu_io(&src, "raw", "write -P 0x11 0 256M");
    let dst = d.join("dst.raw");
    let (code, err) = sync_writing(&src, &dst, &src, &slow);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("SRC was written while it was copied") && err.contains("run blksync again"),
        "{err}"
    );
    // The rerun finishes the copy.
    let out = run(BLKSYNC, &[s(&src), s(&dst)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(same(&src, &dst));

    // A qcow2 SRC whose backing file is written: named.
    let base = d.join("base.raw");
    run_ok_qemu(&["create", "-q", "-f", "raw", s(&base), "256M"]);
    qemu_io(&base, "raw", "write -P 0x22 0 256M");
    let top = d.join("top.qcow2");
    let b = format!("backing_file={},backing_fmt=raw", s(&base));
    run_ok_qemu(&["create", "-q", "-f", "qcow2", "-o", &b, s(&top)]);
    let dst2 = d.join("dst2.raw");
    let (code, err) = sync_writing(&top, &dst2, &base, &slow);
    assert_eq!(code, 1, "{err}");
    let base_name = std::fs::canonicalize(&base).unwrap();
    assert!(
        err.contains(&format!("({} changed during the run)", base_name.display())),
        "{err}"
    );
}

fn run_ok_qemu(args: &[&str]) {
    testkit::tools::qemu_img(args);
}

fn qemu_io(img: &Path, fmt: &str, cmd: &str) {
    testkit::tools::qemu_io(img, fmt, &[cmd]);
}
