//! The qcow2 reader against QEMU: images made with qemu-img and qemu-io,
//! read through our `Source` and compared with `qemu-img convert -O raw`.
//! One or two cases per feature; blksum's tests hold the full matrix.

use crate::common;

use blkimage::{ExtentKind, Format, OpenOptions, Qcow2, Source};
use common::{kinds, open_with, read_by_extents, read_lending, read_plain};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use tempfile::TempDir;

struct Dir(TempDir);

impl Dir {
    fn new() -> Dir {
        Dir(testkit::tools::scratch())
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
    fn img(&self, args: &[&str]) {
        testkit::tools::qemu_img_in(self.0.path(), args);
    }
    fn io(&self, name: &str, fmt: &str, cmds: &[&str]) {
        testkit::tools::qemu_io_in(self.0.path(), Path::new(name), fmt, cmds);
    }
    /// What QEMU reads: `qemu-img convert -O raw`.
    fn expected(&self, name: &str) -> Vec<u8> {
        let out = format!("{name}.expected.raw");
        self.img(&["convert", "-O", "raw", name, &out]);
        std::fs::read(self.path(&out)).unwrap()
    }
    fn open(&self, name: &str) -> io::Result<Box<dyn Source>> {
        open_with(self.path(name), &OpenOptions::default())
    }
    fn patch(&self, name: &str, offset: u64, bytes: &[u8]) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(self.path(name))
            .unwrap();
        f.write_all_at(bytes, offset).unwrap();
    }
    /// Open `name`, read it three ways (by extents, plain reads, and
    /// from memory maps where its data clusters lie contiguously), compare
    /// with QEMU's bytes.
    fn check(&self, name: &str) -> Box<dyn Source> {
        let src = self.open(name).unwrap();
        assert_eq!(src.format(), "qcow2");
        let want = self.expected(name);
        assert_eq!(src.size(), want.len() as u64, "{name}: size");
        assert_eq!(read_by_extents(&*src, 1 << 20), want, "{name}: by extents");
        assert_eq!(read_plain(&*src, 100_000), want, "{name}: plain reads");
        src.finish().unwrap();
        let mapped = self.open_mapped(name).unwrap();
        let (bytes, _) = read_lending(&*mapped, 1 << 20);
        assert!(bytes == want, "{name}: from memory maps");
        mapped.finish().unwrap();
        src
    }
    /// Open `name` through the page cache, its files read from memory maps.
    fn open_mapped(&self, name: &str) -> io::Result<Box<dyn Source>> {
        let opts = OpenOptions {
            cache: true,
            map: blkimage::MapReads::Always,
            ..Default::default()
        };
        open_with(self.path(name), &opts)
    }
}

/// Writes that cross clusters, leave holes and zeros.
const PATTERN: &[&str] = &[
    "write -P 0x11 0 100k",
    "write -P 0x22 1m 1536k",
    "write -P 0x33 5000k 7k",
    "write -z 1200k 256k",
    "write -P 0x44 8m 2m",
    "write -P 0x55 15m 512",
];

#[test]
fn cluster_sizes_and_versions() {
    let d = Dir::new();
    for (i, (compat, cs)) in [
        ("1.1", "512"),
        ("1.1", "4k"),
        ("0.10", "64k"),
        ("1.1", "64k"),
        ("1.1", "2M"),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("v{i}.qcow2");
        let o = format!("compat={compat},cluster_size={cs}");
        d.img(&["create", "-f", "qcow2", "-o", &o, &name, "16m"]);
        d.io(&name, "qcow2", PATTERN);
        d.check(&name);
        // The 1536 KiB and 2 MiB writes lie contiguously in the file; with
        // 512-byte clusters an L2 table maps 32 KiB, less than is worth a
        // map: copied.
        let (_, lent) = read_lending(&*d.open_mapped(&name).unwrap(), 1 << 20);
        assert!((lent >= 2 << 20) == (cs != "512"), "{name}: lent {lent}");
    }
}

