//! What the command tests share: images made with qemu-img and qemu-io,
//! running the commands, and checking content the way users would.
#![allow(dead_code)] // each test file uses a part

pub mod dirty;

use blkhash::{Algorithm, Hasher, Options};
use std::path::{Path, PathBuf};
use std::process::Command;
pub use testkit::nbd::{Listen, Server};

pub const BLKMAP: &str = env!("CARGO_BIN_EXE_blkmap");
pub const BLKDIFF: &str = env!("CARGO_BIN_EXE_blkdiff");
pub const BLKSYNC: &str = env!("CARGO_BIN_EXE_blksync");
pub const MIB: u64 = 1 << 20;

#[allow(unused_imports)] // each test file uses a part
pub use testkit::tools::{have_qemu, require, same_content as same};

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A finished command: exit status (-1 if killed), output.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(bin: &str, args: &[&str]) -> Out {
    let out = Command::new(bin).args(args).output().unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Run a command that must succeed.
pub fn sh(cmd: &str, args: &[&str]) {
    let out = run(cmd, args);
    assert_eq!(out.code, 0, "{cmd} {args:?}: {}", out.stderr);
}

/// `dir/name`: an image of `fmt` and `size`, then qemu-io `cmds` (write,
/// write -z, discard...) run on it.
pub fn image(dir: &Path, name: &str, fmt: &str, size: u64, cmds: &[&str]) -> PathBuf {
    let p = dir.join(name);
    testkit::tools::image_with(&p, fmt, size, cmds);
    p
}

/// qemu-io commands run on an image.
pub fn write(p: &Path, fmt: &str, cmds: &[&str]) {
    testkit::tools::qemu_io(p, fmt, cmds);
}

/// The blkhash checksum (sha256, 64k blocks) of an image's guest content:
/// blksum's, if it was built next to these commands, else the
/// construction's on the image converted to raw by qemu-img.
pub fn checksum(dir: &Path, img: &Path) -> String {
    let blksum = Path::new(BLKMAP).with_file_name("blksum");
    if blksum.exists() {
        let out = run(s(&blksum), &["--cache", s(img)]);
        assert_eq!(out.code, 0, "blksum {}: {}", img.display(), out.stderr);
        return out.stdout.split_whitespace().next().unwrap().to_string();
    }
    reference_checksum(dir, img, Algorithm::Sha256, blkhash::DEFAULT_BLOCK_SIZE)
}

/// The checksum of an image computed with the hasher on its raw
/// conversion (qemu-img's idea of its guest content).
pub fn reference_checksum(dir: &Path, img: &Path, alg: Algorithm, bs: usize) -> String {
    let data = testkit::tools::guest_bytes(img, &dir.join("reference.raw"));
    let mut h = Hasher::with_options(Options::new().algorithm(alg).block_size(bs)).unwrap();
    h.update(&data);
    h.finalize().to_hex()
}

/// A scratch directory for a test, or None without QEMU's tools (the test
/// is then skipped, saying so).
pub fn scratch() -> Option<tempfile::TempDir> {
    have_qemu().then(testkit::tools::scratch)
}

/// `src.qcow2` in `dir`: a qcow2 image of `size`, qemu-io commands run on it.
pub fn src_qcow2(dir: &Path, size: u64, cmds: &[&str]) -> PathBuf {
    image(dir, "src.qcow2", "qcow2", size, cmds)
}

/// `src.qcow2` of `size` with qemu-io `cmds` run on it, an empty
/// `dst.qcow2` of the same size, and the path of DST's state `dst.map`.
pub fn qcow2_src_dst(dir: &Path, size: u64, cmds: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    let src = src_qcow2(dir, size, cmds);
    let dst = image(dir, "dst.qcow2", "qcow2", size, &[]);
    (src, dst, dir.join("dst.map"))
}

/// qemu-nbd serving the qcow2 image `img` (writable unless `extra` says
/// -r) on a socket in `dir`; None (test skipped) if it is not installed.
pub fn qemu_nbd(dir: &Path, img: &Path, extra: &[&str]) -> Option<Server> {
    if !require(&["qemu-nbd"]) {
        return None;
    }
    let sock = dir.join(format!(
        "{}.sock",
        img.file_name().unwrap().to_str().unwrap()
    ));
    Some(testkit::nbd::qemu_nbd_with(
        img,
        "qcow2",
        Listen::Unix(&sock),
        None,
        extra,
    ))
}

/// nbdkit `args` (plugin, filters, parameters) on the socket `sock`; None
/// (test skipped) if it is not installed.
pub fn nbdkit(sock: &Path, args: &[&str]) -> Option<Server> {
    require(&["nbdkit"]).then(|| testkit::nbd::nbdkit(Listen::Unix(sock), args))
}
