//! Incremental maps from QEMU's dirty bitmaps, on real images written by
//! qemu-io and served by qemu-nbd, nbdkit and qemu-storage-daemon: `blkmap
//! --base OLD --dirty-bitmap NAME IMAGE OUT` writes byte for byte the map a
//! full `blkmap IMAGE OUT` writes and prints blksum's checksum, reading
//! only the dirty blocks and a sample; what cannot be trusted (a bitmap in
//! use or disabled, OLD of another image, a server without the bitmap) is
//! refused and nothing written; `blkmap bitmaps` lists what QEMU says;
//! `blksync --dirty-bitmap` copies only the dirty blocks.
//!
//! The oracles: a full `blkmap` of the same image, blksum (or the
//! construction on qemu-img's raw conversion), `qemu-img info`'s bitmaps,
//! and the dirty ranges as QEMU itself exports them (qemu-nbd -B and
//! `qemu-img map` with `x-dirty-bitmap`).

use crate::common;

use blkmap::Map;
use common::dirty::*;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use testkit::qsd::Qsd;

const KIB: u64 = 1024;

/// The blocks the incremental run samples at least (or all clean ones).
const SAMPLE: u64 = 16;

/// The ranges (start, end) the bitmap `name` of the qcow2 image `img`
/// marks dirty, as QEMU exports them: qemu-nbd -r -B NAME read by
/// `qemu-img map` with `x-dirty-bitmap` (dirty ranges show as no data).
/// None (said) if qemu-nbd is missing.
fn qemu_dirty(dir: &Path, img: &Path, name: &str) -> Option<Vec<(u64, u64)>> {
    if !require(&["qemu-nbd"]) {
        return None;
    }
    let sock = dir.join("dirty-oracle.sock");
    let server = testkit::nbd::qemu_nbd_with(
        img,
        "qcow2",
        Listen::Unix(&sock),
        None,
        &["--read-only", "-B", name],
    );
    let opts = format!(
        "driver=nbd,server.type=unix,server.path={},x-dirty-bitmap=qemu:dirty-bitmap:{name}",
        sock.display()
    );
    let out = run("qemu-img", &["map", "--output=json", "--image-opts", &opts]);
    drop(server);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    Some(
        v.as_array()
            .unwrap()
            .iter()
            .filter(|e| !e["data"].as_bool().unwrap())
            .map(|e| {
                let start = e["start"].as_u64().unwrap();
                (start, start + e["length"].as_u64().unwrap())
            })
            .collect(),
    )
}

/// Blocks of `bs` that any of `ranges` touches.
fn blocks_touched(ranges: &[(u64, u64)], bs: u64) -> u64 {
    let mut blocks: Vec<u64> = ranges
        .iter()
        .flat_map(|&(a, b)| a / bs..b.div_ceil(bs))
        .collect();
    blocks.sort_unstable();
    blocks.dedup();
    blocks.len() as u64
}

/// The JSON report of an incremental run against what is known: the
/// image, its checksum, size and block size; the dirty blocks QEMU's
/// bitmap marks (`dirty`, if known); at least 16 clean blocks sampled;
/// read no more than the dirty blocks and the sample.
fn check_report(j: &Value, image: &str, sum: &str, size: u64, bs: u64, dirty: Option<u64>) {
    assert_eq!(j["image"], image, "{j}");
    assert_eq!(j["checksum"], sum, "{j}");
    assert_eq!(j["digest"], "sha256", "{j}");
    assert_eq!(j["block-size"], bs, "{j}");
    assert_eq!(j["schema"], 1, "{j}");
    assert_eq!(j["virtual-size"], size, "{j}");
    assert_eq!(
        j["size"], size,
        "the first spelling, kept while schema is 1: {j}"
    );
    let blocks = size.div_ceil(bs);
    assert_eq!(j["blocks"], blocks, "{j}");
    let n = |k: &str| j[k].as_u64().unwrap_or_else(|| panic!("{k} in {j}"));
    if let Some(d) = dirty {
        assert_eq!(n("dirty-blocks"), d, "the blocks QEMU's bitmap marks: {j}");
    }
    let clean = blocks - n("dirty-blocks");
    assert!(n("sampled-blocks") >= SAMPLE.min(clean), "{j}");
    assert!(n("sampled-blocks") <= clean, "{j}");
    assert!(
        n("read-bytes") <= (n("dirty-blocks") + n("sampled-blocks")) * bs,
        "read more than the dirty blocks and the sample: {j}"
    );
}

/// The full map of `img` with blocks of `bs` in `dir/{tag}.full.map`,
/// its checksum checked against blksum's: what an update must equal.
fn oracle_map(dir: &Path, img: &Path, bs: u64, tag: &str) -> (PathBuf, String) {
    let whole = dir.join(format!("{tag}.full.map"));
    let sum = full(s(img), &whole, &["--block-size", &bs.to_string()]);
    assert_eq!(sum, oracle(dir, s(img), bs), "{tag}: blkmap is not blksum");
    (whole, sum)
}

