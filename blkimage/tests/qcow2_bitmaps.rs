//! Persistent dirty bitmaps of qcow2 images against QEMU: bitmaps added
//! with `qemu-img bitmap`, writes made with qemu-io, and the ranges read
//! through our `Source::dirty` compared with the writes widened to the
//! granularity and with QEMU's own reading of the bitmap (qemu-nbd exports
//! it, `qemu-img map` with `x-dirty-bitmap` shows it).

// Dirty ranges are lists of byte ranges: one range alone is meant.
#![allow(clippy::single_range_in_vec_init)]

use crate::common;

use blkimage::{BitmapInfo, OpenOptions, Qcow2, Source};
use common::open_with;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use tempfile::TempDir;
use testkit::nbd::{Listen, qemu_nbd_with};
use testkit::tools::{have, have_qemu, qemu_img_in, qemu_io_in, scratch};

struct Dir(TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(scratch())
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
    fn img(&self, args: &[&str]) -> String {
        String::from_utf8(qemu_img_in(self.0.path(), args).stdout).unwrap()
    }
    fn io(&self, name: &str, cmds: &[&str]) {
        qemu_io_in(self.0.path(), Path::new(name), "qcow2", cmds);
    }
    fn create(&self, name: &str, opts: &str, size: &str) {
        let mut args = vec!["create", "-q", "-f", "qcow2"];
        if !opts.is_empty() {
            args.extend(["-o", opts]);
        }
        args.extend([name, size]);
        self.img(&args);
    }
    /// `qemu-img bitmap --add [-g GRAN] NAME BITMAP`.
    fn add(&self, name: &str, bitmap: &str, granularity: Option<&str>) {
        let mut args = vec!["bitmap", "--add"];
        if let Some(g) = granularity {
            args.extend(["-g", g]);
        }
        args.extend([name, bitmap]);
        self.img(&args);
    }
    fn open(&self, name: &str) -> Box<dyn Source> {
        open_with(self.path(name), &OpenOptions::default()).unwrap()
    }
    fn patch(&self, name: &str, offset: u64, bytes: &[u8]) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path(name))
            .unwrap();
        f.write_all_at(bytes, offset).unwrap();
    }
    /// QEMU's reading of bitmap `bitmap` of `name`: qemu-nbd exports it,
    /// `qemu-img map` reports its dirty ranges as `"data": false` (the
    /// `x-dirty-bitmap` debugging option). None without qemu-nbd.
    fn qemu_dirty(&self, name: &str, bitmap: &str) -> Option<Vec<Range<u64>>> {
        if !have("qemu-nbd") {
            eprintln!("qemu-nbd missing: QEMU's reading of the bitmap not compared");
            return None;
        }
        let sock = self.path(&format!("{name}.{bitmap}.sock"));
        let _srv = qemu_nbd_with(
            &self.path(name),
            "qcow2",
            Listen::Unix(&sock),
            None,
            &["--read-only", "-B", bitmap],
        );
        let opts = format!(
            "driver=nbd,server.type=unix,server.path={},x-dirty-bitmap=qemu:dirty-bitmap:{bitmap}",
            sock.display()
        );
        let map = self.img(&["map", "--output=json", "--image-opts", &opts]);
        let mut out: Vec<Range<u64>> = Vec::new();
        for line in map.lines().filter(|l| l.contains("\"start\"")) {
            if !line.contains("\"data\": false") {
                continue;
            }
            let (start, len) = (field(line, "start"), field(line, "length"));
            match out.last_mut() {
                Some(last) if last.end == start => last.end += len,
                _ => out.push(start..start + len),
            }
        }
        Some(out)
    }
    /// Check `dirty(bitmap)` of `name` against `want` and QEMU's reading.
    fn check(&self, name: &str, bitmap: &str, want: &[Range<u64>]) {
        let src = self.open(name);
        let d = src.dirty(bitmap).unwrap();
        assert_eq!(d.bitmap.name, bitmap);
        assert_eq!(d.ranges, want, "{name} {bitmap}: the writes, widened");
        if let Some(q) = self.qemu_dirty(name, bitmap) {
            assert_eq!(d.ranges, q, "{name} {bitmap}: QEMU's reading");
        }
        contract(src.size(), &d.ranges);
    }
}