#[test]
fn odd_virtual_size() {
    let d = Dir::new();
    d.img(&["create", "-f", "qcow2", "odd.qcow2", "1000000"]);
    d.io("odd.qcow2", "qcow2", &["write -P 0x77 900000 99840"]);
    d.check("odd.qcow2");
}

#[test]
fn compressed_zlib_and_zstd() {
    let d = Dir::new();
    d.img(&["create", "-f", "raw", "src.raw", "16m"]);
    d.io("src.raw", "raw", PATTERN);
    d.io("src.raw", "raw", &["write -P 0x99 12m 4m"]);
    for (ct, cs) in [
        ("zlib", "64k"),
        ("zstd", "64k"),
        ("zlib", "4k"),
        ("zstd", "2M"),
        ("zlib", "512"),
    ] {
        let name = format!("c-{ct}-{cs}.qcow2");
        let o = format!("compression_type={ct},cluster_size={cs}");
        d.img(&["convert", "-c", "-O", "qcow2", "-o", &o, "src.raw", &name]);
        let src = d.check(&name);
        // Reads that start and end inside compressed clusters.
        let want = d.expected(&name);
        assert_eq!(read_plain(&*src, 12345), want);
    }
}

#[test]
fn zero_clusters() {
    let d = Dir::new();
    // Zero without a host offset (plain), and with one (preallocated).
    d.img(&["create", "-f", "qcow2", "z.qcow2", "4m"]);
    d.io("z.qcow2", "qcow2", &["write -P 1 0 4m", "write -z 1m 1m"]);
    let src = d.check("z.qcow2");
    assert!(
        kinds(&*src)
            .iter()
            .any(|&(o, l, k)| o == 1 << 20 && l == 1 << 20 && k == ExtentKind::Zero),
        "{:?}",
        kinds(&*src)
    );
    d.img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        "preallocation=metadata",
        "p.qcow2",
        "4m",
    ]);
    d.io(
        "p.qcow2",
        "qcow2",
        &["write -P 2 64k 64k", "write -z 2m 128k"],
    );
    d.check("p.qcow2");
    // A zero cluster hides the backing's data.
    d.img(&[
        "create", "-f", "qcow2", "-b", "z.qcow2", "-F", "qcow2", "o.qcow2",
    ]);
    d.io(
        "o.qcow2",
        "qcow2",
        &["write -z 0 64k", "write -z -u 3m 128k"],
    );
    let src = d.check("o.qcow2");
    assert_eq!(kinds(&*src)[0], (0, 65536, ExtentKind::Zero));
}

#[test]
fn backing_chain() {
    let d = Dir::new();
    std::fs::create_dir(d.path("sub")).unwrap();
    d.img(&["create", "-f", "raw", "sub/base.raw", "3m"]);
    d.io("sub/base.raw", "raw", &["write -P 0xaa 0 3m"]);
    // Relative names resolve against the overlay's directory.
    d.img(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        "base.raw",
        "-F",
        "raw",
        "sub/mid.qcow2",
        "6m",
    ]);
    d.io("sub/mid.qcow2", "qcow2", &["write -P 0xbb 1m 64k"]);
    d.img(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        "sub/mid.qcow2",
        "-F",
        "qcow2",
        "top.qcow2",
        "8m",
    ]);
    d.io(
        "top.qcow2",
        "qcow2",
        &["write -P 0xcc 1088k 64k", "write -P 0xdd 7m 4k"],
    );
    let src = d.check("top.qcow2");
    // The backing file's 3 MiB and the overlays' clusters, lent in place.
    let (_, lent) = read_lending(&*d.open_mapped("top.qcow2").unwrap(), 1 << 20);
    assert!(lent >= 2 << 20, "lent {lent}");
    // Data through two layers, merged; past the end of the shorter
    // backings (3 MiB, then 6 MiB): holes, never read.
    let k = kinds(&*src);
    assert_eq!(
        k,
        vec![
            (0, 3 << 20, ExtentKind::Data),
            (3 << 20, 4 << 20, ExtentKind::Hole),
            (7 << 20, 64 << 10, ExtentKind::Data),
            (
                (7 << 20) + (64 << 10),
                (1 << 20) - (64 << 10),
                ExtentKind::Hole
            ),
        ]
    );
}

