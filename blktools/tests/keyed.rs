//! An encrypted Proxmox backup's index compared with a disk by its key
//! (`--keyfile`): its chunk digests are `SHA-256(chunk || id key)`, so the
//! disk is hashed with the same key, a zero chunk's keyed digest is a zero
//! block on both sides, and a wrong or missing key is an error naming the
//! fingerprints, never "every block differs". The datastore is written
//! from the published format by testkit's encoder.

use crate::common::*;
use crate::fidx::{blksum, run_kept};
use std::path::{Path, PathBuf};
use testkit::pbs::{Backup, Kdf, fingerprint, key_file, write_backup};

const KEY: [u8; 32] = [0x42; 32];

/// A disk of 10 MiB + 4 KiB (chunk 1 all zeros, the last chunk short), an
/// encrypted backup of it and its key file: the disk, the index, the key
/// file and the index's `index_csum` in hex.
fn encrypted(d: &Path) -> (PathBuf, PathBuf, PathBuf, String) {
    let mut data: Vec<u8> = (0..10 * MIB as usize + 4096)
        .map(|i| (i % 251) as u8)
        .collect();
    data[4 << 20..8 << 20].fill(0);
    let disk = d.join("disk.raw");
    std::fs::write(&disk, &data).unwrap();
    let keyfile = d.join("key.json");
    std::fs::write(&keyfile, key_file(&KEY, Kdf::None, b"")).unwrap();
    let b = Backup {
        key: Some(KEY),
        ..Backup::of(&data)
    };
    let index = write_backup(&d.join("store"), &b);
    let csum = blkhash::to_hex(&std::fs::read(&index).unwrap()[32..64]);
    (disk, index, keyfile, csum)
}

#[test]
fn a_disk_hashed_with_the_key_is_its_encrypted_backup() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let (disk, index, keyfile, csum) = encrypted(d);
    let key = ["--keyfile", s(&keyfile)];
    // The pbs construction keyed: the index's index_csum, from the disk
    // and from the backup read from its chunks alike.
    for input in [&disk, &index] {
        let o = run(
            &blksum(),
            &[&key[..], &["--construction", "pbs", s(input)]].concat(),
        );
        assert_eq!(o.code, 0, "{}", o.stderr);
        assert_eq!(o.stdout, format!("{csum}  {}\n", s(input)));
    }
    // Without the key the disk's plain checksum is another one.
    let o = run(&blksum(), &["--construction", "pbs", s(&disk)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stdout.starts_with(&csum), "{}", o.stdout);

    // blkdiff: the same disk (its zero chunk a zero block both sides).
    let o = run(BLKDIFF, &[&key[..], &[s(&disk), s(&index)]].concat());
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    // A map blkmap writes with the key is the index's map.
    let map = d.join("disk.map");
    let o = run(BLKMAP, &[&key[..], &[s(&disk), s(&map)]].concat());
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = run(BLKDIFF, &[&key[..], &[s(&map), s(&index)]].concat());
    assert_eq!((o.code, o.stdout.as_str()), (0, ""), "{}", o.stderr);
    // A change in the zero chunk and one in the short last chunk.
    write(&disk, "raw", &["write -P 1 5m 4k", "write -P 2 10m 4k"]);
    let o = run(BLKDIFF, &[&key[..], &[s(&index), s(&disk)]].concat());
    assert_eq!(o.code, 1, "{}", o.stderr);
    // Chunks 1 and 2, next to each other: one range.
    assert_eq!(o.stdout, format!("{}+{}\n", 4 * MIB, 6 * MIB + 4096));
}

