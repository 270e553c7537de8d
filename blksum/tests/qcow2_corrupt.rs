//! Corrupt and hostile qcow2 images, one per case, each made by patching a
//! valid image that QEMU wrote (offsets from the header fields read back
//! from the file, big-endian as in QEMU's `docs/interop/qcow2.txt`).
//!
//! Every one must fail alone: exit status 1, no checksum, a message naming
//! the image and the problem, within seconds (a hang is killed and fails);
//! another input on the same command line is still hashed.

use crate::common;

use common::qemu::*;
use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(20);

/// Words for "this offset is not inside the file".
const BEYOND: &[&str] = &[
    "beyond",
    "past",
    "outside",
    "end of file",
    "eof",
    "exceed",
    "truncat",
    "short",
    "larger than",
    "after the end",
];

/// Words for "this compressed cluster does not decompress to one cluster".
const BAD_COMPRESSED: &[&str] = &[
    "compress", "inflate", "deflate", "zlib", "zstd", "corrupt", "invalid",
];

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A valid 4 MiB qcow2 image (created with `opts`) holding data in its
/// first cluster and further on.
fn valid(dir: &Path, name: &str, opts: &[&str]) -> PathBuf {
    let img = dir.join(name);
    create_qcow2(&img, opts, "4M");
    qemu_io(
        &img,
        "qcow2",
        &["write -P 0x5a 0 128k", "write -P 0x5b 1M 64k"],
    );
    img
}

/// A valid image whose first cluster is compressed (`opts` choose the
/// compression type and cluster size).
fn compressed(dir: &Path, name: &str, opts: &[&str], cluster: u64, pattern: u8) -> PathBuf {
    let img = dir.join(name);
    create_qcow2(&img, opts, "4M");
    qemu_io(
        &img,
        "qcow2",
        &[&format!("write -c -P 0x{pattern:02x} 0 {cluster}")],
    );
    let h = Header::read(&img);
    let entry = be64(&img, h.l2_entry0_pos(&img));
    assert!(
        entry & COMPRESSED != 0,
        "cluster 0 of {} compressed",
        img.display()
    );
    img
}

/// How the command selects the format for a case.
#[derive(Clone, Copy)]
enum Select {
    /// Probed, and with `-f qcow2`.
    Both,
    /// Only with `-f qcow2` (the patch makes probing see a raw file).
    Forced,
}

/// `img` must be refused: status 1, no checksum for it (another input is
/// still hashed), its name and one of `words` on stderr, within `LIMIT`.
fn expect_rejected(img: &Path, select: Select, words: &[&str]) {
    let dir = img.parent().unwrap();
    // A valid qcow2 (so that `-f qcow2` applies to it too), its checksum from
    // QEMU's raw conversion.
    let good = dir.join("good.qcow2");
    if !good.exists() {
        create_qcow2(&good, &[], "1M");
        qemu_io(&good, "qcow2", &["write -P 0x47 4k 8k"]);
    }
    let flat = dir.join("good.flat.raw");
    flatten(&good, &flat);
    let good_sum = raw_sum(&flat, &[]);
    let sets: &[&[&str]] = match select {
        Select::Both => &[&[], &QCOW2],
        Select::Forced => &[&QCOW2],
    };
    for fmt in sets {
        let start = Instant::now();
        let args = [fmt, &[p(img), p(&good)][..]].concat();
        let out = run_timeout(&args, None, LIMIT);
        let err = stderr(&out);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{fmt:?} {}: {err}",
            img.display()
        );
        assert_eq!(
            stdout(&out),
            format!("{good_sum}  {}\n", p(&good)),
            "{fmt:?} {}: {err}",
            img.display()
        );
        assert!(
            err.contains(&format!("{}:", p(img))),
            "{fmt:?}: stderr does not name {}: {err}",
            img.display()
        );
        assert!(
            mentions_any(&err, words),
            "{fmt:?} {}: stderr mentions none of {words:?}: {err}",
            img.display()
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} took {:?}",
            img.display(),
            start.elapsed()
        );
        eprintln!("{} {fmt:?}: {}", img.display(), err.trim());
    }
}