/// One incremental update checked against the full map `whole` (checksum
/// `want`): OUT (plain run) and OUT (--json run) both byte for byte
/// `whole`, the checksum printed `want`, the report as [`check_report`]
/// (dirty blocks from QEMU's export of the bitmap); the report returned.
fn check_against(
    dir: &Path,
    img: &Path,
    old: &Path,
    name: &str,
    (whole, want): (&Path, &str),
    tag: &str,
) -> Value {
    let image = s(img);
    let (out, out_json) = (
        dir.join(format!("{tag}.out.map")),
        dir.join(format!("{tag}.json.map")),
    );
    let o = incremental(old, name, image, &out, &[]);
    assert_eq!(o.code, 0, "{tag}: {}", o.stderr);
    let sum = checksum_of(&o.stdout, image);
    let j = incremental_json(old, name, image, &out_json);
    assert_same_map(&out, whole);
    assert_same_map(&out_json, whole);
    assert_eq!(
        sum, want,
        "{tag}: the incremental checksum is not the full map's"
    );
    let map = Map::load(whole).unwrap();
    let bs = map.block_size() as u64;
    let dirty = qemu_dirty(dir, img, name).map(|r| blocks_touched(&r, bs));
    check_report(&j, image, &sum, map.size(), bs, dirty);
    std::fs::remove_file(&out_json).unwrap();
    std::fs::remove_file(&out).unwrap();
    j
}

/// [`check_against`] the full map of `img` ([`oracle_map`]).
fn check_update(dir: &Path, img: &Path, old: &Path, name: &str, bs: u64, tag: &str) -> Value {
    let (whole, want) = oracle_map(dir, img, bs, tag);
    let j = check_against(dir, img, old, name, (&whole, &want), tag);
    std::fs::remove_file(&whole).unwrap();
    j
}

/// Granularities 4k, 64k, 1M, 2M (four bitmaps of one image) against
/// block sizes 4k, 64k, 1M (one OLD each): data, written zeros, discards,
/// writes across block boundaries and into a hole; then the bitmaps
/// cleared, OUT the new OLD, and another round of writes.
#[test]
fn granularities_and_block_sizes() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 96 * MIB;
    let data = 88 * MIB;
    let img = image(d, "disk.qcow2", "qcow2", size, &["write -P 0x11 0 88M"]);
    let grans = [4 * KIB, 64 * KIB, MIB, 2 * MIB];
    let sizes = [4 * KIB, 64 * KIB, MIB];
    for g in grans {
        bitmap(&img, &["--add", "-g", &g.to_string()], &format!("g{g}"));
    }
    let old = |bs: u64| d.join(format!("old-{bs}.map"));
    for bs in sizes {
        full(s(&img), &old(bs), &["--block-size", &bs.to_string()]);
    }
    let rounds: [&[&str]; 2] = [
        &[
            "write -P 0x21 0 4k",
            "write -P 0x22 3132k 70k", // across 4k, 64k and 1M boundaries
            "write -z 9M 8k",
            "discard 17M 1M",
            "write -P 0x23 31M 512",
            "write -P 0x24 90M 64k", // into the hole
            "write -z 20M 2M",
        ],
        &[
            "write -P 0x31 1M 4k",
            "write -z 3132k 4k",
            "discard 40M 64k",
            "write -P 0x32 95M 1M", // the last MiB
            "write -P 0x33 60M 1k",
        ],
    ];
    for (r, cmds) in rounds.iter().enumerate() {
        write(&img, "qcow2", cmds);
        for bs in sizes {
            let (whole, want) = oracle_map(d, &img, bs, &format!("r{r}-bs{bs}"));
            for g in grans {
                let tag = format!("r{r}-g{g}-bs{bs}");
                let j = check_against(d, &img, &old(bs), &format!("g{g}"), (&whole, &want), &tag);
                let read = j["read-bytes"].as_u64().unwrap();
                assert!(
                    read * 2 < data,
                    "{tag}: read {read} bytes of {data} of data: {j}"
                );
            }
        }
        // The next round starts from here: the maps updated in place (OUT
        // == OLD), then the bitmaps cleared.
        for bs in sizes {
            let o = incremental(&old(bs), "g4096", s(&img), &old(bs), &[]);
            assert_eq!(o.code, 0, "{}", o.stderr);
            assert_same_map(&old(bs), &d.join(format!("r{r}-bs{bs}.full.map")));
        }
        for g in grans {
            bitmap(&img, &["--clear"], &format!("g{g}"));
        }
    }
}

