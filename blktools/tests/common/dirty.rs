//! What the tests of incremental maps share: full and incremental runs of
//! blkmap, their checks, and QEMU's bitmaps.

use super::*;
use blkmap::Map;
use serde_json::Value;
use std::path::Path;

/// The checksum of `image` (a path or a URL) with blocks of `bs`: blksum's
/// if it was built next to blkmap (`cargo build -p blksum`), else the
/// construction's on qemu-img's raw conversion.
pub fn oracle(dir: &Path, image: &str, bs: u64) -> String {
    let blksum = Path::new(BLKMAP).with_file_name("blksum");
    if blksum.exists() {
        let out = run(s(&blksum), &["--block-size", &bs.to_string(), image]);
        assert_eq!(out.code, 0, "blksum {image}: {}", out.stderr);
        return out.stdout.split_whitespace().next().unwrap().to_string();
    }
    reference_checksum(
        dir,
        Path::new(image),
        blkhash::Algorithm::Sha256,
        bs as usize,
    )
}

/// `blkmap EXTRA... IMAGE OUT`, which must succeed: the checksum printed.
pub fn full(image: &str, out: &Path, extra: &[&str]) -> String {
    let mut args = extra.to_vec();
    args.extend([image, s(out)]);
    let o = run(BLKMAP, &args);
    assert_eq!(o.code, 0, "blkmap {args:?}: {}", o.stderr);
    checksum_of(&o.stdout, image)
}

/// The checksum of a checksum line `CHECKSUM  IMAGE`, checking the name.
pub fn checksum_of(line: &str, image: &str) -> String {
    let (sum, name) = line
        .trim_end()
        .split_once("  ")
        .unwrap_or_else(|| panic!("not a checksum line: {line:?}"));
    assert_eq!(name, image, "{line:?}");
    sum.to_string()
}

/// `blkmap --base OLD --dirty-bitmap NAME EXTRA... IMAGE OUT`.
pub fn incremental(old: &Path, name: &str, image: &str, out: &Path, extra: &[&str]) -> Out {
    let mut args = vec!["--base", s(old), "--dirty-bitmap", name];
    args.extend(extra);
    args.extend([image, s(out)]);
    run(BLKMAP, &args)
}

/// [`incremental`] with `--json`, which must succeed: the object printed.
pub fn incremental_json(old: &Path, name: &str, image: &str, out: &Path) -> Value {
    let o = incremental(old, name, image, out, &["--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{e}: {:?}", o.stdout))
}

/// The two files hold the same map, byte for byte but for the record of
/// the input each carries (an update and a full map of the image as it is
/// record the same files; a map of an export records the export).
pub fn assert_same_map(got: &Path, want: &Path) {
    let bare = |p: &Path| {
        let m = Map::load(p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
        assert!(m.identity().is_some(), "{p:?} records nothing of its image");
        m.with_identity(None).unwrap().to_bytes()
    };
    let (a, b) = (bare(got), bare(want));
    assert!(
        a == b,
        "{got:?} ({} bytes) is not {want:?} ({} bytes)",
        a.len(),
        b.len()
    );
}

/// A refused run: exit 1, every one of `words` in its message, `out` not
/// created (or, if it existed, unchanged: `before`).
pub fn assert_refused(o: &Out, words: &[&str], out: &Path, before: Option<&[u8]>) {
    assert_eq!(o.code, 1, "exit status {}: {}", o.code, o.stderr);
    for w in words {
        assert!(o.stderr.contains(w), "{w:?} not in {:?}", o.stderr);
    }
    match before {
        None => assert!(!out.exists(), "{out:?} written"),
        Some(b) => assert_eq!(std::fs::read(out).unwrap(), b, "{out:?} changed"),
    }
    // No temporary file left beside OUT either.
    let dir = out.parent().unwrap();
    let name = out.file_name().unwrap().to_str().unwrap();
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != name && n.contains(name))
        .collect();
    assert!(left.is_empty(), "left beside {out:?}: {left:?}");
}

/// `qemu-img bitmap ARGS... IMG NAME`.
pub fn bitmap(img: &Path, args: &[&str], name: &str) {
    let mut a = vec!["bitmap"];
    a.extend(args);
    a.extend([s(img), name]);
    sh("qemu-img", &a);
}

/// `top.qcow2` in `d`, a qcow2 overlay of `base.qcow2` there, written at
/// 2 MiB (1 MiB of 0x22), with bitmap `b` added after; OLD (`old.map`)
/// made from it: top, old.
pub fn overlay_with_bitmap(d: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let top = d.join("top.qcow2");
    testkit::tools::qemu_img_in(
        d,
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            "base.qcow2",
            "-F",
            "qcow2",
            "top.qcow2",
        ],
    );
    write(&top, "qcow2", &["write -P 0x22 2M 1M"]);
    bitmap(&top, &["--add"], "b");
    let old = d.join("old.map");
    full(s(&top), &old, &[]);
    (top, old)
}