// ---------------------------------------------------------------------------
// Tables and clusters outside the file, or misaligned

#[test]
fn l1_table_beyond_eof() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "l1.qcow2", &[]);
    let h = Header::read(&img);
    set_be64(&img, off::L1_TABLE_OFFSET, h.beyond_eof(&img));
    expect_rejected(&img, Select::Both, BEYOND);
}

#[test]
fn l2_table_beyond_eof() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "l2.qcow2", &[]);
    let h = Header::read(&img);
    set_be64(&img, h.l1_entry_pos(0), h.beyond_eof(&img) | COPIED);
    expect_rejected(&img, Select::Both, BEYOND);
}

#[test]
fn data_cluster_beyond_eof() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "data.qcow2", &[]);
    let h = Header::read(&img);
    set_be64(&img, h.l2_entry0_pos(&img), h.beyond_eof(&img) | COPIED);
    expect_rejected(&img, Select::Both, BEYOND);
}

#[test]
fn data_cluster_beyond_eof_with_4k_clusters() {
    // The second guest cluster: not the first entry of its table.
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "data4k.qcow2", &["-o", "cluster_size=4k"]);
    let h = Header::read(&img);
    set_be64(&img, h.l2_entry0_pos(&img) + 8, h.beyond_eof(&img) | COPIED);
    expect_rejected(&img, Select::Both, BEYOND);
}

#[test]
fn misaligned_l2_table() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "l2align.qcow2", &[]);
    let h = Header::read(&img);
    let l2 = h.l2_entry0_pos(&img);
    set_be64(&img, h.l1_entry_pos(0), (l2 + 512) | COPIED);
    expect_rejected(&img, Select::Both, &["align"]);
}

#[test]
fn misaligned_data_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "dalign.qcow2", &[]);
    let h = Header::read(&img);
    let pos = h.l2_entry0_pos(&img);
    let data = be64(&img, pos) & OFFSET_MASK;
    set_be64(&img, pos, (data + 512) | COPIED);
    expect_rejected(&img, Select::Both, &["align"]);
}

// ---------------------------------------------------------------------------
// Header fields out of range

#[test]
fn cluster_bits_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    for bits in [8u32, 22, 64] {
        let img = valid(dir.path(), &format!("bits{bits}.qcow2"), &[]);
        set_be32(&img, off::CLUSTER_BITS, bits);
        expect_rejected(&img, Select::Both, &["cluster"]);
    }
}

#[test]
fn l1_size_over_the_32_mib_limit() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "l1big.qcow2", &[]);
    // One entry more than QEMU's 32 MiB limit on the active L1 table.
    set_be32(&img, off::L1_SIZE, (32 << 20) / 8 + 1);
    expect_rejected(&img, Select::Both, &["l1", "too large", "limit"]);
}

#[test]
fn l1_size_times_8_overflows() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "l1ovf.qcow2", &[]);
    // l1_size * 8 does not fit in 32 bits.
    set_be32(&img, off::L1_SIZE, u32::MAX);
    expect_rejected(
        &img,
        Select::Both,
        &["l1", "too large", "limit", "overflow"],
    );
}

#[test]
fn l1_table_end_overflows() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "l1end.qcow2", &[]);
    // A cluster-aligned offset where offset + l1_size * 8 wraps around 2^64,
    // with an L1 table within QEMU's 32 MiB limit.
    set_be64(&img, off::L1_TABLE_OFFSET, 0xffff_ffff_ffff_0000);
    set_be32(&img, off::L1_SIZE, 0x2001);
    let mut words = vec!["l1", "overflow", "invalid"];
    words.extend(BEYOND);
    expect_rejected(&img, Select::Both, &words);
}

#[test]
fn virtual_size_overflows() {
    let dir = tempfile::tempdir().unwrap();
    for (i, size) in [1u64 << 63, u64::MAX, u64::MAX - 511]
        .into_iter()
        .enumerate()
    {
        let img = valid(dir.path(), &format!("size{i}.qcow2"), &[]);
        set_be64(&img, off::SIZE, size);
        expect_rejected(&img, Select::Both, &["size", "large", "overflow", "l1"]);
    }
}