/// OUT may be OLD's own path: OLD is replaced by the full map, nothing
/// else is left in the directory.
#[test]
fn out_replaces_old() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 16 * MIB, &["write -P 0x11 0 12M"]);
    bitmap(&img, &["--add"], "b");
    let old = d.join("disk.map");
    let first = full(s(&img), &old, &[]);
    write(&img, "qcow2", &["write -P 0x22 5M 100k", "write -z 1M 64k"]);
    let o = incremental(&old, "b", s(&img), &old, &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let sum = checksum_of(&o.stdout, s(&img));
    assert_ne!(sum, first);
    let whole = d.join("whole.map");
    assert_eq!(full(s(&img), &whole, &[]), sum);
    assert_same_map(&old, &whole);
    assert_eq!(sum, oracle(d, s(&img), 65536));
    let mut names: Vec<_> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["disk.map", "src.qcow2", "whole.map"]);
}

/// --verify passes on a true bitmap (OUT the full map) and fails, naming
/// the block, when the image changed behind the bitmap's back (written
/// while it was disabled, then enabled again); OUT is not written.
#[test]
fn verify_catches_writes_behind_the_bitmap() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 32 * MIB, &["write -P 0x11 0 32M"]);
    bitmap(&img, &["--add"], "b");
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    write(&img, "qcow2", &["write -P 0x22 2M 64k"]);
    let out = d.join("out.map");
    let o = incremental(&old, "b", s(&img), &out, &["--verify"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let whole = d.join("whole.map");
    assert_eq!(checksum_of(&o.stdout, s(&img)), full(s(&img), &whole, &[]));
    assert_same_map(&out, &whole);
    std::fs::remove_file(&out).unwrap();

    // Block 80 (offset 5 MiB) written while the bitmap was disabled.
    bitmap(&img, &["--disable"], "b");
    write(&img, "qcow2", &["write -P 0x33 5M 4k"]);
    bitmap(&img, &["--enable"], "b");
    let o = incremental(&old, "b", s(&img), &out, &["--verify"]);
    assert_refused(&o, &["5242880"], &out, None);
    // The same with OUT == OLD: OLD stays as it was.
    let before = std::fs::read(&old).unwrap();
    let o = incremental(&old, "b", s(&img), &old, &["--verify"]);
    assert_refused(&o, &["5242880"], &old, Some(&before));
}

/// A bitmap left in use by a writer that died (qemu-io aborted) is
/// refused, saying it is in use and inconsistent; nothing is written.
#[test]
fn in_use_bitmap_refused() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 8 * MIB, &["write -P 0x11 0 4M"]);
    bitmap(&img, &["--add"], "b");
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    // qemu-io dies with SIGABRT (no core file wanted).
    let o = run(
        "sh",
        &[
            "-c",
            "ulimit -c 0; exec qemu-io -f qcow2 -c 'write -P 1 0 64k' -c abort \"$0\"",
            s(&img),
        ],
    );
    assert_ne!(o.code, 0, "qemu-io abort: {}", o.stderr);
    let info = qemu_img_bitmaps(&img);
    assert!(
        info[0]["flags"]
            .as_array()
            .unwrap()
            .contains(&Value::from("in-use")),
        "{info:?}"
    );
    let out = d.join("out.map");
    let o = incremental(&old, "b", s(&img), &out, &[]);
    assert_refused(&o, &["in use", "inconsistent"], &out, None);
    let before = std::fs::read(&old).unwrap();
    let o = incremental(&old, "b", s(&img), &old, &[]);
    assert_refused(&o, &["in use", "inconsistent"], &old, Some(&before));
}

/// A disabled bitmap of a qcow2 image is refused (it may miss writes).
#[test]
fn disabled_bitmap_refused() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 8 * MIB, &["write -P 0x11 0 4M"]);
    bitmap(&img, &["--add"], "b");
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    write(&img, "qcow2", &["write -P 0x22 1M 4k"]);
    bitmap(&img, &["--disable"], "b");
    let out = d.join("out.map");
    let o = incremental(&old, "b", s(&img), &out, &[]);
    assert_refused(&o, &["disabled", "'b'"], &out, None);
}

