//! NBD URLs against real servers (qemu-nbd and nbdkit, started and stopped
//! here): the checksum over NBD equals the file's; faults are errors that
//! name the URL, with no checksum and no hang.

use crate::common;

use common::nbd::*;
use common::qemu::qemu_img;
use common::*;
use std::time::{Duration, Instant};

/// The sha256, 64k vectors of raw images (a few dozen recipes).
fn vectors() -> Vec<testkit::Vector> {
    testkit::vectors()
        .into_iter()
        .filter(|v| v.format.is_none() && v.digest == "sha256" && v.block_size == 65536)
        .collect()
}

#[test]
fn qemu_nbd_raw_unix_socket_vectors() {
    if !require(&["qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (i, v) in vectors().iter().enumerate() {
        let img = image(dir.path(), &format!("{i}.raw"), &v.recipe);
        let sock = dir.path().join(format!("{i}.sock"));
        let srv = qemu_nbd(&img, "raw", Listen::Unix(&sock), None);
        // QEMU rounds the size up to 512 bytes, as blksum does for files.
        assert_eq!(nbd_sum(&[&srv.url]), v.file, "{}", v.recipe);
        checked += 1;
    }
    assert!(checked >= 20, "{checked}");
}

#[test]
fn qemu_nbd_qcow2_over_tcp_with_named_exports() {
    if !require(&["qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let recipes = [
        "1m:A 127m:- 1m:B 127m:- 1m:C 63m:-",
        "1m:r 1m:- 1m:0 1m:t 100000:r",
        "8m:t 8m:- 8m:r 8m:0",
    ];
    for (i, v) in vectors()
        .iter()
        .filter(|v| recipes.contains(&v.recipe.as_str()))
        .enumerate()
    {
        let raw = image(dir.path(), &format!("{i}.raw"), &v.recipe);
        let qcow2 = dir.path().join(format!("{i}.qcow2"));
        qemu_img(&[
            "convert",
            "-q",
            "-O",
            "qcow2",
            raw.to_str().unwrap(),
            qcow2.to_str().unwrap(),
        ]);
        let srv = qemu_nbd(&qcow2, "qcow2", Listen::Tcp, Some("disk one"));
        let url = srv.url.replace(' ', "%20");
        assert_eq!(nbd_sum(&[&url]), v.file, "{}", v.recipe);
        // Raw over TCP, default export, another digest and block size.
        let srv = qemu_nbd(&raw, "raw", Listen::Tcp, None);
        let expect = nbd_sum(&["-d", "blake3", "--block-size", "4k", raw.to_str().unwrap()]);
        assert_eq!(
            nbd_sum(&["-d", "blake3", "--block-size", "4k", &srv.url]),
            expect
        );
        // A name the server does not export.
        let srv = qemu_nbd(&raw, "raw", Listen::Tcp, Some("disk"));
        let bad = srv.url.replace("/disk", "/other");
        let err = nbd_fails(&[&bad]);
        assert!(err.contains(&bad) && err.contains("export"), "{err}");
    }
}

#[test]
fn nbdkit_file_exports_the_exact_size() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (i, v) in vectors().iter().enumerate().filter(|(_, v)| v.size > 0) {
        let img = image(dir.path(), &format!("{i}.raw"), &v.recipe);
        let sock = dir.path().join(format!("{i}.sock"));
        let srv = nbdkit(Listen::Unix(&sock), &["file", img.to_str().unwrap()]);
        assert_eq!(nbd_sum(&[&srv.url]), v.pipe_checksum(), "{}", v.recipe);
        checked += 1;
    }
    assert!(checked >= 20, "{checked}");
}

#[test]
fn nbdkit_plugins_match_what_qemu_reads() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cases: &[&[&str]] = &[
        &["memory", "size=1G"],
        &["pattern", "size=64M"],
        &[
            "sparse-random",
            "size=256M",
            "seed=42",
            "percent=5",
            "runlength=65536",
        ],
        // No block status (all read, zero detection on): noextents filter.
        &["--filter=noextents", "sparse-random", "size=32M", "seed=7"],
        // A server that wants aligned requests of at most 64k.
        &[
            "--filter=blocksize-policy",
            "pattern",
            "size=8M",
            "blocksize-minimum=4096",
            "blocksize-maximum=65536",
            "blocksize-error-policy=error",
        ],
    ];
    for (i, args) in cases.iter().enumerate() {
        let sock = dir.path().join(format!("{i}.sock"));
        let srv = nbdkit(Listen::Unix(&sock), args);
        let out = dir.path().join(format!("{i}.raw"));
        fetch(&srv.url, &out);
        let expect = nbd_sum(&[out.to_str().unwrap()]);
        assert_eq!(nbd_sum(&[&srv.url]), expect, "{args:?}");
        std::fs::remove_file(&out).unwrap();
    }
}