#[test]
fn header_length_larger_than_a_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "hlen.qcow2", &[]);
    let h = Header::read(&img);
    set_be32(&img, off::HEADER_LENGTH, 2 * h.cluster_size() as u32);
    expect_rejected(&img, Select::Both, &["header"]);
}

#[test]
fn header_length_too_short_or_not_a_multiple_of_8() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "hshort.qcow2", &[]);
    set_be32(&img, off::HEADER_LENGTH, 72);
    expect_rejected(&img, Select::Both, &["header"]);
    // Not a multiple of 8.
    let img = valid(dir.path(), "hodd.qcow2", &[]);
    set_be32(&img, off::HEADER_LENGTH, 108);
    expect_rejected(&img, Select::Both, &["header"]);
}

#[test]
fn truncated_header() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "trunc.qcow2", &[]);
    // The magic and version, then nothing.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&img)
        .unwrap()
        .set_len(8)
        .unwrap();
    let mut words = vec!["header"];
    words.extend(BEYOND);
    expect_rejected(&img, Select::Both, &words);
}

#[test]
fn unsupported_version() {
    let dir = tempfile::tempdir().unwrap();
    for v in [4u32, 0xffff_ffff] {
        let img = valid(dir.path(), &format!("v{v}.qcow2"), &[]);
        set_be32(&img, off::VERSION, v);
        expect_rejected(&img, Select::Both, &["version"]);
    }
    // Version 1 (and a wrong magic) are not qcow2 to the probe: forced only.
    for (name, at, bytes) in [
        ("v1.qcow2", off::VERSION, &1u32.to_be_bytes()[..]),
        ("magic.qcow2", off::MAGIC, &b"QFI\xfc"[..]),
    ] {
        let img = valid(dir.path(), name, &[]);
        write_at(&img, at, bytes);
        expect_rejected(&img, Select::Forced, &["version", "magic", "not a qcow2"]);
    }
}

#[test]
fn backing_file_name_too_long_or_outside_the_first_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = valid(d, "base.qcow2", &[]);
    let mk = |name: &str| {
        let img = d.join(name);
        create_qcow2(&img, &["-b", p(&base), "-F", "qcow2"], "4M");
        img
    };
    // Longer than the 1023 bytes the specification allows.
    let img = mk("long.qcow2");
    set_be32(&img, off::BACKING_FILE_SIZE, 2000);
    expect_rejected(&img, Select::Both, &["backing"]);
    // Beyond the end of the file.
    let img = mk("far.qcow2");
    let h = Header::read(&img);
    set_be64(&img, off::BACKING_FILE_OFFSET, h.beyond_eof(&img));
    let mut words = vec!["backing"];
    words.extend(BEYOND);
    expect_rejected(&img, Select::Both, &words);
    // Offset plus length overflows.
    let img = mk("wrap.qcow2");
    set_be64(&img, off::BACKING_FILE_OFFSET, u64::MAX - 8);
    expect_rejected(&img, Select::Both, &words);
}

// ---------------------------------------------------------------------------
// Feature bits

#[test]
fn unknown_incompatible_feature() {
    let dir = tempfile::tempdir().unwrap();
    for bit in [5u32, 63] {
        let img = valid(dir.path(), &format!("feature{bit}.qcow2"), &[]);
        set_incompatible(&img, 1 << bit);
        expect_rejected(
            &img,
            Select::Both,
            &["feature", "unsupported", "incompatible", "unknown"],
        );
    }
}

#[test]
fn corrupt_bit() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "corrupt.qcow2", &[]);
    set_incompatible(&img, INCOMPAT_CORRUPT);
    expect_rejected(&img, Select::Both, &["corrupt"]);
}