/// OLD of another image (same size, digest and block size: caught by the
/// sample), of another size, digest or block size; a bitmap that is not
/// there; a raw image: refused, naming what is wrong, nothing written.
#[test]
fn wrong_bases_and_bitmaps_refused() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 16 * MIB;
    let img = src_qcow2(d, size, &["write -P 0x11 0 16M"]);
    bitmap(&img, &["--add"], "b");
    let other = image(d, "other.qcow2", "qcow2", size, &["write -P 0x99 0 16M"]);
    let smaller = image(
        d,
        "smaller.qcow2",
        "qcow2",
        size - MIB,
        &["write -P 0x11 0 15M"],
    );
    let raw = image(d, "disk.raw", "raw", size, &["write -P 0x11 0 16M"]);
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    write(&img, "qcow2", &["write -P 0x22 1M 4k"]);

    let other_map = d.join("other.map");
    full(s(&other), &other_map, &[]);
    let smaller_map = d.join("smaller.map");
    full(s(&smaller), &smaller_map, &[]);
    let blake3 = d.join("blake3.map");
    full(s(&img), &blake3, &["-d", "blake3"]);
    let small_blocks = d.join("small-blocks.map");
    full(s(&img), &small_blocks, &["--block-size", "4k"]);
    let out = d.join("out.map");

    // Another image's map, updated elsewhere or in place.
    let o = incremental(&other_map, "b", s(&img), &out, &[]);
    assert_refused(&o, &[s(&other_map)], &out, None);
    let before = std::fs::read(&other_map).unwrap();
    let o = incremental(&other_map, "b", s(&img), &other_map, &[]);
    assert_refused(&o, &[s(&other_map)], &other_map, Some(&before));
    // Another size.
    let o = incremental(&smaller_map, "b", s(&img), &out, &[]);
    assert_refused(&o, &[s(&smaller_map)], &out, None);
    // A digest or block size asked for that OLD is not of.
    let o = incremental(&old, "b", s(&img), &out, &["-d", "blake3"]);
    assert_refused(&o, &[s(&old)], &out, None);
    let o = incremental(&old, "b", s(&img), &out, &["--block-size", "4k"]);
    assert_refused(&o, &[s(&old)], &out, None);
    // OLD's own digest and block size are taken: these work.
    for (base, bs) in [(&blake3, 65536u64), (&small_blocks, 4096)] {
        let o = incremental(base, "b", s(&img), &out, &[]);
        assert_eq!(o.code, 0, "{}", o.stderr);
        let whole = d.join("whole.map");
        let extra = if bs == 4096 {
            ["--block-size", "4k"]
        } else {
            ["-d", "blake3"]
        };
        assert_eq!(
            checksum_of(&o.stdout, s(&img)),
            full(s(&img), &whole, &extra)
        );
        assert_same_map(&out, &whole);
        std::fs::remove_file(&out).unwrap();
    }
    // No such bitmap: named.
    let o = incremental(&old, "nope", s(&img), &out, &[]);
    assert_refused(&o, &["nope"], &out, None);
    // A raw image has none.
    let raw_map = d.join("raw.map");
    full(s(&raw), &raw_map, &[]);
    let o = incremental(&raw_map, "b", s(&raw), &out, &[]);
    assert_refused(&o, &["no dirty bitmaps"], &out, None);
}

/// A bitmap of an overlay whose unwritten ranges come from its backing
/// file: the incremental map is the full one.
#[test]
fn overlay_with_backing_chain() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 16 * MIB;
    image(
        d,
        "base.qcow2",
        "qcow2",
        size,
        &["write -P 0x11 0 12M", "write -z 12M 1M"],
    );
    let (top, old) = overlay_with_bitmap(d);
    write(
        &top,
        "qcow2",
        &[
            "write -P 0x33 2M 4k",   // over the overlay's own data
            "write -P 0x44 6M 64k",  // over the backing file's data
            "write -z 8M 128k",      // zeros over backing data
            "discard 10M 64k",       // discarded in the overlay
            "write -P 0x55 14M 64k", // over a hole of both
        ],
    );
    check_update(d, &top, &old, "b", 65536, "overlay");
}

/// A dirty range at the very end of images whose size is not a multiple
/// of the granularity (nor of the block size).
#[test]
fn dirty_range_at_an_unaligned_end() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    for (size, gran, bs, last) in [
        (MIB + 4 * KIB, "64k", 65536, "write -P 0x22 1M 4k"),
        (3 * MIB + 512, "1M", 4096, "write -P 0x22 3M 512"),
        (5 * MIB + 64 * KIB, "2M", MIB, "write -P 0x22 5M 64k"),
    ] {
        let tag = format!("end-{size}");
        let img = image(
            d,
            &format!("{tag}.qcow2"),
            "qcow2",
            size,
            &[&format!("write -P 0x11 0 {size}")],
        );
        bitmap(&img, &["--add", "-g", gran], "b");
        let old = d.join(format!("{tag}.map"));
        full(s(&img), &old, &["--block-size", &bs.to_string()]);
        write(&img, "qcow2", &[last]);
        let j = check_update(d, &img, &old, "b", bs, &tag);
        assert!(j["dirty-blocks"].as_u64().unwrap() >= 1, "{j}");
    }
}

