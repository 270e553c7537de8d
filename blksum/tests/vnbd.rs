//! virtnbdbackup's streams written by virtnbdbackup's own writer
//! ([`testkit::vnbd`]) from raw files, without a VM (blktools' libvirt
//! tests take them from a running domain): plain and lz4 streams read as
//! the raw file they hold, a size over QEMU's limit refused, and a zero
//! frame of an incremental stream read as virtnbdrestore restores it.

use crate::common::*;
use std::path::Path;

/// The first word of blksum's output for `args`, which must succeed.
fn sum(args: &[&str]) -> String {
    let o = run(args, None);
    assert!(o.status.success(), "blksum {args:?}: {}", stderr(&o));
    stdout(&o).split_whitespace().next().unwrap().to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Data over 32 MiB (virtnbdbackup cuts it in several lz4 frames:
/// compressed blocks, linked), a hole, random bytes (stored as lz4 blocks
/// of their own), a hole: the lz4 stream, the plain one and the raw file
/// have one checksum, whatever the digest, threads and reads.
#[test]
fn plain_and_lz4_streams_are_the_raw_file() {
    let Some(py) = testkit::vnbd::writer() else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let raw = image(d.path(), "disk.raw", "40m:t 8m:- 1m:r 3m:t 12m:-");
    let (plain, lz4) = (d.path().join("sda.full.data"), d.path().join("lz4"));
    std::fs::create_dir(&lz4).unwrap();
    let lz4 = lz4.join("sda.full.data");
    testkit::vnbd::write_stream(&py, &raw, &plain, &[]);
    testkit::vnbd::write_stream(&py, &raw, &lz4, &["--compress", "2"]);
    for opts in [
        &["-d", "sha256"][..],
        &["-d", "blake3", "-t", "1"],
        &[
            "-d",
            "sha1",
            "--block-size",
            "4k",
            "-t",
            "3",
            "--read-size",
            "256k",
        ],
        &["--cache", "--no-mmap"],
    ] {
        let want = sum(&[opts, &[s(&raw)]].concat());
        for stream in [&plain, &lz4] {
            assert_eq!(
                sum(&[opts, &[s(stream)]].concat()),
                want,
                "{opts:?} {stream:?}"
            );
        }
    }
}

/// A stream claiming a virtual size over 2^63-1 bytes (QEMU's limit),
/// about 500 bytes written by virtnbdbackup's writer: refused, naming the
/// file, at once (it kept blksum busy for weeks).
#[test]
fn a_stream_over_qemus_size_limit_is_refused() {
    let Some(py) = testkit::vnbd::writer() else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let raw = image(d.path(), "disk.raw", "4k:-");
    for size in ["9223372036854775808", "18446744073709551615"] {
        let stream = d.path().join(format!("sda.full.data.{size}"));
        testkit::vnbd::write_stream(&py, &raw, &stream, &["--size", size]);
        assert!(std::fs::metadata(&stream).unwrap().len() < 1024);
        let o = run(&[s(&stream)], None);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(stdout(&o).is_empty());
        assert!(
            err.contains(&format!("virtnbdbackup stream '{}'", s(&stream)))
                && err.contains(&format!(
                    "a virtual size of {size} bytes, over QEMU's limit"
                )),
            "{err}"
        );
    }
}

/// A zero frame of an incremental stream (virtnbdbackup writes none; its
/// writer is made to) over the full backup's data: virtnbdrestore skips
/// zero frames, so the parent's bytes stay; blksum reads the stream as
/// that disk, plain and lz4, the checksum of virtnbdrestore's output
/// (where it runs) and of the raw file those writes make.
#[test]
fn a_zero_frame_of_an_incremental_stream_keeps_the_parents_bytes() {
    let Some(py) = testkit::vnbd::writer() else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let full = image(d.path(), "full.raw", "1m:r 3m:-");
    let inc = image(d.path(), "inc.raw", "2m:- 64k:5 1984k:-");
    // The disk at the incremental backup: the full one, the data written.
    let want = image(d.path(), "want.raw", "1m:r 3m:-");
    let bytes = std::fs::read(&inc).unwrap();
    let mut disk = std::fs::read(&want).unwrap();
    disk[2 << 20..(2 << 20) + (64 << 10)].copy_from_slice(&bytes[2 << 20..(2 << 20) + (64 << 10)]);
    std::fs::write(&want, disk).unwrap();
    let want = sum(&[s(&want)]);
    for compress in [&[][..], &["--compress", "2"]] {
        let bk = d.path().join(format!("bk{}", compress.len()));
        std::fs::create_dir(&bk).unwrap();
        testkit::vnbd::write_stream(&py, &full, &bk.join("sda.full.data"), compress);
        let frames = "zero:0:65536,data:2097152:65536,zero:2162688:65536";
        let args = [
            compress,
            &["--incremental", "--checkpoint", "virtnbdbackup.1"],
            &["--parent", "virtnbdbackup.0", "--frames", frames],
        ]
        .concat();
        let stream = bk.join("sda.inc.virtnbdbackup.1.data");
        testkit::vnbd::write_stream(&py, &inc, &stream, &args);
        assert_eq!(sum(&[s(&stream)]), want, "{compress:?}");
        let files = ["sda.full.data", "sda.inc.virtnbdbackup.1.data"];
        if let Some(restored) = testkit::vnbd::virtnbdrestore(&bk, &files, "sda") {
            assert_eq!(sum(&[s(&restored)]), want, "{compress:?}: virtnbdrestore's");
        }
    }
}
