//! Maps in bounded memory: a full map, an incremental update, a diff of
//! two maps and a merge of a 1 GiB all-data disk in 512-byte blocks (a
//! 64 MiB map, 32 bytes a block) each peak well under the map's size. A
//! build that held a map whole again would peak above it: measured with
//! the maps in memory (blkhash 0.12 before maps were streamed), the full
//! map peaked at 102 MiB and the diff at 135 MiB.
//!
//! The disk is nbdkit's `pattern` plugin (data in every block) under a
//! qcow2 overlay holding a dirty bitmap, served by `qemu-nbd -B`, as
//! issue 52 measured it; peak RSS is GNU time's (the `time` package).

use crate::common;

use common::dirty::{assert_same_map, bitmap};
use common::*;
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};

/// What a run over NBD may use: the reader's buffers (about 38 MiB) and
/// a little more, whatever the map's size.
const NBD_LIMIT: u64 = 48 * MIB;
/// What reading and writing maps alone may use.
const LOCAL_LIMIT: u64 = 16 * MIB;

/// Run `bin args` under GNU time: its exit status, stdout, stderr and
/// peak RSS in bytes. Not wait4(2) from here: a child spawned by this
/// process starts from its peak RSS (the kernel keeps the high-water mark
/// of the memory an exec replaces), and other tests make it large; GNU
/// time, small, forks the command from itself.
fn measured(dir: &Path, bin: &str, args: &[&str]) -> (i32, String, String, u64) {
    let (out, err, rss) = (dir.join("rss.out"), dir.join("rss.err"), dir.join("rss"));
    let status = Command::new("/usr/bin/time")
        .args(["-f", "%M", "-o", s(&rss), bin])
        .args(args)
        .stdout(Stdio::from(File::create(&out).unwrap()))
        .stderr(Stdio::from(File::create(&err).unwrap()))
        .status()
        .unwrap();
    let read = |p: &Path| {
        let s = std::fs::read_to_string(p).unwrap();
        std::fs::remove_file(p).unwrap();
        s
    };
    let (stdout, stderr, rss) = (read(&out), read(&err), read(&rss));
    // GNU time says "Command exited with non-zero status N" first, then
    // the peak in KiB.
    let kib: u64 = rss.lines().last().unwrap().trim().parse().unwrap();
    (status.code().unwrap_or(-1), stdout, stderr, kib * 1024)
}

/// Run a map command that must succeed within `limit` bytes of RSS.
fn bounded(dir: &Path, bin: &str, args: &[&str], limit: u64, expect: i32) -> String {
    let (code, out, err, rss) = measured(dir, bin, args);
    assert_eq!(code, expect, "{bin} {args:?}: {err}");
    assert!(
        rss < limit,
        "{bin} {args:?} peaked at {} MiB (limit {} MiB): is a map held whole?",
        rss / MIB,
        limit / MIB
    );
    out
}

#[test]
fn maps_of_a_large_disk_stay_in_bounded_memory() {
    let Some(d) = scratch() else { return };
    if !require(&["nbdkit", "qemu-nbd", "qemu-io", "/usr/bin/time"]) {
        return;
    }
    let d = d.path();
    let Some(pattern) = nbdkit(&d.join("pattern.sock"), &["pattern", "size=1G"]) else {
        return;
    };
    let top = d.join("top.qcow2");
    let backing = pattern.url.as_str();
    sh(
        "qemu-img",
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            backing,
            "-F",
            "raw",
            s(&top),
        ],
    );
    bitmap(&top, &["--add"], "b");
    let Some(server) = qemu_nbd(d, &top, &["-B", "b"]) else {
        return;
    };
    let url = server.url.clone();
    let (old, new, full) = (d.join("old.map"), d.join("new.map"), d.join("full.map"));
    let opts = ["-d", "blake3", "--block-size", "512"];
    let map = |out: &Path| {
        let mut args = opts.to_vec();
        args.extend([url.as_str(), s(out)]);
        bounded(d, BLKMAP, &args, NBD_LIMIT, 0)
    };
    map(&old);
    // The map is as large as the issue says: 32 bytes a data block.
    assert!(std::fs::metadata(&old).unwrap().len() > 64 * MIB);

    sh(
        "qemu-io",
        &[
            "-f",
            "raw",
            &url,
            "-c",
            "write -P 0x33 1M 1M",
            "-c",
            "write -P 0x44 600M 64k",
        ],
    );
    let args = ["--base", s(&old), "--dirty-bitmap", "b", &url, s(&new)];
    let line = bounded(d, BLKMAP, &args, NBD_LIMIT, 0);
    let sum = map(&full);
    assert_eq!(line, sum, "the update's checksum is the full map's");
    assert_same_map(&new, &full);

    // Maps alone: read as streams, side by side.
    let diff = bounded(d, BLKDIFF, &[s(&old), s(&new)], LOCAL_LIMIT, 1);
    assert_eq!(
        diff,
        format!("{}+{}\n{}+{}\n", MIB, MIB, 600 * MIB, 64 << 10)
    );
    let merged = d.join("merged.map");
    bounded(d, BLKMAP, &["merge", s(&merged), s(&new)], LOCAL_LIMIT, 0);
    drop(server);
    drop(pattern);
}
