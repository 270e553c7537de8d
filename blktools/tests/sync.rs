//! blksync on real images: DST ends with SRC's content (checked with
//! `qemu-img compare` and blksum), only differing blocks are written, bad
//! or stale states are refused without touching DST, and what DST can be.

use crate::common;

use blkmap::Map;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// blksync's exit status and its stderr.
fn sync(args: &[&str]) -> (i32, String) {
    let out = run(BLKSYNC, args);
    (out.code, out.stderr)
}

/// Bytes written, from the summary line.
pub(crate) fn written(stderr: &str) -> u64 {
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

/// DST holds SRC's guest content: qemu-img compare and blksum agree.
fn check_same(dir: &Path, src: &Path, dst: &Path) {
    assert!(
        same(src, dst),
        "qemu-img compare: {src:?} and {dst:?} differ"
    );
    assert_eq!(checksum(dir, src), checksum(dir, dst));
}

/// The state is DST's map, as blkmap computes it.
fn check_state(dir: &Path, dst: &Path, state: &Path) {
    let m = dir.join("check.map");
    sh(BLKMAP, &[s(dst), s(&m)]);
    assert_eq!(Map::load(&m).unwrap(), Map::load(state).unwrap());
}

#[test]
fn sync_writes_only_the_differences() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(d, 16 * MIB, &["write -P 0x11 0 4M", "write -P 0x22 9M 1M"]);
    let dst = d.join("dst.raw");
    sh("qemu-img", &["convert", "-O", "raw", s(&src), s(&dst)]);
    let state = d.join("dst.map");

    // Nothing to do; the state is created.
    let (code, err) = sync(&[s(&src), s(&dst), "--state", s(&state)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(written(&err), 0);
    assert!(Map::load(&state).is_ok());

    // Changed blocks, zeroed blocks, new data in a hole.
    write(
        &src,
        "qcow2",
        &[
            "write -P 0x55 1M 64k",
            "write -z 9M 512k",
            "write -P 0x66 14M 4k",
        ],
    );
    let (code, err) = sync(&[s(&src), s(&dst), "--state", s(&state), "--verify"]);
    assert_eq!(code, 0, "{err}");
    check_same(d, &src, &dst);
    assert_eq!(written(&err), 2 * 65536, "{err}");
    assert!(err.contains("524288 zeroed"), "{err}");
    check_state(d, &dst, &state);

    // Without a state, DST is read.
    write(&src, "qcow2", &["write -P 0x77 3M 64k"]);
    let (code, err) = sync(&[s(&src), s(&dst)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(written(&err), 65536);
    check_same(d, &src, &dst);
}

/// Blocks larger than one write (8 MiB): a changed 32 MiB block is
/// written whole, in pieces, with a state (written while SRC is hashed)
/// and without one (DST read, then copied); a zeroed one is zeroed whole.
#[test]
fn blocks_larger_than_a_write() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 96 * MIB;
    let src = src_qcow2(d, size, &["write -P 0x11 0 96M"]);
    let dst = d.join("dst.raw");
    let state = d.join("dst.map");
    let bs = ["--block-size", "32m"];
    let (code, err) = sync(&[&[s(&src), s(&dst), "--state", s(&state)][..], &bs].concat());
    assert_eq!(code, 0, "{err}");
    check_same(d, &src, &dst);

    write(&src, "qcow2", &["write -P 0x22 40M 4k", "write -z 64M 32M"]);
    let (code, err) = sync(&[&[s(&src), s(&dst), "--state", s(&state)][..], &bs].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(written(&err), 32 * MIB, "{err}");
    assert!(err.contains(&format!("{} zeroed", 32 * MIB)), "{err}");
    check_same(d, &src, &dst);

    write(&src, "qcow2", &["write -P 0x33 1M 4k"]);
    let (code, err) = sync(&[&[s(&src), s(&dst)][..], &bs].concat());
    assert_eq!(code, 0, "{err}");
    assert_eq!(written(&err), 32 * MIB, "{err}");
    check_same(d, &src, &dst);
}

/// qemu-io changes between runs (data, written zeros, discards, in chosen
/// ranges, some across block boundaries), with a state and without one.
#[test]
fn round_trips_with_changes_between_runs() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(d, 24 * MIB, &["write -P 0x01 0 6M", "write -P 0x02 12M 3M"]);
    let with_state = d.join("a.raw");
    let without = d.join("b.raw");
    let state = d.join("a.map");
    let steps: &[&[&str]] = &[
        &[],
        &["write -P 0x10 100k 10k", "write -P 0x11 20M 1M"],
        &["write -z 0 1M", "discard 12M 64k", "write -P 0x12 23M 1M"],
        &["discard 0 24M"],
        &["write -P 0x13 0 24M", "write -z 5M 3M"],
        &["write -P 0x14 4095k 2k", "discard 20M 2M"],
    ];
    for (i, cmds) in steps.iter().enumerate() {
        write(&src, "qcow2", cmds);
        let (code, err) = sync(&[s(&src), s(&with_state), "--state", s(&state)]);
        assert_eq!(code, 0, "step {i}: {err}");
        check_same(d, &src, &with_state);
        check_state(d, &with_state, &state);
        let (code, err) = sync(&[s(&src), s(&without)]);
        assert_eq!(code, 0, "step {i}: {err}");
        check_same(d, &src, &without);
        // The same blocks were written both ways (the first copy aside).
        if i > 0 {
            let (_, again) = sync(&[s(&src), s(&with_state), "--state", s(&state)]);
            assert_eq!(written(&again), 0, "step {i}: a second run writes nothing");
        }
    }
    // Zero blocks became holes, not written zeros.
    let meta = std::fs::metadata(&with_state).unwrap();
    assert!(meta.blocks() * 512 < meta.len(), "DST is not sparse");
}

#[test]
fn sync_resizes_regular_files() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(d, 8 * MIB, &["write -P 0x11 0 1M", "write -P 0x22 7M 64k"]);
    // Smaller and larger.
    for size in [2 * MIB, 12 * MIB + 512] {
        let dst = image(
            d,
            &format!("dst{size}.raw"),
            "raw",
            size,
            &["write -P 0x33 0 2M"],
        );
        let (code, err) = sync(&[s(&src), s(&dst)]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(std::fs::metadata(&dst).unwrap().len(), 8 * MIB);
        check_same(d, &src, &dst);
    }
}

/// A first copy: DST missing, empty, or a file with no data (of any size)
/// is not read, is created sparse with SRC's size, and only SRC's data
/// blocks are written (its zero blocks are holes already).
#[test]
fn first_copy_writes_data_only_and_stays_sparse() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(
        d,
        32 * MIB,
        &[
            "write -P 0x11 0 1M",
            "write -z 4M 4M",
            "write -P 0 10M 1M", // data that reads as zeros
            "write -P 0x22 31M 1M",
        ],
    );
    let empty = d.join("empty.raw");
    std::fs::File::create(&empty).unwrap();
    let holes = image(d, "holes.raw", "raw", 100 * MIB, &[]);
    for (dst, state) in [
        (d.join("new.raw"), None),
        (empty, Some(d.join("e.map"))),
        (holes, None),
    ] {
        let mut args = vec![s(&src), s(&dst)];
        if let Some(st) = &state {
            args.extend(["--state", s(st)]);
        }
        let (code, err) = sync(&args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(written(&err), 2 * MIB, "{err}");
        let meta = std::fs::metadata(&dst).unwrap();
        assert_eq!(meta.len(), 32 * MIB);
        assert!(meta.blocks() * 512 <= 3 * MIB, "{dst:?} not sparse");
        check_same(d, &src, &dst);
        if let Some(st) = &state {
            check_state(d, &dst, st);
        }
    }
    // A dry run creates nothing.
    let none = d.join("none.raw");
    let out = run(BLKSYNC, &[s(&src), s(&none), "-n"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("resize 0 -> 33554432"),
        "{}",
        out.stdout
    );
    assert!(!none.exists());
}

#[test]
fn bad_states_refused_and_dst_untouched() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(d, 4 * MIB, &["write -P 0x11 0 1M"]);
    let dst = image(d, "dst.raw", "raw", 4 * MIB, &["write -P 0x22 0 64k"]);
    let other = image(d, "other.raw", "raw", 2 * MIB, &[]);
    let before = std::fs::read(&dst).unwrap();
    let stale = d.join("stale.map");
    sh(BLKMAP, &[s(&other), s(&stale)]);
    let damaged = d.join("damaged.map");
    let mut bytes = std::fs::read(&stale).unwrap();
    bytes[50] ^= 1;
    std::fs::write(&damaged, &bytes).unwrap();
    let truncated = d.join("truncated.map");
    std::fs::write(&truncated, &bytes[..bytes.len() - 5]).unwrap();
    let blake3 = d.join("blake3.map");
    sh(BLKMAP, &[s(&dst), s(&blake3), "-d", "blake3"]);
    let small = d.join("small.map");
    sh(BLKMAP, &[s(&dst), s(&small), "--block-size", "4k"]);
    for (state, extra, msg) in [
        (&stale, None, "not its state"),
        (&damaged, None, "damaged"),
        (&truncated, None, "truncated"),
        (&blake3, Some(["-d", "sha256"]), "blake3"),
        (&small, Some(["--block-size", "64k"]), "4096-byte blocks"),
    ] {
        let mut args = vec![s(&src), s(&dst), "--state", s(state)];
        if let Some(e) = extra {
            args.extend(e);
        }
        let (code, err) = sync(&args);
        assert_eq!(code, 1, "{msg}");
        assert!(err.contains("state refused") && err.contains(msg), "{err}");
        assert!(err.contains("--force-rescan"), "{err}");
        assert_eq!(std::fs::read(&dst).unwrap(), before);
    }
    // Under --force-rescan each is ignored with a warning, DST read, and
    // the state replaced by a good one.
    let (code, err) = sync(&[s(&src), s(&dst), "--state", s(&damaged), "--force-rescan"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("warning") && err.contains("damaged"), "{err}");
    check_same(d, &src, &dst);
    check_state(d, &dst, &damaged);

    // A pipe is not a SRC.
    let out = std::process::Command::new(BLKSYNC)
        .args(["-", s(&dst)])
        .stdin(std::fs::File::open(&other).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("random access"));
    // --dry-run writes nothing.
    write(&src, "qcow2", &["write -P 0x99 2M 64k"]);
    let before = std::fs::read(&dst).unwrap();
    let out = run(BLKSYNC, &[s(&src), s(&dst), "-n"]);
    assert_eq!(out.code, 0);
    assert_eq!(out.stdout.trim(), "2097152+65536");
    assert_eq!(std::fs::read(&dst).unwrap(), before);
}

/// DST changed behind the state: a write (times in the side record), a
/// replaced file, a different file, a missing DST, a damaged side record;
/// a state with no side record (made by blkmap) is checked by samples.
#[test]
fn dst_changed_behind_the_state() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(d, 8 * MIB, &["write -P 0x11 0 8M"]);
    let dst = d.join("dst.raw");
    let state = d.join("dst.map");
    let side = d.join("dst.map.dst");
    let sync_state = |extra: &[&str]| {
        let mut args = vec![s(&src), s(&dst), "--state", s(&state)];
        args.extend(extra);
        sync(&args)
    };
    assert_eq!(sync_state(&[]).0, 0);
    assert!(side.exists());

    // One block written by someone else: refused, DST as it was.
    write(&dst, "raw", &["write -P 0x44 5M 4k"]);
    let before = std::fs::read(&dst).unwrap();
    let (code, err) = sync_state(&[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("DST changed since the state was saved"),
        "{err}"
    );
    assert_eq!(std::fs::read(&dst).unwrap(), before);
    // --force-rescan: warned, DST read and mended.
    let (code, err) = sync_state(&["--force-rescan"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning") && err.contains("DST changed"),
        "{err}"
    );
    assert_eq!(written(&err), 65536);
    check_same(d, &src, &dst);

    // Another file of the same size and content put in its place.
    let copy = d.join("copy.raw");
    std::fs::copy(&dst, &copy).unwrap();
    std::fs::rename(&copy, &dst).unwrap();
    let (code, err) = sync_state(&[]);
    assert_eq!(code, 1);
    assert!(err.contains("another file"), "{err}");
    assert_eq!(sync_state(&["--force-rescan"]).0, 0);

    // A damaged side record.
    let text = std::fs::read_to_string(&side).unwrap();
    assert!(text.contains("\nfile file "), "{text}");
    std::fs::write(&side, text.replace("\nfile file ", "\nfile fila ")).unwrap();
    let (code, err) = sync_state(&[]);
    assert_eq!(code, 1);
    assert!(err.contains("damaged"), "{err}");
    assert_eq!(sync_state(&["--force-rescan"]).0, 0);

    // No side record (a state made by blkmap): sampled blocks catch a DST
    // rewritten with other data of the same size.
    std::fs::remove_file(&side).unwrap();
    sh(BLKMAP, &[s(&dst), s(&state)]);
    assert_eq!(sync_state(&[]).0, 0, "a blkmap state is accepted");
    std::fs::remove_file(&side).unwrap();
    write(&dst, "raw", &["write -P 0x55 0 8M"]);
    let (code, err) = sync_state(&[]);
    assert_eq!(code, 1);
    assert!(err.contains("block 0 (offset 0)"), "{err}");

    // DST gone.
    std::fs::remove_file(&dst).unwrap();
    let (code, err) = sync_state(&[]);
    assert_eq!(code, 1);
    assert!(err.contains("DST does not exist"), "{err}");
    assert!(!dst.exists());
    assert_eq!(sync_state(&["--force-rescan"]).0, 0);
    check_same(d, &src, &dst);
    check_state(d, &dst, &state);
}

/// DST kinds: a directory is refused by name (image files and NBD exports
/// are tests/nbd.rs's); a raw file holding a copy of an image (it starts
/// as SRC's guest content does) stays a raw file, not an image to serve.
#[test]
fn unsupported_destinations_refused() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(d, 4 * MIB, &["write -P 0x11 0 1M"]);
    let q = image(d, "dst.qcow2", "qcow2", 4 * MIB, &[]);
    let (code, err) = sync(&[s(&src), s(d)]);
    assert_eq!(code, 1);
    assert!(err.contains("not a regular file or block device"), "{err}");

    // SRC's guest content is itself a qcow2 image: its raw copy starts with
    // the qcow2 magic, and is still a fine DST.
    let inner = d.join("inner.raw");
    std::fs::copy(&q, &inner).unwrap();
    let (code, err) = sync(&[s(&inner), s(&d.join("copy.raw")), "-f", "raw"]);
    assert_eq!(code, 0, "{err}");
    write(&inner, "raw", &["write -P 0x66 64k 64k"]);
    let (code, err) = sync(&[s(&inner), s(&d.join("copy.raw")), "-f", "raw"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(written(&err), 65536);
}

/// A block device DST: a loop device over a file, when this runs as root
/// and losetup works here; else skipped, saying why.
#[test]
fn block_device_destination() {
    if !have_qemu() {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: loop device test skipped");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let backing = image(d, "backing.raw", "raw", 16 * MIB, &["write -P 0x77 0 16M"]);
    let out = run("losetup", &["-f", "--show", s(&backing)]);
    if out.code != 0 {
        eprintln!(
            "losetup failed ({}): loop device test skipped",
            out.stderr.trim()
        );
        return;
    }
    struct Loop(String);
    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = run("losetup", &["-d", &self.0]);
        }
    }
    let dev = Loop(out.stdout.trim().to_string());
    let devp = Path::new(&dev.0);
    let src = src_qcow2(d, 16 * MIB, &["write -P 0x11 0 2M", "write -z 8M 1M"]);
    let state = d.join("dev.map");
    let (code, err) = sync(&[s(&src), &dev.0, "--state", s(&state)]);
    assert_eq!(code, 0, "{err}");
    assert!(same(&src, devp));
    assert!(
        std::fs::read_to_string(d.join("dev.map.dst"))
            .unwrap()
            .contains("\nfile block ")
    );
    write(&src, "qcow2", &["write -P 0x22 12M 64k", "discard 0 64k"]);
    let (code, err) = sync(&[s(&src), &dev.0, "--state", s(&state), "--verify"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(written(&err), 65536, "{err}");
    assert!(same(&src, devp));
    assert_eq!(checksum(d, &src), checksum(d, devp));
    // Of another size: refused.
    let big = image(d, "big.qcow2", "qcow2", 32 * MIB, &[]);
    let (code, err) = sync(&[s(&big), &dev.0]);
    assert_eq!(code, 1);
    assert!(err.contains("sizes must match"), "{err}");
}

/// A first copy with nothing to save, verify or print hashes nothing and
/// prints nothing; `--checksum` prints blksum's line. A SRC that fails
/// half-way (a damaged compressed cluster) is named, exit status 1, and no
/// checksum is printed.
#[test]
fn first_copy_prints_checksum_on_request_and_names_a_failing_src() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let raw = image(
        d,
        "src.raw",
        "raw",
        16 * MIB,
        &["write -P 0x11 0 6M", "write -P 0x22 12M 4M"],
    );
    let src = d.join("src.qcow2");
    sh(
        "qemu-img",
        &["convert", "-c", "-O", "qcow2", s(&raw), s(&src)],
    );
    let plain = d.join("plain.raw");
    let out = run(BLKSYNC, &[s(&src), s(&plain)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout, "");
    check_same(d, &src, &plain);

    let printed = d.join("printed.raw");
    let out = run(BLKSYNC, &[s(&src), s(&printed), "--checksum"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!("{}  {}\n", checksum(d, &src), s(&src)),
        "blksum's line"
    );
    check_same(d, &src, &printed);

    // Damage the compressed cluster at 13 MiB (its host offset from the
    // first L2 table): reading it fails on a worker, mid-copy.
    let mut img = std::fs::read(&src).unwrap();
    let be = |at: usize| u64::from_be_bytes(img[at..at + 8].try_into().unwrap());
    let l1 = be(40) as usize;
    let l2 = (be(l1) & 0x00ff_ffff_ffff_fe00) as usize;
    let entry = be(l2 + 8 * 208);
    assert_ne!(entry & (1 << 62), 0, "cluster 208 is compressed");
    let host = (entry & ((1 << 54) - 1)) as usize; // 62 - (16 - 8) bits
    img[host + 16..host + 272].fill(0xff);
    let bad = d.join("bad.qcow2");
    std::fs::write(&bad, &img).unwrap();
    for extra in [&[][..], &["--checksum"][..]] {
        let dst = d.join(format!("bad{}.raw", extra.len()));
        let mut args = vec![s(&bad), s(&dst)];
        args.extend_from_slice(extra);
        let out = run(BLKSYNC, &args);
        assert_eq!(out.code, 1, "{}", out.stderr);
        assert!(
            out.stderr
                .contains(&format!("{}: qcow2: compressed cluster", s(&bad))),
            "{}",
            out.stderr
        );
        assert_eq!(out.stdout, "");
    }
}
