//! Verification workflows as a user runs them: --check round trips, changed
//! and missing images, broken checksum files, --tag, --json, --jobs.

use crate::common;

use common::*;
use std::path::Path;
use std::process::Command;

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
}

fn sums_file(dir: &Path, args: &[&str]) -> std::path::PathBuf {
    let out = run(args, None);
    assert!(out.status.success(), "{}", stderr(&out));
    let path = dir.join(format!("sums-{}", rand_suffix()));
    write(&path, &stdout(&out));
    path
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn round_trip_then_a_change_fails() {
    let dir = tempfile::tempdir().unwrap();
    let raw = image(dir.path(), "a.img", "1m:r 1m:- 1m:t");
    let qcow2 = dir.path().join("a.qcow2");
    let st = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2)
        .status()
        .unwrap();
    assert!(st.success());
    let (pr, pq) = (raw.to_str().unwrap(), qcow2.to_str().unwrap());
    let sums = sums_file(dir.path(), &[pr, pq]);
    let ps = sums.to_str().unwrap();

    let out = run(&["-c", ps], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{pr}: OK\n{pq}: OK\n"));

    // A guest write, the way a user changes an image.
    let st = Command::new("qemu-io")
        .args(["-f", "qcow2", "-c", "write -P 0x42 1536k 4k"])
        .arg(&qcow2)
        .output()
        .unwrap();
    assert!(st.status.success());
    let out = run(&["-c", ps], None);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), format!("{pr}: OK\n{pq}: FAILED\n"));
    assert!(stderr(&out).contains("WARNING: 1 computed checksum did NOT match"));

    let out = run(&["-c", "--quiet", ps], None);
    assert_eq!(stdout(&out), format!("{pq}: FAILED\n"));
    let out = run(&["-c", "--status", ps], None);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    assert_eq!(stderr(&out), "");

    // The checksum file from standard input.
    let out = run(&["-c"], Some(&sums));
    assert_eq!(stdout(&out), format!("{pr}: OK\n{pq}: FAILED\n"));
}

