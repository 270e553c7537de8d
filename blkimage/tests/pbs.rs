//! Proxmox Backup Server backups read from their datastores, written by
//! testkit's encoder from the published format (apart from the decoder):
//! plain, zstd, encrypted and both; key files of every kdf; namespaces; a
//! 0-byte disk and a short last chunk; the vectors proxmox-backup's own
//! tests publish; and hostile chunks, keys and manifests, refused naming
//! the chunk, its offset in the disk and the snapshot.

use blkimage::pbs::store::{Key, blob};
use blkimage::{Input, OpenOptions, Source};
use std::path::{Path, PathBuf};
use testkit::pbs::{Backup, Kdf, key_file, write_backup};

const MIB: usize = 1 << 20;

/// A disk of `len` bytes: data, a full chunk of zeros (the second), text.
fn disk(len: usize) -> Vec<u8> {
    let mut d: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    if len > 8 * MIB {
        d[4 * MIB..8 * MIB].fill(0);
    }
    d
}

fn open(index: &Path, keyfile: Option<&Path>) -> std::io::Result<Box<dyn Source>> {
    let opts = OpenOptions {
        keyfile: keyfile.map(Path::to_path_buf),
        ..Default::default()
    };
    match blkimage::open(index, &opts)? {
        Input::Image(s) => Ok(s),
        Input::Stream(_) => panic!("a backup is an image"),
    }
}

/// Every byte of `src`, read as the reader reads: data extents read, zero
/// extents as zeros.
fn read_all(src: &dyn Source) -> std::io::Result<Vec<u8>> {
    let mut out = vec![0u8; src.size() as usize];
    for e in src.extents(0, src.size())? {
        if e.kind.is_zero() {
            continue;
        }
        let mut at = e.offset;
        while at < e.end() {
            let n = (e.end() - at).min(MIB as u64 * 3 / 2);
            src.read_at(&mut out[at as usize..(at + n) as usize], at)?;
            at += n;
        }
    }
    src.finish()?;
    Ok(out)
}

fn key_of(seed: u8) -> [u8; 32] {
    [seed; 32]
}

/// Each kind of blob, each kdf, a namespace: the disk back, byte for byte.
#[test]
fn every_kind_of_backup_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let data = disk(10 * MIB + 12345);
    let cases = [
        (false, None, Kdf::None, None),
        (true, None, Kdf::None, Some("team/sub")),
        (false, Some(key_of(3)), Kdf::None, None),
        (true, Some(key_of(4)), Kdf::Scrypt, None),
        (true, Some(key_of(5)), Kdf::Pbkdf2, Some("x")),
    ];
    for (n, (compress, key, kdf, ns)) in cases.into_iter().enumerate() {
        let store = dir.path().join(format!("store{n}"));
        let b = Backup {
            compress,
            key,
            ns,
            ..Backup::of(&data)
        };
        let index = write_backup(&store, &b);
        let keyfile = key.map(|k| {
            let p = dir.path().join(format!("key{n}.json"));
            std::fs::write(&p, key_file(&k, kdf, b"correct horse")).unwrap();
            p
        });
        // SAFETY: the tests of this file set it to the same value.
        unsafe { std::env::set_var("PBS_ENCRYPTION_PASSWORD", "correct horse") };
        let src = open(&index, keyfile.as_deref()).unwrap();
        assert_eq!((src.format(), src.size()), ("pbs", data.len() as u64));
        let zeros = src.extents(4 * MIB as u64, 4 * MIB as u64).unwrap();
        assert!(zeros[0].kind.is_zero(), "case {n}: {zeros:?}");
        assert!(read_all(&*src).unwrap() == data, "case {n}");
    }
}

/// A 0-byte disk (no chunks), and one of one short chunk.
#[test]
fn empty_and_short_disks() {
    let dir = tempfile::tempdir().unwrap();
    for len in [0, 1000] {
        let data = disk(len);
        let store = dir.path().join(format!("s{len}"));
        let index = write_backup(&store, &Backup::of(&data));
        let src = open(&index, None).unwrap();
        assert_eq!(read_all(&*src).unwrap(), data);
    }
}