/// The number after `"KEY": ` in a line of qemu-img's JSON.
fn field(line: &str, key: &str) -> u64 {
    let at = line.find(&format!("\"{key}\": ")).unwrap() + key.len() + 4;
    let digits: String = line[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().unwrap()
}

/// The `Dirty` contract: in order, non-empty, not adjacent, within size.
fn contract(size: u64, ranges: &[Range<u64>]) {
    for (i, r) in ranges.iter().enumerate() {
        assert!(r.start < r.end && r.end <= size, "{r:?} of {size}");
        if i > 0 {
            assert!(ranges[i - 1].end < r.start, "{ranges:?}");
        }
    }
}

/// Byte ranges widened to whole granules of `g`, merged, clipped to `size`.
fn widened(writes: &[(u64, u64)], g: u64, size: u64) -> Vec<Range<u64>> {
    let mut w: Vec<Range<u64>> = writes
        .iter()
        .map(|&(o, l)| o / g * g..((o + l).div_ceil(g) * g).min(size))
        .collect();
    w.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::new();
    for r in w {
        match out.last_mut() {
            Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

const K: u64 = 1024;
const M: u64 = 1024 * 1024;

#[test]
fn writes_at_each_granularity() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    let size = 64 * M;
    // Data, zeros and a discard; some at odd offsets, two close together
    // (merged at coarse granularities), one crossing a granule boundary.
    let writes = [
        (100 * K, 4 * K),
        (130 * K, 1),
        (3 * M - 512, 1024),
        (10 * M, 200 * K),
        (20 * M, 64 * K),
        (40 * M + 5 * K, 3 * M),
        (size - 512, 512),
    ];
    let cmds = [
        "write -P 1 100k 4k",
        "write -P 2 130k 1",
        "write -P 3 3145216 1k",
        "write -z 10m 200k",
        "discard 20m 64k",
        "write -P 4 41948160 3m",
        "write -P 5 67108352 512",
    ];
    for (g, gran) in [(4 * K, "4k"), (64 * K, "64k"), (M, "1M"), (2 * M, "2M")] {
        let name = format!("g{gran}.qcow2");
        d.create(&name, "", "64M");
        d.add(&name, "b", Some(gran));
        d.io(&name, &cmds);
        let want = widened(&writes, g, size);
        d.check(&name, "b", &want);
        let info = d.open(&name).dirty("b").unwrap().bitmap;
        assert_eq!(
            info,
            BitmapInfo {
                name: "b".into(),
                granularity: Some(g),
                in_use: Some(false),
                enabled: Some(true),
            }
        );
    }
}

#[test]
fn small_clusters_and_several_data_clusters() {
    if !have_qemu() {
        return;
    }
    // 512-byte clusters: a data cluster of the bitmap covers 4096 granules
    // (2 MiB at 512 bytes), so the bitmap spans several.
    let d = Dir::new();
    d.create("s.qcow2", "cluster_size=512", "16M");
    d.add("s.qcow2", "b", Some("512"));
    d.io(
        "s.qcow2",
        &[
            "write -P 1 1m 1536k",
            "write -P 2 5m 1",
            "write -P 3 9000k 7k",
        ],
    );
    let want = widened(&[(M, 1536 * K), (5 * M, 1), (9000 * K, 7 * K)], 512, 16 * M);
    d.check("s.qcow2", "b", &want);
}

#[test]
fn size_not_a_multiple_of_the_granularity() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    // qemu-img rounds 1000000 up to 1000448 (whole sectors).
    d.create("odd.qcow2", "", "1000000");
    d.add("odd.qcow2", "b", Some("64k"));
    d.io("odd.qcow2", &["write -P 1 999936 512", "write -P 2 0 1"]);
    let size = d.open("odd.qcow2").size();
    assert_eq!(size, 1_000_448);
    // The last granule passes the end: the range stops at the size.
    let want = vec![0..64 * K, 15 * 64 * K..size];
    assert_eq!(widened(&[(999_936, 512), (0, 1)], 64 * K, size), want);
    d.check("odd.qcow2", "b", &want);
}

#[test]
fn no_writes() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    d.create("e.qcow2", "", "10M");
    d.add("e.qcow2", "b", None);
    d.check("e.qcow2", "b", &[]);
    // Reads do not mark anything.
    d.io("e.qcow2", &["read 0 1m"]);
    d.check("e.qcow2", "b", &[]);
}

/// A table entry QEMU reads as "all ones" (bit 0 with no data cluster):
/// QEMU never writes one, so a qemu-made entry of a fully dirty data
/// cluster is replaced by it, and QEMU must read the image the same.
#[test]
fn all_ones_table_entry() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    // 512-byte clusters and granules: a data cluster covers 2 MiB.
    d.create("ones.qcow2", "cluster_size=512", "8M");
    d.add("ones.qcow2", "b", Some("512"));
    d.io("ones.qcow2", &["write -z 2m 2m", "write -P 1 6m 4k"]);
    let want = vec![2 * M..4 * M, 6 * M..6 * M + 4 * K];
    d.check("ones.qcow2", "b", &want);

    // The table's second entry: the directory's first entry says where
    // the table is.
    let file = std::fs::read(d.path("ones.qcow2")).unwrap();
    let q = Qcow2::from_storage(std::sync::Arc::new(file.clone())).unwrap();
    let ext = q.header().bitmaps.unwrap();
    assert!(ext.consistent);
    assert_eq!(ext.count, 1);
    let dir = ext.directory_offset as usize;
    let table = u64::from_be_bytes(file[dir..dir + 8].try_into().unwrap());
    let size = u32::from_be_bytes(file[dir + 8..dir + 12].try_into().unwrap());
    assert_eq!(size, 4);
    let at = table as usize + 8;
    let entry = u64::from_be_bytes(file[at..at + 8].try_into().unwrap());
    assert_ne!(entry, 0, "a data cluster for the dirty 2 MiB");
    d.patch("ones.qcow2", table + 8, &1u64.to_be_bytes());
    d.check("ones.qcow2", "b", &want);
}

