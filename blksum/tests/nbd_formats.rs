//! Formats read through a private qemu-nbd: each converted image has the
//! raw image's checksum, and no qemu-nbd or temporary directory is left,
//! after a checksum, an error, or SIGTERM.

mod common;

use common::nbd::{blksum_temp_dirs, processes_with};
use common::qemu::{qemu_img, run_timeout};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

/// (name, qemu-img convert options)
const TARGETS: &[(&str, &[&str])] = &[
    ("vmdk", &["-O", "vmdk"]),
    (
        "stream.vmdk",
        &["-O", "vmdk", "-o", "subformat=streamOptimized"],
    ),
    ("vdi", &["-O", "vdi"]),
    ("vhdx", &["-O", "vhdx"]),
    ("vhd", &["-O", "vpc", "-o", "subformat=fixed,force_size=on"]),
    ("dynamic.vhd", &["-O", "vpc", "-o", "force_size=on"]),
    ("qed", &["-O", "qed"]),
    ("parallels", &["-O", "parallels"]),
];

fn convert(raw: &Path, out: &Path, opts: &[&str]) {
    let mut args = vec!["convert", "-q"];
    args.extend(opts);
    args.extend([raw.to_str().unwrap(), out.to_str().unwrap()]);
    qemu_img(&args);
}

/// The leftover checks look at every blksum temporary directory: the tests
/// of this file must not run side by side.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn no_leftovers(dir: &Path, before: &[PathBuf]) {
    let procs = processes_with(&format!("qemu-nbd.*{}", dir.display()));
    assert!(procs.is_empty(), "qemu-nbd left running: {procs:?}");
    let after = blksum_temp_dirs();
    let new: Vec<_> = after.iter().filter(|d| !before.contains(d)).collect();
    assert!(new.is_empty(), "temporary directories left: {new:?}");
}

#[test]
fn converted_images_hash_as_their_raw_image() {
    let _serial = serial();
    if !have("qemu-nbd") {
        return;
    }
    let before = blksum_temp_dirs();
    let dir = tempfile::tempdir().unwrap();
    let recipes = [
        "1m:A 127m:- 1m:B 127m:- 1m:C 63m:-",
        "1m:r 1m:- 1m:0 1m:t 100000:r",
        "32k:A 64k:- 32k:0 32k:E 64k:-",
        "8m:t 8m:- 8m:r 8m:0",
    ];
    let mut checked = 0;
    for (i, recipe) in recipes.iter().enumerate() {
        let raw = image(dir.path(), &format!("{i}.raw"), recipe);
        let expect = run_timeout(&[raw.to_str().unwrap()], None, LIMIT);
        let expect = stdout(&expect).split_once("  ").unwrap().0.to_string();
        let mut files = Vec::new();
        for (ext, opts) in TARGETS {
            let out = dir.path().join(format!("{i}.{ext}"));
            convert(&raw, &out, opts);
            files.push(out);
        }
        // Probed from their magic bytes, all in one run.
        let mut args = vec!["--json"];
        args.extend(files.iter().map(|f| f.to_str().unwrap()));
        let out = run_timeout(&args, None, LIMIT);
        assert!(out.status.success(), "{recipe}: {}", stderr(&out));
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let inputs = doc["inputs"].as_array().unwrap();
        for (f, input) in files.iter().zip(inputs) {
            assert_eq!(
                input["checksum"].as_str(),
                Some(expect.as_str()),
                "{recipe} {}: {input}",
                f.display()
            );
            checked += 1;
        }
        // Named with -f, through the page cache.
        let vdi = dir.path().join(format!("{i}.vdi"));
        let out = run_timeout(
            &["-f", "vdi", "--cache", vdi.to_str().unwrap()],
            None,
            LIMIT,
        );
        assert_eq!(
            stdout(&out).split_once("  ").map(|s| s.0),
            Some(expect.as_str())
        );
    }
    assert_eq!(checked, recipes.len() * TARGETS.len());
    no_leftovers(dir.path(), &before);
}

#[test]
fn errors_and_missing_qemu_nbd() {
    let _serial = serial();
    if !have("qemu-nbd") {
        return;
    }
    let before = blksum_temp_dirs();
    let dir = tempfile::tempdir().unwrap();
    let raw = image(dir.path(), "a.raw", "1m:r");
    let vmdk = dir.path().join("a.vmdk");
    convert(&raw, &vmdk, &["-O", "vmdk"]);
    // A truncated vdi: qemu-nbd refuses it, the error says why.
    let vdi = dir.path().join("a.vdi");
    convert(&raw, &vdi, &["-O", "vdi"]);
    let f = std::fs::OpenOptions::new().write(true).open(&vdi).unwrap();
    f.set_len(0x50).unwrap();
    let out = run_timeout(&[vdi.to_str().unwrap()], None, LIMIT);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(stderr(&out).contains("qemu-nbd"), "{}", stderr(&out));
    // -f vmdk on a file that is not one.
    let out = run_timeout(&["-f", "vmdk", raw.to_str().unwrap()], None, LIMIT);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    // No qemu-nbd on PATH: name the package.
    let out = blksum()
        .env("PATH", dir.path())
        .arg(&vmdk)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("qemu-utils"), "{}", stderr(&out));
    // An unknown format name is a usage error that lists the known ones.
    let out = run_timeout(&["-f", "nope", vmdk.to_str().unwrap()], None, LIMIT);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("vhdx"), "{}", stderr(&out));
    no_leftovers(dir.path(), &before);
}

