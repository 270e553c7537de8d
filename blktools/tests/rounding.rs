//! A raw file whose size is not a multiple of 512 is read at QEMU's size
//! (rounded up, the tail zeros): blkmap, blkdiff and blksync say so once
//! per such input, naming both sizes, as blksum does (blkdiff not with -q).

use crate::common;

use common::*;
use std::path::{Path, PathBuf};

/// The reason every command gives, after the sizes.
const WHY: &str = "(a raw image's size is rounded up to a multiple of 512, as QEMU does";

/// A 1000-byte raw file of `kind` (a recipe's: r random, t text...).
fn small(dir: &Path, name: &str, kind: &str) -> PathBuf {
    let p = dir.join(name);
    testkit::Recipe::parse(&format!("1000:{kind}"))
        .unwrap()
        .write_image(&p)
        .unwrap();
    p
}

/// The checksum of `path`'s bytes rounded up to 1024 with zeros.
fn padded_sum(path: &Path) -> String {
    let mut data = std::fs::read(path).unwrap();
    data.resize(1024, 0);
    blkhash::hash(&data).to_hex()
}

fn note(command: &str, name: &Path) -> String {
    format!(
        "{command}: {}: 1000 bytes, hashed as 1024 {WHY}; standard input is hashed as it is)",
        name.display()
    )
}

#[test]
fn blkmap_says_it_for_an_image_and_a_range() {
    let dir = tempfile::tempdir().unwrap();
    let img = small(dir.path(), "small", "r");
    let map = dir.path().join("small.map");
    let out = run(BLKMAP, &[s(&img), s(&map)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!("{}  {}\n", padded_sum(&img), img.display())
    );
    assert_eq!(out.stderr, format!("{}\n", note("blkmap", &img)));
    let part = dir.path().join("small.part");
    let out = run(BLKMAP, &["--range", "0+", s(&img), s(&part)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stderr, format!("{}\n", note("blkmap", &img)));
    // Standard input is its exact bytes: nothing to say.
    let out = std::process::Command::new(BLKMAP)
        .args(["-", s(&dir.path().join("stdin.map"))])
        .stdin(std::fs::File::open(&img).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn blkdiff_says_it_for_each_input_unless_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (small(dir.path(), "a", "r"), small(dir.path(), "b", "t"));
    let out = run(BLKDIFF, &[s(&a), s(&b)]);
    assert_eq!(out.code, 1, "they differ: {}", out.stderr);
    assert_eq!(
        out.stderr,
        format!("{}\n{}\n", note("blkdiff", &a), note("blkdiff", &b))
    );
    let out = run(BLKDIFF, &["-q", s(&a), s(&b)]);
    assert_eq!(out.code, 1);
    assert_eq!(out.stderr, "");
}

#[test]
fn blksync_says_it_before_making_dst_the_rounded_size() {
    let dir = tempfile::tempdir().unwrap();
    let src = small(dir.path(), "small", "r");
    let dst = dir.path().join("copy");
    let out = run(BLKSYNC, &[s(&src), s(&dst)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let first = out.stderr.lines().next().unwrap_or_default();
    assert_eq!(
        first,
        format!(
            "blksync: warning: {}: 1000 bytes, copied as 1024 {WHY})",
            src.display()
        ),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), 1024);
}
