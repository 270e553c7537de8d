//! blkmap and blkdiff on real images made with qemu-img and qemu-io,
//! checked against the blkhash construction and `qemu-img compare`.

use blkhash::Algorithm;
use blkmap::Map;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::common;

use common::*;

fn copy(from: &Path, to: &Path) -> PathBuf {
    std::fs::copy(from, to).unwrap();
    to.to_path_buf()
}

/// `qemu-img compare`: its exit status and first mismatch offset.
fn qemu_compare(a: &Path, b: &Path, strict: bool) -> (i32, Option<u64>) {
    let mut args = vec!["compare"];
    if strict {
        args.push("-s");
    }
    args.extend([s(a), s(b)]);
    let out = Command::new("qemu-img").args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let offset = text
        .split("offset ")
        .nth(1)
        .and_then(|t| t.trim_end_matches(['!', '\n']).trim().parse().ok());
    (out.status.code().unwrap(), offset)
}

/// Parse `OFFSET+LENGTH` lines (ignoring the tail line's words).
fn ranges(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .map(|l| {
            let first = l.split_whitespace().next().unwrap();
            let (o, n) = first.split_once('+').unwrap();
            (o.parse().unwrap(), n.parse().unwrap())
        })
        .collect()
}

fn base(dir: &Path) -> PathBuf {
    image(
        dir,
        "base.qcow2",
        "qcow2",
        16 * MIB,
        &[
            "write -P 0x11 0 3M",
            "write -P 0x22 5M 100k",
            "write -z 8M 1M",
            "write -P 0x33 12M 2M",
        ],
    )
}

#[test]
fn map_checksum_is_the_construction() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = base(d);
    for (alg, bs, extra) in [
        (Algorithm::Sha256, 65536, vec![]),
        (
            Algorithm::Blake3,
            4096,
            vec!["-d", "blake3", "--block-size", "4k"],
        ),
    ] {
        let out_map = d.join(format!("{alg}.map"));
        let mut args = vec![s(&img), s(&out_map)];
        args.extend(extra.iter().copied());
        let r = run(BLKMAP, &args);
        assert_eq!(r.code, 0, "{}", r.stderr);
        let want = reference_checksum(d, &img, alg, bs);
        assert_eq!(r.stdout, format!("{want}  {}\n", s(&img)));
        let map = Map::load(&out_map).unwrap();
        assert_eq!(map.checksum().to_hex(), want);
        assert_eq!((map.algorithm(), map.block_size()), (alg, bs));
        assert_eq!(map.size(), 16 * MIB);
        // Data: 3M + 2 blocks (100k) + 2M; the rest zeros.
        if bs == 65536 {
            assert_eq!(map.data_blocks(), 48 + 2 + 32);
            let bare = map.clone().with_identity(None).unwrap();
            assert!(bare.encoded_len() < 82 * 32 + 200);
        }
    }
    // The raw conversion has the same map as the qcow2 image.
    let raw = d.join("base.raw");
    sh("qemu-img", &["convert", "-O", "raw", s(&img), s(&raw)]);
    let raw_map = d.join("raw.map");
    assert_eq!(run(BLKMAP, &[s(&raw), s(&raw_map)]).code, 0);
    assert_eq!(
        Map::load(&raw_map).unwrap(),
        Map::load(d.join("sha256.map")).unwrap()
    );
    // Standard input: the same checksum again.
    let stdin_map = d.join("stdin.map");
    let out = Command::new(BLKMAP)
        .args(["-", s(&stdin_map)])
        .stdin(std::fs::File::open(&raw).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(Map::load(&stdin_map).unwrap(), Map::load(&raw_map).unwrap());
    // Errors: a missing image, an unwritable output, a bad option.
    let r = run(BLKMAP, &[s(&d.join("missing")), s(&d.join("x.map"))]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("No such file"), "{}", r.stderr);
    let r = run(BLKMAP, &[s(&img), s(&d.join("no/such/dir/x.map"))]);
    assert_eq!(r.code, 1);
    assert_eq!(run(BLKMAP, &[s(&img), "x", "-d", "null"]).code, 2);
}

