//! QEMU's image locks: an image a writer holds (a writable qemu-nbd here,
//! as a running VM would) is "in use" for blksum as for qemu-img, for raw
//! files, qcow2 images, their backing and data files, and the formats a
//! private qemu-nbd serves; `-U`/`--force-share` reads it anyway; and while
//! blksum reads an image, a writer cannot open it.

use crate::common;

use common::progress::spawn_with_progress;
use common::qemu::*;
use common::*;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;
use testkit::nbd::{Listen, Server, qemu_nbd_with};

const LIMIT: Duration = Duration::from_secs(60);

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A writable qemu-nbd holding `img` open (its image locks taken: testkit
/// waits for its greeting, which comes after the image is opened), killed
/// when dropped.
fn writer(img: &Path, fmt: &str) -> Server {
    let sock = img.with_extension("writer.sock");
    qemu_nbd_with(img, fmt, Listen::Unix(&sock), None, &[])
}

/// `qemu-img convert` of `img` must fail on its lock (what QEMU says).
fn qemu_says_in_use(img: &Path) {
    let out = Command::new("qemu-img")
        .args(["convert", "-O", "raw", p(img), "/dev/null"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("lock"),
        "qemu-img convert {}: {err}",
        img.display()
    );
}

/// blksum on `img` fails: exit 1, no checksum, "in use" and `name` in its
/// message.
fn in_use(img: &Path, extra: &[&str], name: &str) {
    let args = [extra, &[p(img)]].concat();
    let out = run_timeout(&args, None, LIMIT);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(out.stdout.is_empty(), "{}", stdout(&out));
    assert!(
        err.contains(p(img)) && err.contains("in use") && err.contains(name),
        "{err}"
    );
    assert!(err.contains("\"write\" lock"), "{err}");
}

/// blksum `-U` on `img` gives the checksum of QEMU's `-U` conversion.
fn force_share_reads(img: &Path, extra: &[&str]) {
    let flat = img.with_extension("flat.raw");
    qemu_img(&["convert", "-U", "-O", "raw", p(img), p(&flat)]);
    let want = raw_sum(&flat, &[]);
    for u in ["-U", "--force-share"] {
        let args = [extra, &[u, p(img)]].concat();
        let out = run_timeout(&args, None, LIMIT);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), format!("{want}  {}\n", p(img)));
    }
    std::fs::remove_file(flat).unwrap();
}

fn qcow2(dir: &Path, name: &str, opts: &[&str]) -> PathBuf {
    let img = dir.join(name);
    create_qcow2(&img, opts, "8M");
    qemu_io(&img, "qcow2", &["write -P 0x61 1M 1M"]);
    img
}

