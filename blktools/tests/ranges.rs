//! `blkmap --range`, `blkmap merge` and `blkmap checksum`: an image hashed
//! in parts, split anywhere on block boundaries, merged in any order, has
//! the checksum blksum gives the whole, for every reference vector and
//! digest, for qcow2 images and for NBD exports hashed by several clients
//! at once; parts that do not make a map are refused, naming them.

use crate::common;

use common::*;
use std::path::{Path, PathBuf};
use testkit::Rng;

/// Split `size` bytes of `bs`-byte blocks at up to `max_cuts` random block
/// boundaries: the parts as OFFSET+LENGTH, in a shuffled order.
fn random_split(rng: &mut Rng, size: u64, bs: u64, max_cuts: u64) -> Vec<String> {
    let blocks = size.div_ceil(bs);
    let mut points: Vec<u64> = (0..rng.below(max_cuts + 1))
        .map(|_| (rng.below(blocks + 1) * bs).min(size))
        .collect();
    points.extend([0, size]);
    points.sort();
    points.dedup();
    let mut parts: Vec<String> = points
        .windows(2)
        .map(|w| format!("{}+{}", w[0], w[1] - w[0]))
        .collect();
    if parts.is_empty() {
        parts.push("0+0".into());
    }
    for i in (1..parts.len()).rev() {
        parts.swap(i, rng.below(i as u64 + 1) as usize);
    }
    parts
}

/// Hash `image` in the parts `ranges` (extra options first), then print the
/// merged checksum with `blkmap checksum`: its hex.
fn parts_checksum(dir: &Path, image: &str, ranges: &[String], extra: &[&str]) -> String {
    let mut parts = Vec::new();
    for (i, r) in ranges.iter().enumerate() {
        let part = dir.join(format!("part{i}"));
        let mut args = extra.to_vec();
        args.extend(["--range", r, image, s(&part)]);
        let out = run(BLKMAP, &args);
        assert_eq!(out.code, 0, "blkmap {args:?}: {}", out.stderr);
        assert_eq!(out.stdout, "", "a part prints no checksum");
        parts.push(part);
    }
    let mut args = vec!["checksum", "--name", image];
    args.extend(parts.iter().map(|p| s(p)));
    let out = run(BLKMAP, &args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for p in &parts {
        std::fs::remove_file(p).unwrap();
    }
    out.stdout.split_whitespace().next().unwrap().to_string()
}

#[test]
fn every_vector_split_at_random_points_merges_to_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut images = std::collections::BTreeMap::new();
    let mut checked = 0;
    for v in testkit::vectors().iter().filter(|v| v.format.is_none()) {
        let n = images.len();
        let img = images.entry(v.recipe.clone()).or_insert_with(|| {
            let p = dir.path().join(format!("img{n}.raw"));
            testkit::Recipe::parse(&v.recipe)
                .unwrap()
                .write_image(&p)
                .unwrap();
            p
        });
        // Opened by path, the image's size is rounded up to 512 (as QEMU).
        let size = v.size.next_multiple_of(512);
        let ranges = random_split(&mut rng, size, v.block_size as u64, 3);
        let bs = v.block_size.to_string();
        let extra = ["-d", v.digest.as_str(), "--block-size", &bs];
        let got = parts_checksum(dir.path(), s(img), &ranges, &extra);
        assert_eq!(
            got, v.file,
            "{} {} {bs} split {ranges:?}",
            v.recipe, v.digest
        );
        checked += 1;
    }
    assert!(checked >= 500, "{checked} vectors");
}

