//! A reader that went away (`blkmap bitmaps IMAGE | head -1`): every
//! command's output into a closed pipe ends with the command's failure
//! status, quietly, never a panic (Rust ignores SIGPIPE, so `println!`
//! would panic there). One handling in the command layer:
//! `blkcli::output`.

use crate::common;

use common::*;
use std::path::Path;
use std::process::{Command, Stdio};

/// Run `bin args` with standard output a pipe whose reading end is closed
/// before it starts: the exit status and what it said on standard error.
fn into_closed_pipe(bin: &str, args: &[&str]) -> (i32, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(bin)
        .args(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn every_listing_into_a_closed_pipe() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let img = src_qcow2(d, 4 * MIB, &["write -P 0x11 0 1M"]);
    sh("qemu-img", &["bitmap", "--add", s(&img), "b"]);
    let other = image(d, "other.raw", "raw", 4 * MIB, &["write -P 0x22 0 64k"]);
    let map = d.join("img.map");
    let o = run(BLKMAP, &[s(&img), s(&map)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let part = d.join("img.part");
    let o = run(BLKMAP, &["--range", "0+", s(&img), s(&part)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let out = |n: &str| d.join(n).to_str().unwrap().to_string();
    let blksum = Path::new(BLKMAP).with_file_name("blksum");
    let blksum = blksum
        .exists()
        .then(|| blksum.to_str().unwrap().to_string());
    let list = d.join("sums");
    std::fs::write(&list, "").unwrap();
    let runs: Vec<(&str, Vec<String>, i32)> = vec![
        (BLKMAP, vec![s(&img).into(), out("a.map")], 1),
        (
            BLKMAP,
            vec!["--json".into(), s(&img).into(), out("b.map")],
            1,
        ),
        (BLKMAP, vec!["bitmaps".into(), s(&img).into()], 1),
        (
            BLKMAP,
            vec!["bitmaps".into(), "--json".into(), s(&img).into()],
            1,
        ),
        (BLKMAP, vec!["checksum".into(), s(&map).into()], 1),
        (
            BLKMAP,
            vec!["merge".into(), out("m.map"), s(&part).into()],
            1,
        ),
        (BLKDIFF, vec![s(&img).into(), s(&other).into()], 2),
        (
            BLKDIFF,
            vec!["--json".into(), s(&img).into(), s(&other).into()],
            2,
        ),
        (
            BLKSYNC,
            vec!["--dry-run".into(), s(&img).into(), s(&other).into()],
            1,
        ),
        (
            BLKSYNC,
            vec!["--checksum".into(), s(&img).into(), out("copy.raw")],
            1,
        ),
    ];
    let mut all = runs;
    if let Some(b) = &blksum {
        let sums = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        for args in [
            sums(&[s(&img)]),
            sums(&["--json", s(&img)]),
            sums(&["--list-digests"]),
        ] {
            all.push((b.as_str(), args, 1));
        }
    }
    for (bin, args, want) in all {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stderr) = into_closed_pipe(bin, &args);
        let name = Path::new(bin).file_name().unwrap().to_string_lossy();
        assert_eq!(code, want, "{name} {args:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "{name} {args:?}: {stderr}"
        );
    }
}

/// Run `bin args` with standard error a pipe whose reading end is closed
/// before it starts (`cmd 2>&1 | head -1` once the first line is out):
/// the exit status and standard output.
fn with_closed_stderr(bin: &str, args: &[&str]) -> (i32, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(bin)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(writer)
        .output()
        .unwrap();
    let code = out.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every command whose messages go to a standard error nobody reads any
/// more ends with the status it has otherwise (never 101, a panic): the
/// note on a raw file of odd size (said by every command), progress
/// lines, usage errors, failures, blksync's summary, blksum -c's notes.
#[test]
fn every_command_with_a_closed_standard_error() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    // 1000 bytes: every command says it hashes them as 1024.
    let odd = d.join("odd.raw");
    std::fs::write(&odd, [7u8; 1000]).unwrap();
    let img = src_qcow2(d, 4 * MIB, &["write -P 0x11 0 1M"]);
    let out = |n: &str| d.join(n).to_str().unwrap().to_string();
    let blksum = Path::new(BLKMAP).with_file_name("blksum");
    let mut runs: Vec<(String, Vec<String>, i32)> = Vec::new();
    let mut add = |bin: &str, args: &[&str], want: i32| {
        let args = args.iter().map(|a| a.to_string()).collect();
        runs.push((bin.to_string(), args, want));
    };
    add(BLKMAP, &[s(&odd), &out("odd.map")], 0);
    add(BLKMAP, &["-p", s(&img), &out("img.map")], 0);
    add(BLKMAP, &["--no-such-option"], 2);
    add(BLKMAP, &[&out("missing.raw"), &out("m.map")], 1);
    add(BLKDIFF, &[s(&odd), s(&odd)], 0);
    add(BLKDIFF, &["-p", s(&img), s(&img)], 0);
    add(BLKDIFF, &[s(&odd), &out("missing.raw")], 2);
    add(BLKSYNC, &[s(&img), &out("copy.raw")], 0);
    add(BLKSYNC, &[s(&odd), &out("odd-copy.raw")], 0);
    add(BLKSYNC, &[&out("missing.raw"), &out("copy2.raw")], 1);
    if blksum.exists() {
        let b = blksum.to_str().unwrap();
        let list = d.join("sums");
        let o = run(b, &[s(&odd)]);
        std::fs::write(&list, &o.stdout).unwrap();
        add(b, &[s(&odd)], 0);
        add(b, &["-p", s(&img)], 0);
        add(b, &["-c", s(&list)], 0);
        add(b, &[&out("missing.raw")], 1);
        add(b, &["--no-such-option"], 2);
    }
    for (bin, args, want) in runs {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stdout) = with_closed_stderr(&bin, &args);
        let name = Path::new(&bin).file_name().unwrap().to_string_lossy();
        assert_eq!(code, want, "{name} {args:?}: {stdout}");
    }
    // What was done is done: the map and the copy are there.
    assert!(d.join("odd.map").exists());
    assert!(same(&img, &d.join("copy.raw")));
}