/// qemu-nbd -r -B NAME: the incremental map of the URL is the full map of
/// the URL and of the file; read-bytes bounded as on a file.
#[test]
fn over_nbd_with_qemu_nbd() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 64 * MIB;
    let img = src_qcow2(d, size, &["write -P 0x11 0 60M"]);
    bitmap(&img, &["--add", "-g", "256k"], "b");
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    write(
        &img,
        "qcow2",
        &["write -P 0x22 1M 8k", "write -z 30M 1M", "discard 50M 256k"],
    );
    let file_map = d.join("file.map");
    let want = full(s(&img), &file_map, &[]);
    let Some(server) = qemu_nbd(d, &img, &["--read-only", "-B", "b"]) else {
        return;
    };
    let url = server.url.clone();
    let out = d.join("out.map");
    let o = incremental(&old, "b", &url, &out, &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(checksum_of(&o.stdout, &url), want);
    let url_map = d.join("url.map");
    assert_eq!(full(&url, &url_map, &[]), want);
    assert_same_map(&out, &url_map);
    assert_same_map(&out, &file_map);
    let j = incremental_json(&old, "b", &url, &d.join("json.map"));
    // 256k granules: 1M, 30M..31M, 50M: 1 + 4 + 1 granules = 6 × 4 blocks.
    check_report(&j, &url, &want, size, 65536, Some(24));
    assert!(j["read-bytes"].as_u64().unwrap() < 8 * MIB, "{j}");
    assert_eq!(want, oracle(d, &url, 65536));
}

/// A server that does not offer the bitmap (qemu-nbd without -B, nbdkit):
/// refused, naming the metadata context; nothing written.
#[test]
fn nbd_server_without_the_bitmap() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 8 * MIB, &["write -P 0x11 0 4M"]);
    bitmap(&img, &["--add"], "b");
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    let out = d.join("out.map");
    if let Some(server) = qemu_nbd(d, &img, &["--read-only"]) {
        let o = incremental(&old, "b", &server.url, &out, &[]);
        assert_refused(&o, &["qemu:dirty-bitmap:b"], &out, None);
    }
    let raw = image(d, "disk.raw", "raw", 8 * MIB, &["write -P 0x11 0 4M"]);
    let raw_map = d.join("raw.map");
    full(s(&raw), &raw_map, &[]);
    if let Some(server) = nbdkit(&d.join("nbdkit.sock"), &["file", s(&raw)]) {
        let o = incremental(&raw_map, "b", &server.url, &out, &[]);
        assert_refused(&o, &["qemu:dirty-bitmap:b"], &out, None);
    }
}