#[test]
fn a_wrong_or_missing_key_is_said_with_its_fingerprints() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let (disk, index, _, _) = encrypted(d);
    let other = [7u8; 32];
    let wrong = d.join("other.json");
    std::fs::write(&wrong, key_file(&other, Kdf::None, b"")).unwrap();
    let state = d.join("state.map");
    let dst = d.join("dst.raw");
    std::fs::copy(&disk, &dst).unwrap();
    for (bin, args) in [
        (BLKDIFF, vec![s(&disk), s(&index)]),
        (
            BLKSYNC,
            vec![
                "--state",
                s(&index),
                "--save-state",
                s(&state),
                s(&disk),
                s(&dst),
            ],
        ),
    ] {
        let o = run_kept(d, bin, &[&["--keyfile", s(&wrong)][..], &args].concat());
        assert!(o.code == 1 || o.code == 2, "{bin}: {}", o.stderr);
        assert_eq!(o.stdout, "", "{bin}");
        for fp in [fingerprint(&KEY), fingerprint(&other)] {
            assert!(o.stderr.contains(&fp), "{bin}: {fp} not in {}", o.stderr);
        }
        // No key: the backup is encrypted, said so.
        let o = run_kept(d, bin, &args);
        assert!(o.code == 1 || o.code == 2, "{bin}: {}", o.stderr);
        assert!(o.stderr.contains("encrypted backup"), "{bin}: {}", o.stderr);
    }
    // A key given for a backup that is not encrypted.
    let plain_data = std::fs::read(&disk).unwrap();
    let plain = write_backup(&d.join("plain"), &Backup::of(&plain_data));
    let o = run(BLKDIFF, &["--keyfile", s(&wrong), s(&disk), s(&plain)]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("not encrypted"), "{}", o.stderr);
    assert!(!state.exists());
}

#[test]
fn blksync_takes_an_encrypted_index_as_dsts_state() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let (disk, index, keyfile, _) = encrypted(d);
    // DST holds the backup; SRC changed one chunk since.
    let dst = d.join("dst.raw");
    std::fs::copy(&disk, &dst).unwrap();
    write(&disk, "raw", &["write -P 9 1m 4k"]);
    let state = d.join("dst.map");
    let o = run_kept(
        d,
        BLKSYNC,
        &[
            "--keyfile",
            s(&keyfile),
            "--state",
            s(&index),
            "--save-state",
            s(&state),
            s(&disk),
            s(&dst),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(crate::sync::written(&o.stderr), 4 * MIB, "{}", o.stderr);
    assert!(std::fs::read(&dst).unwrap() == std::fs::read(&disk).unwrap());
}

/// `blksum --construction pbs` of a backup in its datastore reads every
/// chunk once, checked against the index, and prints the index's digests'
/// checksum: a chunk that lies or is missing is an error naming it, never
/// a checksum; a chunk of zeros is not read (the index says it is zeros).
#[test]
fn the_pbs_construction_checks_every_chunk_once() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let mut data: Vec<u8> = (0..10 * MIB as usize + 4096)
        .map(|i| (i % 241) as u8)
        .collect();
    data[4 << 20..8 << 20].fill(0);
    let index = write_backup(&d.join("store"), &Backup::of(&data));
    let csum = blkhash::to_hex(&std::fs::read(&index).unwrap()[32..64]);
    let chunk = |i: usize| {
        let c = &data[i * 4 * MIB as usize..((i + 1) * 4 * MIB as usize).min(data.len())];
        let hex = blkhash::to_hex(&testkit::pbs::chunk_digest(c, None));
        d.join("store/.chunks").join(&hex[..4]).join(hex)
    };
    let pbs = || run(&blksum(), &["--construction", "pbs", s(&index)]);
    let o = pbs();
    assert_eq!(
        (o.code, o.stdout.clone()),
        (0, format!("{csum}  {}\n", s(&index))),
        "{}",
        o.stderr
    );
    // The zero chunk is not read.
    std::fs::remove_file(chunk(1)).unwrap();
    assert_eq!(pbs().stdout, o.stdout);
    // The last chunk holding other bytes of its length: named, no checksum.
    let other = testkit::pbs::blob(&vec![3u8; 2 * MIB as usize + 4096], true, None);
    std::fs::write(chunk(2), other).unwrap();
    let o = pbs();
    assert_eq!((o.code, o.stdout.as_str()), (1, ""), "{}", o.stderr);
    assert!(
        o.stderr.contains("chunk 2 (disk offset 8388608)")
            && o.stderr.contains("does not have the digest"),
        "{}",
        o.stderr
    );
    // The first one missing.
    std::fs::remove_file(chunk(0)).unwrap();
    let o = pbs();
    assert_eq!((o.code, o.stdout.as_str()), (1, ""), "{}", o.stderr);
    assert!(o.stderr.contains("chunk 0 (disk offset 0)"), "{}", o.stderr);
}
