//! Chains the user names (`OpenOptions::chain`): standalone qcow2 images
//! read oldest first, each over the one before, against QEMU's reading of
//! the same files chained with `qemu-img rebase -u`; and the first bytes
//! of an image (`OpenOptions::size`).

use crate::common;

use blkimage::{Format, OpenOptions};
use common::{open_with, read_by_extents, read_plain};
use std::path::Path;
use testkit::tools::{guest_bytes, qemu_img_in, qemu_io, scratch};

const MIB: u64 = 1 << 20;

fn chained() -> OpenOptions {
    OpenOptions {
        chain: true,
        ..Default::default()
    }
}

/// Standalone qcow2 images of `sizes` in `dir` (a full backup, then
/// incrementals), each written by `writes`: their names, oldest first.
fn backups(dir: &Path, sizes: &[u64], writes: &[&[&str]]) -> Vec<String> {
    let mut names = Vec::new();
    for (i, (size, cmds)) in sizes.iter().zip(writes).enumerate() {
        let name = format!("b{i}.qcow2");
        let p = dir.join(&name);
        testkit::tools::create(
            &p,
            "qcow2",
            &["-o", "cluster_size=65536"],
            &size.to_string(),
        );
        qemu_io(&p, "qcow2", cmds);
        names.push(name);
    }
    names
}

/// QEMU's bytes of the chain: copies of the files rebased with `qemu-img
/// rebase -u`, each over the one before, then converted.
fn rebased(dir: &Path, names: &[String]) -> Vec<u8> {
    let copies: Vec<String> = names.iter().map(|n| format!("rebased-{n}")).collect();
    for (n, c) in names.iter().zip(&copies) {
        std::fs::copy(dir.join(n), dir.join(c)).unwrap();
    }
    for w in copies.windows(2) {
        qemu_img_in(dir, &["rebase", "-u", "-F", "qcow2", "-b", &w[0], &w[1]]);
    }
    let top = dir.join(copies.last().unwrap());
    let want = guest_bytes(&top, &dir.join("rebased.raw"));
    for c in &copies {
        std::fs::remove_file(dir.join(c)).unwrap();
    }
    want
}

fn chain_name(dir: &Path, names: &[String]) -> String {
    let paths: Vec<String> = names
        .iter()
        .map(|n| dir.join(n).to_str().unwrap().to_string())
        .collect();
    paths.join(",")
}

/// Three standalone images: full, then two incrementals that write data,
/// zeros (a zero cluster over data below) and discard, at sizes equal,
/// growing, shrinking and mixed: read as QEMU reads them rebased.
#[test]
fn chain_reads_as_rebased_chain() {
    let writes: [&[&str]; 3] = [
        &["write -P 0x11 0 3M", "write -P 0x12 3584k 512k"],
        &[
            "write -P 0x21 1M 64k",
            "write -z 2M 512k",
            "write -P 0x22 3M 1M",
        ],
        &[
            "write -P 0x31 100k 8k",
            "write -z 0 64k",
            "write -P 0x32 3968k 64k",
        ],
    ];
    for sizes in [
        [4 * MIB, 4 * MIB, 4 * MIB],
        [4 * MIB, 6 * MIB, 8 * MIB],
        [8 * MIB, 6 * MIB, 4 * MIB],
        [4 * MIB, 5 * MIB - 512, 6 * MIB],
        [6 * MIB, 4 * MIB, 8 * MIB],
    ] {
        let dir = scratch();
        let d = dir.path();
        let names = backups(d, &sizes, &writes);
        let want = rebased(d, &names);
        let src = open_with(chain_name(d, &names), &chained()).unwrap();
        assert_eq!(src.format(), "qcow2");
        assert_eq!(src.size(), sizes[2], "{sizes:?}: the last image's size");
        assert!(read_by_extents(&*src, MIB) == want, "{sizes:?}: by extents");
        assert!(read_plain(&*src, 100_000) == want, "{sizes:?}: plain reads");
        src.finish().unwrap();
        // Two of them, and a raw full backup below a qcow2 incremental.
        let two = open_with(chain_name(d, &names[..2]), &chained()).unwrap();
        assert!(
            read_plain(&*two, 1 << 20) == rebased(d, &names[..2]),
            "{sizes:?}"
        );
        let raw = d.join("full.raw");
        testkit::tools::flatten(&d.join(&names[0]), &raw);
        let mixed = format!("{},{}", raw.display(), d.join(&names[1]).display());
        let src = open_with(&mixed, &chained()).unwrap();
        assert!(
            read_plain(&*src, 1 << 20) == rebased(d, &names[..2]),
            "{sizes:?}: raw below"
        );
    }
}

