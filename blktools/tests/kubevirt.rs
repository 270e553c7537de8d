//! What a KubeVirt user checks: a PVC against its source as CDI writes it
//! (`qemu-img convert -O raw`, then `qemu-img resize` to the PVC's size, a
//! tail of zeros; or a block device whose tail is the storage's old
//! bytes), and backups written as standalone qcow2 files named as a chain
//! (`--chain`), against `qemu-img compare` and `qemu-img rebase -u`.

use crate::common;

use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `qemu-img compare [-s] A B`'s exit status.
fn qemu_compare(a: &Path, b: &Path, strict: bool) -> i32 {
    let mut cmd = Command::new("qemu-img");
    cmd.arg("compare");
    if strict {
        cmd.arg("-s");
    }
    cmd.args([a, b]).output().unwrap().status.code().unwrap()
}

/// A source image as a user uploads it: data, written zeros and holes.
fn source(d: &Path, size: u64) -> PathBuf {
    image(
        d,
        "source.qcow2",
        "qcow2",
        size,
        &[
            "write -P 0x41 0 1M",
            "write -z 1M 1M",
            "write -P 0x42 3M 512k",
        ],
    )
}

/// The PVC of a Filesystem volume as CDI leaves it: the source converted to
/// a raw disk.img, then grown to the volume's size less the file system's
/// overhead with `qemu-img resize`.
fn cdi_import(d: &Path, src: &Path, size: &str) -> PathBuf {
    let disk = d.join("disk.img");
    sh("qemu-img", &["convert", "-O", "raw", s(src), s(&disk)]);
    sh("qemu-img", &["resize", "-q", "-f", "raw", s(&disk), size]);
    disk
}

fn json(out: &Out) -> Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// The grown disk holds the source's content, then zeros: the same content
/// (exit 0, said on the tail's line), as qemu-img compare says; with -s a
/// difference, as qemu-img compare -s says.
#[test]
fn a_grown_pvc_holds_its_source() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = source(d, 4 * MIB);
    let disk = cdi_import(d, &src, "9663676416"); // 10 GiB less 10 %: 9 GiB
    assert_eq!(qemu_compare(&src, &disk, false), 0);
    assert_eq!(qemu_compare(&src, &disk, true), 1);
    let tail =
        "4194304+9659482112 only in B, all zeros (A is 4194304 bytes, B is 9663676416 bytes)\n";
    for strict in [false, true] {
        let mut args = vec![s(&src), s(&disk)];
        if strict {
            args.push("--strict");
        }
        let r = run(BLKDIFF, &args);
        assert_eq!(
            (r.code, r.stdout.as_str()),
            (strict as i32, tail),
            "{}",
            r.stderr
        );
        args.push("--json");
        let doc = json(&run(BLKDIFF, &args));
        assert_eq!(doc["same"], !strict);
        assert_eq!(doc["strict"], strict);
        assert_eq!(doc["tail"]["zeros"], true);
        assert_eq!(doc["tail"]["data-offset"], Value::Null);
        assert_eq!(doc["tail"]["only-in"], "b");
        assert_eq!(
            doc["differing-bytes"],
            if strict { 9659482112u64 } else { 0 }
        );
    }
    // Either side larger; -q says nothing, the status tells.
    let r = run(BLKDIFF, &["-q", s(&disk), s(&src)]);
    assert_eq!((r.code, r.stdout.as_str(), r.stderr.as_str()), (0, "", ""));
    assert_eq!(run(BLKDIFF, &["-q", "-s", s(&disk), s(&src)]).code, 1);
    // A saved map of the source compares the same way.
    let map = d.join("source.map");
    sh(BLKMAP, &[s(&src), s(&map)]);
    assert_eq!(run(BLKDIFF, &[s(&map), s(&disk)]).stdout, tail);
}

