//! A raw file whose size is not a multiple of 512 is hashed at QEMU's size
//! (rounded up, the tail zeros), standard input at its own: the two give
//! different checksums, so blksum says so, once per input, naming both
//! sizes, and stays quiet where sha256sum would (`--check` with `--quiet`
//! or `--status`).

use crate::common;

use common::*;
use std::path::Path;

/// What blksum says of a 1000-byte raw file.
const NOTE: &str = "1000 bytes, hashed as 1024 (a raw image's size is rounded up to a \
                    multiple of 512, as QEMU does; standard input is hashed as it is)";

/// The checksum of these bytes as they are (the construction itself).
fn of(data: &[u8]) -> String {
    blkhash::hash(data).to_hex()
}

/// A 1000-byte file of random bytes, its bytes, and its bytes rounded up
/// to 1024 with zeros (what QEMU's guest sees).
fn small(dir: &Path, name: &str) -> (String, Vec<u8>, Vec<u8>) {
    let path = image(dir, name, "1000:r");
    let data = std::fs::read(&path).unwrap();
    let mut padded = data.clone();
    padded.resize(1024, 0);
    (path.to_str().unwrap().to_string(), data, padded)
}

#[test]
fn a_raw_file_of_odd_size_is_said_once_with_both_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let (p, data, padded) = small(dir.path(), "small");
    assert_ne!(of(&data), of(&padded));
    for args in [&[p.as_str()][..], &["-f", "raw", &p]] {
        let out = run(args, None);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), format!("{}  {p}\n", of(&padded)), "{args:?}");
        assert_eq!(stderr(&out), format!("blksum: {p}: {NOTE}\n"), "{args:?}");
    }
    // Standard input: its exact bytes, nothing to say.
    let out = run(&[], Some(Path::new(&p)));
    assert_eq!(stdout(&out), format!("{}  -\n", of(&data)));
    assert_eq!(stderr(&out), "");
    // A size QEMU does not round: nothing to say either.
    let even = image(dir.path(), "even", "1024:r");
    let out = run(&[even.to_str().unwrap()], None);
    assert!(out.status.success());
    assert_eq!(stderr(&out), "");
}

#[test]
fn each_input_is_said_once_in_argument_order() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, _) = small(dir.path(), "small");
    let other = image(dir.path(), "other", "513:r");
    let o = other.to_str().unwrap();
    let other_note = format!(
        "blksum: {o}: 513 bytes, hashed as 1024 (a raw image's size is rounded up to a \
         multiple of 512, as QEMU does; standard input is hashed as it is)"
    );
    let small_note = format!("blksum: {p}: {NOTE}");
    for jobs in ["1", "3"] {
        let out = run(&["-j", jobs, &p, o, &p], None);
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            stderr(&out).lines().collect::<Vec<_>>(),
            [small_note.as_str(), &other_note, &small_note],
            "--jobs {jobs}"
        );
    }
    // With --json the document stays alone on standard output.
    let out = run(&["--json", &p], None);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["inputs"][0]["virtual-size"], 1024);
    assert_eq!(stderr(&out), format!("{small_note}\n"));
}

#[test]
fn check_says_it_unless_quiet_or_status() {
    let dir = tempfile::tempdir().unwrap();
    let (p, _, padded) = small(dir.path(), "small");
    let sums = dir.path().join("SUMS");
    std::fs::write(&sums, format!("{}  {p}\n", of(&padded))).unwrap();
    let s = sums.to_str().unwrap();
    let out = run(&["-c", s], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{p}: OK\n"));
    assert_eq!(stderr(&out), format!("blksum: {p}: {NOTE}\n"));
    for quiet in ["--quiet", "--status"] {
        let out = run(&["-c", quiet, s], None);
        assert!(out.status.success(), "{quiet}: {}", stderr(&out));
        assert_eq!(stdout(&out), "", "{quiet}");
        assert_eq!(stderr(&out), "", "{quiet}");
    }
}

/// oVirt imageio's file backend and Proxmox's backup client read a raw
/// file at its exact size: their constructions hash its bytes as they
/// are, with nothing to say, whatever reads it (blksum, blksum -c, a pipe
/// alike); blkhash 0.11's keeps QEMU's rounding.
#[test]
fn imageio_and_pbs_hash_a_raw_file_at_its_exact_size() {
    use blkhash::{Algorithm, Construction, checksum_with};
    let dir = tempfile::tempdir().unwrap();
    let (p, data, _) = small(dir.path(), "small");
    for (c, alg) in [
        (Construction::Imageio, Algorithm::Blake2b256),
        (Construction::Pbs, Algorithm::Sha256),
    ] {
        let want = checksum_with(c, alg, 4 << 20, &data).to_hex();
        let out = run(&["--construction", c.name(), &p], None);
        assert!(out.status.success(), "{c}: {}", stderr(&out));
        assert_eq!(stdout(&out), format!("{want}  {p}\n"), "{c}");
        assert_eq!(stderr(&out), "", "{c}");
        // Standard input gives the same.
        let piped = run(&["--construction", c.name()], Some(Path::new(&p)));
        assert_eq!(stdout(&piped), format!("{want}  -\n"), "{c}");
        // A --tag line checks with no options, and the file's bytes.
        let tagged = run(&["--tag", "--construction", c.name(), &p], None);
        let list = dir.path().join(format!("{c}.sums"));
        std::fs::write(&list, &tagged.stdout).unwrap();
        let check = run(&["-c", list.to_str().unwrap()], None);
        assert_eq!(stdout(&check), format!("{p}: OK\n"), "{}", stderr(&check));
    }
    // blkhash 0.11's construction still sees QEMU's size.
    let out = run(&[&p], None);
    assert!(stderr(&out).contains(NOTE), "{}", stderr(&out));
}