#[test]
fn dirty_bit_still_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, opts) in [
        ("dirty.qcow2", &[][..]),
        ("lazy.qcow2", &["-o", "lazy_refcounts=on"][..]),
    ] {
        let img = valid(d, name, opts);
        let flat = d.join("flat.raw");
        flatten(&img, &flat);
        let want = raw_sum(&flat, &[]);
        set_incompatible(&img, INCOMPAT_DIRTY);
        assert_ne!(Header::read(&img).incompatible & INCOMPAT_DIRTY, 0);
        for fmt in [&[][..], &QCOW2[..]] {
            let out = run_timeout(&[fmt, &[p(&img)]].concat(), None, LIMIT);
            assert!(out.status.success(), "{name}: {}", stderr(&out));
            assert_eq!(stdout(&out), format!("{want}  {}\n", p(&img)), "{name}");
        }
    }
}

// ---------------------------------------------------------------------------
// Compressed clusters

#[test]
fn compressed_cluster_beyond_eof() {
    let dir = tempfile::tempdir().unwrap();
    let img = compressed(dir.path(), "cbeyond.qcow2", &[], 65536, 0x41);
    let h = Header::read(&img);
    let pos = h.l2_entry0_pos(&img);
    set_be64(&img, pos, h.compressed_entry(h.beyond_eof(&img) + 100, 600));
    expect_rejected(&img, Select::Both, BEYOND);
    // Starting inside the file, its sectors running past the end.
    let img = compressed(dir.path(), "cstraddle.qcow2", &[], 65536, 0x41);
    let h = Header::read(&img);
    let pos = h.l2_entry0_pos(&img);
    let (host, _) = h.compressed_extent(be64(&img, pos));
    set_be64(&img, pos, h.compressed_entry(host, 20 * 512));
    assert!(host + 20 * 512 > file_len(&img));
    expect_rejected(&img, Select::Both, &[BEYOND, BAD_COMPRESSED].concat());
}

/// Put the compressed stream of `from`'s first cluster in place of `to`'s,
/// appended at the end of `to` (sector-aligned), and point `to`'s first L2
/// entry at it.
fn transplant_compressed(from: &Path, to: &Path) {
    let hf = Header::read(from);
    let (host, len) = hf.compressed_extent(be64(from, hf.l2_entry0_pos(from)));
    let len = len.min(file_len(from) - host);
    let stream = read_at(from, host, len as usize);
    let ht = Header::read(to);
    let at = file_len(to).next_multiple_of(512);
    write_at(to, at, &stream);
    let end = file_len(to).next_multiple_of(512);
    std::fs::OpenOptions::new()
        .write(true)
        .open(to)
        .unwrap()
        .set_len(end)
        .unwrap();
    set_be64(to, ht.l2_entry0_pos(to), ht.compressed_entry(at, len));
}

#[test]
fn compressed_data_inflating_past_one_cluster() {
    // A 64k cluster's deflate stream in an image of 4k clusters: it inflates
    // to 16 clusters' worth.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let big = compressed(d, "big.qcow2", &[], 65536, 0x41);
    let img = compressed(d, "past.qcow2", &["-o", "cluster_size=4k"], 4096, 0x42);
    transplant_compressed(&big, &img);
    expect_rejected(&img, Select::Both, BAD_COMPRESSED);
}

#[test]
fn compressed_data_inflating_short_of_one_cluster() {
    // A 4k cluster's stream in an image of 64k clusters: 60k missing.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let small = compressed(d, "small.qcow2", &["-o", "cluster_size=4k"], 4096, 0x42);
    let img = compressed(d, "short.qcow2", &[], 65536, 0x41);
    transplant_compressed(&small, &img);
    expect_rejected(&img, Select::Both, BAD_COMPRESSED);
}

#[test]
fn compressed_data_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (name, opts) in [
        ("zlib.qcow2", &[][..]),
        ("zstd.qcow2", &["-o", "compression_type=zstd"][..]),
    ] {
        let img = compressed(d, name, opts, 65536, 0x41);
        let h = Header::read(&img);
        let (host, len) = h.compressed_extent(be64(&img, h.l2_entry0_pos(&img)));
        let len = len.min(file_len(&img) - host);
        // 0xff: a reserved deflate block type, and no zstd frame magic.
        write_at(&img, host, &vec![0xff; len as usize]);
        expect_rejected(&img, Select::Both, BAD_COMPRESSED);
    }
}

