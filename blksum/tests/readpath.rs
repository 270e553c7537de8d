//! How a file read through the page cache reaches the digest workers:
//! mapped (`--mmap`), copied (`--no-mmap`), or by default measured both
//! ways at first and then the cheaper way (`blkimage::MapReads`). Every
//! way gives the same checksum; `--json` says how many bytes were mapped.

use crate::common;

use common::*;
use testkit::tools::qemu_img;

/// `blksum --json ARGS FILE`: the input's object.
fn report(args: &[&str], file: &str) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend(args);
    all.push(file);
    let out = run(&all, None);
    assert!(out.status.success(), "{all:?}: {}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["inputs"][0].clone()
}

#[test]
fn the_default_maps_and_copies_the_first_rounds_then_keeps_one_way() {
    let dir = tempfile::tempdir().unwrap();
    // The first 32 MiB are 16 lends of 2 MiB: 4 rounds of 4, taken mapped,
    // copied, mapped, copied. The next 16 MiB take the cheaper way.
    let path = image(dir.path(), "a.img", "48m:r");
    let name = path.to_str().unwrap();
    let mapped = report(&["--cache", "--mmap"], name);
    let copied = report(&["--cache", "--no-mmap"], name);
    let chosen = report(&["--cache"], name);
    let direct = report(&[], name);
    for r in [&mapped, &copied, &chosen, &direct] {
        assert_eq!(r["checksum"], mapped["checksum"], "{r}");
        assert_eq!(r["data-bytes"], 48 << 20, "{r}");
    }
    assert_eq!(mapped["mapped-bytes"], 48 << 20);
    assert_eq!(copied["mapped-bytes"], 0);
    assert_eq!(direct["mapped-bytes"], 0, "direct I/O maps nothing");
    let m = chosen["mapped-bytes"].as_u64().unwrap();
    assert!(
        m == 16 << 20 || m == 32 << 20,
        "16 MiB mapped while measuring, and 16 MiB more if maps cost less: {m}"
    );
}

#[test]
fn qcow2_data_clusters_are_read_both_ways_with_the_raw_images_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let raw = image(dir.path(), "a.img", "20m:r 4m:- 12m:r");
    let qcow2 = dir.path().join("a.qcow2");
    let (r, q) = (raw.to_str().unwrap(), qcow2.to_str().unwrap());
    qemu_img(&["convert", "-q", "-f", "raw", "-O", "qcow2", r, q]);
    let want = report(&["--cache"], r)["checksum"].clone();
    for args in [
        &["--cache"][..],
        &["--cache", "--mmap"],
        &["--cache", "--no-mmap"],
    ] {
        let got = report(args, q);
        assert_eq!(got["checksum"], want, "{args:?}");
        let (m, data) = (got["mapped-bytes"].as_u64(), got["data-bytes"].as_u64());
        let want_mapped = match args.len() {
            2 if args[1] == "--mmap" => data,
            2 => Some(0),
            // Measured: some of each, the rest the cheaper way.
            _ => m.filter(|&m| m > 0 && Some(m) < data),
        };
        assert_eq!(m, want_mapped, "{args:?}: {got}");
    }
}

#[test]
fn mmap_and_no_mmap_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let path = image(dir.path(), "a.img", "1m:r");
    let out = run(
        &["--cache", "--mmap", "--no-mmap", path.to_str().unwrap()],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );
}
