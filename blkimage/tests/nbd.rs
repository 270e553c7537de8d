//! The NBD client against real servers (qemu-nbd, nbdkit from
//! `testkit::nbd`): what it reads equals what QEMU reads from the same
//! export, its extents tile the export and keep the holes qemu-nbd reports,
//! and a server that dies or falls silent is an error saying so, in bounded
//! time (the command adds the URL). blksum's tests run the same servers through the command.

use crate::common;

use blkimage::{ExtentKind, OpenOptions, Source};
use common::{kinds, open_with, read_by_extents, read_plain};
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::nbd::{Listen, nbdkit, qemu_nbd};
use testkit::tools::{guest_bytes, image_with, require, scratch};

const MIB: u64 = 1 << 20;

/// A qcow2 image with data, a written-zero range and holes.
fn sparse_qcow2(dir: &Path) -> std::path::PathBuf {
    let img = dir.join("src.qcow2");
    image_with(
        &img,
        "qcow2",
        16 * MIB,
        &[
            "write -P 0x11 0 1M",
            "write -z 2M 1M",
            "write -P 0x22 5000k 7k",
            "write -P 0x33 12M 3M",
        ],
    );
    img
}

fn open(url: &str) -> Box<dyn Source> {
    open_with(url, &OpenOptions::default()).unwrap_or_else(|e| panic!("{url}: {e}"))
}

#[test]
fn reads_what_qemu_reads_over_unix_and_tcp() {
    if !require(&["qemu-img", "qemu-io", "qemu-nbd"]) {
        return;
    }
    let dir = scratch();
    let img = sparse_qcow2(dir.path());
    let want = guest_bytes(&img, &dir.path().join("want.raw"));
    let sock = dir.path().join("nbd.sock");
    for listen in [Listen::Unix(&sock), Listen::Tcp] {
        let srv = qemu_nbd(&img, "qcow2", listen, Some("disk"));
        let src = open(&srv.url);
        assert_eq!(src.size(), want.len() as u64, "{}: size", srv.url);
        assert_eq!(read_by_extents(&*src, MIB), want, "{}: by extents", srv.url);
        assert_eq!(read_plain(&*src, 100_000), want, "{}: plain reads", srv.url);
        src.finish().unwrap();
    }
}

/// qemu-nbd reports the qcow2 holes and zero clusters as zero extents: the
/// client keeps them, so a reader never asks for those bytes.
#[test]
fn extents_keep_the_holes_the_server_reports() {
    if !require(&["qemu-img", "qemu-io", "qemu-nbd"]) {
        return;
    }
    let dir = scratch();
    let img = sparse_qcow2(dir.path());
    let srv = qemu_nbd(&img, "qcow2", Listen::Unix(&dir.path().join("s")), None);
    let src = open(&srv.url);
    let ext = kinds(&*src);
    let mut pos = 0;
    for &(offset, len, _) in &ext {
        assert_eq!(offset, pos, "extents tile the export: {ext:?}");
        pos += len;
    }
    assert_eq!(pos, 16 * MIB);
    let kind_at = |at: u64| {
        ext.iter()
            .find(|(o, l, _)| (*o..o + l).contains(&at))
            .unwrap()
            .2
    };
    assert_eq!(kind_at(0), ExtentKind::Data);
    assert_eq!(kind_at(12 * MIB), ExtentKind::Data);
    for zero in [2 * MIB, 8 * MIB, 15 * MIB + 1] {
        assert!(kind_at(zero).is_zero(), "{zero}: {ext:?}");
    }
}

/// nbdkit's exports of odd sizes (not a multiple of 512) are read to the
/// exact byte, with the extents of a plugin that has none of its own.
#[test]
fn odd_sizes_through_nbdkit() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = scratch();
    for size in [1u64, 511, 4097, MIB + 3] {
        let sock = dir.path().join(format!("{size}.sock"));
        let srv = nbdkit(Listen::Unix(&sock), &["pattern", &size.to_string()]);
        let src = open(&srv.url);
        assert_eq!(src.size(), size, "{}", srv.url);
        // The pattern plugin: each 8-byte word holds its own offset (big-endian).
        let want: Vec<u8> = (0..size.div_ceil(8))
            .flat_map(|w| (w * 8).to_be_bytes())
            .take(size as usize)
            .collect();
        assert_eq!(read_plain(&*src, 1000), want, "{}", srv.url);
        assert_eq!(read_by_extents(&*src, 4096), want, "{}", srv.url);
    }
}

/// A server killed between reads: the next read fails, saying why.
#[test]
fn a_killed_server_is_an_error() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = scratch();
    let mut srv = nbdkit(Listen::Unix(&dir.path().join("s")), &["pattern", "64M"]);
    let src = open(&srv.url);
    let mut buf = vec![0u8; MIB as usize];
    src.read_at(&mut buf, 0).unwrap();
    srv.kill();
    let err = src
        .read_at(&mut buf, MIB)
        .expect_err("read after the server died");
    assert!(err.to_string().contains("closed the connection"), "{err}");
}

/// A server that stops answering: with a timeout, the read fails within
/// about that time instead of hanging.
#[test]
fn a_silent_server_times_out() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = scratch();
    let srv = nbdkit(
        Listen::Unix(&dir.path().join("s")),
        &["--filter=delay", "pattern", "64M", "rdelay=30"],
    );
    let mut opts = OpenOptions::default();
    opts.nbd.timeout = Some(Duration::from_secs(1));
    let src = open_with(&srv.url, &opts).unwrap();
    let t = Instant::now();
    let mut buf = vec![0u8; 4096];
    let err = src
        .read_at(&mut buf, 0)
        .expect_err("a read of a silent server");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(err.to_string().contains("timed out after 1 s"), "{err}");
}