/// A name without a comma is an image as without `chain`; with `chain`
/// off, a name with commas is one file's.
#[test]
fn one_name_is_one_image() {
    let dir = scratch();
    let d = dir.path();
    let names = backups(d, &[MIB], &[&["write -P 1 0 64k"]]);
    let one = open_with(d.join(&names[0]), &chained()).unwrap();
    assert_eq!(one.size(), MIB);
    let comma = d.join("a,b.img");
    std::fs::write(&comma, [7u8; 4096]).unwrap();
    let plain = open_with(&comma, &OpenOptions::default()).unwrap();
    assert_eq!(plain.format(), "raw");
}

/// Every bad chain is an error naming the file: missing, named twice (a
/// loop), not qcow2, an incremental that names a backing file, names that
/// are not files of this host.
#[test]
fn bad_chains_name_the_file() {
    let dir = scratch();
    let d = dir.path();
    let names = backups(
        d,
        &[MIB, MIB],
        &[&["write -P 1 0 64k"], &["write -P 2 0 4k"]],
    );
    let (full, inc) = (d.join(&names[0]), d.join(&names[1]));
    let text = d.join("notes.txt");
    std::fs::write(&text, "not an image\n").unwrap();
    qemu_img_in(
        d,
        &[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            &names[0],
            "-F",
            "qcow2",
            "over.qcow2",
        ],
    );
    let over = d.join("over.qcow2");
    let missing = d.join("gone.qcow2");
    let err = |name: String| match blkimage::open(&name, &chained()) {
        Ok(_) => panic!("{name}: opened"),
        Err(e) => e.to_string(),
    };
    let show = |p: &Path| p.display().to_string();
    let cases = [
        (
            format!("{},{}", show(&full), show(&missing)),
            show(&missing),
            "No such file",
        ),
        (
            format!("{},{}", show(&full), show(&full)),
            show(&full),
            "named twice",
        ),
        (
            format!("{},{},{}", show(&full), show(&inc), show(&full)),
            show(&full),
            "named twice",
        ),
        (
            format!("{},{}", show(&full), show(&text)),
            show(&text),
            "not a qcow2 image",
        ),
        (
            format!("{},{}", show(&inc), show(&over)),
            show(&over),
            "backing file",
        ),
        (
            format!("{},", show(&full)),
            String::new(),
            "files of this host",
        ),
        (
            format!("{},-", show(&full)),
            "'-'".into(),
            "files of this host",
        ),
        (
            format!("{},http://example.com/x.qcow2", show(&full)),
            "http://example.com/x.qcow2".into(),
            "files of this host",
        ),
        (
            format!("{},{}", show(d), show(&inc)),
            show(d),
            "not a regular file",
        ),
    ];
    for (name, names_it, why) in cases {
        let e = err(name.clone());
        assert!(e.contains(&names_it) && e.contains(why), "{name}: {e}");
    }
    // A chain deeper than a backing chain may be.
    let long = vec![show(&full); 65].join(",");
    assert!(err(long).contains("more than 64"));
    // -f names the first image's format: raw below a qcow2 incremental.
    let opts = OpenOptions {
        format: Some(Format::Raw),
        ..chained()
    };
    let src = open_with(format!("{},{}", show(&full), show(&inc)), &opts).unwrap();
    assert_eq!(src.size(), MIB);
}

/// `size`: the first bytes of an image or a stream, as an input of that
/// size; more than there is is an error.
#[test]
fn first_bytes_of_an_image() {
    let dir = scratch();
    let d = dir.path();
    let disk = d.join("disk.raw");
    let mut bytes: Vec<u8> = (0..4 * MIB).map(|i| (i % 251) as u8).collect();
    std::fs::write(&disk, &bytes).unwrap();
    let opts = OpenOptions {
        size: Some(MIB + 512),
        ..Default::default()
    };
    let src = open_with(&disk, &opts).unwrap();
    assert_eq!(src.size(), MIB + 512);
    bytes.truncate((MIB + 512) as usize);
    assert!(read_by_extents(&*src, 65536) == bytes);
    let opts = OpenOptions {
        size: Some(4 * MIB + 1),
        ..Default::default()
    };
    let e = blkimage::open(&disk, &opts).err().unwrap().to_string();
    assert!(e.contains("4194305 bytes") && e.contains("4194304"), "{e}");
}
