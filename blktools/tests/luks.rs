//! A LUKS SRC needs its passphrase: blkdiff and blksync take
//! `--secret-file` as blksum does.

use crate::common;

use common::*;

#[test]
fn luks_src_in_blkdiff_and_blksync() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let raw = image(
        d,
        "disk.raw",
        "raw",
        8 * MIB,
        &["write -P 0x5a 0 1M", "write -P 0x11 5M 64k"],
    );
    let luks = d.join("disk.luks");
    sh(
        "qemu-img",
        &[
            "convert",
            "-q",
            "--object",
            "secret,id=sec0,data=correct horse",
            "-O",
            "luks",
            "-o",
            "key-secret=sec0,iter-time=10",
            s(&raw),
            s(&luks),
        ],
    );
    let secret = d.join("pass");
    std::fs::write(&secret, "correct horse").unwrap();

    // Without the passphrase: refused, and the message says how.
    let out = run(BLKDIFF, &[s(&luks), s(&raw)]);
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--secret-file"), "{}", out.stderr);

    let out = run(BLKDIFF, &["--secret-file", s(&secret), s(&luks), s(&raw)]);
    assert_eq!(out.code, 0, "{}", out.stderr);

    let dst = d.join("copy.raw");
    let state = d.join("copy.map");
    let out = run(
        BLKSYNC,
        &[
            "--secret-file",
            s(&secret),
            s(&luks),
            s(&dst),
            "--state",
            s(&state),
        ],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(checksum(d, &dst), checksum(d, &raw));
    assert!(same(&raw, &dst));

    // A wrong passphrase is QEMU's error, and nothing is written.
    std::fs::write(&secret, "wrong").unwrap();
    let other = d.join("other.raw");
    let out = run(BLKSYNC, &["--secret-file", s(&secret), s(&luks), s(&other)]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("Invalid password"), "{}", out.stderr);
    assert!(!other.exists());
}