#[test]
fn backing_format_probed() {
    let d = Dir::new();
    d.img(&["create", "-f", "qcow2", "base.qcow2", "1m"]);
    d.io("base.qcow2", "qcow2", &["write -P 7 0 128k"]);
    d.img(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        "base.qcow2",
        "-F",
        "qcow2",
        "top.qcow2",
    ]);
    // Rename the backing format extension to an unknown (ignored) type.
    let bytes = std::fs::read(d.path("top.qcow2")).unwrap();
    let at = bytes[..65536]
        .windows(4)
        .position(|w| w == [0xe2, 0x79, 0x2a, 0xca])
        .unwrap();
    d.patch("top.qcow2", at as u64, &[0x12, 0x34, 0x56, 0x78]);
    let src = d.open("top.qcow2").unwrap();
    let mut buf = vec![0u8; 131072];
    src.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 7));
}

#[test]
fn backing_errors() {
    let d = Dir::new();
    // A loop: a image that is its own backing file.
    d.img(&["create", "-f", "qcow2", "a.qcow2", "1m"]);
    d.img(&[
        "create", "-f", "qcow2", "-b", "a.qcow2", "-F", "qcow2", "b.qcow2",
    ]);
    d.img(&["rebase", "-u", "-b", "b.qcow2", "-F", "qcow2", "a.qcow2"]);
    let e = d.open("b.qcow2").err().unwrap().to_string();
    assert!(e.contains("loops"), "{e}");
    // Missing backing file.
    d.img(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        "gone.qcow2",
        "-F",
        "qcow2",
        "-u",
        "m.qcow2",
        "1m",
    ]);
    let e = d.open("m.qcow2").err().unwrap().to_string();
    assert!(e.contains("gone.qcow2"), "{e}");
    // A directory.
    std::fs::create_dir(d.path("dir")).unwrap();
    d.img(&[
        "create", "-f", "qcow2", "-b", "dir", "-F", "raw", "-u", "d.qcow2", "1m",
    ]);
    let e = d.open("d.qcow2").err().unwrap().to_string();
    assert!(e.contains("directory"), "{e}");
    // A device.
    d.img(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        "/dev/null",
        "-F",
        "raw",
        "-u",
        "n.qcow2",
        "1m",
    ]);
    let e = d.open("n.qcow2").err().unwrap().to_string();
    assert!(e.contains("not a regular file"), "{e}");
    // Refused when asked.
    d.img(&["create", "-f", "raw", "r.raw", "1m"]);
    d.img(&[
        "create", "-f", "qcow2", "-b", "r.raw", "-F", "raw", "ok.qcow2",
    ]);
    let opts = OpenOptions {
        no_backing: true,
        ..Default::default()
    };
    let e = open_with(d.path("ok.qcow2"), &opts)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("backing file 'r.raw'"), "{e}");
    d.open("ok.qcow2").unwrap();
}

#[test]
fn chain_depth_limit() {
    let d = Dir::new();
    d.img(&["create", "-f", "qcow2", "l0.qcow2", "1m"]);
    for i in 1..=blkimage::qcow2::MAX_CHAIN_DEPTH {
        let (b, t) = (format!("l{}.qcow2", i - 1), format!("l{i}.qcow2"));
        d.img(&[
            "create", "-f", "qcow2", "-b", &b, "-F", "qcow2", "-u", &t, "1m",
        ]);
    }
    // l63 has 63 backing images: 64 in all, the limit.
    d.io("l0.qcow2", "qcow2", &["write -P 5 0 4k"]);
    let src = d
        .open(&format!("l{}.qcow2", blkimage::qcow2::MAX_CHAIN_DEPTH - 1))
        .unwrap();
    let mut buf = vec![0u8; 4096];
    src.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 5));
    let e = d
        .open(&format!("l{}.qcow2", blkimage::qcow2::MAX_CHAIN_DEPTH))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("deeper"), "{e}");
}