/// Every command's `-h` is a summary (at most 40 lines, pointing at
/// `--help`, which has every option); `blkmap bitmaps` takes only the
/// options that open an image.
#[test]
fn short_help_is_a_summary_and_bitmaps_takes_what_applies() {
    for (bin, sub) in [
        (BLKMAP, None),
        (BLKMAP, Some("merge")),
        (BLKMAP, Some("checksum")),
        (BLKMAP, Some("bitmaps")),
        (BLKDIFF, None),
        (BLKSYNC, None),
    ] {
        let args = |h| sub.into_iter().chain([h]).collect::<Vec<_>>();
        let short = run(bin, &args("-h")).stdout;
        let long = run(bin, &args("--help")).stdout;
        assert!(short.lines().count() <= 40, "{bin} {sub:?}:\n{short}");
        assert!(long.contains("-h, --help"), "{bin} {sub:?}:\n{long}");
        if sub.is_none() {
            assert!(short.contains("--help (all of them)"), "{bin}:\n{short}");
            assert!(!short.contains("--io-depth"), "{bin}:\n{short}");
            assert!(long.contains("--io-depth"), "{bin}:\n{long}");
        }
    }
    let long = run(BLKMAP, &["bitmaps", "--help"]).stdout;
    for opt in [
        "--format",
        "--force-share",
        "--timeout",
        "--tls-certificates",
    ] {
        assert!(long.contains(opt), "{opt}:\n{long}");
    }
    for opt in [
        "--digest",
        "--block-size",
        "--threads",
        "--read-size",
        "--io-depth",
    ] {
        assert!(!long.contains(opt), "{opt}:\n{long}");
    }
    let r = run(BLKMAP, &["bitmaps", "--block-size", "4k", "x.qcow2"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(
        r.stderr
            .contains("--block-size does not apply to listing bitmaps"),
        "{}",
        r.stderr
    );
}

#[test]
fn damaged_and_truncated_maps_refused() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = base(d);
    let good = d.join("good.map");
    assert_eq!(run(BLKMAP, &[s(&img), s(&good)]).code, 0);
    let bytes = std::fs::read(&good).unwrap();
    assert_eq!(run(BLKDIFF, &[s(&good), s(&img)]).code, 0);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "flipped",
            {
                let mut b = bytes.clone();
                b[bytes.len() / 2] ^= 4;
                b
            },
            "damaged",
        ),
        ("truncated", bytes[..bytes.len() - 10].to_vec(), "truncated"),
        ("header-only", bytes[..30].to_vec(), "truncated"),
        (
            "appended",
            {
                let mut b = bytes.clone();
                b.push(0);
                b
            },
            "after the end",
        ),
        (
            "version",
            {
                let mut b = bytes.clone();
                b[8] = 9;
                b
            },
            "version 9",
        ),
    ];
    for (name, content, msg) in cases {
        let p = d.join(name);
        std::fs::write(&p, content).unwrap();
        let r = run(BLKDIFF, &[s(&p), s(&img)]);
        assert_eq!(r.code, 2, "{name}");
        assert!(r.stderr.contains(msg), "{name}: {}", r.stderr);
        assert!(r.stdout.is_empty());
    }
}