#[test]
fn errors_name_the_url_and_print_no_checksum() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw", "8m:r 8m:- 8m:t");
    let f = img.to_str().unwrap();
    // Every read fails: a rate below 100% would let some runs see no error
    // at all (at 20%, 0.8^16 of them), so the test could not be relied on.
    let sock = dir.path().join("random.sock");
    let srv = nbdkit(
        Listen::Unix(&sock),
        &[
            "--filter=error",
            "file",
            f,
            "error-pread-rate=100%",
            "error=EIO",
        ],
    );
    let err = nbd_fails(&[&srv.url]);
    assert!(err.contains(&srv.url) && err.contains("EIO"), "{err}");
    drop(srv);
    // Errors on a chosen range only (the last 1 MiB), from a script plugin.
    let sock = dir.path().join("range.sock");
    let pread = format!(
        "if [ $4 -ge 15728640 ]; then echo 'EIO bad sector' >&2; exit 1; fi; \
         dd if={f} iflag=skip_bytes,count_bytes skip=$4 count=$3 status=none"
    );
    let srv = nbdkit(
        Listen::Unix(&sock),
        &["eval", "get_size=echo 16777216", &format!("pread={pread}")],
    );
    let err = nbd_fails(&[&srv.url]);
    assert!(err.contains(&srv.url) && err.contains("EIO"), "{err}");
    drop(srv);
    // No server at all: a free port, a missing socket.
    let url = format!("nbd://127.0.0.1:{}/", free_port());
    let err = nbd_fails(&[&url]);
    assert!(err.contains(&url) && err.contains("connect"), "{err}");
    let url = format!(
        "nbd+unix:///?socket={}",
        dir.path().join("none.sock").display()
    );
    assert!(nbd_fails(&[&url]).contains(&url));
    // Not an NBD server.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let t = std::thread::spawn(move || {
        use std::io::Write;
        let (mut s, _) = listener.accept().unwrap();
        let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    });
    let err = nbd_fails(&[&format!("nbd://127.0.0.1:{port}")]);
    assert!(err.contains("NBD"), "{err}");
    t.join().unwrap();
}

#[test]
fn a_silent_server_times_out() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw", "4m:r");
    let sock = dir.path().join("slow.sock");
    let srv = nbdkit(
        Listen::Unix(&sock),
        &["--filter=delay", "file", img.to_str().unwrap(), "rdelay=20"],
    );
    let start = Instant::now();
    let err = nbd_fails(&["--timeout", "1", &srv.url]);
    assert!(
        err.contains(&srv.url) && err.contains("did not answer"),
        "{err}"
    );
    assert!(start.elapsed() < Duration::from_secs(15));
    // A slow server within the timeout is fine.
    let sock = dir.path().join("slowish.sock");
    let srv = nbdkit(
        Listen::Unix(&sock),
        &[
            "--filter=delay",
            "file",
            img.to_str().unwrap(),
            "rdelay=200ms",
        ],
    );
    let expect = run(&["-"], Some(&img));
    assert_eq!(
        nbd_sum(&["--timeout", "5", &srv.url]),
        stdout(&expect).split_once("  ").unwrap().0
    );
}

#[test]
fn a_server_killed_mid_transfer_is_an_error() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.raw", "64m:r");
    let sock = dir.path().join("k.sock");
    let log = dir.path().join("log");
    let mut srv = nbdkit(
        Listen::Unix(&sock),
        &[
            "--filter=log",
            "--filter=delay",
            "file",
            img.to_str().unwrap(),
            &format!("logfile={}", log.display()),
            // Each read takes a second: the server is killed while the
            // first read it logged waits for its reply.
            "rdelay=1",
        ],
    );
    let url = srv.url.clone();
    let pid = srv.pid();
    let killer = std::thread::spawn(move || {
        // Killed once a read request came (the log filter logs it as it
        // comes, before the delay), not after a time a slow start outlasts.
        let start = Instant::now();
        while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains(" Read id=")) {
            assert!(start.elapsed() < Duration::from_secs(60), "no read request");
            std::thread::sleep(Duration::from_millis(5));
        }
        // SAFETY: plain syscall.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let start = Instant::now();
    let err = nbd_fails(&[&url]);
    killer.join().unwrap();
    srv.kill();
    assert!(err.contains(&url) && err.contains("closed"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30));
    drop(srv);
    assert!(!sock.exists());
    assert!(processes_with(&sock.display().to_string()).is_empty());
}