#[test]
fn in_use_refused() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    d.create("u.qcow2", "", "1M");
    d.add("u.qcow2", "b", None);
    // qemu-io aborts with the image open for writing: the bitmap stays in
    // use (qemu-io exits on SIGABRT, hence no run_ok).
    let status = std::process::Command::new("qemu-io")
        .args([
            "-f",
            "qcow2",
            "-c",
            "write -P 1 0 64k",
            "-c",
            "abort",
            "u.qcow2",
        ])
        .current_dir(d.0.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success());
    let info = d.img(&["info", "--output", "json", "u.qcow2"]);
    assert!(info.contains("\"in-use\""), "{info}");
    let src = d.open("u.qcow2");
    let list = src.bitmaps().unwrap();
    assert_eq!(list[0].in_use, Some(true));
    let e = src.dirty("b").unwrap_err();
    let t = e.to_string();
    assert!(
        t.contains("in use") && t.contains("inconsistent") && t.contains("'b'"),
        "{t}"
    );
}

#[test]
fn disabled_returned_as_such() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    d.create("dis.qcow2", "", "4M");
    d.add("dis.qcow2", "b", None);
    d.io("dis.qcow2", &["write -P 1 0 4k"]);
    d.img(&["bitmap", "--disable", "dis.qcow2", "b"]);
    // Not recorded any more.
    d.io("dis.qcow2", &["write -P 2 1m 4k"]);
    let dirty = d.open("dis.qcow2").dirty("b").unwrap();
    assert_eq!(dirty.bitmap.enabled, Some(false));
    d.check("dis.qcow2", "b", &[0..64 * K]);
}