#[test]
fn raw_and_qcow2_images_held_by_a_writer_are_in_use() {
    if !require(&["qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let raw = image(d, "disk.raw", "1m:r 1m:- 1m:r");
    let qc = qcow2(d, "disk.qcow2", &[]);
    for (img, fmt) in [(&raw, "raw"), (&qc, "qcow2")] {
        let w = writer(img, fmt);
        qemu_says_in_use(img);
        in_use(img, &[], p(img));
        in_use(img, &["-f", fmt], p(img));
        force_share_reads(img, &[]);
        drop(w);
        // Free again: hashed.
        let out = run_timeout(&[p(img)], None, LIMIT);
        assert!(out.status.success(), "{}", stderr(&out));
    }
}

#[test]
fn backing_and_data_files_held_by_a_writer_are_in_use() {
    if !require(&["qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A backing file in use: the overlay is, as qemu-img convert says.
    let base = qcow2(d, "base.qcow2", &[]);
    let top = d.join("top.qcow2");
    create_qcow2(&top, &["-b", p(&base), "-F", "qcow2"], "8M");
    let w = writer(&base, "qcow2");
    qemu_says_in_use(&top);
    in_use(&top, &[], p(&base));
    force_share_reads(&top, &[]);
    drop(w);
    // A raw backing file.
    let rbase = image(d, "base.raw", "2m:r");
    let rtop = d.join("rtop.qcow2");
    create_qcow2(&rtop, &["-b", p(&rbase), "-F", "raw"], "8M");
    let w = writer(&rbase, "raw");
    qemu_says_in_use(&rtop);
    in_use(&rtop, &[], p(&rbase));
    drop(w);
    // An external data file.
    let data = d.join("ext.data");
    let ext = qcow2(d, "ext.qcow2", &["-o", &format!("data_file={}", p(&data))]);
    let w = writer(&data, "raw");
    qemu_says_in_use(&ext);
    in_use(&ext, &[], p(&data));
    force_share_reads(&ext, &[]);
    drop(w);
}

#[test]
fn formats_served_by_qemu_nbd_held_by_a_writer_are_in_use() {
    if !require(&["qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let raw = image(d, "v.raw", "1m:r 1m:- 1m:r");
    let vmdk = d.join("v.vmdk");
    qemu_img(&["convert", "-q", "-O", "vmdk", p(&raw), p(&vmdk)]);
    let w = writer(&vmdk, "vmdk");
    qemu_says_in_use(&vmdk);
    in_use(&vmdk, &[], p(&vmdk));
    in_use(&vmdk, &["-f", "vmdk"], p(&vmdk));
    force_share_reads(&vmdk, &[]);
    drop(w);
}

#[test]
fn readers_share_and_writers_wait_while_blksum_reads() {
    if !require(&["qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = d.join("big.qcow2");
    create_qcow2(&img, &[], "256M");
    qemu_io(&img, "qcow2", &["write -P 0x33 0 256M"]);
    // Another reader (qemu-io -r holding the image) does not stop blksum.
    let mut reader = Command::new("qemu-io")
        .args(["-r", "-f", "qcow2", p(&img)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Its answer to a read says it has the image open (and locked).
    reader
        .stdin
        .as_mut()
        .unwrap()
        .write_all(b"read 0 512\n")
        .unwrap();
    let mut said = String::new();
    let mut answers = BufReader::new(reader.stdout.take().unwrap());
    while !said.contains("read 512/512 bytes") {
        let n = answers.read_line(&mut said).unwrap();
        assert!(n > 0, "qemu-io -r ended: {said}");
    }
    let out = run_timeout(&["-d", "null", p(&img)], None, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    drop(reader.stdin.take());
    reader.wait().unwrap();
    // While blksum reads (stopped with SIGSTOP once it is under way, so
    // that it cannot end first, however fast the machine; a stopped process
    // keeps its files and their locks), a writer cannot open the image.
    let (mut child, mut progress) = spawn_with_progress(
        blksum()
            .args(["--progress=3", "-d", "sha512"])
            .arg(&img)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    assert!(progress.wait_for(1), "blksum ended before 1%");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    assert!(
        child.try_wait().unwrap().is_none(),
        "blksum ended too soon to test"
    );
    let out = Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", "write -P 0x44 0 64k", p(&img)])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        text.contains("Failed to get \"write\" lock"),
        "a writer opened the image blksum was reading: {text}"
    );
}

/// A loop device over `file`, detached when dropped; None (test skipped)
/// where loop devices cannot be set up (not root, no loop driver).
struct Loop(String);

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

fn loop_device(file: &Path) -> Option<Loop> {
    let out = Command::new("losetup")
        .args(["-f", "--show", p(file)])
        .output()
        .ok()?;
    if !out.status.success() {
        eprintln!("no loop device: test skipped");
        return None;
    }
    Some(Loop(
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
    ))
}

#[test]
fn block_devices_held_by_a_writer_are_in_use() {
    if !require(&["qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = image(dir.path(), "dev.raw", "1m:r 1m:- 2m:r");
    let Some(dev) = loop_device(&file) else {
        return;
    };
    let dev_path = Path::new(&dev.0);
    let w = writer(dev_path, "raw");
    qemu_says_in_use(dev_path);
    in_use(dev_path, &[], &dev.0);
    let out = run_timeout(&["-U", &dev.0], None, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    drop(w);
    let out = run_timeout(&[&dev.0], None, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).split_once("  ").unwrap().0,
        raw_sum(&file, &[]),
        "the device hashes as its file"
    );
}
