//! Proxmox Backup Server fixed indexes (`.fidx`) read as block maps by
//! `blkmap checksum` and `blkdiff`. No PBS runs here: the indexes are
//! written from the published format (proxmox-backup's
//! docs/file-formats.rst) over the guest bytes qemu-img gives of an image,
//! as a backup of it would hold them: 4096-byte header (magic, uuid,
//! ctime, index_csum = SHA-256 of the digests, size, chunk size), then the
//! SHA-256 of each chunk, the last one shorter.

use crate::common::*;
use blkhash::Algorithm;
use std::path::{Path, PathBuf};

const BLKSUM: &str = "blksum";

/// The fixed index of `data` in chunks of `chunk`: the file's bytes, and
/// its index_csum.
fn fidx_bytes(data: &[u8], chunk: usize) -> (Vec<u8>, [u8; 32]) {
    let mut digests = Vec::new();
    for c in data.chunks(chunk) {
        let mut d = [0u8; 32];
        Algorithm::Sha256.digest_into(c, &mut d);
        digests.extend_from_slice(&d);
    }
    fidx_of_digests(&digests, data.len() as u64, chunk as u64)
}

/// The fixed index of a disk of `size` bytes in chunks of `chunk` whose
/// chunk digests are `digests`: the file's bytes, and its index_csum.
fn fidx_of_digests(digests: &[u8], size: u64, chunk: u64) -> (Vec<u8>, [u8; 32]) {
    let mut csum = [0u8; 32];
    Algorithm::Sha256.digest_into(digests, &mut csum);
    let mut f = vec![0u8; 4096];
    f[..8].copy_from_slice(&blkmap::FIDX_MAGIC);
    f[8..24].copy_from_slice(b"\x51\x0e\x8e\x5c\x5a\x6e\x4b\x0c\x9d\x41\x70\x3e\x11\x22\x33\x44");
    f[24..32].copy_from_slice(&1_764_201_600i64.to_le_bytes());
    f[32..64].copy_from_slice(&csum);
    f[64..72].copy_from_slice(&size.to_le_bytes());
    f[72..80].copy_from_slice(&chunk.to_le_bytes());
    f.extend_from_slice(digests);
    (f, csum)
}