/// The bitmaps in `qemu-img info --output json`'s format-specific data:
/// (name, granularity, flags).
fn qemu_bitmaps(info: &str) -> Vec<(String, u64, Vec<String>)> {
    let Some(at) = info.find("\"bitmaps\": [") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut rest = info[at + 12..].trim_start();
    // Objects without nested braces (flags are a list), up to the "]".
    while let Some(obj_start) = rest.strip_prefix('{') {
        let end = obj_start.find('}').unwrap();
        let obj = &obj_start[..end];
        let name = obj.split("\"name\": \"").nth(1).unwrap();
        let name = name[..name.find('"').unwrap()].to_string();
        let flags_at = obj.find("\"flags\": [").unwrap() + 10;
        let flags_end = flags_at + obj[flags_at..].find(']').unwrap();
        let flags = obj[flags_at..flags_end]
            .split(',')
            .map(|f| f.trim().trim_matches('"').to_string())
            .filter(|f| !f.is_empty())
            .collect();
        out.push((name, field(obj, "granularity"), flags));
        rest = obj_start[end + 1..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    out
}

#[test]
fn listing_matches_qemu_img_info() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    d.create("l.qcow2", "", "8M");
    d.add("l.qcow2", "first", None);
    d.add("l.qcow2", "fine", Some("4k"));
    d.add("l.qcow2", "coarse", Some("2M"));
    d.img(&["bitmap", "--disable", "l.qcow2", "coarse"]);
    d.io("l.qcow2", &["write -P 1 0 1m"]);
    let info = d.img(&["info", "--output", "json", "l.qcow2"]);
    let want = qemu_bitmaps(&info);
    assert_eq!(want.len(), 3, "{info}");
    let got = d.open("l.qcow2").bitmaps().unwrap();
    assert_eq!(got.len(), 3);
    for (b, (name, g, flags)) in got.iter().zip(&want) {
        assert_eq!(&b.name, name);
        assert_eq!(b.granularity, Some(*g));
        assert_eq!(b.in_use, Some(flags.iter().any(|f| f == "in-use")));
        assert_eq!(b.enabled, Some(flags.iter().any(|f| f == "auto")));
    }
    assert_eq!(got[2].enabled, Some(false));

    // A missing name: NotFound, with the names there are.
    let e = d.open("l.qcow2").dirty("nope").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    let t = e.to_string();
    assert!(
        t.contains("'nope'") && t.contains("first, fine, coarse"),
        "{t}"
    );

    // An image without bitmaps.
    d.create("none.qcow2", "", "1M");
    let src = d.open("none.qcow2");
    assert_eq!(src.bitmaps().unwrap(), vec![]);
    let e = src.dirty("b").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotFound);
    assert!(e.to_string().contains("the image has none"), "{e}");
}

/// The bitmap of an overlay records the writes through the overlay; the
/// backing file's bitmaps are the backing file's, not the overlay's.
#[test]
fn overlay_with_backing_file() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    d.create("base.qcow2", "", "8M");
    d.add("base.qcow2", "old", None);
    d.io("base.qcow2", &["write -P 1 0 4m"]);
    d.img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        "top.qcow2",
    ]);
    d.add("top.qcow2", "b", Some("4k"));
    d.io("top.qcow2", &["write -P 2 1m 8k", "write -z 6m 4k"]);
    d.check("top.qcow2", "b", &[M..M + 8 * K, 6 * M..6 * M + 4 * K]);
    let top = d.open("top.qcow2");
    let names: Vec<String> = top.bitmaps().unwrap().into_iter().map(|b| b.name).collect();
    assert_eq!(names, ["b"]);
    assert_eq!(
        top.dirty("old").unwrap_err().kind(),
        io::ErrorKind::NotFound
    );
    d.check("base.qcow2", "old", &[0..4 * M]);
}

/// With an external data file the bitmaps stay in the qcow2 file.
#[test]
fn external_data_file() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    // An absolute name: qemu-nbd runs elsewhere.
    let raw = d.path("x.raw");
    d.create("x.qcow2", &format!("data_file={}", raw.display()), "4M");
    d.add("x.qcow2", "b", None);
    d.io("x.qcow2", &["write -P 1 100k 1k", "write -P 2 3m 128k"]);
    d.check("x.qcow2", "b", &[64 * K..128 * K, 3 * M..3 * M + 128 * K]);
}

/// The autoclear bit of the bitmaps extension cleared, as a program
/// without bitmap support leaves it: every bitmap is inconsistent.
#[test]
fn autoclear_bit_clear() {
    if !have_qemu() {
        return;
    }
    let d = Dir::new();
    d.create("a.qcow2", "", "4M");
    d.add("a.qcow2", "b", None);
    d.io("a.qcow2", &["write -P 1 0 4k"]);
    // autoclear_features: bytes 88-95 of a version 3 header, bit 0 last.
    let file = std::fs::read(d.path("a.qcow2")).unwrap();
    assert_eq!(file[95] & 1, 1);
    d.patch("a.qcow2", 95, &[file[95] & !1]);
    let src = d.open("a.qcow2");
    let list = src.bitmaps().unwrap();
    assert_eq!((list[0].name.as_str(), list[0].in_use), ("b", Some(true)));
    let t = src.dirty("b").unwrap_err().to_string();
    assert!(t.contains("inconsistent") && t.contains("'b'"), "{t}");
    // QEMU agrees: it drops the bitmaps of such an image.
    let info = d.img(&["info", "--output", "json", "a.qcow2"]);
    assert!(qemu_bitmaps(&info).is_empty(), "{info}");
}