/// `qemu-img info`'s bitmaps of a qcow2 image (name, granularity, flags).
fn qemu_img_bitmaps(img: &Path) -> Vec<Value> {
    let out = run("qemu-img", &["info", "-U", "--output=json", s(img)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    v["format-specific"]["data"]["bitmaps"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// `blkmap bitmaps [--json] IMAGE`, which must succeed: the lines, or
/// the JSON array.
fn bitmaps_lines(image: &str) -> Vec<String> {
    let o = run(BLKMAP, &["bitmaps", image]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    o.stdout.lines().map(String::from).collect()
}

fn bitmaps_json(image: &str) -> Vec<Value> {
    let o = run(BLKMAP, &["bitmaps", "--json", image]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: Value = serde_json::from_str(&o.stdout).unwrap();
    v.as_array().unwrap().clone()
}

/// The flags of a line of `blkmap bitmaps`: its third column, split.
fn line_of<'a>(lines: &'a [String], name: &str) -> Vec<&'a str> {
    let line = lines
        .iter()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no line for {name}: {lines:?}"));
    line.split_whitespace().collect()
}

/// `blkmap bitmaps` of qcow2 images agrees with `qemu-img info`: names,
/// granularities, enabled or disabled, in use.
#[test]
fn lists_bitmaps_of_a_qcow2_image() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 8 * MIB, &[]);
    let none = bitmaps_json(s(&img));
    assert!(none.is_empty(), "{none:?}");
    bitmap(&img, &["--add"], "b1");
    bitmap(&img, &["--add", "-g", "1M", "--disable"], "b2");
    bitmap(&img, &["--add", "-g", "4k"], "third-bitmap");
    let check = |img: &Path| {
        let want = qemu_img_bitmaps(img);
        let got = bitmaps_json(s(img));
        let lines = bitmaps_lines(s(img));
        assert_eq!(got.len(), want.len(), "{got:?} {want:?}");
        for w in &want {
            let name = w["name"].as_str().unwrap();
            let flags: Vec<&str> = w["flags"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap())
                .collect();
            let g = got
                .iter()
                .find(|g| g["name"] == name)
                .unwrap_or_else(|| panic!("{name} not listed: {got:?}"));
            assert_eq!(g["granularity"], w["granularity"], "{g}");
            assert_eq!(g["enabled"], flags.contains(&"auto"), "{g} {w}");
            assert_eq!(g["in-use"], flags.contains(&"in-use"), "{g} {w}");
            let cols = line_of(&lines, name);
            assert_eq!(cols.len(), 3, "{cols:?}");
            assert_eq!(cols[1], w["granularity"].to_string(), "{cols:?}");
            let shown: Vec<&str> = cols[2].split(',').collect();
            let state = if flags.contains(&"auto") {
                "enabled"
            } else {
                "disabled"
            };
            assert!(shown.contains(&state), "{cols:?} {w}");
            assert_eq!(
                shown.contains(&"in-use"),
                flags.contains(&"in-use"),
                "{cols:?} {w}"
            );
        }
    };
    check(&img);
    // A writer that died leaves them in use.
    let o = run(
        "sh",
        &[
            "-c",
            "ulimit -c 0; exec qemu-io -f qcow2 -c 'write -P 1 0 64k' -c abort \"$0\"",
            s(&img),
        ],
    );
    assert_ne!(o.code, 0);
    assert!(
        qemu_img_bitmaps(&img)
            .iter()
            .any(|b| b["flags"].to_string().contains("in-use"))
    );
    check(&img);
}

/// Over NBD only the names are known: each bitmap qemu-nbd offers (-B,
/// twice), nothing else; none for a server without.
#[test]
fn lists_bitmaps_of_an_nbd_export() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 8 * MIB, &[]);
    bitmap(&img, &["--add"], "b1");
    bitmap(&img, &["--add", "-g", "1M"], "b2");
    bitmap(&img, &["--add"], "not-exported");
    let Some(server) = qemu_nbd(d, &img, &["--read-only", "-B", "b1", "-B", "b2"]) else {
        return;
    };
    let got = bitmaps_json(&server.url);
    let mut names: Vec<&str> = got.iter().map(|b| b["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["b1", "b2"], "{got:?}");
    for b in &got {
        assert!(b["granularity"].is_null(), "{b}");
    }
    let lines = bitmaps_lines(&server.url);
    for name in ["b1", "b2"] {
        let cols = line_of(&lines, name);
        assert_eq!(&cols[1..], ["-", "-"], "{lines:?}");
    }
    assert!(!lines.iter().any(|l| l.contains("not-exported")));
    drop(server);
    let Some(server) = qemu_nbd(d, &img, &["--read-only"]) else {
        return;
    };
    assert!(bitmaps_json(&server.url).is_empty());
}

/// blksync's summary: bytes written.
fn written(stderr: &str) -> u64 {
    let line = stderr.lines().last().unwrap();
    line.split(": ")
        .last()
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Bytes read from SRC, if blksync's summary says (`N bytes read`).
fn src_read(stderr: &str) -> Option<u64> {
    let line = stderr.lines().last()?;
    let words: Vec<&str> = line.split([' ', ',', ';']).collect();
    words
        .windows(3)
        .find(|w| w[1] == "bytes" && w[2] == "read")
        .and_then(|w| w[0].parse().ok())
}

/// `blksync --dirty-bitmap b --state MAP SRC DST` after a first copy with
/// the state and writes to SRC: DST holds SRC's content, the state is
/// SRC's full map, the dirty blocks only are written; rounds with the
/// bitmap kept (more dirty than needed) and cleared.
#[test]
fn blksync_with_a_dirty_bitmap() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 64 * MIB;
    let src = src_qcow2(d, size, &["write -P 0x11 0 56M"]);
    bitmap(&src, &["--add"], "b");
    let dst = d.join("dst.raw");
    let state = d.join("dst.map");
    let o = run(BLKSYNC, &[s(&src), s(&dst), "--state", s(&state)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let rounds: [(&[&str], bool); 3] = [
        (
            &[
                "write -P 0x22 1M 4k",
                "write -z 9M 1M",
                "discard 20M 64k",
                "write -P 0x23 60M 128k",
            ],
            false,
        ),
        // The bitmap still marks the first round's blocks too.
        (&["write -P 0x33 2M 64k", "write -P 0x34 63M 1M"], true),
        (&["write -P 0x44 30M 4k", "write -z 60M 64k"], false),
    ];
    for (i, (cmds, clear_after)) in rounds.iter().enumerate() {
        write(&src, "qcow2", cmds);
        let o = sync_through(&["--dirty-bitmap", "b"], &state, &src, &dst);
        assert_eq!(o.code, 0, "round {i}: {}", o.stderr);
        assert!(same(&src, &dst), "round {i}: DST is not SRC");
        assert_eq!(
            oracle(d, s(&src), 65536),
            oracle(d, s(&dst), 65536),
            "round {i}"
        );
        let whole = d.join("whole.map");
        full(s(&src), &whole, &[]);
        assert_eq!(
            Map::load(&state).unwrap(),
            Map::load(&whole).unwrap(),
            "round {i}: the state is not SRC's map"
        );
        let dirty = qemu_dirty(d, &src, "b").map(|r| blocks_touched(&r, 65536) * 65536);
        if let Some(dirty) = dirty {
            assert!(
                written(&o.stderr) <= dirty,
                "round {i}: wrote more than the dirty blocks ({dirty}): {}",
                o.stderr
            );
            match src_read(&o.stderr) {
                Some(read) => assert!(
                    read <= dirty + SAMPLE * 65536,
                    "round {i}: read {read} bytes of SRC, dirty {dirty}: {}",
                    o.stderr
                ),
                None => eprintln!("round {i}: blksync does not say what it read: not checked"),
            }
        }
        if *clear_after {
            bitmap(&src, &["--clear"], "b");
        }
    }
}

// ---------------------------------------------------------------- live

/// A live writer: qemu-storage-daemon holding `disk.qcow2` (data in its
/// first 24 MiB), the persistent bitmap `b` (64k) added over QMP, a
/// writable export `w` taking qemu-io writes. None (said) without
/// qemu-storage-daemon.
fn live(d: &Path) -> Option<(Qsd, String)> {
    if !testkit::qsd::have_qsd() {
        return None;
    }
    let img = image(d, "disk.qcow2", "qcow2", 32 * MIB, &["write -P 0x11 0 24M"]);
    let mut qsd = Qsd::start(&img, "qcow2", d);
    qsd.bitmap_add("b", Some(65536), true);
    qsd.nbd_start(&d.join("nbd.sock"));
    let w = qsd.export("w", true, &[]);
    Some((qsd, w))
}

/// Writes through the export `url` (qemu-io on NBD).
fn write_url(url: &str, cmds: &[&str]) {
    write(Path::new(url), "raw", cmds);
}

/// The writes of each cycle.
const CYCLES: [&[&str]; 3] = [
    &["write -P 7 1M 64k", "write -z 4M 128k", "write -P 8 30M 4k"],
    &["write -P 9 1M 4k", "discard 8M 1M", "write -P 10 12M 192k"],
    &["write -P 11 31M 1M", "write -P 12 100k 1k"],
];

/// An incremental map of the export `url` (bitmap `name` offered) equals
/// a full map of it and blksum's checksum; OUT returned.
fn live_check(d: &Path, url: &str, old: &Path, name: &str, cycle: usize) -> PathBuf {
    let out = d.join(format!("cycle{cycle}.map"));
    let o = incremental(old, name, url, &out, &[]);
    assert_eq!(o.code, 0, "cycle {cycle}: {}", o.stderr);
    let whole = d.join(format!("cycle{cycle}.full.map"));
    let want = full(url, &whole, &[]);
    assert_eq!(checksum_of(&o.stdout, url), want, "cycle {cycle}");
    assert_same_map(&out, &whole);
    assert_eq!(want, oracle(d, url, 65536), "cycle {cycle}");
    out
}

/// The live bitmap offered by a second export of the node (writable:
/// QEMU refuses an enabled bitmap on a read-only export of a writable
/// node; nobody writes through it): full map right after the bitmap is
/// added; each cycle writes, the incremental map equals the full one, the
/// export is removed (an exported bitmap is busy), the bitmap cleared over
/// QMP, OUT the next OLD.
#[test]
fn live_writer_bitmap_exported() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let Some((mut qsd, w)) = live(d) else { return };
    let e = qsd.try_export("ro", false, &["b"]).unwrap_err();
    assert!(e.desc.contains("readonly"), "{e}");
    let url = qsd.export("r", true, &["b"]);
    let mut old = d.join("old.map");
    full(&url, &old, &[]);
    for (i, cmds) in CYCLES.iter().enumerate() {
        write_url(&w, cmds);
        old = live_check(d, &url, &old, "b", i);
        qsd.export_del("r");
        qsd.bitmap_clear("b");
        qsd.export("r", true, &["b"]);
    }
}

/// The backup application's way: each cycle freezes the bitmap (a
/// disabled copy made and the live one cleared in one QMP transaction)
/// and offers the copy on a read-only export; the incremental map of that
/// export equals its full map; the copy is dropped after.
#[test]
fn live_writer_frozen_bitmap_read_only() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let Some((mut qsd, w)) = live(d) else { return };
    let url = qsd.export("r", false, &[]);
    let mut old = d.join("old.map");
    full(&url, &old, &[]);
    qsd.export_del("r");
    for (i, cmds) in CYCLES.iter().enumerate() {
        write_url(&w, cmds);
        qsd.bitmap_freeze("b", "frozen", true);
        let url = qsd.export("r", false, &["frozen"]);
        old = live_check(d, &url, &old, "frozen", i);
        // The live bitmap was cleared at the freeze; a write since is
        // in it, not in the frozen copy.
        let counts = qsd.bitmaps();
        let count = |n: &str| {
            counts.iter().find(|b| b["name"] == n).unwrap()["count"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(count("b"), 0, "{counts:?}");
        assert!(count("frozen") > 0, "{counts:?}");
        qsd.export_del("r");
        qsd.bitmap_remove("frozen");
    }
}

/// What a user of a running VM meets (issue #50): blksync on the image
/// file a qemu-storage-daemon holds is refused (the bitmap is in use)
/// and pointed to the recipe; the recipe (a frozen copy of the bitmap on
/// a read-only export) then works, the socket named relative to the
/// directory where the first copy named it absolute: one export.
#[test]
fn a_running_vm_s_bitmap_through_the_recipe() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    if !testkit::qsd::have_qsd() {
        return;
    }
    let img = image(d, "vm.qcow2", "qcow2", 32 * MIB, &["write -P 0x11 0 24M"]);
    bitmap(&img, &["--add"], "b");
    let mut qsd = Qsd::start(&img, "qcow2", d);
    qsd.nbd_start(&d.join("nbd.sock"));
    let w = qsd.export("w", true, &[]);
    // The image file, read anyway (-U): its copy, then an update refused.
    let (file_dst, file_state) = (d.join("file.raw"), d.join("file.map"));
    let o = sync_through(&["-U"], &file_state, &img, &file_dst);
    assert_eq!(o.code, 0, "{}", o.stderr);
    write_url(&w, CYCLES[0]);
    let o = sync_through(&["-U", "--dirty-bitmap", "b"], &file_state, &img, &file_dst);
    assert_eq!(o.code, 1, "{}", o.stderr);
    for words in [
        "in use",
        "frozen copy of the bitmap",
        "over NBD",
        "incremental.md",
    ] {
        assert!(o.stderr.contains(words), "{words}: {}", o.stderr);
    }
    // The recipe: night 0 from a read-only export, its socket absolute.
    let (dst, state) = (d.join("dst.raw"), d.join("dst.map"));
    let url = qsd.export("r", false, &[]);
    assert!(url.contains(&format!("socket={}", d.display())), "{url}");
    let o = run(BLKSYNC, &["--state", s(&state), &url, s(&dst)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    qsd.export_del("r");
    write_url(&w, CYCLES[1]);
    // The next night: frozen, exported, read by a relative socket path.
    qsd.bitmap_freeze("b", "frozen", true);
    qsd.export("r", false, &["frozen"]);
    let relative = "nbd+unix:///r?socket=nbd.sock";
    let o = std::process::Command::new(BLKSYNC)
        .args([
            "--dirty-bitmap",
            "frozen",
            "--state",
            s(&state),
            relative,
            s(&dst),
        ])
        .current_dir(d)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("(the dirty bitmap's)"), "{err}");
    qsd.export_del("r");
    qsd.bitmap_remove("frozen");
    let copied = full(s(&dst), &d.join("dst.check.map"), &[]);
    assert_eq!(copied, full(&w, &d.join("w.map"), &[]));
}

/// An update that must read the image whole says what each command's
/// user runs (issue #50): blkmap a full map (or --verify, when only the
/// base's record is missing), blksync a copy without --dirty-bitmap.
#[test]
fn refusals_name_what_each_command_runs() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 8 * MIB, &["write -P 0x11 0 4M"]);
    bitmap(&img, &["--add"], "b");
    let (dst, state) = (d.join("dst.raw"), d.join("dst.map"));
    let o = run(BLKSYNC, &["--state", s(&state), s(&img), s(&dst)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    write(&img, "qcow2", &["write -P 0x22 1M 4k"]);
    // A base (and a state) written before maps recorded their image.
    let bare = |p: &Path| {
        let m = Map::load(p).unwrap().with_identity(None).unwrap();
        m.save(p).unwrap();
    };
    let old = d.join("old.map");
    full(s(&img), &old, &[]);
    bare(&old);
    let o = incremental(&old, "b", s(&img), &d.join("out.map"), &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("read the image whole")
            && o.stderr.contains("blkmap IMAGE OUT, without --base")
            && o.stderr.contains("--verify"),
        "{}",
        o.stderr
    );
    bare(&state);
    let o = sync_through(&["--dirty-bitmap", "b"], &state, &img, &dst);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains("blksync without --dirty-bitmap") && !o.stderr.contains("--base"),
        "{}",
        o.stderr
    );
}

/// `blksync OPTS --state STATE SRC DST`.
fn sync_through(opts: &[&str], state: &Path, src: &Path, dst: &Path) -> Out {
    let mut args = opts.to_vec();
    args.extend(["--state", s(state), s(src), s(dst)]);
    run(BLKSYNC, &args)
}
