//! Changes a dirty bitmap does not record: a shrink and grow, a backing
//! file written (the overlay read as a file or served by qemu-nbd), an
//! unsafe rebase, an external data file written outside QEMU, a base made
//! before the bitmap existed (and another export under the same bitmap
//! name). Each is made with QEMU's own tools, and each update is refused:
//! exit 1, OUT not written; `blksync --dirty-bitmap` leaves DST and its
//! state as they were. The same sequence without the offending step
//! updates, reading the dirty blocks and little else, and `--json` says
//! which checks ran.

use crate::common;

use common::dirty::*;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

const BS: u64 = 65536;

/// DST and its state, copied from `src` by a first blksync (its state
/// records SRC); and what they hold, to show a refused run left them.
struct Synced {
    dst: PathBuf,
    state: PathBuf,
}

impl Synced {
    fn new(d: &Path, src: &str) -> Synced {
        let s = Synced {
            dst: d.join("dst.raw"),
            state: d.join("dst.map"),
        };
        let o = run(
            BLKSYNC,
            &[src, common::s(&s.dst), "--state", common::s(&s.state)],
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        s
    }

    fn files(&self) -> Vec<Vec<u8>> {
        let side = self.state.with_extension("map.dst");
        [&self.dst, &self.state, &side]
            .iter()
            .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{p:?}: {e}")))
            .collect()
    }

    /// `blksync --dirty-bitmap b --state STATE SRC DST`.
    fn sync(&self, src: &str) -> Out {
        run(
            BLKSYNC,
            &[
                "--dirty-bitmap",
                "b",
                "--state",
                common::s(&self.state),
                src,
                common::s(&self.dst),
            ],
        )
    }

    /// `blksync --dirty-bitmap b` from `src`, which must be refused with
    /// every one of `words` said, DST, the state and its record untouched.
    fn refused(&self, src: &str, words: &[&str]) {
        let before = self.files();
        let o = self.sync(src);
        assert_eq!(o.code, 1, "blksync: {}", o.stderr);
        for w in words {
            assert!(o.stderr.contains(w), "{w:?} not in {:?}", o.stderr);
        }
        assert!(self.files() == before, "DST or its state changed");
    }

    /// `blksync --dirty-bitmap b` from `src`, which must leave DST equal
    /// to SRC.
    fn updates(&self, src: &Path) {
        let o = self.sync(common::s(src));
        assert_eq!(o.code, 0, "blksync: {}", o.stderr);
        assert!(same(src, &self.dst), "DST is not SRC");
    }
}

/// The update of `old` from `image` must be refused, saying each of
/// `words`, writing nothing; with `--verify` too.
fn refused(d: &Path, old: &Path, image: &str, words: &[&str]) {
    let out = d.join("out.map");
    let o = incremental(old, "b", image, &out, &[]);
    assert_refused(&o, words, &out, None);
    let before = std::fs::read(old).unwrap();
    let o = incremental(old, "b", image, old, &["--verify"]);
    assert_refused(&o, words, old, Some(&before));
}

/// The update of `old` from `image` (its dirty bytes `dirty` at most,
/// in `BS` blocks) is the full map, read little more than the dirty
/// blocks and the samples, and ran `checks`.
fn updates(d: &Path, old: &Path, image: &str, dirty: u64, checks: &[&str]) {
    let out = d.join("next.map");
    let j = incremental_json(old, "b", image, &out);
    let whole = d.join("whole.map");
    let want = full(image, &whole, &[]);
    assert_eq!(j["checksum"], Value::from(want), "{j}");
    assert_same_map(&out, &whole);
    let read = j["read-bytes"].as_u64().unwrap();
    assert!(
        read <= dirty + 16 * BS,
        "read {read} bytes, dirty {dirty}: {j}"
    );
    let ran: Vec<&str> = (j["checks"].as_array().unwrap().iter())
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(ran, checks, "{j}");
}

const FILE_CHECKS: [&str; 6] = [
    "size",
    "parameters",
    "files",
    "bitmap",
    "allocation",
    "samples",
];

/// Data at 40 MiB cut off by `qemu-img resize --shrink`, the image grown
/// again: the range reads as zeros, and no bitmap marks it.
#[test]
fn shrink_then_grow() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let cmds = ["write -P 0x11 0 8M", "write -P 0x22 40M 2M"];
    let img = src_qcow2(d, 64 * MIB, &cmds);
    bitmap(&img, &["--add"], "b");
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    let synced = Synced::new(d, s(&img));
    sh("qemu-img", &["resize", "-q", "--shrink", s(&img), "32M"]);
    sh("qemu-img", &["resize", "-q", s(&img), "64M"]);
    refused(d, &old, s(&img), &[s(&old), "bitmap 'b'"]);
    synced.refused(s(&img), &["bitmap 'b'"]);