#[test]
fn missing_images() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", "64k:A");
    let pa = a.to_str().unwrap();
    let sums = sums_file(dir.path(), &[pa]);
    let text = std::fs::read_to_string(&sums).unwrap();
    let hex = text.split_whitespace().next().unwrap();
    let gone = dir.path().join("gone.img");
    let pg = gone.to_str().unwrap();
    write(&sums, &format!("{text}{hex}  {pg}\n"));
    let ps = sums.to_str().unwrap();
    let out = run(&["-c", ps], None);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stdout(&out),
        format!("{pa}: OK\n{pg}: FAILED open or read\n")
    );
    let err = stderr(&out);
    assert!(
        err.contains(&format!("blksum: {pg}: No such file or directory")),
        "{err}"
    );
    assert!(
        err.contains("WARNING: 1 listed file could not be read"),
        "{err}"
    );

    let out = run(&["-c", "--ignore-missing", ps], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{pa}: OK\n"));

    write(&sums, &format!("{hex}  {pg}\n"));
    let out = run(&["-c", "--ignore-missing", ps], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no file was verified"));
}

#[test]
fn tagged_lines_carry_digest_and_block_size() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", "1m:r 1m:-");
    let pa = a.to_str().unwrap();
    let out = run(&["--tag", "-d", "blake3", "--block-size", "4k", pa], None);
    let line = stdout(&out);
    assert!(
        line.starts_with(&format!("blkhash/blake3/4k ({pa}) = ")),
        "{line}"
    );
    let default = stdout(&run(&["--tag", pa], None));
    assert!(
        default.starts_with(&format!("blkhash/sha256 ({pa}) = ")),
        "{default}"
    );
    // Checked with no options at all, mixed with an untagged sha256 line.
    let untagged = stdout(&run(&[pa], None));
    let sums = dir.path().join("sums");
    write(&sums, &format!("{line}{default}{untagged}"));
    let out = run(&["-c", sums.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stdout(&out), format!("{pa}: OK\n").repeat(3));
    // An untagged line checked with the wrong digest fails.
    let out = run(&["-c", "-d", "sha512-256", sums.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn broken_checksum_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", "64k:A");
    let pa = a.to_str().unwrap();
    let good = stdout(&run(&[pa], None));
    let sums = dir.path().join("sums");
    let ps = sums.to_str().unwrap();

    // Half garbage: the good line verifies, the rest is counted.
    write(&sums, &format!("# a comment\n{good}not a line\n\n"));
    let out = run(&["-c", ps], None);
    assert_eq!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("WARNING: 3 lines are improperly formatted"));
    let out = run(&["-c", "--warn", ps], None);
    assert!(stderr(&out).contains(&format!("{ps}: 1: improperly formatted")));
    assert!(stderr(&out).contains(&format!("{ps}: 3: improperly formatted")));
    let out = run(&["-c", "--strict", ps], None);
    assert_eq!(out.status.code(), Some(1));

    // All garbage.
    write(&sums, "hello\nworld\n");
    let out = run(&["-c", ps], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no properly formatted checksum lines found"));

    // A disk image passed by mistake (as a reference user typing -c for
    // --cache would): refused at once, not read to the end.
    let big = dir.path().join("big.img");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(64 << 30).unwrap();
    let start = std::time::Instant::now();
    let out = run(&["-c", big.to_str().unwrap()], None);
    assert!(start.elapsed().as_secs() < 5);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not a checksum file"),
        "{}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "");
}

#[test]
fn odd_names_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let names = [
        "with space.img",
        "back\\slash.img",
        "new\nline.img",
        "  lead.img",
    ];
    let paths: Vec<String> = names
        .iter()
        .map(|n| image(dir.path(), n, "4k:Z").to_str().unwrap().to_string())
        .collect();
    let args: Vec<&str> = paths.iter().map(|s| s.as_str()).collect();
    for tag in [false, true] {
        let mut a = args.clone();
        if tag {
            a.insert(0, "--tag");
        }
        let sums = sums_file(dir.path(), &a);
        let out = run(&["-c", sums.to_str().unwrap()], None);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(stdout(&out).matches(": OK\n").count(), names.len());
        // Escaped as coreutils does: a leading backslash, then \n for the newline.
        let shown = stdout(&out);
        assert!(
            shown
                .lines()
                .any(|l| l.starts_with('\\') && l.ends_with("new\\nline.img: OK")),
            "{shown}"
        );
    }
}

#[test]
fn json_document() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", "1m:r 2m:- 1m:0");
    let pa = a.to_str().unwrap();
    let missing = dir.path().join("missing.img");
    let pm = missing.to_str().unwrap();
    let out = run(&["--json", "-d", "blake3", pa, pm, "-"], Some(&a));
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["schema"], 1);
    let inputs = doc["inputs"].as_array().unwrap();
    assert_eq!(inputs.len(), 3);
    // qemu-img's spelling of the option gives the same document.
    let same = run(&["--output", "json", "-d", "blake3", pa, pm, "-"], Some(&a));
    assert_eq!(same.stdout, out.stdout);
    let file = &inputs[0];
    assert_eq!(file["name"], pa);
    assert_eq!(file["format"], "raw");
    assert_eq!(file["virtual-size"], 4 << 20);
    assert_eq!(file["digest"], "blake3");
    assert_eq!(file["block-size"], 65536);
    assert_eq!(
        file["data-bytes"],
        2 << 20,
        "the written zeros are data in a raw file"
    );
    assert_eq!(file["unallocated-bytes"], 2 << 20);
    assert_eq!(file["zero-bytes"], 0);
    let want = stdout(&run(&["-d", "blake3", pa], None));
    assert_eq!(file["checksum"], want.split_whitespace().next().unwrap());
    assert_eq!(inputs[1]["name"], pm);
    assert_eq!(inputs[1]["error"], "No such file or directory");
    assert_eq!(inputs[2]["format"], "stream");
    assert_eq!(inputs[2]["data-bytes"], 4 << 20);
    // Keys in docs/guide/verify.md's order: the document's, then each input's.
    let text = stdout(&out);
    let mut at = 0;
    for key in [
        "schema",
        "version",
        "inputs",
        "name",
        "format",
        "virtual-size",
        "digest",
        "block-size",
        "checksum",
        "data-bytes",
        "zero-bytes",
        "unallocated-bytes",
        "mapped-bytes",
    ] {
        let quoted = format!("\"{key}\"");
        match text[at..].find(&quoted) {
            Some(i) => at += i + quoted.len(),
            None => panic!("{key} not after byte {at}: {text}"),
        }
    }
}