/// proxmox-backup's tests/blob_writer.rs: the data `i % 255` for i below
/// 100000 has these digests, plain and with the key `[1; 32]`.
#[test]
fn the_published_digests() {
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 255) as u8).collect();
    let plain: [u8; 32] = [
        83, 154, 96, 195, 167, 204, 38, 142, 204, 224, 130, 201, 24, 71, 2, 188, 130, 155, 177, 6,
        162, 100, 61, 238, 38, 219, 63, 240, 191, 132, 87, 238,
    ];
    let keyed: [u8; 32] = [
        50, 162, 191, 93, 255, 132, 9, 14, 127, 23, 92, 39, 246, 102, 245, 204, 130, 104, 4, 106,
        182, 239, 218, 14, 80, 17, 150, 188, 239, 253, 198, 117,
    ];
    let store = blkimage::pbs::store::ChunkStore::new(Path::new("/nonexistent"), None);
    assert_eq!(store.digest(&data), plain);
    assert_eq!(Key::new([1; 32]).digest(&data), keyed);
    // The key 0..31's fingerprint (pbs-key-config's fingerprint_checks).
    let key = Key::new((0u8..32).collect::<Vec<_>>().try_into().unwrap());
    assert_eq!(
        key.fingerprint_text(),
        "0e:ab:d4:46:0b:6e:b9:ca:34:50:23:de:e2:b7:78:c7:90:e5:4a:16:83:b9:65:9c:0a:57:ae:19:90:90:15:9b"
    );
    assert_eq!(
        testkit::pbs::fingerprint(&(0u8..32).collect::<Vec<_>>().try_into().unwrap()),
        key.fingerprint_text()
    );
}

/// Hostile blobs: each refused with its reason, nothing decoded.
#[test]
fn hostile_blobs_are_refused() {
    let key = Key::new(key_of(9));
    let data = disk(64 * 1024);
    let good = testkit::pbs::blob(&data, false, None);
    let mut bad_magic = good.clone();
    bad_magic[0] ^= 1;
    let mut bad_crc = good.clone();
    bad_crc[20] ^= 1;
    // 32 MiB of zeros compressed: past any chunk's 16 MiB.
    let bomb = testkit::pbs::blob(&vec![0u8; 32 * MIB], true, None);
    // A GCM tag that fails, the CRC made true again.
    let mut tag = testkit::pbs::blob(&data, true, Some(&key_of(9)));
    tag[50] ^= 1;
    let crc = crc32fast::hash(&tag[44..]);
    tag[8..12].copy_from_slice(&crc.to_le_bytes());
    let other_key = testkit::pbs::blob(&data, false, Some(&key_of(8)));
    let cases: Vec<(&str, Vec<u8>, usize, &str)> = vec![
        ("magic", bad_magic, data.len(), "bad magic"),
        ("crc", bad_crc, data.len(), "CRC"),
        ("bomb", bomb, 16 * MIB, "more than 16777216 bytes"),
        ("tag", tag, data.len(), "GCM tag"),
        ("key", other_key, data.len(), "GCM tag"),
        (
            "short",
            good[..10].to_vec(),
            data.len(),
            "shorter than its 12-byte header",
        ),
        (
            "enc-short",
            [&blob::ENCRYPTED[..], &[0u8; 20]].concat(),
            10,
            "shorter than its 44-byte",
        ),
    ];
    for (name, raw, max, why) in cases {
        let e = blob::decode(&raw, Some(&key), max).unwrap_err();
        assert!(e.contains(why), "{name}: {e}");
    }
    let e = blob::decode(
        &testkit::pbs::blob(&data, false, Some(&key_of(9))),
        None,
        1 << 20,
    );
    assert!(e.unwrap_err().contains("no key"));
}