#[test]
fn extended_l2() {
    let d = Dir::new();
    d.img(&["create", "-f", "raw", "base.raw", "4m"]);
    d.io("base.raw", "raw", &["write -P 0x0b 0 4m"]);
    d.img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        "extended_l2=on,cluster_size=64k",
        "-b",
        "base.raw",
        "-F",
        "raw",
        "x.qcow2",
    ]);
    // Subclusters of 2 KiB: allocated, zero and unallocated in one cluster.
    d.io(
        "x.qcow2",
        "qcow2",
        &[
            "write -P 1 0 2k",
            "write -z 4k 2k",
            "write -P 2 66k 6k",
            "write -z 1m 64k",
        ],
    );
    let src = d.check("x.qcow2");
    let k = kinds(&*src);
    assert_eq!(k[0], (0, 4096, ExtentKind::Data), "{k:?}");
    assert_eq!(k[1], (4096, 2048, ExtentKind::Zero), "{k:?}");
    // Without a backing file, at 16 KiB and 2 MiB clusters.
    for cs in ["16k", "2M"] {
        let name = format!("x{cs}.qcow2");
        let o = format!("extended_l2=on,cluster_size={cs}");
        d.img(&["create", "-f", "qcow2", "-o", &o, &name, "16m"]);
        d.io(&name, "qcow2", PATTERN);
        d.check(&name);
    }
}

#[test]
fn external_data_file() {
    let d = Dir::new();
    for (i, raw) in ["off", "on"].into_iter().enumerate() {
        let name = format!("e{i}.qcow2");
        let o = format!("data_file=e{i}.data,data_file_raw={raw}");
        d.img(&["create", "-f", "qcow2", "-o", &o, &name, "4m"]);
        d.io(
            &name,
            "qcow2",
            &["write -P 3 0 64k", "write -P 4 1m 100k", "write -z 2m 64k"],
        );
        d.check(&name);
        let opts = OpenOptions {
            no_backing: true,
            ..Default::default()
        };
        let e = open_with(d.path(&name), &opts).err().unwrap().to_string();
        assert!(e.contains("external data file"), "{e}");
    }
}

#[test]
fn snapshots_dirty_and_formats() {
    let d = Dir::new();
    d.img(&["create", "-f", "qcow2", "s.qcow2", "1m"]);
    d.io("s.qcow2", "qcow2", &["write -P 1 0 1m"]);
    d.img(&["snapshot", "-c", "snap1", "s.qcow2"]);
    d.io("s.qcow2", "qcow2", &["write -P 2 0 64k"]);
    // The active layer, not the snapshot.
    let src = d.check("s.qcow2");
    let mut b = [0u8; 1];
    src.read_at(&mut b, 0).unwrap();
    assert_eq!(b[0], 2);
    // The dirty bit (incompatible bit 0) does not prevent reading.
    d.patch("s.qcow2", 79, &[1]);
    d.check("s.qcow2");
    // Forced raw: the file's bytes.
    let opts = OpenOptions {
        format: Some(Format::Raw),
        ..Default::default()
    };
    let src = open_with(d.path("s.qcow2"), &opts).unwrap();
    assert_eq!(src.format(), "raw");
    // Forced qcow2 on a raw file: an error.
    d.img(&["create", "-f", "raw", "r.raw", "1m"]);
    let opts = OpenOptions {
        format: Some(Format::Qcow2),
        ..Default::default()
    };
    let e = open_with(d.path("r.raw"), &opts).err().unwrap().to_string();
    assert!(e.contains("not a qcow2 image"), "{e}");
}

