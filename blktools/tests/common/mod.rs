//! What the command tests share: images made with qemu-img and qemu-io,
//! running the commands, and checking content the way users would.
#![allow(dead_code)] // each test file uses a part

use blkhash::{Algorithm, Hasher, Options};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BLKMAP: &str = env!("CARGO_BIN_EXE_blkmap");
pub const BLKDIFF: &str = env!("CARGO_BIN_EXE_blkdiff");
pub const BLKSYNC: &str = env!("CARGO_BIN_EXE_blksync");
pub const MIB: u64 = 1 << 20;

/// True if qemu-img and qemu-io run; else says the test is skipped.
pub fn have_qemu() -> bool {
    let ok = |c: &str| {
        Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let have = ok("qemu-img") && ok("qemu-io");
    if !have {
        eprintln!("qemu-img or qemu-io missing: test skipped (scripts/setup.sh installs them)");
    }
    have
}

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

/// An image of `fmt` and `size`, then qemu-io commands run on it.
pub fn image(dir: &Path, name: &str, fmt: &str, size: u64, cmds: &[&str]) -> PathBuf {
    let p = dir.join(name);
    sh(
        "qemu-img",
        &["create", "-q", "-f", fmt, s(&p), &size.to_string()],
    );
    write(&p, fmt, cmds);
    p
}

/// qemu-io commands (write, write -z, discard...) run on an image.
pub fn write(p: &Path, fmt: &str, cmds: &[&str]) {
    if cmds.is_empty() {
        return;
    }
    let mut args = vec!["-f", fmt];
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(s(p));
    sh("qemu-io", &args);
}

/// Same guest content, as `qemu-img compare` sees it (`-s` would also
/// compare allocation, which differs between qcow2 and raw by design).
pub fn same(a: &Path, b: &Path) -> bool {
    run("qemu-img", &["compare", "-q", s(a), s(b)]).code == 0
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
    let raw = dir.join("reference.raw");
    sh("qemu-img", &["convert", "-O", "raw", s(img), s(&raw)]);
    let data = std::fs::read(&raw).unwrap();
    std::fs::remove_file(&raw).unwrap();
    let mut h = Hasher::with_options(Options::new().algorithm(alg).block_size(bs)).unwrap();
    h.update(&data);
    h.finalize().to_hex()
}

/// A scratch directory for a test, or None without QEMU's tools (the test
/// is then skipped, saying so).
pub fn scratch() -> Option<tempfile::TempDir> {
    have_qemu().then(|| tempfile::tempdir().unwrap())
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

/// A server on a unix socket, killed when dropped.
pub struct Server {
    child: Child,
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `cmd args` serving on `sock`; None (test skipped) if the server
/// is not installed.
pub fn serve(cmd: &str, args: &[&str], sock: &Path) -> Option<Server> {
    let child = match Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(_) => {
            eprintln!("{cmd} missing: test skipped (scripts/setup.sh installs it)");
            return None;
        }
    };
    let mut server = Server {
        child,
        url: format!("nbd+unix:///?socket={}", s(sock)),
    };
    // The socket file exists before the server listens: wait for a
    // connection that succeeds.
    let t = Instant::now();
    while UnixStream::connect(sock).is_err() {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("{cmd} {args:?} exited: {status}");
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{cmd} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(server)
}

/// qemu-nbd serving the qcow2 image `img` (writable unless `extra` says
/// -r) on a socket in `dir`.
pub fn qemu_nbd(dir: &Path, img: &Path, extra: &[&str]) -> Option<Server> {
    let sock = dir.join(format!(
        "{}.sock",
        img.file_name().unwrap().to_str().unwrap()
    ));
    let mut args = vec!["-f", "qcow2", "-k", s(&sock), "--persistent"];
    args.extend_from_slice(extra);
    args.push(s(img));
    serve("qemu-nbd", &args, &sock)
}
