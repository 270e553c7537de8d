//! `blkmap merge` of a part that claims a huge image of zeros (2^48 zero
//! digests to hash: hours) stops on SIGTERM, leaving OUT as it was and no
//! temporary file beside it.

use crate::common;

use blkhash::Algorithm;
use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A 105-byte part covering all of a 2^64 - 64 KiB image of zeros.
fn huge_zero_part() -> Vec<u8> {
    let size: u64 = u64::MAX - 65535;
    let mut b = Vec::new();
    b.extend_from_slice(&blkmap::MAGIC);
    b.extend_from_slice(&1u32.to_le_bytes()); // version
    b.extend_from_slice(&1u32.to_le_bytes()); // partial
    let mut name = [0u8; 16];
    name[..6].copy_from_slice(b"sha256");
    b.extend_from_slice(&name);
    b.extend_from_slice(&32u32.to_le_bytes());
    b.extend_from_slice(&65536u32.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&size.to_le_bytes());
    b.push(b'Z');
    b.extend_from_slice(&(size / 65536).to_le_bytes());
    let mut d = [0u8; 32];
    Algorithm::Sha256.digest_into(&b, &mut d);
    b.extend_from_slice(&d);
    b
}

#[test]
fn sigterm_stops_a_huge_merge_and_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let part = d.join("huge.part");
    std::fs::write(&part, huge_zero_part()).unwrap();
    let out = d.join("out.map");
    let child = Command::new(BLKMAP)
        .args(["merge", s(&out), s(&part)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The merge writes into its temporary file from its start: once the
    // file is there, the merge is under way.
    let start = Instant::now();
    let tmp = loop {
        let found = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with(".out.map.tmp-"));
        if let Some(t) = found {
            break t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no temporary file"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let done = child.wait_with_output().unwrap();
    assert_eq!(
        done.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(
        String::from_utf8_lossy(&done.stderr).contains("out.map: interrupted"),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(done.stdout.is_empty());
    assert!(!d.join(&tmp).exists(), "{tmp} left behind");
    assert!(!out.exists());
}