#[test]
fn diff_agrees_with_qemu_img_compare() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let a = base(d);
    // (qemu-io writes, expected ranges with 64k blocks, with 4k blocks)
    type Case = (Vec<&'static str>, Vec<(u64, u64)>, Vec<(u64, u64)>);
    let cases: Vec<Case> = vec![
        (vec![], vec![], vec![]),
        (
            vec!["write -P 0x55 1M 64k"],
            vec![(MIB, 65536)],
            vec![(MIB, 65536)],
        ),
        (
            // Unaligned: rounded out to whole blocks.
            vec!["write -P 0x55 100k 1k"],
            vec![(65536, 65536)],
            vec![(100 << 10, 4096)],
        ),
        (
            // Into a hole, into zeros, and two adjacent writes merged.
            vec![
                "write -P 0x55 7M 4k",
                "write -P 0x55 8M 8k",
                "write -P 0x55 10M 64k",
                "write -P 0x55 10304k 64k",
            ],
            vec![(7 * MIB, 65536), (8 * MIB, 65536), (10 * MIB, 131072)],
            vec![(7 * MIB, 4096), (8 * MIB, 8192), (10 * MIB, 131072)],
        ),
        (
            // Data discarded to zeros, and the same bytes written again (no change).
            vec!["write -z 12M 1M", "write -P 0x11 0 64k"],
            vec![(12 * MIB, MIB)],
            vec![(12 * MIB, MIB)],
        ),
        (
            // The very end.
            vec!["write -P 0x55 16380k 4k"],
            vec![(16 * MIB - 65536, 65536)],
            vec![(16 * MIB - 4096, 4096)],
        ),
    ];
    for (i, (writes, want64, want4)) in cases.into_iter().enumerate() {
        let b = copy(&a, &d.join(format!("b{i}.qcow2")));
        write(&b, "qcow2", &writes);
        let (qcode, qoffset) = qemu_compare(&a, &b, false);
        let r = run(BLKDIFF, &[s(&a), s(&b)]);
        assert_eq!(r.code, qcode, "case {i}: {}", r.stderr);
        assert_eq!(ranges(&r.stdout), want64, "case {i}");
        let r4 = run(BLKDIFF, &[s(&a), s(&b), "--block-size", "4k"]);
        assert_eq!(r4.code, qcode, "case {i}");
        assert_eq!(ranges(&r4.stdout), want4, "case {i}");
        // qemu-img's first mismatch lies in our first range.
        if let Some(off) = qoffset {
            let (o, n) = want4[0];
            assert!(o <= off && off < o + n, "case {i}: qemu says {off}");
        }
        // A raw copy of b compares the same way.
        let raw = d.join(format!("b{i}.raw"));
        sh("qemu-img", &["convert", "-O", "raw", s(&b), s(&raw)]);
        assert_eq!(run(BLKDIFF, &[s(&a), s(&raw)]).stdout, r.stdout);
    }
}

#[test]
fn holes_and_written_zeros_are_the_same() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let sparse = image(d, "sparse.qcow2", "qcow2", 4 * MIB, &[]);
    let zeros = image(
        d,
        "zeros.raw",
        "raw",
        4 * MIB,
        &["write -P 0 0 1M", "write -z 2M 1M", "write -P 0 3M 512"],
    );
    let qzeros = image(
        d,
        "zeros.qcow2",
        "qcow2",
        4 * MIB,
        &["write -P 0 0 1M", "write -z 1M 1M"],
    );
    for (x, y) in [(&sparse, &zeros), (&sparse, &qzeros), (&zeros, &qzeros)] {
        assert_eq!(qemu_compare(x, y, false).0, 0);
        let r = run(BLKDIFF, &[s(x), s(y)]);
        assert_eq!((r.code, r.stdout.as_str()), (0, ""), "{}", r.stderr);
    }
    let m = d.join("sparse.map");
    assert_eq!(run(BLKMAP, &[s(&sparse), s(&m)]).code, 0);
    // Sparse: the map is a header, one run and a trailer, and the record
    // of the image it was made from.
    let record = Map::load(&m).unwrap().identity().unwrap().len() as u64;
    assert_eq!(
        std::fs::metadata(&m).unwrap().len(),
        48 + 32 + 4 + record + 9 + 32
    );
    assert_eq!(run(BLKDIFF, &[s(&m), s(&zeros)]).code, 0);
}

/// `words` appear in `text` in this order.
fn in_order(text: &str, words: &[&str]) {
    let mut at = 0;
    for w in words {
        match text[at..].find(w) {
            Some(i) => at += i + w.len(),
            None => panic!("{w} not after byte {at} in {text}"),
        }
    }
}