#[test]
fn refused() {
    let d = Dir::new();
    d.img(&[
        "create",
        "--object",
        "secret,id=s0,data=secret",
        "-f",
        "qcow2",
        "-o",
        "encrypt.format=luks,encrypt.key-secret=s0",
        "luks.qcow2",
        "1m",
    ]);
    let e = d.open("luks.qcow2").err().unwrap().to_string();
    assert!(e.contains("LUKS"), "{e}");
    d.img(&["create", "-f", "qcow2", "c.qcow2", "1m"]);
    d.patch("c.qcow2", 79, &[2]); // corrupt bit
    let e = d.open("c.qcow2").err().unwrap().to_string();
    assert!(e.contains("corrupt"), "{e}");
    d.patch("c.qcow2", 72, &[0x80]); // bit 63, unknown
    d.patch("c.qcow2", 79, &[0]);
    let e = d.open("c.qcow2").err().unwrap().to_string();
    assert!(e.contains("unknown incompatible features: bit 63"), "{e}");
}

#[test]
fn corrupt_tables() {
    let d = Dir::new();
    d.img(&["create", "-f", "qcow2", "t.qcow2", "1m"]);
    d.io("t.qcow2", "qcow2", &["write -P 1 0 64k"]);
    let f = std::fs::read(d.path("t.qcow2")).unwrap();
    let be64 = |at: usize| u64::from_be_bytes(f[at..at + 8].try_into().unwrap());
    let l1 = be64(40);
    let l2 = be64(l1 as usize) & 0x00ff_ffff_ffff_fe00;
    // The L2 table beyond the end of the file.
    let mut bad = f.clone();
    bad[l1 as usize..][..8].copy_from_slice(&(0x8000_0000_0000_0000u64 | 1 << 40).to_be_bytes());
    std::fs::write(d.path("l2.qcow2"), &bad).unwrap();
    let src = d.open("l2.qcow2").unwrap();
    let e = src.extents(0, src.size()).unwrap_err().to_string();
    assert!(
        e.contains("L2 table at offset 0x10000000000 is beyond the end"),
        "{e}"
    );
    // A data cluster not aligned to the cluster size.
    let mut bad = f.clone();
    let entry = be64(l2 as usize) + 4096;
    bad[l2 as usize..][..8].copy_from_slice(&entry.to_be_bytes());
    std::fs::write(d.path("al.qcow2"), &bad).unwrap();
    let src = d.open("al.qcow2").unwrap();
    let e = src.read_at(&mut [0u8; 512], 0).unwrap_err().to_string();
    assert!(e.contains("not aligned"), "{e}");
    // cluster_bits out of range.
    let mut bad = f.clone();
    bad[23] = 30;
    std::fs::write(d.path("cb.qcow2"), &bad).unwrap();
    let e = d.open("cb.qcow2").err().unwrap().to_string();
    assert!(e.contains("cluster_bits 30"), "{e}");
    // An L1 table larger than QEMU allows.
    let mut bad = f.clone();
    bad[36..40].copy_from_slice(&(5u32 << 20).to_be_bytes());
    std::fs::write(d.path("l1.qcow2"), &bad).unwrap();
    let e = d.open("l1.qcow2").err().unwrap().to_string();
    assert!(e.contains("larger than QEMU allows"), "{e}");
}

#[test]
fn huge_empty_image_is_fast() {
    let d = Dir::new();
    d.img(&["create", "-f", "qcow2", "big.qcow2", "1T"]);
    d.img(&[
        "create",
        "-f",
        "qcow2",
        "-b",
        "big.qcow2",
        "-F",
        "qcow2",
        "top.qcow2",
    ]);
    let t = Instant::now();
    for name in ["big.qcow2", "top.qcow2"] {
        let src = d.open(name).unwrap();
        assert_eq!(kinds(&*src), vec![(0, 1 << 40, ExtentKind::Hole)]);
    }
    assert!(t.elapsed().as_secs() < 5);
}

#[test]
fn in_memory() {
    let d = Dir::new();
    d.img(&["create", "-f", "qcow2", "m.qcow2", "2m"]);
    d.io("m.qcow2", "qcow2", &["write -P 9 64k 64k"]);
    let bytes = std::fs::read(d.path("m.qcow2")).unwrap();
    let q = Qcow2::from_storage(Arc::new(bytes)).unwrap();
    assert_eq!(read_by_extents(&q, 4096), d.expected("m.qcow2"));
    assert_eq!(q.header().cluster_bits, 16);
}

