//! QEMU dirty bitmaps read over NBD (the `qemu:dirty-bitmap:NAME` metadata
//! context) from real servers: qcow2 images whose persistent bitmaps QEMU's
//! own tools made and dirtied (qemu-img bitmap, qemu-io), served by
//! `qemu-nbd -B`. The expected ranges are the writes widened to the
//! bitmap's granularity (what QEMU records), clipped to the export's size,
//! and our qcow2 reader's for the same image. Replies QEMU never sends come
//! from `testkit::hostile` (the `hostile` module).

use crate::common;

use blkimage::nbd::{Nbd, NbdOptions, open_url};
use blkimage::{BitmapInfo, Source};
use common::{read_by_extents, read_plain};
use std::ops::Range;
use std::path::{Path, PathBuf};
use testkit::nbd::{Listen, Server, nbdkit, qemu_nbd_with};
use testkit::tools::{create, guest_bytes, qemu_img, qemu_io, require, scratch};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

fn have_tools() -> bool {
    require(&["qemu-img", "qemu-io", "qemu-nbd"])
}

/// A qemu-io command for one write: `(command, offset, length)`.
type Write = (&'static str, u64, u64);

/// A qcow2 image of `size` bytes at `dir/NAME.qcow2`.
fn qcow2(dir: &Path, name: &str, size: u64) -> PathBuf {
    let img = dir.join(format!("{name}.qcow2"));
    create(&img, "qcow2", &[], &size.to_string());
    img
}

/// `qemu-img bitmap --add -g GRAN IMG NAME`.
fn add_bitmap(img: &Path, name: &str, granularity: u64) {
    let g = granularity.to_string();
    qemu_img(&["bitmap", "--add", "-g", &g, img.to_str().unwrap(), name]);
}

/// Run the writes through qemu-io (which dirties the enabled bitmaps).
fn write(img: &Path, writes: &[Write]) {
    let cmds: Vec<String> = writes
        .iter()
        .map(|(cmd, off, len)| format!("{cmd} {off} {len}"))
        .collect();
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io(img, "qcow2", &cmds);
}

/// The ranges a bitmap of `granularity` marks for `writes`: each widened to
/// whole granules, clipped to `size`, in order, overlapping and adjacent
/// ones merged.
fn widened(writes: &[Write], granularity: u64, size: u64) -> Vec<Range<u64>> {
    let mut v: Vec<Range<u64>> = writes
        .iter()
        .map(|&(_, off, len)| {
            off / granularity * granularity
                ..(off + len)
                    .div_ceil(granularity)
                    .saturating_mul(granularity)
                    .min(size)
        })
        .collect();
    v.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::new();
    for r in v {
        match out.last_mut() {
            Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// `qemu-nbd --read-only --shared=8 -f qcow2 -B NAME... IMG` on a unix
/// socket in `dir` (several clients: multi-conn, so extra connections that
/// negotiate no bitmap are used too).
fn serve(dir: &Path, img: &Path, bitmaps: &[&str]) -> Server {
    let mut args = vec!["--read-only", "--shared=8"];
    for b in bitmaps {
        args.extend(["-B", b]);
    }
    let sock = dir.join("nbd.sock");
    qemu_nbd_with(img, "qcow2", Listen::Unix(&sock), None, &args)
}

fn opts(bitmap: Option<&str>, list: bool) -> NbdOptions {
    NbdOptions {
        dirty_bitmap: bitmap.map(String::from),
        list_bitmaps: list,
        ..Default::default()
    }
}

fn open(url: &str, o: &NbdOptions) -> Nbd {
    open_url(url, o).unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn dirty(src: &dyn Source, name: &str) -> Vec<Range<u64>> {
    let d = src
        .dirty(name)
        .unwrap_or_else(|e| panic!("dirty {name}: {e}"));
    assert_eq!(d.bitmap.name, name);
    d.ranges
}

/// The writes of the granularity tests, in a 64 MiB image: a byte at 0,
/// unaligned data, zeros written, a discard, two writes a granule apart
/// or less (merged at large granularities), and the export's last byte.
fn writes() -> Vec<Write> {
    vec![
        ("write -P 1", 0, 1),
        ("write -P 2", 3 * MIB + 100, 10_000),
        ("write -z", 10 * MIB, 3 * MIB),
        ("discard", 20 * MIB + 4 * KIB, 8 * KIB),
        ("write -P 3", 30 * MIB, 4 * KIB),
        ("write -P 4", 30 * MIB + 68 * KIB, 4 * KIB),
        ("write -P 5", 64 * MIB - 1, 1),
    ]
}

#[test]
fn dirty_ranges_are_the_writes_at_each_granularity() {
    if !have_tools() {
        return;
    }
    let size = 64 * MIB;
    for gran in [4 * KIB, 64 * KIB, MIB, 2 * MIB] {
        let dir = scratch();
        let img = qcow2(dir.path(), "disk", size);
        add_bitmap(&img, "b", gran);
        write(&img, &writes());
        let srv = serve(dir.path(), &img, &["b"]);
        let src = open(&srv.url, &opts(Some("b"), false));
        assert_eq!(
            dirty(&src, "b"),
            widened(&writes(), gran, size),
            "granularity {gran}"
        );
        // Without listing, the negotiated bitmap alone, and NBD says nothing
        // of its granularity or flags.
        let info = BitmapInfo {
            name: "b".into(),
            granularity: None,
            in_use: None,
            enabled: None,
        };
        assert_eq!(src.bitmaps().unwrap(), [info]);
    }
}

/// A clean bitmap is no range; a wholly dirty one, the whole export.
#[test]
fn clean_and_wholly_dirty_bitmaps() {
    if !have_tools() {
        return;
    }
    let dir = scratch();
    let size = 8 * MIB;
    let img = qcow2(dir.path(), "disk", size);
    add_bitmap(&img, "all", 64 * KIB);
    write(&img, &[("write -P 1", 0, size)]);
    // Added after the writes: it saw none.
    add_bitmap(&img, "clean", 64 * KIB);
    let srv = serve(dir.path(), &img, &["clean", "all"]);
    let all = open(&srv.url, &opts(Some("all"), false));
    let ranges = dirty(&all, "all");
    assert!(ranges.len() == 1 && ranges[0] == (0..size), "{ranges:?}");
    drop(all);
    let clean = open(&srv.url, &opts(Some("clean"), false));
    assert_eq!(dirty(&clean, "clean"), Vec::<Range<u64>>::new());
}

/// An export whose size is not a multiple of the granularity: the last
/// range ends at the export's end, not at the granule's.
#[test]
fn the_last_range_ends_at_the_export_end() {
    if !have_tools() {
        return;
    }
    let size = 10 * MIB + 3 * 512;
    for gran in [64 * KIB, 2 * MIB] {
        let dir = scratch();
        let img = qcow2(dir.path(), "disk", size);
        add_bitmap(&img, "b", gran);
        let w = [("write -P 7", MIB, 512), ("write -P 8", size - 1000, 1000)];
        write(&img, &w);
        let srv = serve(dir.path(), &img, &["b"]);
        let src = open(&srv.url, &opts(Some("b"), false));
        assert_eq!(src.size(), size);
        let got = dirty(&src, "b");
        assert_eq!(got, widened(&w, gran, size), "granularity {gran}");
        assert_eq!(got.last().unwrap().end, size);
    }
}

/// Two bitmaps exported: both listed; each connection reads the one it
/// negotiated, and only that one.
#[test]
fn two_bitmaps_listed_and_read() {
    if !have_tools() {
        return;
    }
    let dir = scratch();
    let size = 16 * MIB;
    let img = qcow2(dir.path(), "disk", size);
    let before = [("write -P 1", MIB, 4 * KIB)];
    let after = [("write -P 2", 8 * MIB + 5, 70 * KIB)];
    add_bitmap(&img, "a", 64 * KIB);
    write(&img, &before);
    add_bitmap(&img, "b", MIB);
    write(&img, &after);
    let srv = serve(dir.path(), &img, &["a", "b"]);

    let src = open(&srv.url, &opts(Some("b"), true));
    let mut names: Vec<String> = src.bitmaps().unwrap().into_iter().map(|b| b.name).collect();
    names.sort();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(dirty(&src, "b"), widened(&after, MIB, size));
    let e = src.dirty("a").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    let msg = e.to_string();
    assert!(
        msg.contains("'a'") && msg.contains("not asked for when connecting"),
        "{msg}"
    );
    drop(src);

    let both = [before[0], after[0]];
    let src = open(&srv.url, &opts(Some("a"), false));
    assert_eq!(dirty(&src, "a"), widened(&both, 64 * KIB, size));
    drop(src);

    // Listing alone: the names, and no bitmap to read.
    let src = open(&srv.url, &opts(None, true));
    assert_eq!(src.bitmaps().unwrap().len(), 2);
    let msg = src.dirty("a").unwrap_err().to_string();
    assert!(msg.contains("not asked for when connecting"), "{msg}");
}

/// A bitmap the server does not export is an error at connect, naming
/// the context and what the server offers instead.
#[test]
fn a_missing_bitmap_is_an_error_at_connect() {
    if !have_tools() {
        return;
    }
    let dir = scratch();
    let img = qcow2(dir.path(), "disk", 4 * MIB);
    add_bitmap(&img, "other", 64 * KIB);
    add_bitmap(&img, "b", 64 * KIB);
    let connect_err = |url: &str| {
        let e = open_url(url, &opts(Some("b"), false))
            .err()
            .expect("connect fails");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        e.to_string()
    };
    {
        // The image has "b", but qemu-nbd exports "other" only.
        let srv = serve(dir.path(), &img, &["other"]);
        assert_eq!(
            connect_err(&srv.url),
            "the server does not offer the metadata context qemu:dirty-bitmap:b \
             (it offers: qemu:dirty-bitmap:other)"
        );
    }
    {
        let srv = serve(dir.path(), &img, &[]);
        let msg = connect_err(&srv.url);
        assert!(
            msg.contains("qemu:dirty-bitmap:b") && msg.contains("offers no dirty bitmap"),
            "{msg}"
        );
        // Without a bitmap asked for, the same server is fine.
        let src = open(&srv.url, &opts(None, true));
        assert!(src.bitmaps().unwrap().is_empty());
    }
}

/// nbdkit has no dirty bitmaps: asking for one is the same error.
#[test]
fn nbdkit_offers_no_bitmap() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = scratch();
    let sock = dir.path().join("nbdkit.sock");
    let srv = nbdkit(Listen::Unix(&sock), &["memory", "1M"]);
    let e = open_url(&srv.url, &opts(Some("b"), false))
        .err()
        .expect("connect fails");
    let msg = e.to_string();
    assert!(
        msg.contains("does not offer the metadata context qemu:dirty-bitmap:b"),
        "{msg}"
    );
    let src = open(&srv.url, &opts(None, true));
    assert!(src.bitmaps().unwrap().is_empty());
    assert!(src.dirty("b").is_err());
}

/// With the bitmap negotiated, reads and extents are as without it: every
/// block status reply then carries two chunks, and extents use
/// base:allocation's.
#[test]
fn reads_and_extents_with_a_bitmap_negotiated() {
    if !have_tools() {
        return;
    }
    let dir = scratch();
    let size = 16 * MIB;
    let img = qcow2(dir.path(), "disk", size);
    add_bitmap(&img, "b", 64 * KIB);
    let w = [
        ("write -P 0x11", 0, MIB),
        ("write -z", 2 * MIB, MIB),
        ("write -P 0x22", 5000 * KIB, 7 * KIB),
        ("write -P 0x33", 12 * MIB, 3 * MIB),
    ];
    write(&img, &w);
    let want = guest_bytes(&img, &dir.path().join("want.raw"));
    let srv = serve(dir.path(), &img, &["b"]);
    let src = open(&srv.url, &opts(Some("b"), true));
    assert!(src.has_block_status());
    // The bitmap before, between and after the reads.
    let ranges = widened(&w, 64 * KIB, size);
    assert_eq!(dirty(&src, "b"), ranges);
    assert_eq!(read_by_extents(&src, MIB), want);
    assert_eq!(dirty(&src, "b"), ranges);
    assert_eq!(read_plain(&src, 100_000), want);
    // The holes qemu-nbd reports are kept.
    let exts = src.extents(6 * MIB, MIB).unwrap();
    assert!(
        exts.iter().all(|e| e.kind != blkimage::ExtentKind::Data),
        "{exts:?}"
    );
    assert_eq!(dirty(&src, "b"), ranges);
}

/// QEMU's server and our qcow2 reader read the same bitmaps the same.
#[test]
fn the_same_ranges_as_the_qcow2_reader() {
    if !have_tools() {
        return;
    }
    for (size, gran) in [
        (64 * MIB, 64 * KIB),
        (64 * MIB, 2 * MIB),
        (10 * MIB + 1536, 4 * KIB),
    ] {
        let dir = scratch();
        let img = qcow2(dir.path(), "disk", size);
        add_bitmap(&img, "b", gran);
        let w: Vec<Write> = writes().into_iter().filter(|w| w.1 + w.2 <= size).collect();
        write(&img, &w);
        write(&img, &[("write -P 9", size - 1000, 1000)]);
        let file = common::open_with(&img, &blkimage::OpenOptions::default()).unwrap();
        let from_file = file.dirty("b").unwrap();
        drop(file);
        let srv = serve(dir.path(), &img, &["b"]);
        let src = open(&srv.url, &opts(Some("b"), false));
        assert_eq!(
            dirty(&src, "b"),
            from_file.ranges,
            "size {size}, granularity {gran}"
        );
    }
}

/// Bitmap replies from `testkit::hostile`'s server: what QEMU never sends
/// but a server may (short answers) or must not (a missing chunk, a
/// descriptor past the request), each read in bounded time.
mod hostile {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use testkit::hostile::{BITMAP_ANSWER, BITMAP_GRANULE, Hostile, Misbehave};

    fn open_hostile(how: Misbehave) -> (Hostile, Nbd) {
        let srv = Hostile::start(vec![0u8; 1 << 20], how);
        let mut o = opts(Some("b"), false);
        o.timeout = Some(Duration::from_secs(10));
        let src = open(&srv.url, &o);
        (srv, src)
    }

    /// Answers for less than asked, ranges straddling answers: the client
    /// asks again from where each answer ended and merges them.
    #[test]
    fn short_answers_are_read_whole() {
        let (srv, src) = open_hostile(Misbehave::DirtyBitmap);
        let want: Vec<Range<u64>> = (0..src.size())
            .step_by(2 * BITMAP_GRANULE as usize)
            .map(|s| s..s + BITMAP_GRANULE)
            .collect();
        assert_eq!(dirty(&src, "b"), want);
        let requests = srv.stats.requests.load(Ordering::SeqCst) as u64;
        assert_eq!(requests, src.size().div_ceil(BITMAP_ANSWER));
        // Extents still come from base:allocation (one data extent).
        let e = src.extents(0, src.size()).unwrap();
        assert_eq!((e.len(), e[0].len), (1, src.size()));
    }

    #[test]
    fn bad_answers_are_errors() {
        for (how, what) in [
            (
                Misbehave::BitmapChunkMissing,
                "block status without a chunk for qemu:dirty-bitmap:b",
            ),
            (
                Misbehave::BitmapPastRequest,
                "block status for qemu:dirty-bitmap:b past the request",
            ),
        ] {
            let (_srv, src) = open_hostile(how);
            let e = src.dirty("b").unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{how:?}: {e}");
            assert!(e.to_string().contains(what), "{how:?}: {e}");
            // The connection lives on: the bitmap's errors are the client's.
            assert!(src.extents(0, 4096).is_ok(), "{how:?}");
        }
    }
}