#[test]
fn different_sizes_differ_in_the_tail_with_strict() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let a = image(d, "a.qcow2", "qcow2", 4 * MIB, &["write -P 0x11 0 1M"]);
    let b = image(d, "b.qcow2", "qcow2", 6 * MIB, &["write -P 0x11 0 1M"]);
    assert_eq!(qemu_compare(&a, &b, true).0, 1);
    assert_eq!(qemu_compare(&a, &b, false).0, 0);
    let line = "4194304+2097152 only in B, all zeros (A is 4194304 bytes, B is 6291456 bytes)\n";
    let r = run(BLKDIFF, &[s(&a), s(&b), "--strict"]);
    assert_eq!((r.code, r.stdout.as_str()), (1, line));
    // Without --strict, a tail of zeros is the same content (qemu-img
    // compare's rule).
    let r = run(BLKDIFF, &[s(&a), s(&b)]);
    assert_eq!((r.code, r.stdout.as_str()), (0, line));
    let r = run(BLKDIFF, &[s(&b), s(&a), "-s", "--json"]);
    assert_eq!(r.code, 1);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["same"], false);
    assert_eq!(doc["strict"], true);
    assert_eq!(doc["ranges"].as_array().unwrap().len(), 0);
    assert_eq!(doc["tail"]["offset"], 4194304);
    assert_eq!(doc["tail"]["length"], 2097152);
    assert_eq!(doc["tail"]["only-in"], "a");
    assert_eq!(doc["differing-bytes"], 2097152);
    assert_eq!(doc["schema"], 2);
    // Sizes as blksum's --json spells them (and `size`, kept from schema 1).
    assert_eq!(doc["a"]["virtual-size"], 6 * MIB);
    assert_eq!(doc["b"]["virtual-size"], 4 * MIB);
    assert_eq!(doc["a"]["size"], 6 * MIB);
    // Keys in the order blktools/README.md shows them.
    in_order(
        &r.stdout,
        &[
            "\"schema\"",
            "\"a\"",
            "\"name\"",
            "\"format\"",
            "\"virtual-size\"",
            "\"checksum\"",
            "\"b\"",
            "\"digest\"",
            "\"block-size\"",
            "\"same\"",
            "\"strict\"",
            "\"ranges\"",
            "\"tail\"",
            "\"zeros\"",
            "\"data-offset\"",
            "\"differing-bytes\"",
        ],
    );
    let same = run(BLKDIFF, &[s(&b), s(&a), "-s", "--output", "json"]);
    assert_eq!(same.stdout, r.stdout, "--output json is --json");

    // A smaller size inside a block: the short last block cannot be
    // compared by digest and is reported, clipped to the smaller size.
    let c = image(d, "c.raw", "raw", 4 * MIB + 1024, &["write -P 0x11 0 1M"]);
    let r = run(BLKDIFF, &[s(&c), s(&b)]);
    assert_eq!(r.code, 1);
    assert_eq!(
        ranges(&r.stdout),
        [(4 * MIB, 1024), (4 * MIB + 1024, 2 * MIB - 1024)]
    );
}

#[test]
fn maps_and_images_mix() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let a = base(d);
    let b = copy(&a, &d.join("b.qcow2"));
    write(
        &b,
        "qcow2",
        &["write -P 0x55 2M 1k", "write -P 0x55 9M 128k"],
    );
    let (ma, mb) = (d.join("a.map"), d.join("b.map"));
    assert_eq!(run(BLKMAP, &[s(&a), s(&ma)]).code, 0);
    assert_eq!(run(BLKMAP, &[s(&b), s(&mb)]).code, 0);
    let images = run(BLKDIFF, &[s(&a), s(&b)]);
    assert_eq!(images.code, 1);
    assert_eq!(
        ranges(&images.stdout),
        [(2 * MIB, 65536), (9 * MIB, 131072)]
    );
    for (x, y) in [(&ma, &b), (&a, &mb), (&ma, &mb)] {
        let r = run(BLKDIFF, &[s(x), s(y)]);
        assert_eq!((r.code, &r.stdout), (1, &images.stdout), "{}", r.stderr);
    }
    assert_eq!(run(BLKDIFF, &[s(&ma), s(&a)]).code, 0);
    let r = run(BLKDIFF, &[s(&ma), s(&b), "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(doc["a"]["format"], "map");
    assert_eq!(doc["b"]["format"], "qcow2");
    assert_eq!(doc["digest"], "sha256");
    assert_eq!(doc["block-size"], 65536);
    assert_eq!(doc["ranges"][1]["offset"], 9 * MIB);
    assert_eq!(doc["tail"], serde_json::Value::Null);
    assert_eq!(
        doc["a"]["checksum"],
        reference_checksum(d, &a, Algorithm::Sha256, 65536)
    );
    // --quiet: the status alone.
    let r = run(BLKDIFF, &[s(&ma), s(&b), "-q"]);
    assert_eq!((r.code, r.stdout.as_str()), (1, ""));

    // A map on standard input.
    let mut child = Command::new(BLKDIFF)
        .args(["-", s(&b)])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&std::fs::read(&ma).unwrap())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), images.stdout);
}