    // Without the shrink: a write the bitmap marks.
    let img = image(d, "control.qcow2", "qcow2", 64 * MIB, &cmds);
    bitmap(&img, &["--add"], "b");
    full(s(&img), &old, &[]);
    write(&img, "qcow2", &["write -P 0x33 40M 64k"]);
    updates(d, &old, s(&img), BS, &FILE_CHECKS);
}

/// An overlay and its backing file (data in both), the bitmap on the
/// overlay, OLD made from the overlay file.
fn overlay(d: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let base = image(d, "base.qcow2", "qcow2", 16 * MIB, &["write -P 0x11 0 12M"]);
    let (top, old) = overlay_with_bitmap(d);
    (base, top, old)
}

/// A write into the backing file, under data the overlay does not hold:
/// refused as a file and through `qemu-nbd -r -B b top.qcow2` alike (an
/// export cannot show its backing files: OLD says there is one).
#[test]
fn backing_file_written() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let (base, top, old) = overlay(d);
    let synced = Synced::new(d, s(&top));
    write(&base, "qcow2", &["write -P 0x77 6M 64k"]);
    refused(d, &old, s(&top), &["base.qcow2", "changed after"]);
    synced.refused(s(&top), &["base.qcow2", "changed after"]);
    let Some(server) = qemu_nbd(d, &top, &["--read-only", "-B", "b"]) else {
        return;
    };
    refused(d, &old, &server.url, &["base.qcow2", "cannot show"]);
    synced.refused(&server.url, &["base.qcow2", "cannot show"]);
    drop(server);

    // Without the backing write: as a file, every file checked; over NBD
    // from a base made over NBD, the export checked.
    let d2 = d.join("control");
    std::fs::create_dir(&d2).unwrap();
    let (_, top, old) = overlay(&d2);
    write(&top, "qcow2", &["write -P 0x33 2M 4k"]);
    updates(&d2, &old, s(&top), BS, &FILE_CHECKS);
    let Some(server) = qemu_nbd(&d2, &top, &["--read-only", "-B", "b"]) else {
        return;
    };
    let url_old = d2.join("url.map");
    full(&server.url, &url_old, &[]);
    drop(server);
    write(&top, "qcow2", &["write -P 0x44 3M 4k"]);
    let Some(server) = qemu_nbd(&d2, &top, &["--read-only", "-B", "b"]) else {
        return;
    };
    let checks = [
        "size",
        "parameters",
        "export",
        "bitmap",
        "allocation",
        "samples",
    ];
    updates(&d2, &url_old, &server.url, 2 * BS, &checks);
}

/// `qemu-img rebase -u` onto another file (made before OLD, other
/// content): the overlay reads another backing file.
#[test]
fn unsafe_rebase() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    image(
        d,
        "other.qcow2",
        "qcow2",
        16 * MIB,
        &["write -P 0x99 0 12M"],
    );
    let (_, top, old) = overlay(d);
    let synced = Synced::new(d, s(&top));
    testkit::tools::qemu_img_in(
        d,
        &[
            "rebase",
            "-u",
            "-b",
            "other.qcow2",
            "-F",
            "qcow2",
            "top.qcow2",
        ],
    );
    refused(d, &old, s(&top), &["no longer reads", "base.qcow2"]);
    synced.refused(s(&top), &["no longer reads", "base.qcow2"]);
}

/// A qcow2 image whose guest data is the raw file `d.raw`
/// (`data_file_raw=on`), data in its first 8 MiB, the bitmap added, OLD
/// made.
fn with_data_file(d: &Path) -> (PathBuf, PathBuf) {
    let img = d.join("img.qcow2");
    // An absolute name: QEMU takes a relative one from where it runs.
    let opts = format!("data_file={},data_file_raw=on", s(&d.join("d.raw")));
    sh(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-o", &opts, s(&img), "64M"],
    );
    write(&img, "qcow2", &["write -P 0x11 0 8M"]);
    bitmap(&img, &["--add"], "b");
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    (img, old)
}

/// The external data file written with dd: QEMU wrote the image file
/// last when it closed it, so a data file written after is not QEMU's.
/// Written through QEMU (qemu-io on the image), the update goes on.
#[test]
fn data_file_written_outside_qemu() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let (img, old) = with_data_file(d);
    let synced = Synced::new(d, s(&img));
    let data = d.join("d.raw");
    sh(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", s(&data)),
            "bs=64k",
            "count=1",
            "seek=32",
            "conv=notrunc",
            "status=none",
        ],
    );
    refused(
        d,
        &old,
        s(&img),
        &["d.raw", "data file", "written after QEMU"],
    );
    synced.refused(s(&img), &["d.raw", "data file"]);

    let d2 = d.join("control");
    std::fs::create_dir(&d2).unwrap();
    let (img, old) = with_data_file(&d2);
    let synced = Synced::new(&d2, s(&img));
    write(&img, "qcow2", &["write -P 0x22 2M 64k"]);
    updates(&d2, &old, s(&img), BS, &FILE_CHECKS);
    synced.updates(&img);
}

