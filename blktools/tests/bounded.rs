//! Maps in bounded memory: a full map, an incremental update, a diff of
//! two maps, a merge, and blksync's runs with a state, of a 1 GiB
//! all-data disk in 512-byte blocks (a 64 MiB map, 32 bytes a block) each
//! peak well under the map's size. A build that held a map whole again
//! would peak above it: measured with the maps in memory (blkhash 0.12
//! before maps were streamed), the full map peaked at 102 MiB and the
//! diff at 135 MiB, and blksync's update with a state at 160 MiB (the
//! state and SRC's map).
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
pub(crate) const LOCAL_LIMIT: u64 = 16 * MIB;

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
pub(crate) fn bounded(dir: &Path, bin: &str, args: &[&str], limit: u64, expect: i32) -> String {
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

/// Digest and block size: 32 bytes a 512-byte block.
const OPTS: [&str; 4] = ["-d", "blake3", "--block-size", "512"];

/// The disk of issue 52, 1 GiB: nbdkit's `pattern` (data in every block)
/// under a qcow2 overlay in `d` holding dirty bitmap `b`, served by
/// `qemu-nbd -B b`; both servers (the second's URL is the disk's), or
/// `None` (the test skipped) without the tools.
fn all_data_disk(d: &Path) -> Option<(Server, Server)> {
    if !require(&["nbdkit", "qemu-nbd", "qemu-io", "/usr/bin/time"]) {
        return None;
    }
    let pattern = nbdkit(&d.join("pattern.sock"), &["pattern", "size=1G"])?;
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
    let server = qemu_nbd(d, &top, &["-B", "b"])?;
    Some((pattern, server))
}

/// The disk's full map (at `url`) written to `out`, in bounded memory:
/// its checksum line.
fn map_of(d: &Path, url: &str, out: &Path) -> String {
    let mut args = OPTS.to_vec();
    args.extend([url, s(out)]);
    bounded(d, BLKMAP, &args, NBD_LIMIT, 0)
}

/// Two 1 MiB-and-64-KiB writes to the disk at `url`, as the bitmap sees them.
fn write_some(url: &str) {
    sh(
        "qemu-io",
        &[
            "-f",
            "raw",
            url,
            "-c",
            "write -P 0x33 1M 1M",
            "-c",
            "write -P 0x44 600M 64k",
        ],
    );
}

#[test]
fn maps_of_a_large_disk_stay_in_bounded_memory() {
    let Some(d) = scratch() else { return };
    let d = d.path();
    let Some((pattern, server)) = all_data_disk(d) else {
        return;
    };
    let url = server.url.clone();
    let (old, new, full) = (d.join("old.map"), d.join("new.map"), d.join("full.map"));
    let map = |out: &Path| map_of(d, &url, out);
    map(&old);
    // The map is as large as the issue says: 32 bytes a data block.
    assert!(std::fs::metadata(&old).unwrap().len() > 64 * MIB);

    write_some(&url);
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

/// blksync --state from the disk into a local file: the first copy, an
/// update that reads SRC whole (nothing to write), one through the dirty
/// bitmap and a comparison with DST read, each well under the state's
/// size: the state is read where it lies, the maps written as they are
/// made.
#[test]
fn blksync_with_a_state_stays_in_bounded_memory() {
    let Some(d) = scratch() else { return };
    let d = d.path();
    let Some((pattern, server)) = all_data_disk(d) else {
        return;
    };
    let url = server.url.clone();
    let (dst, state, full) = (d.join("dst.raw"), d.join("dst.map"), d.join("full.map"));
    let sync = |extra: &[&str]| {
        let mut args = OPTS.to_vec();
        args.extend([url.as_str(), s(&dst), "--state", s(&state)]);
        args.extend(extra);
        bounded(d, BLKSYNC, &args, NBD_LIMIT, 0)
    };
    sync(&[]);
    assert!(std::fs::metadata(&state).unwrap().len() > 64 * MIB);
    sync(&[]);
    write_some(&url);
    sync(&["--dirty-bitmap", "b"]);
    // DST read and compared, the state ignored: both maps on disk.
    sync(&["--force-rescan"]);
    // The state is SRC's map now, and DST holds what it says.
    map_of(d, &url, &full);
    assert_same_map(&state, &full);
    let diff = run(BLKDIFF, &["-q", s(&state), s(&dst)]);
    assert_eq!(diff.code, 0, "{}", diff.stderr);
    drop(server);
    drop(pattern);
}
