//! Backups of a running VM with libvirt (9.0) and virtnbdbackup, on the
//! real stack: a libvirtd of the test's own ([`testkit::libvirt`]), a
//! domain under TCG whose disk takes the guest's writes through its
//! device (qemu-io over HMP).
//!
//! - virtnbdbackup's streams (full and two incrementals, plain and lz4)
//!   read as the disk at each backup: blkmap's and blksum's checksum of
//!   a stream, for several digests and block sizes, equal blksum's of the
//!   backup job's NBD export at that moment, and virtnbdrestore's output;
//!   a chain with a gap is refused, naming the missing checkpoint.
//! - libvirt's own checkpoints and pull backups: `blkmap --base OLD
//!   --dirty-bitmap backup-sda` over the incremental backup's export
//!   writes the map a full run writes, `blksync --dirty-bitmap` copies
//!   the export; a bitmap the export does not offer and OLD of another
//!   disk are refused.
//!
//! One libvirtd for all (its start probes QEMU, some seconds), domains in
//! turn.

use crate::common;

use blkmap::Map;
use common::dirty::*;
use common::*;
use std::path::{Path, PathBuf};
use testkit::libvirt::{Domain, Libvirtd, have_libvirt};

/// The blksum built beside blkmap (the workspace's tests build it).
fn blksum() -> Option<PathBuf> {
    let p = Path::new(BLKMAP).with_file_name("blksum");
    p.exists().then_some(p)
}

/// The digests and block sizes checked.
const SUMS: &[(&str, &str)] = &[("sha256", "64k"), ("sha1", "4k"), ("blake2b512", "1m")];

/// `blkmap -d D --block-size B IMAGE MAP`'s checksum for each of [`SUMS`];
/// blksum's too, which must agree.
fn sums(d: &Path, image: &str) -> Vec<String> {
    SUMS.iter()
        .map(|(digest, bs)| {
            let out = d.join("sum.map");
            let o = run(BLKMAP, &["-d", digest, "--block-size", bs, image, s(&out)]);
            assert_eq!(o.code, 0, "blkmap {image}: {}", o.stderr);
            let sum = checksum_of(&o.stdout, image);
            if let Some(b) = blksum() {
                let o = run(s(&b), &["-d", digest, "--block-size", bs, image]);
                assert_eq!(o.code, 0, "blksum {image}: {}", o.stderr);
                assert_eq!(o.stdout.split_whitespace().next(), Some(&*sum), "{image}");
            }
            std::fs::remove_file(&out).unwrap();
            sum
        })
        .collect()
}

fn url(sock: &Path) -> String {
    format!("nbd+unix:///sda?socket={}", sock.display())
}

/// The checksums of the disk as it is, from a pull backup's export (no
/// checkpoint: virtnbdbackup's chain is left alone).
fn export_sums(d: &Path, dom: &Domain) -> Vec<String> {
    let sock = d.join("truth.sock");
    dom.backup_begin(&sock, None, None);
    let got = sums(d, &url(&sock));
    dom.backup_end();
    got
}

fn virtnbdbackup(lv: &Libvirtd, dom: &Domain, level: &str, out: &Path, compress: bool) {
    let mut args = vec!["-U", lv.uri(), "-d", dom.name(), "-l", level, "-o", s(out)];
    if compress {
        args.push("-z");
    }
    virt_tool(
        "virtnbdbackup",
        &args,
        out.parent().expect("in the scratch directory"),
    );
}

/// One of virtnbdbackup's tools, which must succeed, its temporary files
/// (virtnbdrestore leaves qemu-img's and qemu-nbd's logs there) in
/// `dir/tmp`, removed with the scratch directory `dir`.
fn virt_tool(cmd: &str, args: &[&str], dir: &Path) {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = std::process::Command::new(cmd)
        .args(args)
        .env("TMPDIR", &tmp)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd} {args:?}: {stderr}");
}

