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

/// `\\`, `\n`, `\r` and `\xNN` undone: the bytes of a JSON document's
/// `name-escaped` (or `image-escaped`).
pub fn unescape(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut rest = s.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let (&e, tail) = rest.split_first().expect("an escape");
        rest = tail;
        match e {
            b'\\' => out.push(b'\\'),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b'x' => {
                let hex = std::str::from_utf8(&rest[..2]).unwrap();
                out.push(u8::from_str_radix(hex, 16).unwrap());
                rest = &rest[2..];
            }
            e => panic!("unknown escape \\{}", e as char),
        }
    }
    out
}

/// --json: a name that is not UTF-8 in full in `image-escaped` (blkmap)
/// and `name-escaped` (blkdiff), beside the lossy `image` and `name` (kept
/// as they were); a UTF-8 name gets no such key.
#[test]
fn json_gives_names_that_are_not_utf8_in_full() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let name: &[u8] = b"d\xe9j\xe0\\vu\n\x01\xff.raw";
    let img = d.join(OsStr::from_bytes(name));
    std::fs::write(&img, vec![9u8; 300 << 10]).unwrap();
    let plain = d.join("plain.raw");
    std::fs::write(&plain, vec![9u8; 300 << 10]).unwrap();
    let json = |cmd: &mut Command| -> serde_json::Value {
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let j = json(
        Command::new(BLKMAP)
            .arg("--json")
            .arg(&img)
            .arg(d.join("m.map")),
    );
    let lossy = img.to_string_lossy();
    assert_eq!(j["image"], *lossy, "{j}");
    let escaped = j["image-escaped"].as_str().unwrap();
    assert_eq!(unescape(escaped), img.as_os_str().as_bytes(), "{j}");
    let j = json(
        Command::new(BLKMAP)
            .arg("--json")
            .arg(&plain)
            .arg(d.join("p.map")),
    );
    assert!(j.get("image-escaped").is_none(), "{j}");
    let j = json(Command::new(BLKDIFF).arg("--json").arg(&img).arg(&plain));
    assert_eq!(j["a"]["name"], *lossy, "{j}");
    let escaped = j["a"]["name-escaped"].as_str().unwrap();
    assert_eq!(unescape(escaped), img.as_os_str().as_bytes(), "{j}");
    assert!(j["b"].get("name-escaped").is_none(), "{j}");
}
