//! Compressed images (gzip, xz, zstd, written by their CLIs) taken by
//! blkmap, blkdiff and blksync as the image they hold, as blksum takes
//! them: a map's checksum is the image's, blkdiff finds no difference
//! with the uncompressed image, blksync copies the image (a raw one too:
//! decompressed into a temporary file for random access).

use crate::common;

use common::*;
use std::path::{Path, PathBuf};

fn ready() -> bool {
    require(&["qemu-img", "qemu-io", "gzip", "xz", "zstd"])
}

/// `cmd -c FILE > FILE.suffix`; the compressed file's path.
fn compress(file: &Path, suffix: &str, cmd: &str) -> PathBuf {
    let out = PathBuf::from(format!("{}.{suffix}", file.display()));
    let status = std::process::Command::new(cmd)
        .arg("-c")
        .arg(file)
        .stdout(std::fs::File::create(&out).unwrap())
        .status()
        .unwrap();
    assert!(status.success(), "{cmd}");
    out
}

/// A raw image with data, zeros and holes, and its qcow2 conversion.
fn images(dir: &Path) -> (PathBuf, PathBuf) {
    let raw = image(
        dir,
        "disk.raw",
        "raw",
        5 * MIB,
        &[
            "write -P 0x5a 0 1M",
            "write -z 2M 1M",
            "write -P 0x6b 4M 64k",
        ],
    );
    let qcow2 = dir.join("disk.qcow2");
    sh(
        "qemu-img",
        &[
            "convert",
            "-q",
            "-f",
            "raw",
            "-O",
            "qcow2",
            s(&raw),
            s(&qcow2),
        ],
    );
    (raw, qcow2)
}

#[test]
fn blkmap_blkdiff_and_blksync_take_them() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (raw, qcow2) = images(d);
    let want = checksum(d, &raw);
    for (suffix, cmd) in [("gz", "gzip"), ("xz", "xz"), ("zst", "zstd")] {
        for image in [&raw, &qcow2] {
            let c = compress(image, suffix, cmd);
            let map = d.join("c.map");
            let out = run(BLKMAP, &[s(&c), s(&map)]);
            assert_eq!(out.code, 0, "{c:?}: {}", out.stderr);
            assert_eq!(out.stdout, format!("{want}  {}\n", c.display()));
            let out = run(BLKDIFF, &[s(&raw), s(&c)]);
            assert_eq!(out.code, 0, "{c:?}: {}", out.stderr);
            let dst = d.join("dst.raw");
            let _ = std::fs::remove_file(&dst);
            let out = run(BLKSYNC, &[s(&c), s(&dst)]);
            assert_eq!(out.code, 0, "{c:?}: {}", out.stderr);
            // Said once, as the other notes are.
            assert!(
                out.stderr.contains(&format!(
                    "blksync: warning: {}: {cmd}-compressed: decompressed into an unnamed \
                     temporary file in ",
                    c.display()
                )),
                "{}",
                out.stderr
            );
            assert!(same(&raw, &dst), "{c:?}");
        }
    }
}

#[test]
fn a_corrupt_file_is_an_error_for_each() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (_, qcow2) = images(d);
    let good = std::fs::read(compress(&qcow2, "xz", "xz")).unwrap();
    let cut = d.join("cut.qcow2.xz");
    std::fs::write(&cut, &good[..good.len() / 2]).unwrap();
    let map = d.join("cut.map");
    let dst = d.join("dst");
    for (bin, args) in [
        (BLKMAP, vec![s(&cut), s(&map)]),
        (BLKDIFF, vec![s(&qcow2), s(&cut)]),
        (BLKSYNC, vec![s(&cut), s(&dst)]),
    ] {
        let out = run(bin, &args);
        assert!(out.code >= 1, "{bin}: {}", out.stderr);
        assert!(out.stderr.contains(s(&cut)), "{bin}: {}", out.stderr);
        assert!(
            out.stderr.contains("xz: truncated"),
            "{bin}: {}",
            out.stderr
        );
        assert!(out.stdout.is_empty(), "{bin}: {}", out.stdout);
    }
    assert!(!map.exists() && !dst.exists());
}