// ---------------------------------------------------------------------------
// Backing chains that loop, go too deep, or name what is not an image

const CHAIN_WORDS: &[&str] = &[
    "loop", "cycle", "circular", "recurs", "itself", "deep", "depth", "twice", "already",
    "too many", "limit",
];

/// `qemu-img rebase -u -b BACKING -F FMT IMG`: change the backing name only.
fn set_backing(img: &Path, backing: &str, fmt: &str) {
    qemu_img(&["rebase", "-u", "-b", backing, "-F", fmt, p(img)]);
}

#[test]
fn backing_chain_loops() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // a -> b -> a
    let a = valid(d, "a.qcow2", &[]);
    let b = d.join("b.qcow2");
    create_qcow2(&b, &["-b", p(&a), "-F", "qcow2"], "4M");
    set_backing(&a, p(&b), "qcow2");
    expect_rejected(&b, Select::Both, CHAIN_WORDS);
    expect_rejected(&a, Select::Both, CHAIN_WORDS);
    // c -> c, by a relative name.
    let c = valid(d, "c.qcow2", &[]);
    set_backing(&c, "c.qcow2", "qcow2");
    expect_rejected(&c, Select::Both, CHAIN_WORDS);
    // e -> f -> g -> f, a loop below the top, through a relative "./" name.
    let f = valid(d, "f.qcow2", &[]);
    let g = d.join("g.qcow2");
    create_qcow2(&g, &["-b", p(&f), "-F", "qcow2"], "4M");
    set_backing(&f, "./g.qcow2", "qcow2");
    let e = d.join("e.qcow2");
    create_qcow2(&e, &["-u", "-b", p(&f), "-F", "qcow2"], "4M");
    expect_rejected(&e, Select::Both, CHAIN_WORDS);
}

/// The reader's limit: the top image and 63 backing images.
const MAX_CHAIN_DEPTH: usize = 64;

fn chain_of(dir: &Path, depth: usize) -> PathBuf {
    let mut prev = valid(dir, "c0.qcow2", &["-o", "cluster_size=4k"]);
    for i in 1..depth {
        let img = dir.join(format!("c{i}.qcow2"));
        let name = format!("c{}.qcow2", i - 1);
        qemu_img_in(
            dir,
            &[
                "create",
                "-q",
                "-u",
                "-f",
                "qcow2",
                "-b",
                &name,
                "-F",
                "qcow2",
                p(&img),
                "4M",
            ],
        );
        if i % 8 == 0 {
            qemu_io(
                &img,
                "qcow2",
                &[&format!("write -P 0x{i:02x} {}k 4k", i * 12)],
            );
        }
        prev = img;
    }
    prev
}

#[test]
fn backing_chain_deeper_than_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let top = chain_of(dir.path(), 100);
    expect_rejected(&top, Select::Both, CHAIN_WORDS);
    // One past the limit fails too.
    let dir = tempfile::tempdir().unwrap();
    let top = chain_of(dir.path(), MAX_CHAIN_DEPTH + 1);
    expect_rejected(&top, Select::Both, CHAIN_WORDS);
}

#[test]
fn backing_chain_at_the_limit_still_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let top = chain_of(dir.path(), MAX_CHAIN_DEPTH);
    let flat = dir.path().join("flat.raw");
    flatten(&top, &flat);
    let want = raw_sum(&flat, &[]);
    let out = run_timeout(&[p(&top)], None, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{want}  {}\n", p(&top)));
}

#[test]
fn backing_file_is_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let sub = d.join("sub");
    std::fs::create_dir(&sub).unwrap();
    for (i, (backing, fmt)) in [(p(&sub), "raw"), (p(&sub), "qcow2"), ("/tmp", "raw")]
        .into_iter()
        .enumerate()
    {
        let img = valid(d, &format!("dir{i}.qcow2"), &[]);
        set_backing(&img, backing, fmt);
        expect_rejected(&img, Select::Both, &["directory", "regular", "not a file"]);
    }
}