/// The bytes under an image, counting what is read.
struct Counting {
    bytes: Vec<u8>,
    read: std::sync::atomic::AtomicU64,
}

impl blkimage::qcow2::Storage for Counting {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.bytes.read_exact_at(buf, offset)
    }
}

/// Discards the bytes, running every read.
struct Discard;

impl blkimage::Sink for Discard {
    fn read(&mut self, len: usize, fill: blkimage::Fill) -> io::Result<()> {
        fill(&mut vec![0; len])
    }
    fn data(&mut self, _: blkimage::AlignedBuf) -> io::Result<()> {
        Ok(())
    }
    fn zeros(&mut self, _: u64) -> io::Result<()> {
        Ok(())
    }
    fn reclaim(&mut self) -> Option<blkimage::AlignedBuf> {
        None
    }
    fn reclaim_wait(&mut self) -> Option<blkimage::AlignedBuf> {
        None
    }
}

#[test]
fn zero_and_unallocated_ranges_are_never_read() {
    let d = Dir::new();
    // Every cluster allocated in the file (preallocation=full), then most of
    // them zeroed: zero clusters that keep their host offsets. Reading the
    // guest must not touch them.
    d.img(&[
        "create",
        "-f",
        "qcow2",
        "-o",
        "preallocation=full",
        "p.qcow2",
        "64m",
    ]);
    d.io(
        "p.qcow2",
        "qcow2",
        &["write -P 7 0 64m", "write -z 0 40m", "write -P 9 62m 1m"],
    );
    let bytes = std::fs::read(d.path("p.qcow2")).unwrap();
    assert!(bytes.len() >= 64 << 20, "preallocated");
    let storage = Arc::new(Counting {
        bytes,
        read: Default::default(),
    });
    let src: Arc<dyn Source> = Arc::new(Qcow2::from_storage(storage.clone()).unwrap());
    let stats = blkimage::read_image(
        src,
        &mut Discard,
        1 << 20,
        None,
        &std::sync::atomic::AtomicBool::new(false),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(stats.zero, 40 << 20);
    assert_eq!(stats.data, 24 << 20);
    let read = storage.read.load(std::sync::atomic::Ordering::Relaxed);
    // The 24 MiB of data, plus the header and the tables (a few KiB).
    assert!(
        ((24 << 20)..(25 << 20)).contains(&read),
        "read {read} bytes"
    );
}

/// An image whose data is compressed is read on the digest workers (its
/// reads are decompression); its uncompressed conversion, read with direct
/// I/O, with reading threads of their own.
#[test]
fn compressed_images_read_on_the_digest_workers() {
    let d = Dir::new();
    d.img(&["create", "-f", "raw", "src.raw", "8m"]);
    d.io(
        "src.raw",
        "raw",
        &["write -P 0x11 1m 3m", "write -P 0x22 6m 1m"],
    );
    d.img(&["convert", "-c", "-O", "qcow2", "src.raw", "c.qcow2"]);
    d.img(&["convert", "-O", "qcow2", "src.raw", "u.qcow2"]);
    let direct = OpenOptions::default(); // cache: false
    let c = open_with(d.path("c.qcow2"), &direct).unwrap();
    assert!(!c.is_direct(), "compressed image read with reading threads");
    if !blkimage::RawFile::open(&d.path("u.qcow2"), true)
        .unwrap()
        .is_direct()
    {
        eprintln!("no direct I/O where the test images are: the rest skipped");
        return;
    }
    let u = open_with(d.path("u.qcow2"), &direct).unwrap();
    assert!(u.is_direct());
    assert_eq!(
        blkimage::io_depth_for(&*u, None, 1 << 20),
        blkimage::direct_io_depth(1 << 20)
    );
    assert_eq!(blkimage::io_depth_for(&*c, None, 1 << 20), 0);
    // Asked for, reading threads serve a compressed image too.
    assert_eq!(blkimage::io_depth_for(&*c, Some(8), 1 << 20), 8);
}