#[test]
fn qcow2_vectors_in_parts_merge_to_the_map_of_the_whole() {
    if !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(42);
    let vectors: Vec<_> = testkit::vectors()
        .into_iter()
        .filter(|v| v.format.as_deref() == Some("qcow2"))
        .collect();
    assert!(vectors.len() >= 15);
    for (i, v) in vectors.iter().enumerate() {
        let raw = dir.path().join(format!("r{i}.raw"));
        testkit::Recipe::parse(&v.recipe)
            .unwrap()
            .write_image(&raw)
            .unwrap();
        let qcow2 = dir.path().join(format!("v{i}.qcow2"));
        let mut args = vec!["convert", "-q", "-f", "raw", "-O", "qcow2"];
        args.extend(v.options.as_deref().unwrap_or("").split_whitespace());
        args.extend([s(&raw), s(&qcow2)]);
        testkit::tools::qemu_img(&args);
        let size = v.virtual_size.unwrap_or(v.size).next_multiple_of(512);
        let ranges = random_split(&mut rng, size, v.block_size as u64, 4);
        let bs = v.block_size.to_string();
        let extra = ["-d", v.digest.as_str(), "--block-size", &bs];
        let got = parts_checksum(dir.path(), s(&qcow2), &ranges, &extra);
        assert_eq!(got, v.file, "{} {:?} split {ranges:?}", v.recipe, v.options);
    }

    // A qcow2 image with data, zeros, compressed clusters and a backing
    // file: 3 parts merged are the map blkmap writes of the whole, byte
    // for byte.
    let base = image(
        dir.path(),
        "base.qcow2",
        "qcow2",
        24 * MIB,
        &["write -P 1 0 8M"],
    );
    let top = dir.path().join("top.qcow2");
    testkit::tools::qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-F",
        "qcow2",
        "-b",
        s(&base),
        s(&top),
    ]);
    write(
        &top,
        "qcow2",
        &[
            "write -P 2 4M 2M",
            "write -z 6M 1M",
            "write -c -P 3 16M 64k",
        ],
    );
    let whole = dir.path().join("whole.map");
    sh(BLKMAP, &[s(&top), s(&whole)]);
    let mut parts = Vec::new();
    for k in ["3/3", "1/3", "2/3"] {
        let p = dir.path().join(format!("top-{}.part", &k[..1]));
        sh(BLKMAP, &["--range", k, s(&top), s(&p)]);
        parts.push(p);
    }
    let merged = dir.path().join("merged.map");
    let mut args = vec!["merge", "--name", s(&top), s(&merged)];
    args.extend(parts.iter().map(|p| s(p)));
    let out = run(BLKMAP, &args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!("{}  {}\n", checksum(dir.path(), &top), s(&top))
    );
    assert_eq!(
        std::fs::read(&merged).unwrap(),
        std::fs::read(&whole).unwrap()
    );
    // blkdiff reads the merged map as any map.
    sh(BLKDIFF, &[s(&merged), s(&top)]);
}