#[test]
fn sigterm_stops_qemu_nbd_and_removes_its_directory() {
    let _serial = serial();
    if !have("qemu-nbd") {
        return;
    }
    let before = blksum_temp_dirs();
    let dir = tempfile::tempdir().unwrap();
    let raw = image(dir.path(), "big.raw", "256m:r");
    let vdi = dir.path().join("big.vdi");
    convert(&raw, &vdi, &["-O", "vdi"]);
    std::fs::remove_file(&raw).unwrap();
    // Small reads, one at a time: slow enough to be stopped midway.
    let child = blksum()
        .args([
            "--read-size",
            "4k",
            "--queue-depth",
            "1",
            "-t",
            "1",
            "-d",
            "sha512",
        ])
        .arg(&vdi)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while processes_with(&format!("qemu-nbd.*{}", dir.path().display())).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "qemu-nbd did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: plain syscall.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    no_leftovers(dir.path(), &before);
}

/// `qemu-img convert` of `raw` to a LUKS image with the passphrase `pass`
/// (iter-time=10: a fast key derivation, for tests only).
fn to_luks(raw: &Path, out: &Path, pass: &str) {
    qemu_img(&[
        "convert",
        "-q",
        "--object",
        &format!("secret,id=sec0,data={pass}"),
        "-O",
        "luks",
        "-o",
        "key-secret=sec0,iter-time=10",
        raw.to_str().unwrap(),
        out.to_str().unwrap(),
    ]);
}

#[test]
fn luks_images_with_a_secret_file() {
    let _serial = serial();
    if !have("qemu-nbd") {
        return;
    }
    let before = blksum_temp_dirs();
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "correct horse").unwrap();
    let s = secret.to_str().unwrap();
    let recipes = ["1m:A 127m:- 1m:B 127m:- 1m:C 63m:-", "8m:t 8m:- 8m:r 8m:0"];
    for (i, recipe) in recipes.iter().enumerate() {
        let raw = image(dir.path(), &format!("{i}.raw"), recipe);
        let luks = dir.path().join(format!("{i}.luks"));
        to_luks(&raw, &luks, "correct horse");
        let l = luks.to_str().unwrap();
        let expect = run_timeout(&[raw.to_str().unwrap()], None, LIMIT);
        let expect = stdout(&expect).split_once("  ").unwrap().0.to_string();
        // Probed, and forced with -f luks; --cache passes through.
        for args in [
            vec!["--secret-file", s, l],
            vec!["-f", "luks", "--cache", "--secret-file", s, l],
        ] {
            let out = run_timeout(&args, None, LIMIT);
            assert!(out.status.success(), "{args:?}: {}", stderr(&out));
            assert_eq!(stdout(&out), format!("{expect}  {l}\n"), "{recipe}");
        }
    }
    // Data written with qemu-io into a new LUKS image, and the same bytes
    // into a raw file. Every byte is written: unwritten ranges of a new
    // LUKS image decrypt to noise, not zeros.
    let luks = dir.path().join("io.luks");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "luks",
        "--object",
        "secret,id=sec0,data=correct horse",
        "-o",
        "key-secret=sec0,iter-time=10",
        luks.to_str().unwrap(),
        "4M",
    ]);
    let out = std::process::Command::new("qemu-io")
        .args([
            "--object",
            "secret,id=sec0,data=correct horse",
            "--image-opts",
            &format!(
                "driver=luks,key-secret=sec0,file.filename={}",
                luks.display()
            ),
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "write -P 0 1M 2M",
            "-c",
            "write -P 0x5c 3M 512k",
            "-c",
            "write -P 0 3584k 512k",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let raw = image(dir.path(), "io.raw", "1m:- 2m:- 512k:- 512k:-");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&raw).unwrap();
        f.write_all_at(&[0xab; 1 << 20], 0).unwrap();
        f.write_all_at(&[0x5c; 512 << 10], 3 << 20).unwrap();
    }
    let expect = run_timeout(&[raw.to_str().unwrap()], None, LIMIT);
    let expect = stdout(&expect).split_once("  ").unwrap().0.to_string();
    let out = run_timeout(&["--secret-file", s, luks.to_str().unwrap()], None, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with(&expect), "{}", stdout(&out));
    no_leftovers(dir.path(), &before);

    // Errors: exit 1, no checksum, the reason, nothing left behind.
    let l = luks.to_str().unwrap();
    let fails = |args: &[&str]| {
        let out = run_timeout(args, None, LIMIT);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{}", stdout(&out));
        let err = stderr(&out);
        assert!(err.contains(l), "{err}");
        err
    };
    // No secret: name the option.
    let err = fails(&[l]);
    assert!(err.contains("--secret-file"), "{err}");
    // A wrong passphrase (with a newline: it counts): qemu-nbd's reason.
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "correct horse\n").unwrap();
    let err = fails(&["--secret-file", wrong.to_str().unwrap(), l]);
    assert!(
        err.contains("qemu-nbd") && err.contains("password"),
        "{err}"
    );
    // No such secret file.
    let none = dir.path().join("none");
    let err = fails(&["--secret-file", none.to_str().unwrap(), l]);
    assert!(err.contains("secret file") && err.contains("none"), "{err}");
    no_leftovers(dir.path(), &before);
}