/// A block device's tail holds what the storage held: a difference where
/// it is not zeros (its first block named), as qemu-img compare finds;
/// `--size` compares only the source's length, and `blkmap --size` (as
/// `blksum --size`) checksums the device's first bytes as the source.
#[test]
fn a_block_pvc_tail_is_not_the_sources() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = source(d, 4 * MIB);
    let dev = cdi_import(d, &src, "8M");
    write(&dev, "raw", &["write -P 0xee 6M 4k"]);
    assert_eq!(qemu_compare(&src, &dev, false), 1);
    let r = run(BLKDIFF, &[s(&src), s(&dev)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert_eq!(
        r.stdout,
        "4194304+4194304 only in B, data at 6291456 (A is 4194304 bytes, B is 8388608 bytes)\n"
    );
    let doc = json(&run(BLKDIFF, &[s(&src), s(&dev), "--json"]));
    assert_eq!(doc["same"], false);
    assert_eq!(doc["tail"]["zeros"], false);
    assert_eq!(doc["tail"]["data-offset"], 6291456);
    assert_eq!(doc["differing-bytes"], 4194304);
    // The source's length only: the same, both ways, and as a map.
    let n = (4 * MIB).to_string();
    let r = run(BLKDIFF, &["--size", &n, s(&src), s(&dev)]);
    assert_eq!((r.code, r.stdout.as_str()), (0, ""), "{}", r.stderr);
    let line = |img: &Path, size: Option<&str>| {
        let map = d.join("m.map");
        let mut args = vec![s(img), s(&map)];
        args.extend(size.map(|n| ["--size", n]).into_iter().flatten());
        let r = run(BLKMAP, &args);
        assert_eq!(r.code, 0, "{}", r.stderr);
        r.stdout.split_whitespace().next().unwrap().to_string()
    };
    assert_eq!(line(&dev, Some("4m")), line(&src, None));
    assert_ne!(line(&dev, None), line(&src, None));
    // More than the device holds: an error naming the sizes.
    let r = run(BLKDIFF, &["--size", "9m", s(&src), s(&dev)]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("9437184 bytes"), "{}", r.stderr);
}

/// A source whose size is not a multiple of the block size: its short last
/// block cannot be compared by digest with the grown disk's whole block,
/// so it differs, and blkdiff says which block size compares it.
#[test]
fn a_short_last_block_says_the_block_size_that_compares_it() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = image(
        d,
        "odd.qcow2",
        "qcow2",
        MIB + 4096,
        &["write -P 0x51 0 1028k"],
    );
    let disk = cdi_import(d, &src, "4M");
    assert_eq!(qemu_compare(&src, &disk, false), 0);
    let r = run(BLKDIFF, &[s(&src), s(&disk)]);
    assert_eq!(r.code, 1);
    assert!(r.stdout.starts_with("1048576+4096\n"), "{}", r.stdout);
    assert!(
        r.stderr.contains("short last block") && r.stderr.contains("--block-size 4096 compares it"),
        "{}",
        r.stderr
    );
    let r = run(BLKDIFF, &["--block-size", "4096", s(&src), s(&disk)]);
    assert_eq!((r.code, r.stderr.as_str()), (0, ""));
}

/// Standalone qcow2 backups (as KubeVirt's VirtualMachineBackup writes
/// them), `blkmap`, `blkdiff` and `blksync` of `--chain FULL,INC1,INC2`:
/// the disk QEMU reads once they are chained with `qemu-img rebase -u`.
#[test]
fn backups_named_as_a_chain() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let full = image(d, "full.qcow2", "qcow2", 4 * MIB, &["write -P 0x61 0 3M"]);
    let inc1 = image(
        d,
        "inc1.qcow2",
        "qcow2",
        4 * MIB,
        &["write -P 0x62 1M 64k", "write -z 2M 64k"],
    );
    // The volume grew between the backups.
    let inc2 = image(d, "inc2.qcow2", "qcow2", 6 * MIB, &["write -P 0x63 5M 64k"]);
    let chain = format!("{},{},{}", s(&full), s(&inc1), s(&inc2));
    // QEMU's reading of the same files rebased, converted.
    for (i, f) in [&full, &inc1, &inc2].iter().enumerate() {
        std::fs::copy(f, d.join(format!("r{i}.qcow2"))).unwrap();
    }
    for (b, top) in [("r0.qcow2", "r1.qcow2"), ("r1.qcow2", "r2.qcow2")] {
        sh(
            "qemu-img",
            &[
                "rebase",
                "-u",
                "-F",
                "qcow2",
                "-b",
                s(&d.join(b)),
                s(&d.join(top)),
            ],
        );
    }
    let restored = d.join("restored.raw");
    sh(
        "qemu-img",
        &["convert", "-O", "raw", s(&d.join("r2.qcow2")), s(&restored)],
    );

    let map = d.join("chain.map");
    let r = run(BLKMAP, &["--chain", &chain, s(&map)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stdout.split_whitespace().next().unwrap(),
        checksum(d, &restored)
    );
    let r = run(BLKDIFF, &["--chain", &chain, s(&restored)]);
    assert_eq!((r.code, r.stdout.as_str()), (0, ""), "{}", r.stderr);
    // Without the last incremental, the disk of the day before.
    let r = run(
        BLKDIFF,
        &[
            "--chain",
            &format!("{},{}", s(&full), s(&inc1)),
            s(&restored),
        ],
    );
    assert_eq!(r.code, 1);
    assert!(
        r.stdout.contains("only in B, data at 5242880"),
        "{}",
        r.stdout
    );
    // Restored by blksync, read as the chain.
    let dst = d.join("dst.raw");
    let r = run(BLKSYNC, &["--chain", &chain, s(&dst)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(same(&dst, &restored));
    // A file of the chain missing: trouble, naming it.
    let r = run(
        BLKDIFF,
        &[
            "--chain",
            &format!("{},{}", s(&full), s(&d.join("inc9.qcow2"))),
            s(&restored),
        ],
    );
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("inc9.qcow2"), "{}", r.stderr);
}
