//! qcow2 test support: QEMU's tools (from `testkit::tools`: the expected
//! values always come from them, never from our reader), blksum with a time
//! limit, and the qcow2 header fields
//! (big-endian, as in QEMU's `docs/interop/qcow2.txt`) for
//! patching valid images into corrupt ones.

#[allow(unused_imports)] // each test file uses a part
pub use testkit::tools::{create, flatten, qemu_img, qemu_img_in, qemu_io, qemu_io_in};

use super::blksum;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// The arguments that select the qcow2 reader explicitly.
pub const QCOW2: [&str; 2] = ["-f", "qcow2"];

/// `qemu-img create -f qcow2 [OPTS] IMG SIZE`.
pub fn create_qcow2(img: &Path, opts: &[&str], size: &str) {
    create(img, "qcow2", opts, size);
}

/// Run blksum, killing it after `limit`: a hang fails the test.
pub fn run_timeout(args: &[&str], cwd: Option<&Path>, limit: Duration) -> Output {
    let mut cmd = blksum();
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let mut child = cmd.spawn().expect("blksum runs");
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            let err = String::from_utf8_lossy(&t_err.join().unwrap()).into_owned();
            panic!("blksum {args:?} still running after {limit:?} (killed); stderr: {err}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

/// The checksums blksum prints for `files` (one call, `extra` arguments
/// first), by name. Inputs it failed on are missing from the map; their
/// errors are in the second value.
pub fn sums_by_name(
    extra: &[&str],
    files: &[PathBuf],
    cwd: Option<&Path>,
) -> (HashMap<String, String>, String) {
    let mut args: Vec<&str> = extra.to_vec();
    args.extend(files.iter().map(|p| p.to_str().unwrap()));
    let out = run_timeout(&args, cwd, Duration::from_secs(120));
    let mut map = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let (sum, name) = line.split_once("  ").expect("CHECKSUM  NAME");
        map.insert(name.to_string(), sum.to_string());
    }
    (map, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The checksum of each of `files` (one call), which must all succeed.
pub fn sums(extra: &[&str], files: &[PathBuf]) -> Vec<String> {
    let (map, err) = sums_by_name(extra, files, None);
    files
        .iter()
        .map(|f| {
            map.get(f.to_str().unwrap())
                .unwrap_or_else(|| panic!("no checksum for {}: {err}", f.display()))
                .clone()
        })
        .collect()
}

/// The checksum of one raw file (which must hash).
pub fn raw_sum(path: &Path, extra: &[&str]) -> String {
    sums(extra, &[path.to_path_buf()]).remove(0)
}

// ---------------------------------------------------------------------------
// qcow2 header fields and patching

/// Byte offsets of the header fields (qcow2.txt, "Header").
pub mod off {
    pub const MAGIC: u64 = 0;
    pub const VERSION: u64 = 4;
    pub const BACKING_FILE_OFFSET: u64 = 8;
    pub const BACKING_FILE_SIZE: u64 = 16;
    pub const CLUSTER_BITS: u64 = 20;
    pub const SIZE: u64 = 24;
    pub const CRYPT_METHOD: u64 = 32;
    pub const L1_SIZE: u64 = 36;
    pub const L1_TABLE_OFFSET: u64 = 40;
    pub const REFCOUNT_TABLE_OFFSET: u64 = 48;
    pub const INCOMPATIBLE_FEATURES: u64 = 72;
    pub const COMPATIBLE_FEATURES: u64 = 80;
    pub const AUTOCLEAR_FEATURES: u64 = 88;
    pub const HEADER_LENGTH: u64 = 100;
}

/// Incompatible feature bits.
pub const INCOMPAT_DIRTY: u64 = 1 << 0;
pub const INCOMPAT_CORRUPT: u64 = 1 << 1;
/// Bits 9-55 of an L1 or standard L2 entry: a host offset.
pub const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// Bit 62 of an L2 entry: a compressed cluster.
pub const COMPRESSED: u64 = 1 << 62;
/// Bit 63 of an L1 or L2 entry: refcount exactly one.
pub const COPIED: u64 = 1 << 63;

pub fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let f = File::open(path).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf
}

pub fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

pub fn be32(path: &Path, offset: u64) -> u32 {
    u32::from_be_bytes(read_at(path, offset, 4).try_into().unwrap())
}

pub fn be64(path: &Path, offset: u64) -> u64 {
    u64::from_be_bytes(read_at(path, offset, 8).try_into().unwrap())
}

pub fn set_be32(path: &Path, offset: u64, v: u32) {
    write_at(path, offset, &v.to_be_bytes());
}

pub fn set_be64(path: &Path, offset: u64, v: u64) {
    write_at(path, offset, &v.to_be_bytes());
}

pub fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// The header fields a patch needs, read from the file.
#[derive(Debug, Clone)]
pub struct Header {
    pub version: u32,
    pub cluster_bits: u32,
    pub size: u64,
    pub l1_size: u32,
    pub l1_table_offset: u64,
    pub incompatible: u64,
}

impl Header {
    pub fn read(path: &Path) -> Header {
        assert_eq!(
            read_at(path, off::MAGIC, 4),
            b"QFI\xfb",
            "{}",
            path.display()
        );
        let version = be32(path, off::VERSION);
        Header {
            version,
            cluster_bits: be32(path, off::CLUSTER_BITS),
            size: be64(path, off::SIZE),
            l1_size: be32(path, off::L1_SIZE),
            l1_table_offset: be64(path, off::L1_TABLE_OFFSET),
            incompatible: if version >= 3 {
                be64(path, off::INCOMPATIBLE_FEATURES)
            } else {
                0
            },
        }
    }

    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    /// Where L1 entry `i` is stored.
    pub fn l1_entry_pos(&self, i: u64) -> u64 {
        self.l1_table_offset + 8 * i
    }

    /// Where the L2 entry of guest cluster 0 is stored (the image must have
    /// an L2 table for it; no extended L2 entries).
    pub fn l2_entry0_pos(&self, path: &Path) -> u64 {
        let l1 = be64(path, self.l1_entry_pos(0));
        let l2 = l1 & OFFSET_MASK;
        assert_ne!(l2, 0, "{}: no L2 table for cluster 0", path.display());
        l2
    }

    /// A cluster-aligned host offset well past the end of the file.
    pub fn beyond_eof(&self, path: &Path) -> u64 {
        let cs = self.cluster_size();
        (file_len(path) / cs + 16) * cs
    }

    /// Bit x of a compressed cluster descriptor, where the sector count starts.
    pub fn compressed_shift(&self) -> u32 {
        62 - (self.cluster_bits - 8)
    }

    /// Host offset and byte length (whole sectors, from the offset) of a
    /// compressed L2 entry.
    pub fn compressed_extent(&self, entry: u64) -> (u64, u64) {
        assert!(
            entry & COMPRESSED != 0,
            "entry {entry:#x} is not compressed"
        );
        let x = self.compressed_shift();
        let host = entry & ((1u64 << x) - 1);
        let sectors = (entry & ((1u64 << 62) - 1)) >> x;
        let len = (sectors + 1) * 512 - (host % 512);
        (host, len)
    }

    /// A compressed L2 entry for `len` bytes at host offset `host`.
    pub fn compressed_entry(&self, host: u64, len: u64) -> u64 {
        let x = self.compressed_shift();
        let sectors = (host % 512 + len).div_ceil(512) - 1;
        COMPRESSED | (sectors << x) | host
    }
}

/// Set (OR) bits of the incompatible feature field of a version 3 image.
pub fn set_incompatible(path: &Path, bits: u64) {
    let h = Header::read(path);
    assert!(h.version >= 3);
    set_be64(path, off::INCOMPATIBLE_FEATURES, h.incompatible | bits);
}

/// Case-insensitive: does `text` contain one of `words`?
pub fn mentions_any(text: &str, words: &[&str]) -> bool {
    let t = text.to_lowercase();
    words.iter().any(|w| t.contains(&w.to_lowercase()))
}