#[test]
fn mismatched_maps_refused() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let a = base(d);
    let (m3, m4) = (d.join("blake3.map"), d.join("4k.map"));
    assert_eq!(run(BLKMAP, &[s(&a), s(&m3), "-d", "blake3"]).code, 0);
    assert_eq!(run(BLKMAP, &[s(&a), s(&m4), "--block-size", "4k"]).code, 0);
    // Without -d and --block-size, the image is hashed as the map was.
    assert_eq!(run(BLKDIFF, &[s(&m3), s(&a)]).code, 0);
    assert_eq!(run(BLKDIFF, &[s(&a), s(&m4)]).code, 0);
    for (args, msg) in [
        (vec![s(&m3), s(&a), "-d", "sha256"], "blake3"),
        (
            vec![s(&m4), s(&a), "--block-size", "64k"],
            "4096-byte blocks",
        ),
        (vec![s(&m3), s(&m4)], "not blake3"),
    ] {
        let r = run(BLKDIFF, &args);
        assert_eq!(r.code, 2, "{args:?}");
        assert!(r.stderr.contains(msg), "{args:?}: {}", r.stderr);
        assert!(r.stdout.is_empty());
    }
    // Trouble with an input: exit 2.
    let r = run(BLKDIFF, &[s(&a), s(&d.join("missing"))]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("missing"));
    assert_eq!(run(BLKDIFF, &[s(&a)]).code, 2);
}

#[test]
fn blkdiff_takes_a_format_for_each_side_as_qemu_img_compare() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = image(d, "a.raw", "raw", 4 * MIB, &["write -P 0x11 0 1M"]);
    let b = image(d, "b.qcow2", "qcow2", 4 * MIB, &["write -P 0x11 0 1M"]);
    assert_eq!(run(BLKDIFF, &[s(&a), s(&b)]).code, 0, "probed");
    assert_eq!(
        run(BLKDIFF, &["-f", "raw", "-F", "qcow2", s(&a), s(&b)]).code,
        0
    );
    // -f alone is both sides' format: B read as raw bytes differs.
    assert_eq!(run(BLKDIFF, &["-f", "raw", s(&a), s(&b)]).code, 1);
    // -F alone: A is probed.
    assert_eq!(run(BLKDIFF, &["-F", "qcow2", s(&a), s(&b)]).code, 0);
    let r = run(BLKDIFF, &["-F", "qcow2", s(&b), s(&a)]);
    assert_eq!(r.code, 2, "a raw file is not qcow2: {}", r.stderr);
}

#[test]
fn blkmap_and_blkdiff_show_progress_as_blksum() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = image(d, "a.raw", "raw", 4 * MIB, &["write -P 0x11 0 4M"]);
    let b = image(d, "b.qcow2", "qcow2", 4 * MIB, &["write -P 0x11 0 4M"]);
    // Without a terminal: a line at each tenth, named by the command.
    let r = run(
        BLKMAP,
        &["-p", "--read-size", "256k", s(&a), s(&d.join("a.map"))],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let want: Vec<String> = (1..=10)
        .map(|t| format!("blkmap: {}: {}%", s(&a), t * 10))
        .collect();
    assert_eq!(r.stderr.lines().collect::<Vec<_>>(), want);
    // A range, and each of blkdiff's two images: they end at 100% too.
    let r = run(
        BLKMAP,
        &["-p", "--range", "1/2", s(&b), s(&d.join("b.part"))],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        r.stderr.lines().last(),
        Some(format!("blkmap: {}: 100%", s(&b)).as_str())
    );
    let r = run(BLKDIFF, &["-p", s(&a), s(&b)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    for img in [&a, &b] {
        let done = format!("blkdiff: {}: 100%", s(img));
        assert_eq!(
            r.stderr.lines().filter(|l| *l == done).count(),
            1,
            "{}",
            r.stderr
        );
    }
    // --progress=FD: the run's percentage, both images weighing the same.
    let fd_file = d.join("progress");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{BLKDIFF} --progress=3 --read-size 256k {} {} 3>{}",
            s(&a),
            s(&b),
            s(&fd_file)
        ))
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let text = std::fs::read_to_string(&fd_file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        (lines.first(), lines.last()),
        (Some(&"0/100"), Some(&"100/100")),
        "{text}"
    );
}