#[test]
fn an_export_hashed_by_four_clients_at_once_merges_to_blksum() {
    if !require(&["qemu-nbd", "qemu-img", "qemu-io"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = image(
        dir.path(),
        "disk.qcow2",
        "qcow2",
        64 * MIB + 4096,
        &[
            "write -P 5 0 20M",
            "write -z 20M 4M",
            "write -P 6 40M 10M",
            "write -P 7 64M 4k",
        ],
    );
    let sock = dir.path().join("nbd.sock");
    // One export, four clients: qemu-nbd --shared=4 (the recipe's server).
    let srv = testkit::nbd::qemu_nbd_with(
        &img,
        "qcow2",
        Listen::Unix(&sock),
        None,
        &["--read-only", "--shared=4"],
    );
    let parts: Vec<PathBuf> = (1..=4)
        .map(|k| dir.path().join(format!("part{k}")))
        .collect();
    let children: Vec<_> = parts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            std::process::Command::new(BLKMAP)
                .args(["--range", &format!("{}/4", i + 1), &srv.url, s(p)])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let merged = dir.path().join("merged.map");
    let mut args = vec!["merge", s(&merged)];
    args.extend(parts.iter().rev().map(|p| s(p)));
    let out = run(BLKMAP, &args);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let want = checksum(dir.path(), &img);
    assert_eq!(out.stdout.split_whitespace().next(), Some(want.as_str()));
    // The same map as one client hashing the whole export.
    let whole = dir.path().join("whole.map");
    sh(BLKMAP, &[&srv.url, s(&whole)]);
    assert_eq!(
        std::fs::read(&merged).unwrap(),
        std::fs::read(&whole).unwrap()
    );
}

#[test]
fn parts_that_do_not_make_a_map_are_refused_and_out_is_kept() {
    if !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let img = image(d, "a.raw", "raw", 4 * MIB, &["write -P 1 0 4M"]);
    let other = image(d, "b.raw", "raw", 8 * MIB, &["write -P 1 0 4M"]);
    let part = |name: &str, args: &[&str]| -> PathBuf {
        let p = d.join(name);
        let mut a = args.to_vec();
        a.push(s(&p));
        sh(BLKMAP, &a);
        p
    };
    let first = part("first", &["--range", "0+1m", s(&img)]);
    let rest = part("rest", &["--range", "2m+", s(&img)]);
    let wide = part("wide", &["--range", "512k+", s(&img)]);
    let b3 = part("b3", &["-d", "blake3", "--range", "1m+", s(&img)]);
    let big = part("big", &["--range", "1m+", s(&other)]);
    let out_map = d.join("out.map");
    std::fs::write(&out_map, b"").unwrap();
    let merge = |parts: &[&Path]| {
        let mut args = vec!["merge", s(&out_map)];
        args.extend(parts.iter().map(|p| s(p)));
        run(BLKMAP, &args)
    };
    let cases: [(&[&Path], String); 4] = [
        (
            &[&first, &rest],
            format!(
                "a gap: bytes 1048576+1048576 are in no part ({} ends at 1048576, {} starts at 2097152)",
                s(&first),
                s(&rest)
            ),
        ),
        (
            &[&wide, &first],
            format!(
                "an overlap: {} and {} both cover bytes 524288+524288",
                s(&first),
                s(&wide)
            ),
        ),
        (
            &[&first, &b3],
            format!("{} is of a 4194304-byte image in blake3 digests", s(&b3)),
        ),
        (
            &[&big, &first],
            format!("{} is of a 4194304-byte image in sha256", s(&first)),
        ),
    ];
    for (parts, want) in cases {
        let out = merge(parts);
        assert_eq!(out.code, 1, "{parts:?}");
        assert!(out.stderr.contains(&want), "{}\nwant {want}", out.stderr);
        let said = format!("blkmap: {}: ", s(&out_map));
        assert!(out.stderr.starts_with(&said), "{}", out.stderr);
        assert_eq!(std::fs::read(&out_map).unwrap(), b"", "OUT left alone");
    }
    // Damage is said of the part.
    let tail = part("tail", &["--range", "1m+", s(&img)]);
    let mut bytes = std::fs::read(&tail).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    let bad = d.join("bad");
    std::fs::write(&bad, &bytes).unwrap();
    let out = merge(&[&first, &bad]);
    let said = format!("blkmap: {}: damaged block map", s(&bad));
    assert!(out.stderr.starts_with(&said), "{}", out.stderr);
    // So is a part that is missing (the reason as every error gives it).
    let missing = d.join("missing");
    let out = run(BLKMAP, &["checksum", "--name", "x", s(&first), s(&missing)]);
    let said = format!("blkmap: {}: No such file or directory\n", s(&missing));
    assert_eq!(out.stderr, said);
    // Several parts are no one file to name the line after.
    let out = run(BLKMAP, &["checksum", s(&first), s(&rest)]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("needs --name NAME"), "{}", out.stderr);
    // A part alone has no checksum; a part is not a map for blkdiff.
    let out = run(BLKMAP, &["checksum", s(&rest)]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("bytes 0+2097152 are in no part"),
        "{}",
        out.stderr
    );
    let out = run(BLKDIFF, &[s(&rest), s(&img)]);
    assert_ne!(out.code, 0);
    assert!(
        out.stderr.contains("merge the parts first"),
        "{}",
        out.stderr
    );
    // A range a pipe cannot give, or one that is not whole blocks.
    let out = run(
        "sh",
        &[
            "-c",
            &format!(
                "cat {} | {BLKMAP} --range 0+ - {}",
                s(&img),
                s(&d.join("p"))
            ),
        ],
    );
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("needs an image that can seek"),
        "{}",
        out.stderr
    );
    for (r, why) in [
        ("100+64k", "does not start at a block boundary"),
        ("0+100", "neither ends at a block boundary"),
        ("3m+2m", "ends past the end of the image"),
        ("5/4", "K from 1 to N"),
        ("1m", "use OFFSET+LENGTH"),
    ] {
        let out = run(BLKMAP, &["--range", r, s(&img), s(&d.join("p"))]);
        assert_ne!(out.code, 0, "{r}");
        assert!(out.stderr.contains(why), "{r}: {}", out.stderr);
    }
    assert!(!d.join("p").exists());
    // merge never replaces one of its parts, nor a file that is not a map.
    let out = merge(&[&first, &rest]);
    assert_eq!(out.code, 1);
    let out = run(BLKMAP, &["merge", s(&first), s(&first), s(&wide)]);
    assert_eq!(out.code, 1);
    assert!(out.stderr.contains("first"), "{}", out.stderr);
    assert!(std::fs::read(&first).unwrap().starts_with(&blkmap::MAGIC));
    std::fs::write(&out_map, b"precious").unwrap();
    let mid = part("mid", &["--range", "1m+1m", s(&img)]);
    let out = merge(&[&first, &mid, &rest]);
    assert_eq!(out.code, 1);
    assert_eq!(std::fs::read(&out_map).unwrap(), b"precious");
    std::fs::remove_file(&out_map).unwrap();
    let out = merge(&[&rest, &mid, &first]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let want = checksum(d, &img);
    assert_eq!(out.stdout, format!("{want}  {}\n", s(&out_map)));
}