#[test]
fn backing_file_is_a_character_device() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (dev, fmt)) in [
        ("/dev/zero", "raw"),
        ("/dev/null", "raw"),
        ("/dev/null", "qcow2"),
    ]
    .into_iter()
    .enumerate()
    {
        let img = valid(dir.path(), &format!("dev{i}.qcow2"), &[]);
        set_backing(&img, dev, fmt);
        expect_rejected(
            &img,
            Select::Both,
            &["device", "regular", "not a file", "character"],
        );
    }
}

#[test]
fn missing_backing_file_or_data_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = valid(d, "orphan.qcow2", &[]);
    set_backing(&img, p(&d.join("gone.qcow2")), "qcow2");
    expect_rejected(
        &img,
        Select::Both,
        &["no such file", "not found", "gone.qcow2"],
    );
    let data = d.join("x.data");
    let img = d.join("ext.qcow2");
    let o = format!("data_file={}", p(&data));
    create_qcow2(&img, &["-o", &o], "1M");
    qemu_io(&img, "qcow2", &["write -P 0x31 0 64k"]);
    std::fs::remove_file(&data).unwrap();
    expect_rejected(&img, Select::Both, &["no such file", "not found", "x.data"]);
}

#[test]
fn backing_format_not_supported() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let base = d.join("base.vmdk");
    qemu_img(&["create", "-q", "-f", "vmdk", p(&base), "4M"]);
    let img = valid(d, "top.qcow2", &[]);
    set_backing(&img, p(&base), "vmdk");
    expect_rejected(&img, Select::Both, &["vmdk", "format", "unsupported"]);
}

// ---------------------------------------------------------------------------
// What QEMU refuses on open, refused here too (each case is first checked
// against the real qemu-img: it must refuse the image with its reason)

/// `qemu-img info IMG` must fail with `reason` in its message.
fn qemu_refuses(img: &Path, reason: &str) {
    let out = std::process::Command::new("qemu-img")
        .args(["info", p(img)])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(reason),
        "qemu-img info {} should fail with {reason:?}: {err}",
        img.display()
    );
}

/// Write a header extension (type, data) and an end marker at the end of
/// the header of the version 3 image `img`.
fn add_extension(img: &Path, kind: u32, data: &[u8]) {
    let at = u64::from(be32(img, off::HEADER_LENGTH));
    let mut ext = Vec::new();
    ext.extend(kind.to_be_bytes());
    ext.extend((data.len() as u32).to_be_bytes());
    ext.extend(data);
    ext.resize(ext.len().next_multiple_of(8), 0);
    ext.extend([0u8; 8]);
    write_at(img, at, &ext);
}

const REFCOUNT_TABLE_CLUSTERS: u64 = 56;
const NB_SNAPSHOTS: u64 = 60;
const SNAPSHOTS_OFFSET: u64 = 64;

#[test]
fn refcount_table_larger_than_qemu_allows() {
    let dir = tempfile::tempdir().unwrap();
    // QEMU allows 8 MiB of refcount table: 128 clusters of 64 KiB.
    for (i, clusters) in [u32::MAX, 129].into_iter().enumerate() {
        let img = valid(dir.path(), &format!("rt{i}.qcow2"), &[]);
        set_be32(&img, REFCOUNT_TABLE_CLUSTERS, clusters);
        qemu_refuses(&img, "Reference count table too large");
        expect_rejected(&img, Select::Both, &["reference count table too large"]);
    }
    // At the limit (the table beyond the end of the file, unread): hashed,
    // as QEMU reads it.
    let img = valid(dir.path(), "rt128.qcow2", &[]);
    set_be32(&img, REFCOUNT_TABLE_CLUSTERS, 128);
    let flat = dir.path().join("rt128.raw");
    flatten(&img, &flat);
    assert_eq!(raw_sum(&img, &[]), raw_sum(&flat, &[]));
}