#[test]
fn jobs_keep_order_and_checksums() {
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (i, recipe) in ["8m:r", "4k:A", "2m:t 6m:-", "64k:B", "1m:0", "3m:r"]
        .iter()
        .enumerate()
    {
        paths.push(
            image(dir.path(), &format!("{i}.img"), recipe)
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    paths.insert(2, dir.path().join("missing").to_str().unwrap().to_string());
    let args: Vec<&str> = paths.iter().map(|s| s.as_str()).collect();
    let one = run(&args, None);
    for jobs in ["2", "4", "16"] {
        let mut a = vec!["--jobs", jobs];
        a.extend(&args);
        let many = run(&a, None);
        assert_eq!(stdout(&many), stdout(&one), "--jobs {jobs}");
        assert_eq!(many.status.code(), Some(1));
        assert_eq!(stderr(&many), stderr(&one));
    }
}

#[test]
fn man_page_and_completions() {
    let out = run(&["--man"], None);
    assert!(out.status.success());
    assert!(
        stdout(&out).contains(".TH blksum"),
        "{}",
        &stdout(&out)[..200]
    );
    for section in [".SH \"EXIT STATUS\"", ".SH EXAMPLES"] {
        assert!(stdout(&out).contains(section), "no {section}");
    }
    // As man shows it: no roff warnings, FILE repeats, options take values,
    // no Markdown backticks.
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("blksum.1");
    std::fs::write(&page, &out.stdout).unwrap();
    let man = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(&page)
        .env("MANWIDTH", "80")
        .output()
        .expect("man runs (scripts/setup.sh installs man-db)");
    let text = String::from_utf8_lossy(&man.stdout);
    assert_eq!(String::from_utf8_lossy(&man.stderr), "");
    assert!(text.contains(" [FILE]...\n"), "{text}");
    assert!(text.contains("[-d|--digest NAME]"), "{text}");
    assert!(!text.contains('`'), "{text}");
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&["--completions", shell], None);
        assert!(out.status.success(), "{shell}");
        assert!(stdout(&out).contains("--block-size"), "{shell}");
        // --digest and --format complete their names.
        assert!(stdout(&out).contains("sha3-256"), "{shell}");
        assert!(stdout(&out).contains("vhdx"), "{shell}");
    }
    let out = run(&["--completions", "bash", "x.img"], None);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn names_that_are_not_utf8_as_sha256sum_takes_them() {
    use std::os::unix::ffi::OsStrExt;
    let dir = tempfile::tempdir().unwrap();
    let name = std::ffi::OsStr::from_bytes(b"disk\xff\xfe.img");
    let path = dir.path().join(name);
    std::fs::write(&path, vec![7u8; 100_000]).unwrap();
    let utf8 = dir.path().join("same.img");
    std::fs::write(&utf8, vec![7u8; 100_000]).unwrap();

    let out = blksum().arg(&path).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let line = out.stdout.clone();
    // The name's bytes, as they are, after the checksum of the same content.
    assert!(line.ends_with(&[path.as_os_str().as_bytes(), b"\n"].concat()));
    let same = run(&[utf8.to_str().unwrap()], None);
    assert_eq!(line[..64], same.stdout[..64]);

    // The line checks back, and so does a tagged one.
    for tag in [false, true] {
        let mut cmd = blksum();
        if tag {
            cmd.arg("--tag");
        }
        let sums = cmd.arg(&path).output().unwrap().stdout;
        let list = dir.path().join("sums");
        std::fs::write(&list, &sums).unwrap();
        let out = blksum().arg("-c").arg(&list).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(
            out.stdout,
            [path.as_os_str().as_bytes(), b": OK\n"].concat()
        );
    }

    // A missing one is named in the error, not refused as a usage error.
    let missing = dir.path().join(std::ffi::OsStr::from_bytes(b"gone\xff"));
    let out = blksum().arg(&missing).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));

    // --json: `name` as it was (U+FFFD for the bytes that are not UTF-8),
    // and the whole name escaped in `name-escaped`, for an input hashed or
    // not; none for a UTF-8 name.
    let out = blksum()
        .arg("--json")
        .arg(&path)
        .arg(&missing)
        .arg(&utf8)
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let inputs = doc["inputs"].as_array().unwrap();
    let dir_escaped = dir.path().to_str().unwrap().replace('\\', "\\\\");
    for (input, name) in inputs.iter().zip([&path, &missing]) {
        assert_eq!(input["name"], *name.to_string_lossy(), "{doc}");
        let tail = name.file_name().unwrap().as_bytes();
        let tail: String = tail
            .iter()
            .map(|&b| match b {
                0x20..0x7f => (b as char).to_string(),
                b => format!("\\x{b:02x}"),
            })
            .collect();
        assert_eq!(
            input["name-escaped"],
            format!("{dir_escaped}/{tail}"),
            "{doc}"
        );
    }
    assert!(inputs[2].get("name-escaped").is_none(), "{doc}");
}

