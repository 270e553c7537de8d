//! blksync to NBD exports, served by the real servers: a qcow2 image
//! through qemu-nbd (one client at a time, qcow2 allocation done by QEMU)
//! and a raw file through nbdkit (multi-conn). DST ends with SRC's content
//! as `qemu-img compare` and blksum see it, only the changed blocks are
//! written on an update, zeroed blocks become holes, and exports blksync
//! cannot make equal to SRC are refused by name.

use crate::common;

use common::*;
use std::path::{Path, PathBuf};

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

fn check_same(dir: &Path, src: &Path, dst: &Path) {
    let o = run("qemu-img", &["compare", s(src), s(dst)]);
    assert!(
        same(src, dst),
        "qemu-img compare: {src:?} and {dst:?} differ: {} {}",
        o.stdout,
        o.stderr
    );
    assert_eq!(checksum(dir, src), checksum(dir, dst));
}

/// Guest ranges allocated in a qcow2 image (qemu-img map).
fn allocated(img: &Path) -> Vec<(u64, u64)> {
    let out = run("qemu-img", &["map", "--output=json", s(img)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter(|e| e["data"].as_bool().unwrap())
        .map(|e| (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap()))
        .collect()
}

/// Nothing of the range `from..to` is allocated in the qcow2 image `img`
/// (a range blksync zeroed).
fn assert_deallocated(img: &Path, from: u64, to: u64) {
    let a = allocated(img);
    assert!(
        !a.iter()
            .any(|&(start, len)| start < to && start + len > from),
        "the zeroed range is still allocated in {img:?}: {a:?}",
    );
}

/// A qcow2 DST through qemu-nbd: first copy (the empty image is not read:
/// block status says it holds nothing), updates with a state after
/// qemu-io changes to SRC (only the changes written; a zeroed range
/// deallocated in DST), without a state (DST read through the same
/// connection: qemu-nbd takes one client), and --verify.
#[test]
fn qcow2_through_qemu_nbd() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 32 * MIB;
    let (src, dst, state) = qcow2_src_dst(d, size, &["write -P 0x11 0 8M", "write -P 0x22 20M 4M"]);
    let check = |server: Server| {
        drop(server); // qemu-img reads the image once the server is gone
        check_same(d, &src, &dst);
    };

    let Some(server) = qemu_nbd(d, &dst, &[]) else {
        return;
    };
    let out = run(
        BLKSYNC,
        &[s(&src), &server.url, "--state", s(&state), "--checksum"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(written(&out.stderr), 12 * MIB);
    assert!(out.stdout.starts_with(&checksum(d, &src)));
    check(server);

    write(&src, "qcow2", &["write -P 0x33 1M 64k", "write -z 20M 2M"]);
    let server = qemu_nbd(d, &dst, &[]).unwrap();
    let out = run(
        BLKSYNC,
        &[s(&src), &server.url, "--state", s(&state), "--verify"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(written(&out.stderr), 64 * 1024, "{}", out.stderr);
    assert!(out.stderr.contains("2097152 zeroed"), "{}", out.stderr);
    check(server);
    assert_deallocated(&dst, 20 * MIB, 22 * MIB);

    // No state: DST is read and compared; only the change is written.
    write(&src, "qcow2", &["write -P 0x44 30M 128k"]);
    let server = qemu_nbd(d, &dst, &[]).unwrap();
    let out = run(BLKSYNC, &[s(&src), &server.url]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(written(&out.stderr), 128 * 1024, "{}", out.stderr);
    check(server);

    // The state is now behind DST (that run saved none): its sampled
    // blocks do not show it, the size matches; --verify would. Removing
    // it is the user's way out; a state of another image is refused.
    let other = d.join("other.map");
    sh(
        BLKMAP,
        &[
            s(&image(d, "o.raw", "raw", size, &["write -P 0x77 0 32M"])),
            s(&other),
        ],
    );
    let server = qemu_nbd(d, &dst, &[]).unwrap();
    let out = run(BLKSYNC, &[s(&src), &server.url, "--state", s(&other)]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("state refused"), "{}", out.stderr);
    check(server);
}

/// blksync with TMPDIR set to `tmp` (where the private qemu-nbd's socket
/// directory goes, to check it is removed).
fn sync_in(tmp: &Path, args: &[&str]) -> Out {
    let out = std::process::Command::new(BLKSYNC)
        .args(args)
        .env("TMPDIR", tmp)
        .output()
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn format_of(img: &Path) -> String {
    let out = run("qemu-img", &["info", "--output=json", s(img)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v["format"].as_str().unwrap().to_string()
}

/// A qcow2 file as DST, no server given: blksync serves it writable with
/// a private qemu-nbd (stopped, its directory removed, by the time blksync
/// exits), so the image keeps its format and gets SRC's guest content:
/// first copy, an update with a state (only the change written, a zeroed
/// range deallocated), --verify. Other formats QEMU writes work the same;
/// an image of another virtual size and a LUKS image are refused by name.
#[test]
fn image_file_dst_through_a_private_qemu_nbd() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let left = || std::fs::read_dir(&tmp).unwrap().count();
    let size = 32 * MIB;
    let (src, dst, state) = qcow2_src_dst(d, size, &["write -P 0x11 0 8M", "write -P 0x22 20M 4M"]);

    let out = sync_in(&tmp, &[s(&src), s(&dst), "--state", s(&state)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(written(&out.stderr), 12 * MIB);
    assert_eq!(left(), 0, "the private server's directory is left");
    assert_eq!(format_of(&dst), "qcow2");
    check_same(d, &src, &dst);

    write(&src, "qcow2", &["write -P 0x33 1M 64k", "write -z 20M 2M"]);
    let out = sync_in(&tmp, &[s(&src), s(&dst), "--state", s(&state), "--verify"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(written(&out.stderr), 64 * 1024, "{}", out.stderr);
    assert!(out.stderr.contains("2097152 zeroed"), "{}", out.stderr);
    assert_eq!(left(), 0);
    check_same(d, &src, &dst);
    // Stopped with SIGTERM, the server flushed and closed the image.
    let check = run("qemu-img", &["check", s(&dst)]);
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
    assert_deallocated(&dst, 20 * MIB, 22 * MIB);

    // The image changed behind the state (its file's times, in the side
    // record taken once the server was gone): refused, then rescanned.
    assert!(
        d.join("dst.map.dst").exists(),
        "no side record for a served image"
    );
    write(&dst, "qcow2", &["write -P 0x99 5M 4k"]);
    let out = sync_in(&tmp, &[s(&src), s(&dst), "--state", s(&state)]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("DST changed since the state was saved"),
        "{}",
        out.stderr
    );
    let out = sync_in(
        &tmp,
        &[s(&src), s(&dst), "--state", s(&state), "--force-rescan"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(written(&out.stderr), 64 * 1024, "{}", out.stderr);
    check_same(d, &src, &dst);

    // A DST that does not exist is created in the format -O names; an
    // existing one must be of it.
    let made = d.join("made.qcow2");
    let out = sync_in(&tmp, &[s(&src), s(&made), "-O", "qcow2", "-n"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!made.exists(), "a dry run created DST");
    let made_state = d.join("made.map");
    let args = [s(&src), s(&made), "-O", "qcow2", "--state", s(&made_state)];
    let out = sync_in(&tmp, &args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(format_of(&made), "qcow2");
    check_same(d, &src, &made);
    let out = sync_in(&tmp, &args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(written(&out.stderr), 0, "{}", out.stderr);
    let out = sync_in(&tmp, &[s(&src), s(&made), "-O", "raw"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("a qcow2 image, not raw"),
        "{}",
        out.stderr
    );
    let raw = image(d, "some.raw", "raw", size, &["write -P 0x5 0 1M"]);
    let out = sync_in(&tmp, &[s(&src), s(&raw), "-O", "qcow2"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("a raw image, not qcow2"),
        "{}",
        out.stderr
    );
    assert_eq!(format_of(&raw), "raw");

    for fmt in ["vdi", "vhdx"] {
        let other = image(d, &format!("dst.{fmt}"), fmt, size, &[]);
        let out = sync_in(&tmp, &[s(&src), s(&other)]);
        assert_eq!(out.code, 0, "{fmt}: {}", out.stderr);
        assert_eq!(format_of(&other), fmt);
        check_same(d, &src, &other);
    }

    let small = image(d, "small.qcow2", "qcow2", size / 2, &[]);
    let before = std::fs::read(&small).unwrap();
    let out = sync_in(&tmp, &[s(&src), s(&small)]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let want = format!("a qcow2 image of {} bytes, SRC is {size}", size / 2);
    assert!(out.stderr.contains(&want), "{}", out.stderr);
    assert!(out.stderr.contains(s(&small)), "{}", out.stderr);
    assert_eq!(std::fs::read(&small).unwrap(), before);
    assert_eq!(left(), 0);

    // An image whose data lives in another file: written there, as QEMU
    // does; --no-backing refuses it, the other file untouched.
    let data = d.join("data.raw");
    let ext = d.join("ext.qcow2");
    let opt = format!("data_file={}", s(&data));
    sh(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", "-o", &opt, s(&ext), "32M"],
    );
    write(&data, "raw", &["write -P 0x99 0 1M"]);
    let before = std::fs::read(&data).unwrap();
    let out = sync_in(&tmp, &[s(&src), s(&ext), "--no-backing"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("external data file"), "{}", out.stderr);
    assert_eq!(std::fs::read(&data).unwrap(), before);
    let vdi = image(d, "refs.vdi", "vdi", size, &[]);
    let out = sync_in(&tmp, &[s(&src), s(&vdi), "--no-backing"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("only qcow2 DSTs"), "{}", out.stderr);
    let out = sync_in(&tmp, &[s(&src), s(&ext)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    check_same(d, &src, &ext);
    assert_ne!(std::fs::read(&data).unwrap(), before);

    let luks = d.join("dst.luks");
    sh(
        "qemu-img",
        &[
            "create",
            "-f",
            "luks",
            "--object",
            "secret,id=s0,data=pass",
            "-o",
            "key-secret=s0,iter-time=10",
            s(&luks),
            "32M",
        ],
    );
    let out = sync_in(&tmp, &[s(&src), s(&luks)]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("a LUKS image"), "{}", out.stderr);
}

/// Exports blksync cannot bring to SRC's content are refused by name, and
/// left untouched: read-only, of another size.
#[test]
fn read_only_and_other_size_exports_refused() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(d, 4 * MIB, &["write -P 0x11 0 1M"]);
    let dst = image(d, "dst.qcow2", "qcow2", 4 * MIB, &["write -P 0x22 0 4M"]);
    let before = std::fs::read(&dst).unwrap();
    let Some(server) = qemu_nbd(d, &dst, &["-r"]) else {
        return;
    };
    let out = run(BLKSYNC, &[s(&src), &server.url]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("the export is read-only"),
        "{}",
        out.stderr
    );
    drop(server);

    let big = image(d, "big.qcow2", "qcow2", 8 * MIB, &[]);
    let server = qemu_nbd(d, &big, &[]).unwrap();
    let out = run(BLKSYNC, &[s(&src), &server.url]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("sizes must match"), "{}", out.stderr);
    drop(server);
    assert_eq!(std::fs::read(&dst).unwrap(), before);
}

/// A raw file through nbdkit, which offers multi-conn: blksync writes over
/// several connections and flushes each before the state is saved.
#[test]
fn raw_file_through_nbdkit_multi_conn() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 16 * MIB;
    let src = src_qcow2(d, size, &["write -P 0x11 0 6M", "write -P 0x22 10M 3M"]);
    let dst: PathBuf = image(d, "dst.raw", "raw", size, &["write -P 0x55 0 16M"]);
    let state = d.join("dst.map");
    let sock = d.join("kit.sock");
    let Some(server) = nbdkit(&sock, &["file", s(&dst)]) else {
        return;
    };
    // DST holds other data: read, compared, rewritten where it differs.
    let out = run(BLKSYNC, &[s(&src), &server.url, "--state", s(&state)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    check_same(d, &src, &dst);
    write(&src, "qcow2", &["write -P 0x66 5M 64k"]);
    let out = run(
        BLKSYNC,
        &[s(&src), &server.url, "--state", s(&state), "--verify"],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(written(&out.stderr), 64 * 1024, "{}", out.stderr);
    drop(server);
    check_same(d, &src, &dst);
}

/// A server whose writes or write zeroes fail (nbdkit's error filter):
/// blksync names DST and the server's error, exits 1, prints no checksum
/// and leaves no state behind.
#[test]
fn failing_writes_and_zeroes_are_errors() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 8 * MIB;
    let src = src_qcow2(d, size, &["write -P 0x11 0 3M"]);
    let state = d.join("dst.map");
    // An empty DST gets SRC's data (writes); one holding data where SRC
    // has zeros gets write zeroes there.
    let cases = [
        (
            "empty.raw",
            &[][..],
            "error-pwrite=EIO",
            "error-pwrite-rate=100%",
            "EIO",
        ),
        (
            "data.raw",
            &["write -P 0x11 0 3M", "write -P 0x22 4M 1M"][..],
            "error-zero=ENOSPC",
            "error-zero-rate=100%",
            "ENOSPC",
        ),
    ];
    for (name, cmds, error, rate, why) in cases {
        let dst = image(d, name, "raw", size, cmds);
        let sock = d.join(format!("{name}.sock"));
        let args = ["--filter=error", "file", s(&dst), error, rate];
        let Some(server) = nbdkit(&sock, &args) else {
            return;
        };
        let out = run(
            BLKSYNC,
            &[s(&src), &server.url, "--state", s(&state), "--checksum"],
        );
        assert_eq!(out.code, 1, "{}", out.stderr);
        assert!(out.stderr.contains(&server.url), "{}", out.stderr);
        assert!(out.stderr.contains(why), "{}", out.stderr);
        assert_eq!(out.stdout, "");
        assert!(!state.exists(), "a state was saved for a DST not written");
    }
}

/// An update with a valid state writes while SRC is still hashed: a server
/// that fails those writes (EIO) ends the run with exit 1, naming DST and
/// the error, no checksum printed, and the state gone (DST may be partly
/// written); a rerun through a working server finishes the job.
#[test]
fn failing_writes_during_an_update_with_a_state() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 16 * MIB;
    let src = src_qcow2(d, size, &["write -P 0x11 0 6M", "write -P 0x33 12M 2M"]);
    let dst = image(d, "dst.raw", "raw", size, &[]);
    let state = d.join("dst.map");
    // nbdkit [--filter=F] file DST [the filter's parameters]
    let serve_dst = |name: &str, filter: &[&str], params: &[&str]| {
        let sock = d.join(format!("{name}.sock"));
        let mut args = filter.to_vec();
        args.extend(["file", s(&dst)]);
        args.extend(params);
        nbdkit(&sock, &args)
    };
    let Some(good) = serve_dst("good", &[], &[]) else {
        return;
    };
    let out = run(BLKSYNC, &[s(&src), &good.url, "--state", s(&state)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    drop(good);
    assert!(state.exists());
    write(
        &src,
        "qcow2",
        &["write -P 0x44 1M 64k", "write -P 0x55 15M 128k"],
    );

    let Some(failing) = serve_dst(
        "failing",
        &["--filter=error"],
        &["error-pwrite=EIO", "error-pwrite-rate=100%"],
    ) else {
        return;
    };
    let out = run(
        BLKSYNC,
        &[s(&src), &failing.url, "--state", s(&state), "--checksum"],
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains(&failing.url), "{}", out.stderr);
    assert!(out.stderr.contains("EIO"), "{}", out.stderr);
    assert_eq!(out.stdout, "");
    assert!(!state.exists(), "the state outlived a failed write");
    drop(failing);

    let Some(good) = serve_dst("again", &[], &[]) else {
        return;
    };
    let out = run(BLKSYNC, &[s(&src), &good.url, "--state", s(&state)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    drop(good);
    check_same(d, &src, &dst);
}

/// A server that stops answering writes (nbdkit's delay filter, 30 s per
/// write): with --timeout 1, blksync gives up within seconds, names DST,
/// and saves no state.
#[test]
fn silent_server_times_out() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(d, 4 * MIB, &["write -P 0x11 0 1M"]);
    let dst = image(d, "dst.raw", "raw", 4 * MIB, &[]);
    let state = d.join("dst.map");
    let sock = d.join("slow.sock");
    let args = ["--filter=delay", "file", s(&dst), "delay-write=30"];
    let Some(server) = nbdkit(&sock, &args) else {
        return;
    };
    let t = std::time::Instant::now();
    let out = run(
        BLKSYNC,
        &[s(&src), &server.url, "--state", s(&state), "--timeout", "1"],
    );
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(10),
        "took {:?}",
        t.elapsed()
    );
    assert!(out.stderr.contains(&server.url), "{}", out.stderr);
    assert!(out.stderr.contains("did not answer"), "{}", out.stderr);
    assert!(!state.exists());
}