#[test]
fn snapshot_table_larger_than_qemu_allows_or_misaligned() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "snaps.qcow2", &[]);
    let h = Header::read(&img);
    set_be32(&img, NB_SNAPSHOTS, u32::MAX);
    set_be64(&img, SNAPSHOTS_OFFSET, h.beyond_eof(&img));
    qemu_refuses(&img, "Snapshot table too large");
    expect_rejected(&img, Select::Both, &["snapshot table too large"]);
    // Misaligned, even with no snapshots (QEMU checks it all the same).
    let img = valid(dir.path(), "snapoff.qcow2", &[]);
    set_be64(&img, SNAPSHOTS_OFFSET, h.cluster_size() + 512);
    qemu_refuses(&img, "Snapshot table offset invalid");
    expect_rejected(&img, Select::Both, &["snapshot table offset invalid"]);
}

#[test]
fn backing_format_extension_too_long() {
    let dir = tempfile::tempdir().unwrap();
    for (i, len) in [4000usize, 16].into_iter().enumerate() {
        let img = valid(dir.path(), &format!("bf{i}.qcow2"), &[]);
        let mut name = b"qcow2".to_vec();
        name.resize(len, 0);
        add_extension(&img, 0xe279_2aca, &name);
        qemu_refuses(&img, "ext_backing_format");
        expect_rejected(&img, Select::Both, &["backing format extension"]);
    }
}

#[test]
fn encryption_header_extension_without_encryption() {
    let dir = tempfile::tempdir().unwrap();
    let img = valid(dir.path(), "fde.qcow2", &[]);
    let h = Header::read(&img);
    let mut data = h.beyond_eof(&img).to_be_bytes().to_vec();
    data.extend(4096u64.to_be_bytes());
    add_extension(&img, 0x0537_be77, &data);
    qemu_refuses(&img, "CRYPTO header extension only expected with LUKS");
    expect_rejected(&img, Select::Both, &["encryption", "crypto"]);
}

#[test]
fn bitmaps_extension_malformed() {
    let dir = tempfile::tempdir().unwrap();
    // A wrong length, whatever the autoclear bit says.
    let img = valid(dir.path(), "bm.qcow2", &[]);
    add_extension(&img, 0x2385_2875, &[0; 8]);
    qemu_refuses(&img, "bitmaps_ext: Invalid extension length");
    expect_rejected(&img, Select::Both, &["bitmaps extension"]);
    // Zero bitmaps, marked consistent by the autoclear bit.
    let img = valid(dir.path(), "bm0.qcow2", &[]);
    add_extension(&img, 0x2385_2875, &[0; 24]);
    let autoclear = be64(&img, off::AUTOCLEAR_FEATURES);
    set_be64(&img, off::AUTOCLEAR_FEATURES, autoclear | 1);
    qemu_refuses(&img, "zero bitmaps");
    expect_rejected(&img, Select::Both, &["zero bitmaps"]);
}

#[test]
fn backing_or_data_file_on_a_pseudo_file_system() {
    // /proc/self/mem is a "regular file" of size 0 that reads memory: as a
    // raw backing file QEMU would show zeros. Refused, as are other proc
    // and sysfs files.
    let dir = tempfile::tempdir().unwrap();
    for (i, (file, fmt)) in [
        ("/proc/self/mem", "raw"),
        ("/proc/self/mem", "qcow2"),
        ("/proc/self/environ", "raw"),
        ("/sys/kernel/mm/transparent_hugepage/enabled", "raw"),
    ]
    .into_iter()
    .enumerate()
    {
        if !Path::new(file).exists() {
            continue;
        }
        let img = valid(dir.path(), &format!("proc{i}.qcow2"), &[]);
        set_backing(&img, file, fmt);
        expect_rejected(&img, Select::Both, &["proc file", "sysfs file"]);
    }
    // The same as an external data file.
    let data = dir.path().join("d.data");
    let img = dir.path().join("procdata.qcow2");
    create_qcow2(&img, &["-o", &format!("data_file={}", p(&data))], "1M");
    qemu_img(&["amend", "-o", "data_file=/proc/self/mem", p(&img)]);
    expect_rejected(&img, Select::Both, &["proc file"]);
}