/// OLD made before the bitmap existed, then a write into one of its
/// holes and only then the bitmap: the write is in no bitmap, but the
/// image's allocation there is no longer OLD's.
#[test]
fn base_made_before_the_bitmap() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 64 * MIB, &["write -P 0x11 0 8M"]);
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    let synced = Synced::new(d, s(&img));
    write(&img, "qcow2", &["write -P 0x22 20M 64k"]);
    bitmap(&img, &["--add"], "b");
    write(&img, "qcow2", &["write -P 0x33 1M 4k"]);
    refused(d, &old, s(&img), &["20971520+65536", "allocation"]);
    synced.refused(s(&img), &["20971520+65536"]);

    // Made after the bitmap: the same writes update.
    let img = image(
        d,
        "control.qcow2",
        "qcow2",
        64 * MIB,
        &["write -P 0x11 0 8M"],
    );
    bitmap(&img, &["--add"], "b");
    full(s(&img), &old, &[]);
    write(
        &img,
        "qcow2",
        &["write -P 0x22 20M 64k", "write -P 0x33 1M 4k"],
    );
    updates(d, &old, s(&img), 2 * BS, &FILE_CHECKS);
}

/// Another image of the same size served at the same socket, with a
/// bitmap of the same name: its allocation is not OLD's.
#[test]
fn another_export_under_the_same_name() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    if !require(&["qemu-nbd"]) {
        return;
    }
    let a = image(d, "a.qcow2", "qcow2", 64 * MIB, &["write -P 0x11 0 8M"]);
    let b = image(
        d,
        "b.qcow2",
        "qcow2",
        64 * MIB,
        &["write -P 0x11 0 8M", "write -P 0x55 30M 2M"],
    );
    for img in [&a, &b] {
        bitmap(img, &["--add"], "b");
    }
    let sock = d.join("nbd.sock");
    let serve = |img: &Path| {
        testkit::nbd::qemu_nbd_with(
            img,
            "qcow2",
            Listen::Unix(&sock),
            None,
            &["--read-only", "-B", "b"],
        )
    };
    let server = serve(&a);
    let old = d.join("old.map");
    full(&server.url, &old, &[]);
    drop(server);
    let server = serve(&b);
    refused(d, &old, &server.url, &["31457280+2097152", "allocation"]);
}

/// Preallocated metadata: every cluster allocated, its bytes a hole of
/// the file. They read as zeros without a read, so OLD's zero blocks
/// agree with the allocation and an update reads the dirty blocks only.
#[test]
fn preallocated_metadata_reads_no_zero_block() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = d.join("pre.qcow2");
    sh(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-o",
            "preallocation=metadata",
            s(&img),
            "64M",
        ],
    );
    write(&img, "qcow2", &["write -P 0x11 0 8M"]);
    bitmap(&img, &["--add"], "b");
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    write(&img, "qcow2", &["write -P 0x22 40M 64k"]);
    updates(d, &old, s(&img), BS, &FILE_CHECKS);
    let j = incremental_json(&old, "b", s(&img), &d.join("again.map"));
    assert_eq!(j["conflicting-blocks"], 0, "{j}");
}

/// Another image renamed over the base's: OLD is the map of `d.qcow2`; a
/// copy of it, changed in one block before its own bitmap `nb` was
/// added, is renamed over `d.qcow2`. The bitmap says nothing of that
/// block and the samples may miss it: the update is refused naming the
/// file and the reason (blkmap and blksync's state alike). `--verify`
/// reads every block and finds the block the bitmap missed.
#[test]
fn another_file_renamed_over_the_image() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 64 * MIB, &["write -P 0x11 0 32M"]);
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    let dst = d.join("dst.raw");
    let state = d.join("dst.map");
    let o = run(BLKSYNC, &[s(&img), s(&dst), "--state", s(&state)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let copy = d.join("copy.qcow2");
    std::fs::copy(&img, &copy).unwrap();
    // Block 65: not one of the 16 samples (data blocks 0, 32, 64, ...).
    write(&copy, "qcow2", &["write -P 0x99 4160k 64k"]);
    bitmap(&copy, &["--add"], "nb");
    std::fs::rename(&copy, &img).unwrap();

    let out = d.join("new.map");
    let o = incremental(&old, "nb", s(&img), &out, &[]);
    assert_refused(
        &o,
        &[s(&img), "not the one", "verify the update"],
        &out,
        None,
    );
    let o = incremental(&old, "nb", s(&img), &out, &["--verify"]);
    assert_refused(&o, &["4259840"], &out, None);
    let before = std::fs::read(&dst).unwrap();
    let o = run(
        BLKSYNC,
        &[
            "--dirty-bitmap",
            "nb",
            "--state",
            s(&state),
            s(&img),
            s(&dst),
        ],
    );
    assert_eq!(o.code, 1, "blksync: {}", o.stderr);
    assert!(o.stderr.contains("not the one"), "{}", o.stderr);
    assert_eq!(std::fs::read(&dst).unwrap(), before, "DST changed");
}
