//! Backups of a running VM with libvirt (9.0) and virtnbdbackup, on the
//! real stack: a libvirtd of the test's own ([`testkit::libvirt`]), a
//! domain under TCG whose disk takes the guest's writes through its
//! device (qemu-io over HMP).
//!
//! - virtnbdbackup's streams (full, two incrementals, copy and
//!   differential, plain and lz4) read as the disk at each backup:
//!   blkmap's and blksum's checksum of a stream, for several digests and
//!   block sizes, equal blksum's of the backup job's NBD export at that
//!   moment, and virtnbdrestore's output; blkdiff finds the stream and the
//!   restore the same, blksync copies a stream; a chain with a gap is
//!   refused, naming the missing checkpoint.
//! - libvirt's own checkpoints and pull backups: `blkmap --base OLD
//!   --dirty-bitmap backup-sda` over the incremental backup's export
//!   writes the map a full run writes, `blksync --dirty-bitmap` copies
//!   the export; a bitmap the export does not offer and OLD of another
//!   disk are refused.
//! - Python's blkhash on the same stack (`libvirt_from_python`, run by
//!   scripts/test-python.sh with its venv's Python in `BLKHASH_PYTHON`:
//!   cargo does not build the package, so without it the test says it is
//!   skipped): `update_map` over the incremental backup's export writes
//!   the map a full blkmap writes and refuses `backup-sdb`; `checksum()`
//!   of virtnbdbackup's streams (full and incremental, plain and lz4)
//!   equals blksum's of the stream and of the export.
//!
//! One libvirtd for each test (its start probes QEMU, some seconds),
//! domains in turn.

use crate::common;

use blkmap::Map;
use common::dirty::*;
use common::*;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use testkit::libvirt::{Domain, Libvirtd, have_libvirt};

/// The blksum built beside blkmap (the workspace's tests build it).
fn blksum() -> Option<PathBuf> {
    let p = Path::new(BLKMAP).with_file_name("blksum");
    p.exists().then_some(p)
}

/// The digests and block sizes (bytes: Python takes no suffix) checked.
const SUMS: &[(&str, usize)] = &[("sha256", 65536), ("sha1", 4096), ("blake2b512", 1 << 20)];