/// Waits (at most a minute) until no process holds `img`'s write lock:
/// virtnbdrestore ends its qemu-nbd with SIGTERM and does not wait for
/// it, so the restored image can still be locked when it returns.
fn wait_unlocked(img: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let o = std::process::Command::new("qemu-img")
            .args(["info", "--output=json", s(img)])
            .output()
            .unwrap();
        if o.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("lock") && std::time::Instant::now() < deadline,
            "qemu-img info {img:?}: {err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A short scratch directory: libvirt's sockets live there.
fn short_scratch() -> tempfile::TempDir {
    let tmp = std::env::temp_dir();
    let base = if tmp.as_os_str().len() > 40 {
        PathBuf::from("/tmp")
    } else {
        tmp
    };
    tempfile::Builder::new()
        .prefix("lv")
        .tempdir_in(base)
        .unwrap()
}

#[test]
fn libvirt_backups() {
    if !have_libvirt() || !have_qemu() {
        return;
    }
    let dir = short_scratch();
    let d = dir.path();
    let lv = Libvirtd::start(&d.join("lv"));
    for compress in [false, true] {
        virtnbdbackup_streams(&lv, d, compress);
    }
    checkpoints_and_pull_backups(&lv, d);
    drop(lv);
}

/// virtnbdbackup full, inc, inc: each stream is the disk at its backup.
fn virtnbdbackup_streams(lv: &Libvirtd, d: &Path, compress: bool) {
    let tag = if compress { "z" } else { "p" };
    let img = d.join(format!("{tag}.qcow2"));
    testkit::tools::create(&img, "qcow2", &[], "64M");
    let dom = Domain::start(lv, &format!("vnbd{tag}"), &img);
    let bk = d.join(format!("bk{tag}"));
    std::fs::create_dir(&bk).unwrap();
    let rounds: [&[&str]; 3] = [
        &[
            "write -P 0x5 1M 64k",
            "write -P 0x7 40M 3M",
            "write -P 0x8 63M 1M",
        ],
        // Inside a written cluster, zeros written, a hole written.
        &[
            "write -P 0x9 1056k 8k",
            "write -z 40M 1M",
            "write -P 0xa 20M 4k",
        ],
        // Over 32 MiB: cut in several lz4 frames.
        &["write -P 0x3 2M 40M", "write -P 0xb 63M 4k"],
    ];
    let mut files = Vec::new();
    for (i, cmds) in rounds.iter().enumerate() {
        for c in *cmds {
            dom.write(c);
        }
        let level = if i == 0 { "full" } else { "inc" };
        virtnbdbackup(lv, &dom, level, &bk, compress);
        let file = match i {
            0 => bk.join("sda.full.data"),
            n => bk.join(format!("sda.inc.virtnbdbackup.{n}.data")),
        };
        let truth = export_sums(d, &dom);
        assert_eq!(sums(d, s(&file)), truth, "{file:?}");
        files.push((file, truth));
    }
    // A copy backup (no checkpoint) of the disk as it is.
    let copy = bk.join("copy");
    std::fs::create_dir(&copy).unwrap();
    virtnbdbackup(lv, &dom, "copy", &copy, compress);
    assert_eq!(sums(d, s(&copy.join("sda.copy.data"))), files[2].1);
    drop(dom);

    // virtnbdrestore's output (named as the disk's image) is the disk at
    // the last backup.
    let out = d.join(format!("restored{tag}"));
    virt_tool(
        "virtnbdrestore",
        &["-U", lv.uri(), "-i", s(&bk), "-o", s(&out)],
        d,
    );
    let restored = out.join(img.file_name().unwrap());
    wait_unlocked(&restored);
    assert_eq!(sums(d, s(&restored)), files[2].1);

    // A gap: without the first incremental, the second is refused.
    let (inc1, inc2) = (&files[1].0, &files[2].0);
    let aside = d.join("aside.data");
    std::fs::rename(inc1, &aside).unwrap();
    let o = run(BLKMAP, &[s(inc2), s(&d.join("gap.map"))]);
    assert_refused(
        &o,
        &[
            "a gap in the chain",
            "virtnbdbackup.1",
            "sda.inc.virtnbdbackup.2.data",
        ],
        &d.join("gap.map"),
        None,
    );
    std::fs::rename(&aside, inc1).unwrap();
    std::fs::remove_dir_all(&bk).unwrap();
    std::fs::remove_dir_all(&out).unwrap();
    std::fs::remove_file(&img).unwrap();
}

/// libvirt's checkpoints: a full pull backup with checkpoint cp1 and its
/// map; writes; an incremental one from cp1 (creating cp2) whose export
/// offers `backup-sda`: the incremental map is the full map, blksync
/// copies the dirty blocks, what cannot be trusted is refused.
fn checkpoints_and_pull_backups(lv: &Libvirtd, d: &Path) {
    let img = d.join("ck.qcow2");
    testkit::tools::create(&img, "qcow2", &[], "64M");
    let dom = Domain::start(lv, "ckpt", &img);
    dom.write("write -P 0x11 0 24M");
    let sock = d.join("ck.sock");
    let u = url(&sock);
    let (cp1, dst, state) = (d.join("cp1.map"), d.join("dst.raw"), d.join("dst.map"));
    dom.backup_begin(&sock, None, Some("cp1"));
    full(&u, &cp1, &[]);
    let o = run(BLKSYNC, &[&u, s(&dst), "--state", s(&state)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    dom.backup_end();

    for c in [
        "write -P 0x22 1M 4k",
        "write -z 9M 1M",
        "write -P 0x23 60M 128k",
    ] {
        dom.write(c);
    }
    dom.backup_begin(&sock, Some("cp1"), Some("cp2"));
    let (cp2, whole) = (d.join("cp2.map"), d.join("whole.map"));
    let o = incremental(&cp1, "backup-sda", &u, &cp2, &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let sum = checksum_of(&o.stdout, &u);
    assert_eq!(full(&u, &whole, &[]), sum);
    assert_same_map(&cp2, &whole);
    assert_eq!(sum, oracle(d, &u, 65536));

    let o = run(
        BLKSYNC,
        &[
            "--dirty-bitmap",
            "backup-sda",
            "--state",
            s(&state),
            &u,
            s(&dst),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(oracle(d, s(&dst), 65536), sum);
    assert_eq!(Map::load(&state).unwrap(), Map::load(&whole).unwrap());

    // Refused: a bitmap the export does not offer; OLD of another disk.
    let x = d.join("x.map");
    let o = incremental(&cp1, "backup-sdb", &u, &x, &[]);
    assert_refused(&o, &["backup-sdb"], &x, None);
    // (Another disk of the same size: caught by the sample of clean blocks.)
    let other = image(
        d,
        "other.qcow2",
        "qcow2",
        64 * MIB,
        &["write -P 0x99 0 64M"],
    );
    let other_map = d.join("other.map");
    full(s(&other), &other_map, &[]);
    let o = incremental(&other_map, "backup-sda", &u, &x, &[]);
    assert_refused(&o, &[s(&other_map)], &x, None);
    dom.backup_end();
    drop(dom);
}