/// A backup whose chunks or manifest were damaged, or read with the wrong
/// key: an error naming the snapshot, the chunk, its offset and why.
#[test]
fn damaged_datastores_name_the_chunk_and_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let data = disk(10 * MIB + 100);
    let store = dir.path().join("store");
    let b = Backup {
        key: Some(key_of(7)),
        ..Backup::of(&data)
    };
    let index = write_backup(&store, &b);
    let keyfile = dir.path().join("key.json");
    std::fs::write(&keyfile, key_file(&key_of(7), Kdf::None, b"")).unwrap();
    let chunk = |i: usize| -> PathBuf {
        let d = testkit::pbs::chunk_digest(
            &data[i * 4 * MIB..((i + 1) * 4 * MIB).min(data.len())],
            Some(&key_of(7)),
        );
        let hex: String = d.iter().map(|x| format!("{x:02x}")).collect();
        store.join(".chunks").join(&hex[..4]).join(hex)
    };
    let err = |keyfile: Option<&Path>| match open(&index, keyfile) {
        Ok(src) => read_all(&*src).unwrap_err().to_string(),
        Err(e) => e.to_string(),
    };
    // Without the key: refused, naming the key the backup was made with.
    let e = err(None);
    assert!(
        e.contains("an encrypted backup") && e.contains(&testkit::pbs::fingerprint(&key_of(7))),
        "{e}"
    );
    // Another key: both fingerprints named.
    let wrong = dir.path().join("wrong.json");
    std::fs::write(&wrong, key_file(&key_of(6), Kdf::None, b"")).unwrap();
    let e = err(Some(&wrong));
    assert!(
        e.contains(&testkit::pbs::fingerprint(&key_of(6)))
            && e.contains(&testkit::pbs::fingerprint(&key_of(7))),
        "{e}"
    );
    assert_eq!(
        read_all(&*open(&index, Some(&keyfile)).unwrap()).unwrap(),
        data
    );

    // The last chunk (short) holding the first chunk's blob: a lie.
    let last = chunk(2);
    let saved = std::fs::read(&last).unwrap();
    std::fs::copy(chunk(0), &last).unwrap();
    let e = err(Some(&keyfile));
    assert!(
        e.starts_with("vm/100/2026-11-28T10:00:00Z: chunk 2 (disk offset 8388608): "),
        "{e}"
    );
    assert!(e.contains("it holds more than 2097252 bytes"), "{e}");
    // The first chunk holding other bytes of its length: a digest that lies.
    let first = chunk(0);
    let kept = std::fs::read(&first).unwrap();
    let other = testkit::pbs::blob(&vec![1u8; 4 * MIB], true, Some(&key_of(7)));
    std::fs::write(&first, other).unwrap();
    let e = err(Some(&keyfile));
    assert!(
        e.contains("chunk 0 (disk offset 0)") && e.contains("does not have the digest"),
        "{e}"
    );
    std::fs::write(&first, kept).unwrap();
    // Missing, and renamed .bad by a verify job.
    std::fs::remove_file(&last).unwrap();
    let e = err(Some(&keyfile));
    assert!(
        e.contains("chunk 2 (disk offset 8388608)") && e.contains("No such file"),
        "{e}"
    );
    std::fs::write(format!("{}.0.bad", last.display()), &saved).unwrap();
    let e = err(Some(&keyfile));
    assert!(e.contains("renamed .bad by a verify job"), "{e}");
    std::fs::write(&last, &saved).unwrap();
    // A manifest that lists another csum.
    let manifest = index.with_file_name("index.json.blob");
    let b2 = Backup {
        data: &data[..100],
        ..b.clone()
    };
    let other = testkit::pbs::manifest(&b2, &[0u8; 32]);
    std::fs::write(&manifest, testkit::pbs::blob(other.as_bytes(), false, None)).unwrap();
    let e = err(Some(&keyfile));
    assert!(e.contains("not the index the manifest"), "{e}");
}

/// A key loaded once is kept for the process (its KDF is costly), but by
/// its file and passphrase: a later load with a wrong passphrase, as a
/// long-lived program (Python) may try, is refused, and a changed file
/// gives its own key.
#[test]
fn a_kept_key_is_the_file_and_passphrase_given() {
    let dir = tempfile::tempdir().unwrap();
    let (keyfile, pass) = (dir.path().join("key.json"), dir.path().join("pass"));
    std::fs::write(&keyfile, key_file(&key_of(9), Kdf::Pbkdf2, b"right")).unwrap();
    let opts = OpenOptions {
        secret_file: Some(pass.clone()),
        ..Default::default()
    };
    let fingerprint = |k: &Key| k.fingerprint_text();
    std::fs::write(&pass, "right\n").unwrap();
    let first = blkimage::pbs::load_key(&keyfile, &opts).unwrap();
    std::fs::write(&pass, "wrong\n").unwrap();
    let e = blkimage::pbs::load_key(&keyfile, &opts)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the passphrase does not open it"), "{e}");
    std::fs::write(&pass, "right\n").unwrap();
    let again = blkimage::pbs::load_key(&keyfile, &opts).unwrap();
    assert_eq!(fingerprint(&again), fingerprint(&first));
    std::fs::write(&keyfile, key_file(&key_of(8), Kdf::Pbkdf2, b"right")).unwrap();
    let other = blkimage::pbs::load_key(&keyfile, &opts).unwrap();
    assert_eq!(fingerprint(&other), testkit::pbs::fingerprint(&key_of(8)));
    assert_ne!(fingerprint(&other), fingerprint(&first));
}