/// `blkmap -d D --block-size B IMAGE MAP`'s checksum for each of [`SUMS`];
/// blksum's too, which must agree.
fn sums(d: &Path, image: &str) -> Vec<String> {
    SUMS.iter()
        .map(|(digest, bs)| {
            let out = d.join("sum.map");
            let bs = &bs.to_string();
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
        lv,
        "virtnbdbackup",
        &args,
        out.parent().expect("in the scratch directory"),
    );
}

/// One of virtnbdbackup's tools, which must succeed, run in libvirtd's
/// namespace (the backup job's socket is in its /var/tmp), its temporary
/// files (virtnbdrestore leaves qemu-img's and qemu-nbd's logs there) in
/// `dir/tmp`, removed with the scratch directory `dir`.
fn virt_tool(lv: &Libvirtd, cmd: &str, args: &[&str], dir: &Path) {
    let o = in_scratch(lv.inside(cmd), args, dir);
    assert_eq!(o.code, 0, "{cmd} {args:?}: {}", o.stderr);
}

/// `cmd args...` with TMPDIR `dir/tmp` (removed with the scratch directory
/// `dir`): the test command's TMPDIR must end empty, whatever the tools
/// leave in theirs.
fn in_scratch(mut cmd: std::process::Command, args: &[&str], dir: &Path) -> Out {
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let out = cmd.args(args).env("TMPDIR", &tmp).output();
    let out = out.unwrap_or_else(|e| panic!("{cmd:?} runs: {e}"));
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
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

/// The one file of `dir` whose name starts with `prefix`.
fn only_file(dir: &Path, prefix: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect();
    assert_eq!(found.len(), 1, "{prefix}* in {dir:?}: {found:?}");
    found.into_iter().next().unwrap()
}

/// A short scratch directory: libvirt's sockets live there.
pub(crate) fn short_scratch() -> tempfile::TempDir {
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

/// The guest's writes before each of virtnbdbackup's backups (full, inc,
/// inc).
const ROUNDS: [&[&str]; 3] = [
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

/// [`ROUNDS`]`[i]` written, then virtnbdbackup's backup `i` into `bk`
/// (full first, then incrementals): the stream file it wrote.
fn backup_round(lv: &Libvirtd, dom: &Domain, bk: &Path, i: usize, compress: bool) -> PathBuf {
    for c in ROUNDS[i] {
        dom.write(c);
    }
    let level = if i == 0 { "full" } else { "inc" };
    virtnbdbackup(lv, dom, level, bk, compress);
    match i {
        0 => bk.join("sda.full.data"),
        n => bk.join(format!("sda.inc.virtnbdbackup.{n}.data")),
    }
}

/// For virtnbdbackup's runs: a 64 MiB qcow2 disk `{prefix}{tag}.qcow2`, a
/// domain on it and an empty backup directory, each named by `prefix` and
/// the tag (`z` for lz4 streams, `p` for plain ones, as `compress` says).
fn backup_setup<'a>(
    lv: &'a Libvirtd,
    d: &Path,
    prefix: &str,
    compress: bool,
) -> (&'static str, PathBuf, Domain<'a>, PathBuf) {
    let tag = if compress { "z" } else { "p" };
    let img = d.join(format!("{prefix}{tag}.qcow2"));
    testkit::tools::create(&img, "qcow2", &[], "64M");
    let dom = Domain::start(lv, &format!("{prefix}vnbd{tag}"), &img);
    let bk = d.join(format!("{prefix}bk{tag}"));
    std::fs::create_dir(&bk).unwrap();
    (tag, img, dom, bk)
}

/// virtnbdbackup full, inc, inc: each stream is the disk at its backup.
fn virtnbdbackup_streams(lv: &Libvirtd, d: &Path, compress: bool) {
    let (tag, img, dom, bk) = backup_setup(lv, d, "", compress);
    let mut files = Vec::new();
    for i in 0..ROUNDS.len() {
        let file = backup_round(lv, &dom, &bk, i, compress);
        let truth = export_sums(d, &dom);
        assert_eq!(sums(d, s(&file)), truth, "{file:?}");
        files.push((file, truth));
    }
    // A copy backup (no checkpoint) of the disk as it is.
    let copy = bk.join("copy");
    std::fs::create_dir(&copy).unwrap();
    virtnbdbackup(lv, &dom, "copy", &copy, compress);
    assert_eq!(sums(d, s(&copy.join("sda.copy.data"))), files[2].1);
    // A differential backup (changes since the last checkpoint, no
    // checkpoint of its own; nothing written since, so it holds no data):
    // read over the streams its parent checkpoint names.
    virtnbdbackup(lv, &dom, "diff", &bk, compress);
    let diff = only_file(&bk, "sda.diff.");
    assert_eq!(sums(d, s(&diff)), files[2].1, "{diff:?}");
    drop(dom);

    // virtnbdrestore's output (named as the disk's image) is the disk at
    // the last backup.
    let out = d.join(format!("restored{tag}"));
    virt_tool(
        lv,
        "virtnbdrestore",
        &["-U", lv.uri(), "-i", s(&bk), "-o", s(&out)],
        d,
    );
    let restored = out.join(img.file_name().unwrap());
    wait_unlocked(&restored);
    assert_eq!(sums(d, s(&restored)), files[2].1);
    // blkdiff and blksync take a stream as they take an image: the last
    // incremental against the restore (the same disk), and copied to a
    // raw file whose checksum is the disk's.
    let o = run(BLKDIFF, &[s(&files[2].0), s(&restored)]);
    assert_eq!(o.code, 0, "blkdiff: {}", o.stderr);
    let copied = d.join(format!("copied{tag}.raw"));
    let o = run(BLKSYNC, &[s(&files[2].0), s(&copied)]);
    assert_eq!(o.code, 0, "blksync: {}", o.stderr);
    assert_eq!(sums(d, s(&copied)), files[2].1);
    std::fs::remove_file(&copied).unwrap();

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
    let (dst, state) = (d.join("dst.raw"), d.join("dst.map"));
    let (dom, u, cp1) = at_cp2(lv, d, "ckpt", |u| {
        let o = run(BLKSYNC, &[u, s(&dst), "--state", s(&state)]);
        assert_eq!(o.code, 0, "{}", o.stderr);
    });
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

/// Domain `name` on `d/name.qcow2`, written; a full pull backup creating
/// checkpoint cp1, whose export blkmap maps into `d/cp1.map` (then
/// `at_cp1` runs on the export's URL); writes; an incremental pull backup
/// from cp1 creating cp2, left running: the domain, its export's URL
/// (offering `backup-sda`: the writes since cp1) and `d/cp1.map`.
fn at_cp2<'a>(
    lv: &'a Libvirtd,
    d: &Path,
    name: &str,
    at_cp1: impl FnOnce(&str),
) -> (Domain<'a>, String, PathBuf) {
    let img = d.join(format!("{name}.qcow2"));
    testkit::tools::create(&img, "qcow2", &[], "64M");
    let dom = Domain::start(lv, name, &img);
    dom.write("write -P 0x11 0 24M");
    let sock = d.join(format!("{name}.sock"));
    let u = url(&sock);
    let cp1 = d.join("cp1.map");
    dom.backup_begin(&sock, None, Some("cp1"));
    full(&u, &cp1, &[]);
    at_cp1(&u);
    dom.backup_end();

    for c in [
        "write -P 0x22 1M 4k",
        "write -z 9M 1M",
        "write -P 0x23 60M 128k",
    ] {
        dom.write(c);
    }
    dom.backup_begin(&sock, Some("cp1"), Some("cp2"));
    (dom, u, cp1)
}

/// `update_map(IMAGE, BASE, BITMAP, OUT)`: the checksum printed; an
/// exception left to Python (exit 1, the traceback's last line its type
/// and message).
const UPDATE_MAP: &str = "import sys, blkhash\nprint(blkhash.update_map(*sys.argv[1:5]))\n";

/// `checksum(IMAGE, digest=D, block_size=B)` for each `D:B` after IMAGE:
/// a checksum a line, in order.
const CHECKSUM: &str = "import sys, blkhash
for spec in sys.argv[2:]:
    digest, bs = spec.split(':')
    print(blkhash.checksum(sys.argv[1], digest=digest, block_size=int(bs)))
";

/// `py -c script args...`, TMPDIR in the scratch directory `d`.
fn python(py: &OsStr, d: &Path, script: &str, args: &[&str]) -> Out {
    let mut all = vec!["-c", script];
    all.extend(args);
    in_scratch(std::process::Command::new(py), &all, d)
}

/// Python's `checksum()` of `image` for each of [`SUMS`].
fn python_sums(py: &OsStr, d: &Path, image: &Path) -> Vec<String> {
    let specs: Vec<String> = SUMS.iter().map(|(dg, bs)| format!("{dg}:{bs}")).collect();
    let mut args = vec![s(image)];
    args.extend(specs.iter().map(String::as_str));
    let o = python(py, d, CHECKSUM, &args);
    assert_eq!(o.code, 0, "checksum({image:?}): {}", o.stderr);
    assert_eq!(o.stderr, "", "checksum({image:?})");
    o.stdout.lines().map(str::to_string).collect()
}

/// Python's blkhash on the real stack (see the module doc): run by
/// scripts/test-python.sh, which names its venv's Python in
/// `BLKHASH_PYTHON`.
#[test]
fn libvirt_from_python() {
    let Some(py) = std::env::var_os("BLKHASH_PYTHON") else {
        eprintln!(
            "BLKHASH_PYTHON unset (a Python with the blkhash package installed: \
             scripts/test-python.sh sets it): test skipped"
        );
        return;
    };
    if !have_libvirt() || !have_qemu() {
        return;
    }
    let dir = short_scratch();
    let d = dir.path();
    // A Python without the package is a broken setup, not a skip.
    let o = python(&py, d, "import blkhash", &[]);
    assert_eq!(o.code, 0, "BLKHASH_PYTHON={py:?}: {}", o.stderr);
    let lv = Libvirtd::start(&d.join("lv"));
    python_update_map(&lv, d, &py);
    for compress in [false, true] {
        python_streams(&lv, d, &py, compress);
    }
    drop(lv);
}

/// `update_map` over the incremental pull backup's export from cp1 (OLD
/// written by blkmap at cp1): the map and checksum a full run gives; a
/// bitmap the export does not offer refused, nothing written.
fn python_update_map(lv: &Libvirtd, d: &Path, py: &OsStr) {
    let (dom, u, cp1) = at_cp2(lv, d, "pyckpt", |_| {});
    let (cp2, whole) = (d.join("cp2.map"), d.join("whole.map"));
    let o = python(py, d, UPDATE_MAP, &[&u, s(&cp1), "backup-sda", s(&cp2)]);
    assert_eq!(o.code, 0, "update_map({u}): {}", o.stderr);
    assert_eq!(o.stderr, "", "update_map({u})");
    let sum = o.stdout.trim_end();
    assert_eq!(full(&u, &whole, &[]), sum);
    assert_same_map(&cp2, &whole);
    assert_eq!(sum, oracle(d, &u, 65536));

    let x = d.join("x.map");
    let o = python(py, d, UPDATE_MAP, &[&u, s(&cp1), "backup-sdb", s(&x)]);
    assert_refused(&o, &["\nOSError: ", "backup-sdb"], &x, None);
    assert_eq!(o.stdout, "", "update_map({u}, backup-sdb)");
    dom.backup_end();
    drop(dom);
}

/// virtnbdbackup full and inc: Python's `checksum()` of each stream equals
/// blkmap's and blksum's of it and of the export at that backup.
fn python_streams(lv: &Libvirtd, d: &Path, py: &OsStr, compress: bool) {
    let (_, img, dom, bk) = backup_setup(lv, d, "py", compress);
    for i in 0..2 {
        let file = backup_round(lv, &dom, &bk, i, compress);
        let truth = export_sums(d, &dom);
        assert_eq!(sums(d, s(&file)), truth, "{file:?}");
        assert_eq!(python_sums(py, d, &file), truth, "{file:?}");
    }
    drop(dom);
    std::fs::remove_dir_all(&bk).unwrap();
    std::fs::remove_file(&img).unwrap();
}
