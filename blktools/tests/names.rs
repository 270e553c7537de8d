//! File names need not be UTF-8 (as sha256sum and qemu-img take them):
//! blkmap, blkdiff and blksync read and write such files, and print their
//! names' bytes as they are.

use crate::common;

use common::*;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

#[test]
fn names_that_are_not_utf8() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = d.join(OsStr::from_bytes(b"src\xff.raw"));
    std::fs::write(&src, vec![9u8; 300 << 10]).unwrap();
    let dst = d.join(OsStr::from_bytes(b"dst\xfe.raw"));
    let map = d.join(OsStr::from_bytes(b"m\xfd.map"));

    // Succeeds, and its checksum line ends with SRC's name as it is.
    let prints_src = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        let line_end = [src.as_os_str().as_bytes(), b"\n"].concat();
        assert!(out.stdout.ends_with(&line_end));
    };
    prints_src(Command::new(BLKMAP).arg(&src).arg(&map));
    let state = d.join(OsStr::from_bytes(b"st\xfc"));
    prints_src(
        Command::new(BLKSYNC)
            .arg(&src)
            .arg(&dst)
            .arg("--state")
            .arg(&state)
            .arg("--checksum"),
    );
    assert!(std::fs::read(&dst).unwrap() == std::fs::read(&src).unwrap());
    // The image and the map of its copy are the same.
    let out = Command::new(BLKDIFF).arg(&dst).arg(&map).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