/// `bin args` with blksync's records of the DSTs it wrote kept under
/// `dir` (never in the user's own state directory).
pub(crate) fn run_kept(dir: &Path, bin: &str, args: &[&str]) -> Out {
    let out = std::process::Command::new(bin)
        .args(args)
        .env("XDG_STATE_HOME", dir.join("state"))
        .output()
        .unwrap();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn hex(b: &[u8]) -> String {
    blkhash::to_hex(b)
}

pub(crate) fn blksum() -> String {
    Path::new(BLKMAP)
        .with_file_name(BLKSUM)
        .to_str()
        .unwrap()
        .to_string()
}

/// A qcow2 disk of 10 MiB + 64 KiB (the last 4 MiB chunk short): data,
/// written zeros, a hole; and its backup's index.
fn disk_and_index(dir: &Path) -> (PathBuf, PathBuf, [u8; 32]) {
    let img = image(
        dir,
        "disk.qcow2",
        "qcow2",
        10 * MIB + 65536,
        &["write -P 0x33 0 3m", "write -z 4m 4m", "write -P 7 10m 64k"],
    );
    let data = testkit::tools::guest_bytes(&img, &dir.join("guest.raw"));
    let (bytes, csum) = fidx_bytes(&data, 4 << 20);
    let fidx = dir.join("drive-scsi0.img.fidx");
    std::fs::write(&fidx, bytes).unwrap();
    (img, fidx, csum)
}

#[test]
fn index_csum_is_blksum_construction_pbs() {
    let Some(dir) = scratch() else { return };
    let (img, fidx, csum) = disk_and_index(dir.path());
    let o = run(BLKMAP, &["checksum", "--construction", "pbs", s(&fidx)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout, format!("{}  {}\n", hex(&csum), s(&fidx)));
    // blksum --construction pbs reproduces it from the disk.
    if Path::new(&blksum()).exists() {
        let o = run(&blksum(), &["--construction", "pbs", s(&img)]);
        assert_eq!(o.stdout, format!("{}  {}\n", hex(&csum), s(&img)));
        // In the other constructions too, from the digests alone.
        for (c, extra) in [
            ("blkhash", ["-d", "sha256", "--block-size", "4m"]),
            ("imageio", ["-d", "sha256", "--block-size", "4m"]),
        ] {
            let ours = run(
                &blksum(),
                &[&["--construction", c][..], &extra, &[s(&img)]].concat(),
            );
            let theirs = run(
                BLKMAP,
                &["checksum", "--construction", c, "--name", s(&img), s(&fidx)],
            );
            assert_eq!(
                (theirs.code, &theirs.stdout),
                (0, &ours.stdout),
                "{c}: {}",
                theirs.stderr
            );
        }
    }
    // A tagged line names the construction, checked by blksum -c alone.
    let o = run(
        BLKMAP,
        &[
            "checksum",
            "--construction",
            "pbs",
            "--tag",
            "--name",
            s(&img),
            s(&fidx),
        ],
    );
    assert_eq!(
        o.stdout,
        format!("pbs/sha256 ({}) = {}\n", s(&img), hex(&csum))
    );
    if Path::new(&blksum()).exists() {
        let list = dir.path().join("sums");
        std::fs::write(&list, &o.stdout).unwrap();
        let c = run(&blksum(), &["-c", s(&list)]);
        assert_eq!(
            (c.code, c.stdout.as_str()),
            (0, &*format!("{}: OK\n", s(&img))),
            "{}",
            c.stderr
        );
    }
}

/// blksum reads an index as the disk it holds (#61 item 5): from its
/// digests alone where they give the checksum asked for (the pbs
/// construction's index_csum, blkhash's at sha256 and the chunk size),
/// refused naming what would (its chunks) otherwise; never a checksum of
/// the index file's own bytes. `blkmap checksum` of an index prints its
/// index_csum unless asked for another construction (#61 item 10), and
/// its --tag line checks with `blksum -c` as it is (the line names the
/// index, which blksum now reads as the disk).
#[test]
fn blksum_reads_an_index_as_the_disk_it_holds() {
    let Some(dir) = scratch() else { return };
    let (img, fidx, csum) = disk_and_index(dir.path());
    let blksum = blksum();
    let line = |hex: &str| format!("{hex}  {}\n", s(&fidx));
    let o = run(&blksum, &["--construction", "pbs", s(&fidx)]);
    assert_eq!((o.code, o.stdout), (0, line(&hex(&csum))), "{}", o.stderr);
    assert_eq!(
        o.stderr, "",
        "no note of a size rounded up: not the file's bytes"
    );
    let ours = run(&blksum, &["-d", "sha256", "--block-size", "4m", s(&img)]);
    let want = ours.stdout.split(' ').next().unwrap();
    let o = run(&blksum, &["-d", "sha256", "--block-size", "4m", s(&fidx)]);
    assert_eq!((o.code, o.stdout), (0, line(want)), "{}", o.stderr);
    let o = run(&blksum, &["--json", "--construction", "pbs", s(&fidx)]);
    let doc: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    let input = &doc["inputs"][0];
    assert_eq!(input["format"], "fidx");
    assert_eq!(input["virtual-size"], 10 * MIB + 65536);
    // The written zeros' chunk is zeros; the others hold data.
    assert_eq!(input["zero-bytes"], 4 * MIB);
    // Other digests or block sizes need the chunks: refused, saying so.
    for args in [
        &[][..],
        &["-d", "blake3", "--block-size", "4m"],
        &["--construction", "imageio"],
    ] {
        let o = run(&blksum, &[args, &[s(&fidx)]].concat());
        assert_eq!(
            (o.code, o.stdout.as_str()),
            (1, ""),
            "{args:?}: {}",
            o.stderr
        );
        assert!(
            o.stderr.contains(&format!(
                "blksum: {}: a PBS fixed index whose datastore was not found",
                s(&fidx)
            )) && o
                .stderr
                .contains("needs the chunks (--construction pbs, or -d sha256 --block-size 4m)"),
            "{args:?}: {}",
            o.stderr
        );
    }
    // A damaged index is no checksum either.
    let bad = dir.path().join("bad.fidx");
    let mut bytes = std::fs::read(&fidx).unwrap();
    bytes[4096 + 3] ^= 1;
    std::fs::write(&bad, bytes).unwrap();
    let o = run(&blksum, &["--construction", "pbs", s(&bad)]);
    assert_eq!((o.code, o.stdout.as_str()), (1, ""), "{}", o.stderr);
    assert!(
        o.stderr
            .contains("index_csum is not the SHA-256 of its digests"),
        "{}",
        o.stderr
    );

    // blkmap checksum: the index's own checksum by default.
    let o = run(BLKMAP, &["checksum", s(&fidx)]);
    assert_eq!((o.code, o.stdout), (0, line(&hex(&csum))), "{}", o.stderr);
    let o = run(BLKMAP, &["checksum", "--construction", "blkhash", s(&fidx)]);
    assert_eq!((o.code, o.stdout), (0, line(want)), "{}", o.stderr);
    // Its tagged lines, naming the index, check with blksum -c.
    for c in ["pbs", "blkhash"] {
        let o = run(
            BLKMAP,
            &["checksum", "--construction", c, "--tag", s(&fidx)],
        );
        let list = dir.path().join("SUMS");
        std::fs::write(&list, &o.stdout).unwrap();
        let c = run(&blksum, &["-c", s(&list)]);
        assert_eq!(
            (c.code, c.stdout),
            (0, format!("{}: OK\n", s(&fidx))),
            "{}",
            c.stderr
        );
    }
}

/// proxmox-backup-client backs a raw file up at its exact size (the
/// index's size is the file's): `blksum --construction pbs` of a file
/// whose size is no multiple of 512 gives its index's index_csum, which
/// `blkmap checksum --construction pbs` reads from the index.
#[test]
fn a_raw_file_of_odd_size_is_backed_up_at_its_size() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = image(d, "disk.raw", "raw", 9 * MIB, &["write -P 0x5a 0 5M"]);
    let mut data = std::fs::read(&img).unwrap();
    data.truncate((9 * MIB - 24) as usize);
    std::fs::write(&img, &data).unwrap();
    let (bytes, csum) = fidx_bytes(&data, 4 << 20);
    let fidx = d.join("disk.raw.fidx");
    std::fs::write(&fidx, bytes).unwrap();
    let o = run(BLKMAP, &["checksum", "--construction", "pbs", s(&fidx)]);
    assert_eq!(
        o.stdout,
        format!("{}  {}\n", hex(&csum), s(&fidx)),
        "{}",
        o.stderr
    );
    if Path::new(&blksum()).exists() {
        let o = run(&blksum(), &["--construction", "pbs", s(&img)]);
        assert_eq!(
            o.stdout,
            format!("{}  {}\n", hex(&csum), s(&img)),
            "{}",
            o.stderr
        );
        assert_eq!(o.stderr, "");
    }
}

#[test]
fn blkdiff_names_the_chunks_that_differ() {
    let Some(dir) = scratch() else { return };
    let (img, fidx, _) = disk_and_index(dir.path());
    let o = run(BLKDIFF, &[s(&img), s(&fidx)]);
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    // The index on standard input is read as one, its chunk size taken
    // from it (#57 item 7: "map the images again with the same
    // --block-size"), on either side.
    let piped = |args: &[&str]| {
        let out = std::process::Command::new(BLKDIFF)
            .args(args)
            .stdin(std::fs::File::open(&fidx).unwrap())
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    for args in [[s(&img), "-"], ["-", s(&img)]] {
        let (code, out, err) = piped(&args);
        assert_eq!((code, out.as_str()), (Some(0), ""), "{args:?}: {err}");
    }
    // A change in the second 4 MiB chunk (the written zeros).
    write(&img, "qcow2", &["write -P 1 5m 4k"]);
    let o = run(BLKDIFF, &[s(&img), s(&fidx)]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert_eq!(o.stdout, format!("{}+{}\n", 4 * MIB, 4 * MIB));
    let (code, out, err) = piped(&[s(&img), "-"]);
    assert_eq!((code, out), (Some(1), o.stdout.clone()), "{err}");
    // Either side; --json says the construction asked for.
    let o = run(
        BLKDIFF,
        &["--json", "--construction", "pbs", s(&fidx), s(&img)],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    let doc: serde_json::Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(doc["construction"], "pbs");
    assert_eq!(
        (doc["digest"].as_str(), doc["block-size"].as_u64()),
        (Some("sha256"), Some(4 * MIB))
    );
    assert_eq!(doc["ranges"][0]["offset"], 4 * MIB);
    // Other parameters than the index's are refused, naming it.
    let o = run(BLKDIFF, &["--block-size", "1m", s(&img), s(&fidx)]);
    assert_eq!(o.code, 2);
    assert!(o.stderr.contains(s(&fidx)), "{}", o.stderr);
}

/// blkdiff of two indexes of an 8 TiB disk (2 Mi chunks of 4 MiB: 64 MiB
/// of digests each), named or on standard input, peaks well under one
/// index's size: each is streamed into a map in a temporary file, never
/// held whole (as they were before: 265 MiB for the two).
#[test]
fn blkdiff_of_indexes_in_bounded_memory() {
    if !require(&["/usr/bin/time"]) {
        return;
    }
    let Some(dir) = scratch() else { return };
    let (chunks, chunk, differs) = (2u64 << 20, 4 * MIB, 1_234_567u64);
    let index = |name: &str, differ: Option<u64>| {
        let mut digests = Vec::with_capacity(chunks as usize * 32);
        for i in 0..chunks {
            let seed = if Some(i) == differ { i + chunks } else { i };
            let mut d = [0u8; 32];
            Algorithm::Sha256.digest_into(&seed.to_le_bytes(), &mut d);
            digests.extend_from_slice(&d);
        }
        let path = dir.path().join(name);
        std::fs::write(&path, fidx_of_digests(&digests, chunks * chunk, chunk).0).unwrap();
        path
    };
    let (a, b) = (index("a.fidx", None), index("b.fidx", Some(differs)));
    // Held whole, the two indexes' digests alone take 128 MiB; streamed,
    // blkdiff (a debug build) peaked at 15.3 to 16.0 MiB on machine D, at
    // the maps' own limit: this one leaves room for the index's buffers.
    let limit = 24 * MIB;
    let out = crate::bounded::bounded(dir.path(), BLKDIFF, &[s(&a), s(&b)], limit, 1);
    assert_eq!(out, format!("{}+{}\n", differs * chunk, chunk));
    // The same with one of them on standard input (exec: GNU time
    // measures blkdiff, not a shell).
    let out = crate::bounded::bounded(
        dir.path(),
        "sh",
        &["-c", "exec \"$0\" \"$1\" - < \"$2\"", BLKDIFF, s(&a), s(&b)],
        limit,
        1,
    );
    assert_eq!(out, format!("{}+{}\n", differs * chunk, chunk));
}

#[test]
fn bad_indexes_are_refused_naming_the_file() {
    let Some(dir) = scratch() else { return };
    let (img, fidx, _) = disk_and_index(dir.path());
    let good = std::fs::read(&fidx).unwrap();
    let patch = |at: usize, with: &[u8]| {
        let mut b = good.clone();
        b[at..at + with.len()].copy_from_slice(with);
        b
    };
    // The short last chunk with the digest of a full chunk of zeros, and
    // an index_csum true to that: what no backup can hold (found by the
    // fidx fuzz target, which got a map refused where the index was taken).
    let zero_tail = {
        let mut b = good.clone();
        let at = b.len() - 32;
        Algorithm::Sha256.digest_into(&vec![0u8; 4 << 20], &mut b[at..]);
        let mut csum = [0u8; 32];
        Algorithm::Sha256.digest_into(&b[4096..], &mut csum);
        b[32..64].copy_from_slice(&csum);
        b
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "zero-tail.fidx",
            zero_tail,
            "the short last chunk (2162688 bytes) has the digest of 4194304 bytes of zeros",
        ),
        ("short.fidx", good[..good.len() - 32].to_vec(), "not the"),
        ("long.fidx", [&good[..], &[0u8; 32]].concat(), "not the"),
        (
            "header.fidx",
            good[..100].to_vec(),
            "shorter than its 4096-byte header",
        ),
        (
            "npot.fidx",
            patch(72, &(3u64 << 20).to_le_bytes()),
            "not a power of two",
        ),
        (
            "huge.fidx",
            patch(72, &(128u64 << 20).to_le_bytes()),
            "not a power of two from 512 to 64 MiB",
        ),
        (
            "lies.fidx",
            patch(40, &[0xff]),
            "index_csum is not the SHA-256 of its digests",
        ),
        (
            "digest.fidx",
            patch(4096 + 40, &[0xff]),
            "index_csum is not the SHA-256 of its digests",
        ),
        (
            "size.fidx",
            patch(64, &(1u64 << 40).to_le_bytes()),
            "not the",
        ),
    ];
    for (name, bytes, why) in cases {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        for c in ["pbs", "blkhash"] {
            let o = run(BLKMAP, &["checksum", "--construction", c, s(&p)]);
            assert_eq!(
                (o.code, o.stdout.as_str()),
                (1, ""),
                "{name} {c}: {}",
                o.stderr
            );
            assert!(
                o.stderr
                    .contains(&format!("blkmap: {}: invalid PBS fixed index: ", s(&p))),
                "{name}: {}",
                o.stderr
            );
            assert!(o.stderr.contains(why), "{name}: {}", o.stderr);
        }
        // blkdiff: trouble (2), as for a damaged map; 1 means "differ".
        let o = run(BLKDIFF, &[s(&img), s(&p)]);
        assert_eq!((o.code, o.stdout.as_str()), (2, ""), "{name}: {}", o.stderr);
        assert!(
            o.stderr.contains(s(&p)) && o.stderr.contains(why),
            "{name}: {}",
            o.stderr
        );
    }
    // A bad magic is no fixed index: read as a map, which it is not either.
    let p = dir.path().join("magic.fidx");
    std::fs::write(&p, patch(0, b"PROXMOX!")).unwrap();
    let o = run(BLKMAP, &["checksum", s(&p)]);
    assert_eq!((o.code, o.stdout.as_str()), (1, ""), "{}", o.stderr);
    assert!(
        o.stderr.contains(s(&p)) && o.stderr.contains("bad magic"),
        "{}",
        o.stderr
    );
}

/// blksync takes an index as DST's state (DST restored from that backup):
/// DST is read only in the sampled chunks, the index is never written,
/// the state after the copy goes to --save-state, and the index is
/// refused once a run from it has written DST.
#[test]
fn blksync_takes_an_index_as_dsts_state() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let chunk = 4 << 20;
    let src = image(
        d,
        "src.qcow2",
        "qcow2",
        96 * MIB,
        &["write -P 0x33 0 3m", "write -P 0x44 40m 8m"],
    );
    let dst = d.join("restored.raw");
    let data = testkit::tools::guest_bytes(&src, &dst);
    std::fs::write(&dst, &data).unwrap();
    let fidx = d.join("drive-scsi0.img.fidx");
    let (bytes, _) = fidx_bytes(&data, chunk);
    std::fs::write(&fidx, &bytes).unwrap();
    // A chunk the state check does not sample, made to differ in DST
    // only: a run that takes the index does not see it.
    let checksum = blkhash::checksum_of(Algorithm::Sha256, chunk, &data);
    let jitter = u64::from_le_bytes(checksum.as_bytes()[..8].try_into().unwrap());
    let sampled = blkjob::state::spread(24, jitter);
    let hidden = (0..24u64)
        .find(|i| !sampled.contains(i) && *i != 20)
        .unwrap();
    write(&dst, "raw", &[&format!("write -P 0x55 {}m 4k", hidden * 4)]);
    write(&src, "qcow2", &["write -P 0x66 80m 4k"]);
    let map = d.join("dst.map");
    let from_index = |extra: &[&str]| {
        let mut args = vec!["--state", s(&fidx), s(&src), s(&dst)];
        args.extend(extra);
        run_kept(d, BLKSYNC, &args)
    };

    // The state after the copy must go somewhere: refused, DST untouched.
    let before = std::fs::read(&dst).unwrap();
    let o = from_index(&[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(
        o.stderr.contains(s(&fidx)) && o.stderr.contains("--save-state"),
        "{}",
        o.stderr
    );
    assert_eq!(std::fs::read(&dst).unwrap(), before);
    // A dry run needs none: the chunk SRC changed, nothing else.
    let o = from_index(&["-n"]);
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (0, "83886080+4194304\n"),
        "{}",
        o.stderr
    );

    let o = from_index(&["--save-state", s(&map)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(crate::sync::written(&o.stderr), 4 * MIB);
    // It says what it checked of DST, and what it leaves.
    assert!(
        o.stderr.contains(&format!(
            "{}: taken as DST's state: {} of its 24 chunks read from DST",
            s(&fidx),
            sampled.len()
        )),
        "{}",
        o.stderr
    );
    assert!(
        o.stderr
            .contains(&format!("state saved: {} (SRC's map", s(&map)))
            && o.stderr
                .contains(&format!("and {}.dst (DST's identity", s(&map))),
        "{}",
        o.stderr
    );
    assert_eq!(
        std::fs::read(&fidx).unwrap(),
        bytes,
        "the index was written"
    );
    let off = (hidden * 4 * MIB) as usize;
    let now = std::fs::read(&dst).unwrap();
    assert_eq!(
        now[off..off + 4096],
        [0x55; 4096],
        "DST was read and mended"
    );
    assert_eq!(now[80 * MIB as usize], 0x66);
    // The saved state is SRC's map, in the index's digest and chunk size.
    let sum = run(BLKMAP, &["checksum", s(&map)]);
    let want = run(&blksum(), &["-d", "sha256", "--block-size", "4m", s(&src)]);
    assert_eq!(
        sum.stdout.split(' ').next(),
        want.stdout.split(' ').next(),
        "{} {}",
        sum.stderr,
        want.stderr
    );

    // The index no longer says what DST holds: refused, naming the map;
    // so it is when only the record a run from it began with is left.
    for remove in [false, true] {
        if remove {
            std::fs::remove_file(&map).unwrap();
        }
        let o = from_index(&["--save-state", s(&map)]);
        assert_eq!(o.code, 1, "{}", o.stderr);
        assert!(o.stderr.contains("--state"), "{}", o.stderr);
        assert!(o.stderr.contains("exists"), "{}", o.stderr);
    }
    // The index (or another) as where to save: refused, naming it.
    let o = from_index(&["--save-state", s(&fidx)]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("never writes one"), "{}", o.stderr);
    assert_eq!(std::fs::read(&fidx).unwrap(), bytes);
    // A map given as --state has nowhere else to be saved.
    let other = d.join("x.map");
    let o = run(
        BLKSYNC,
        &[
            "--state",
            s(&map),
            "--save-state",
            s(&other),
            s(&src),
            s(&dst),
        ],
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    assert!(o.stderr.contains("--save-state is for"), "{}", o.stderr);
}

/// A run from an index that wrote DST supersedes the index for every
/// later run, whatever map that run names (#57 item 1: SRC rolled back to
/// the backup, the same index with `--save-state run2.map` wrote nothing
/// and left DST holding run 1's chunk, exit 0).
#[test]
fn an_index_is_refused_once_a_run_wrote_dst_whatever_map_is_named() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let chunk = 4 << 20;
    let src = image(d, "src.qcow2", "qcow2", 96 * MIB, &["write -P 0x33 0 3m"]);
    let dst = d.join("restored.raw");
    let data = testkit::tools::guest_bytes(&src, &dst);
    std::fs::write(&dst, &data).unwrap();
    let fidx = d.join("drive-scsi0.img.fidx");
    std::fs::write(&fidx, fidx_bytes(&data, chunk).0).unwrap();
    // A chunk of zeros the state check does not sample.
    let checksum = blkhash::checksum_of(Algorithm::Sha256, chunk, &data);
    let jitter = u64::from_le_bytes(checksum.as_bytes()[..8].try_into().unwrap());
    let sampled = blkjob::state::spread(24, jitter);
    let hidden = (1..24u64).find(|i| !sampled.contains(i)).unwrap();
    let at = format!("{}m", hidden * 4);
    let sync = |map: &str, extra: &[&str]| {
        let map = d.join(map);
        let mut args = vec!["--state", s(&fidx), "--save-state", s(&map)];
        args.extend(extra);
        args.extend([s(&src), s(&dst)]);
        run_kept(d, BLKSYNC, &args)
    };

    write(&src, "qcow2", &[&format!("write -P 0x66 {at} 4k")]);
    let o = sync("run1.map", &[]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(crate::sync::written(&o.stderr), 4 * MIB);
    // SRC back to the backup's content: the index and SRC agree again.
    write(&src, "qcow2", &[&format!("write -z {at} 4k")]);
    let o = sync("run2.map", &[]);
    assert_eq!(o.code, 1, "DST left holding run 1's chunk: {}", o.stderr);
    assert!(
        o.stderr.contains("blksync wrote DST at")
            && o.stderr
                .contains(&format!("--state {}", s(&d.join("run1.map")))),
        "{}",
        o.stderr
    );
    assert!(!d.join("run2.map").exists());
    // Reading DST instead of the index makes it right.
    let o = sync("run2.map", &["--force-rescan"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("4194304 zeroed"), "{}", o.stderr);
    assert!(
        std::fs::read(&dst).unwrap() == data,
        "DST is not the backup"
    );
    // A run from the map wrote DST too: the index stays refused.
    write(&src, "qcow2", &[&format!("write -P 0x77 {at} 4k")]);
    let map2 = d.join("run2.map");
    let o = run_kept(d, BLKSYNC, &["--state", s(&map2), s(&src), s(&dst)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    write(&src, "qcow2", &[&format!("write -z {at} 4k")]);
    let o = sync("run3.map", &[]);
    assert_eq!(o.code, 1, "{}", o.stderr);
    // DST restored from the backup again (by other means): the index
    // describes it again.
    std::fs::write(&dst, &data).unwrap();
    let o = sync("run3.map", &[]);
    assert_eq!(
        (o.code, crate::sync::written(&o.stderr)),
        (0, 0),
        "{}",
        o.stderr
    );
}

/// A backup in its datastore is the disk it holds for every command
/// (#59 items 2 and 3): blksum in any construction equals blksum of the
/// disk, an encrypted one with its key file; blksync restores it into an
/// existing disk writing only what differs, and the result's checksum is
/// the backup's.
#[test]
fn a_backup_in_its_datastore_is_the_disk_it_holds() {
    use testkit::pbs::{Backup, Kdf, key_file, write_backup};
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let mut data: Vec<u8> = (0..10 * MIB as usize + 4096)
        .map(|i| (i % 253) as u8)
        .collect();
    data[4 << 20..8 << 20].fill(0);
    let disk = d.join("disk.raw");
    std::fs::write(&disk, &data).unwrap();
    let key = [0x42u8; 32];
    let keyfile = d.join("key.json");
    std::fs::write(&keyfile, key_file(&key, Kdf::Pbkdf2, b"s3cret pass")).unwrap();
    let pass = d.join("pass");
    std::fs::write(&pass, "s3cret pass\n").unwrap();
    let plain = write_backup(&d.join("store"), &Backup::of(&data));
    let b = Backup {
        key: Some(key),
        ..Backup::of(&data)
    };
    let encrypted = write_backup(&d.join("enc"), &b);
    let blksum = blksum();
    for args in [
        &[][..],
        &["--construction", "pbs"],
        &["--construction", "imageio", "-d", "sha1"],
    ] {
        let want = run(&blksum, &[args, &[s(&disk)]].concat());
        let want = want.stdout.split(' ').next().unwrap().to_string();
        for (index, extra) in [
            (&plain, vec![]),
            (
                &encrypted,
                vec!["--keyfile", s(&keyfile), "--secret-file", s(&pass)],
            ),
        ] {
            // With a key, the pbs construction's block digests are keyed
            // (keyed.rs): the encrypted index's index_csum, not the disk's.
            let want = match (args, extra.is_empty()) {
                (["--construction", "pbs"], false) => {
                    blkhash::to_hex(&std::fs::read(index).unwrap()[32..64])
                }
                _ => want.clone(),
            };
            let o = run(&blksum, &[args, &extra, &[s(index)]].concat());
            assert_eq!(o.code, 0, "{args:?} {extra:?}: {}", o.stderr);
            assert_eq!(
                o.stdout,
                format!("{want}  {}\n", s(index)),
                "{args:?} {extra:?}"
            );
        }
    }
    // A wrong passphrase: refused naming the key file, no checksum.
    std::fs::write(&pass, "wrong\n").unwrap();
    let o = run(
        &blksum,
        &[
            "--keyfile",
            s(&keyfile),
            "--secret-file",
            s(&pass),
            s(&encrypted),
        ],
    );
    assert_eq!((o.code, o.stdout.as_str()), (1, ""), "{}", o.stderr);
    assert!(
        o.stderr.contains("the passphrase does not open it"),
        "{}",
        o.stderr
    );

    // Rolled back into an existing disk: only what differs is written.
    let dst = d.join("dst.raw");
    let mut changed = data.clone();
    changed[100..200].fill(9);
    changed[9 << 20] ^= 1;
    std::fs::write(&dst, &changed).unwrap();
    let o = run(BLKSYNC, &[s(&plain), s(&dst)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(crate::sync::written(&o.stderr), 2 * 65536, "{}", o.stderr);
    assert!(
        std::fs::read(&dst).unwrap() == data,
        "DST is not the backup"
    );
    let a = run(&blksum, &["--construction", "pbs", s(&dst)]);
    let b = run(&blksum, &["--construction", "pbs", s(&plain)]);
    assert_eq!(a.stdout.split(' ').next(), b.stdout.split(' ').next());
}