#[test]
fn zero_ends_lines_with_nul_and_does_not_escape_as_sha256sum() {
    let dir = tempfile::tempdir().unwrap();
    let odd = dir.path().join("a\nb\\c");
    std::fs::write(&odd, b"x").unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, b"y").unwrap();
    let (po, pp) = (odd.to_str().unwrap(), plain.to_str().unwrap());
    let sum = |p: &str| stdout(&run(&[p], None)).trim_start_matches('\\')[..64].to_string();
    let out = run(&["-z", po, pp], None);
    assert!(out.status.success());
    let want = format!("{}  {po}\0{}  {pp}\0", sum(po), sum(pp));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), want);
    // Tagged lines too; and the records split as xargs -0 would.
    let out = run(&["-z", "--tag", po], None);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("blkhash/sha256 ({po}) = {}\0", sum(po))
    );
    // As sha256sum: not when verifying.
    assert_eq!(run(&["-z", "-c", pp], None).status.code(), Some(2));
}

#[test]
fn a_list_made_with_other_options_says_which_would_check_it() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.img", "1m:r 1m:-");
    let p = img.to_str().unwrap();
    let sums = sums_file(dir.path(), &["-d", "blake3", "--block-size", "1m", p]);
    let s = sums.to_str().unwrap();
    let out = run(&["-c", s], None);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{s}: no listed image matched: the images may have changed since the list was \
             made, or be damaged; or the list was made otherwise: the checksums are 64 hex \
             digits, as sha256, "
        )),
        "{err}"
    );
    let hint =
        format!("(`blksum -c -d blake3 --block-size 1m {s}` checks them if they were made so)");
    assert!(err.contains(&hint), "{err}");
    let out = run(&["-c", "-d", "blake3", "--block-size", "1m", s], None);
    assert!(out.status.success(), "{}", stderr(&out));

    // Of another length: the digests that write it are named.
    let sums = sums_file(dir.path(), &["-d", "sha512", p]);
    let s = sums.to_str().unwrap();
    let out = run(&["-c", s], None);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{s}: the checksums are 128 hex digits, as sha512, sha3-512 and blake2b512 write them, not sha256"
        )),
        "{err}"
    );
}
