//! `--construction imageio` against the real oVirt imageio daemon: its
//! checksum API (`GET /images/TICKET/checksum`) and blksum give the same
//! checksum for every algorithm it lists that blkhash computes and block
//! sizes from 1 to 16 MiB, on sparse, zero-filled, odd-sized raw files
//! (its file backend) and sparse and compressed qcow2 images (served to it
//! by qemu-nbd, hashed here from the files with the native qcow2 reader).
//!
//! ovirt-imageio comes from PyPI into a venv under the target directory
//! (made once, kept across runs: `IMAGEIO_VENV` names another). Its
//! daemon runs on 127.0.0.1 with a configuration of its own in a scratch
//! directory (run dir, control socket, log on standard error: nothing
//! under /run or /var/log), and is stopped by its pid.

use crate::common::qemu;
use crate::common::*;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The imageio release the tests were written against.
const IMAGEIO: &str = "ovirt-imageio==2.5.1";

/// The venv holding ovirt-imageio, made (pip from PyPI) if missing; `None`
/// (test skipped, said) where python3 -m venv or pip cannot make it.
fn venv() -> Option<PathBuf> {
    let dir = std::env::var_os("IMAGEIO_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("imageio-venv"));
    let daemon = dir.join("bin/ovirt-imageio");
    if daemon.exists() {
        return Some(dir);
    }
    let ok = |c: &mut Command| c.stdin(Stdio::null()).status().is_ok_and(|s| s.success());
    let made = ok(Command::new("python3")
        .args(["-m", "venv", "--system-site-packages"])
        .arg(&dir))
        && ok(Command::new(dir.join("bin/pip")).args(["install", "-q", IMAGEIO]));
    if !made || !daemon.exists() {
        eprintln!("skipped: cannot install {IMAGEIO} into {}", dir.display());
        let _ = std::fs::remove_dir_all(&dir);
        return None;
    }
    Some(dir)
}

/// The imageio daemon, stopped by its pid (SIGTERM, then SIGKILL) when dropped.
struct Daemon {
    child: Child,
    port: u16,
    control: PathBuf,
}

impl Daemon {
    fn start(venv: &Path, dir: &Path) -> Daemon {
        let port = testkit::nbd::free_port();
        let run = dir.join("run");
        let conf = dir.join("conf");
        std::fs::create_dir_all(conf.join("conf.d")).unwrap();
        std::fs::create_dir_all(&run).unwrap();
        let control = run.join("sock");
        // The log goes to standard error (a file here), not /var/log; no
        // systemd notification (it would import python3-systemd, which a
        // venv of another Python than the system's cannot see).
        let text = format!(
            "[daemon]\nrun_dir = {run}\ndrop_privileges = false\nsystemd_enable = false\n\
             [tls]\nenable = false\n\
             [remote]\nhost = 127.0.0.1\nport = {port}\n\
             [local]\nenable = false\n\
             [control]\ntransport = unix\nsocket = {sock}\n\
             [handlers]\nkeys = stderr\n\
             [logger_root]\nhandlers = stderr\nlevel = INFO\n",
            run = run.display(),
            sock = control.display(),
        );
        std::fs::write(conf.join("conf.d/50-test.conf"), text).unwrap();
        let log = std::fs::File::create(dir.join("daemon.log")).unwrap();
        let child = Command::new(venv.join("bin/ovirt-imageio"))
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("ovirt-imageio starts");
        let mut d = Daemon {
            child,
            port,
            control,
        };
        let until = Instant::now() + Duration::from_secs(60);
        // Both services answer: the control socket and the remote port.
        while !(UnixStream::connect(&d.control).is_ok()
            && TcpStream::connect(("127.0.0.1", port)).is_ok())
        {
            if let Ok(Some(st)) = d.child.try_wait() {
                let log = std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default();
                panic!("ovirt-imageio exited ({st}): {log}");
            }
            assert!(Instant::now() < until, "ovirt-imageio did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    /// Add a read ticket `id` for `url` (file:///PATH or nbd:unix:SOCKET).
    fn ticket(&self, id: &str, url: &str, size: u64) {
        let body = serde_json::json!({
            "uuid": id, "size": size, "url": url, "timeout": 300, "ops": ["read"],
        })
        .to_string();
        let req = format!(
            "PUT /tickets/{id} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut s = UnixStream::connect(&self.control).unwrap();
        let (status, reply) = exchange(&mut s, &req);
        assert!(status == 200, "PUT ticket {id}: {status} {reply}");
    }

    /// GET `path` from the daemon's remote service: the status and body.
    fn get_status(&self, path: &str) -> (u32, String) {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        exchange(&mut s, &req)
    }

    /// GET `path` from the daemon's remote service: the JSON reply.
    fn get(&self, path: &str) -> serde_json::Value {
        let (status, body) = self.get_status(path);
        assert!(status == 200, "GET {path}: {status} {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child, not yet waited for.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(10);
        while let Ok(None) = self.child.try_wait() {
            if Instant::now() > until {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request: the status and the body, read to its
/// Content-Length (imageio sends one, never chunks), not to the end: the
/// daemon may reset a connection it is done with.
fn exchange(s: &mut (impl Read + Write), req: &str) -> (u32, String) {
    s.write_all(req.as_bytes()).unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = reply.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = s.read(&mut buf).expect("a reply");
        assert!(n > 0, "the connection closed before a reply: {reply:?}");
        reply.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&reply[..head_end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0);
    while reply.len() < head_end + len {
        let n = s.read(&mut buf).expect("the body");
        assert!(n > 0, "the connection closed in the body");
        reply.extend_from_slice(&buf[..n]);
    }
    (
        status,
        String::from_utf8_lossy(&reply[head_end..head_end + len]).into_owned(),
    )
}

#[test]
fn checksums_equal_imageio_daemon() {
    if !require(&["qemu-img", "qemu-nbd", "python3"]) {
        return;
    }
    let Some(venv) = venv() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    const MIB: u64 = 1 << 20;

    // Raw files, served by imageio's file backend (testkit's recipes: "-"
    // a hole, "0" written zeros, "r" pseudo-random bytes): sparse, all
    // zeros written, and a size that is no multiple of any block size (but
    // of 512), and one whose size is no multiple of 512.
    let sparse = image(d, "sparse.raw", "3m:- 1m:r 13m:- 8k:- 4k:r 4084k:-");
    let zeros = image(d, "zeros.raw", "9m:0");
    let odd = image(d, "odd.raw", "5m:r 1536:r");
    // A size of no multiple of 512: the file backend hashes its exact
    // bytes (no rounding up, as QEMU's), and so does blksum here. It reads
    // with O_DIRECT, which a disk file system refuses for the last partial
    // sector (EINVAL: 500), and tmpfs serves as it is: the file is there.
    let shm = tempfile::tempdir_in("/dev/shm").ok();
    let unaligned = image(
        shm.as_ref().map_or(d, |t| t.path()),
        "unaligned.raw",
        "4m:r 1m:- 1000:r",
    );

    // qcow2 images, served to imageio by qemu-nbd.
    let src = image(d, "src.raw", "6m:r 4m:0 1m:r 4k:r");
    let compressed = d.join("compressed.qcow2");
    qemu::qemu_img(&[
        "convert",
        "-c",
        "-f",
        "raw",
        "-O",
        "qcow2",
        src.to_str().unwrap(),
        compressed.to_str().unwrap(),
    ]);
    let sparse_q = d.join("sparse.qcow2");
    qemu::qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        sparse_q.to_str().unwrap(),
        "19M",
    ]);
    qemu::qemu_io(
        &sparse_q,
        "qcow2",
        &[
            "write -P 0x5a 1m 3m",
            "write -z 8m 1m",
            "write -P 7 18m 64k",
        ],
    );
    std::fs::remove_file(&src).unwrap();

    let daemon = Daemon::start(&venv, &d.join("imageio"));
    let mut servers = Vec::new();
    let mut images: Vec<(String, PathBuf)> = Vec::new();
    let mut raws = vec![&sparse, &zeros, &odd];
    if shm.is_some() {
        raws.push(&unaligned);
    } else {
        eprintln!("no tmpfs at /dev/shm: the unaligned file is not compared");
    }
    for p in raws {
        let id = p.file_name().unwrap().to_str().unwrap().replace('.', "-");
        let size = std::fs::metadata(p).unwrap().len();
        daemon.ticket(&id, &format!("file://{}", p.display()), size);
        images.push((id, p.clone()));
    }
    for p in [&compressed, &sparse_q] {
        let id = p.file_name().unwrap().to_str().unwrap().replace('.', "-");
        let sock = d.join(format!("{id}.sock"));
        let srv = testkit::nbd::qemu_nbd(p, "qcow2", testkit::nbd::Listen::Unix(&sock), None);
        let size = match p == &compressed {
            true => 11 * MIB + 4096,
            false => 19 * MIB,
        };
        daemon.ticket(&id, &format!("nbd:unix:{}", sock.display()), size);
        servers.push(srv);
        images.push((id, p.clone()));
    }

    // Every algorithm imageio lists (hashlib.algorithms_available) and
    // computes, by imageio's name. It makes its hasher with
    // getattr(hashlib, NAME), which fails (500) for the names hashlib
    // has no function of its own for, and SHAKE needs an output length it
    // does not give: those are checked to fail there, the rest compared.
    const IMAGEIO_FAILS: [&str; 7] = [
        "md5-sha1",
        "ripemd160",
        "sm3",
        "sha512_224",
        "sha512_256",
        "shake_128",
        "shake_256",
    ];
    let first = &images[0].0;
    let listed = daemon.get(&format!("/images/{first}/checksum/algorithms"));
    let mut algorithms = Vec::new();
    for name in listed["algorithms"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        if IMAGEIO_FAILS.contains(&name) {
            let (status, _) =
                daemon.get_status(&format!("/images/{first}/checksum?algorithm={name}"));
            assert_eq!(status, 500, "imageio now computes {name}: compare it");
            // blksum refuses it too: no checksum imageio never gives.
            let path = images[0].1.to_str().unwrap();
            let out = run(&["--construction", "imageio", "-d", name, path], None);
            assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
            continue;
        }
        let ours = name.parse::<blkhash::Algorithm>();
        assert!(
            ours.is_ok_and(|a| a.imageio_name() == Some(name)),
            "imageio's {name}"
        );
        algorithms.push(name.to_string());
    }
    assert!(algorithms.len() >= 10, "{algorithms:?}");

    // imageio's default first (BLAKE2b-256, 4 MiB, with no parameter),
    // then each algorithm at one of the block sizes, in turn.
    let sizes = [MIB, 2 * MIB, 4 * MIB, 8 * MIB, 16 * MIB];
    let mut cases: Vec<(Option<&str>, Option<u64>)> = vec![(None, None)];
    for (i, a) in algorithms.iter().enumerate() {
        cases.push((Some(a), Some(sizes[i % sizes.len()])));
    }
    for bs in sizes {
        cases.push((Some("sha256"), Some(bs)));
    }
    let mut compared = 0;
    for (alg, bs) in cases {
        let mut args = vec!["--construction".to_string(), "imageio".to_string()];
        let mut query = Vec::new();
        if let Some(a) = alg {
            args.extend(["-d".into(), a.to_string()]);
            query.push(format!("algorithm={a}"));
        }
        if let Some(b) = bs {
            args.extend(["--block-size".into(), b.to_string()]);
            query.push(format!("block_size={b}"));
        }
        let paths: Vec<String> = images
            .iter()
            .map(|(_, p)| p.display().to_string())
            .collect();
        let all = [args.clone(), paths].concat();
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let out = run(&all, None);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = stdout(&out);
        let ours: Vec<&str> = text
            .lines()
            .map(|l| l.split("  ").next().unwrap())
            .collect();
        assert_eq!(ours.len(), images.len());
        for ((id, _), ours) in images.iter().zip(ours) {
            let theirs = daemon.get(&format!("/images/{id}/checksum?{}", query.join("&")));
            assert_eq!(theirs["algorithm"], alg.unwrap_or("blake2b"));
            assert_eq!(theirs["block_size"], bs.unwrap_or(4 * MIB));
            assert_eq!(ours, theirs["checksum"], "{id} {alg:?} {bs:?}");
            compared += 1;
        }
    }
    assert!(compared >= images.len() * 16, "{compared}");
    drop(servers);
    drop(daemon);
}
