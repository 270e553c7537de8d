//! Formats read through a private qemu-nbd: each converted image has the
//! raw image's checksum, and no qemu-nbd or temporary directory is left,
//! after a checksum, an error, or SIGTERM.

use crate::common;

use common::nbd::{processes_with, temp_leftovers};
use common::progress::spawn_with_progress;
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

/// One test at a time: they start many qemu-nbd processes.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A test's scratch directory, and blksum's TMPDIR inside it (for this
/// thread's runs).
fn scratch() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().join("tmp");
    use_tmpdir(&tmp);
    (dir, tmp)
}

/// No qemu-nbd serving a file of `dir` runs, and blksum left nothing in
/// its TMPDIR `tmp`.
fn no_leftovers(dir: &Path, tmp: &Path) {
    let procs = processes_with(&format!("qemu-nbd.*{}", dir.display()));
    assert!(procs.is_empty(), "qemu-nbd left running: {procs:?}");
    let left = temp_leftovers(tmp);
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

#[test]
fn converted_images_hash_as_their_raw_image() {
    let _serial = serial();
    if !require(&["qemu-nbd"]) {
        return;
    }
    let (dir, tmp) = scratch();
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
    no_leftovers(dir.path(), &tmp);
}

#[test]
fn errors_and_missing_qemu_nbd() {
    let _serial = serial();
    if !require(&["qemu-nbd"]) {
        return;
    }
    let (dir, tmp) = scratch();
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
    // The vmdk with one variable of the environment changed: exit 1 and
    // its message.
    let vmdk_with = |var: &str, value: &std::path::Path| {
        let out = blksum()
            .env(var, value)
            .arg(&vmdk)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{var}: {}", stderr(&out));
        stderr(&out)
    };
    // No qemu-nbd on PATH: name the package.
    let msg = vmdk_with("PATH", dir.path());
    assert!(
        msg.contains("install qemu-utils (Debian, Ubuntu) or qemu-img (Fedora, RHEL)"),
        "{msg}"
    );
    // No directory to make the private one in (a bare chroot has no /tmp):
    // named, with the way out.
    let msg = vmdk_with("TMPDIR", &dir.path().join("nowhere"));
    assert!(
        msg.contains("cannot make a private directory for qemu-nbd's socket in")
            && msg.contains("nowhere (TMPDIR names another)"),
        "{msg}"
    );
    // An unknown format name is a usage error that lists the known ones.
    let out = run_timeout(&["-f", "nope", vmdk.to_str().unwrap()], None, LIMIT);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("vhdx"), "{}", stderr(&out));
    no_leftovers(dir.path(), &tmp);
}

#[test]
fn sigterm_stops_qemu_nbd_and_removes_its_directory() {
    let _serial = serial();
    if !require(&["qemu-nbd"]) {
        return;
    }
    let (dir, tmp) = scratch();
    let raw = image(dir.path(), "big.raw", "256m:r");
    let vdi = dir.path().join("big.vdi");
    convert(&raw, &vdi, &["-O", "vdi"]);
    std::fs::remove_file(&raw).unwrap();
    // Small reads, one at a time: slow, so that 99% are left to do when
    // the signal comes at 1% (qemu-nbd up and serving), however fast or
    // loaded the machine.
    let (child, mut progress) = spawn_with_progress(
        blksum()
            .args([
                "--progress=3",
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
            .stderr(Stdio::piped()),
    );
    assert!(progress.wait_for(1), "blksum ended before 1%");
    // SAFETY: plain syscall.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    no_leftovers(dir.path(), &tmp);
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
    if !require(&["qemu-nbd"]) {
        return;
    }
    let (dir, tmp) = scratch();
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
    no_leftovers(dir.path(), &tmp);

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
    no_leftovers(dir.path(), &tmp);
}

/// A secret file must be a regular file of at most 64 KiB, read by blksum
/// itself: anything else fails at once with a clear error, and never
/// reaches qemu-nbd (/dev/zero made it read forever, a FIFO blocked it).
#[test]
fn secret_files_that_cannot_be_a_passphrase_fail_at_once() {
    let _serial = serial();
    if !require(&["qemu-nbd"]) {
        return;
    }
    let (dir, tmp) = scratch();
    let d = dir.path();
    let raw = image(d, "s.raw", "1m:r");
    let luks = d.join("s.luks");
    to_luks(&raw, &luks, "correct horse");
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: plain syscall on a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let big = d.join("big");
    std::fs::write(&big, vec![b'x'; 1 << 20]).unwrap();
    let limit = d.join("limit");
    std::fs::write(&limit, vec![b'x'; (64 << 10) + 1]).unwrap();
    let cases: [(&Path, &str); 5] = [
        (Path::new("/dev/zero"), "not a regular file"),
        (&fifo, "not a regular file"),
        (d, "not a regular file"),
        (&big, "larger than a passphrase"),
        (&limit, "larger than a passphrase"),
    ];
    for (secret, reason) in cases {
        let start = Instant::now();
        let args = [
            "--secret-file",
            secret.to_str().unwrap(),
            luks.to_str().unwrap(),
        ];
        let out = run_timeout(&args, None, Duration::from_secs(20));
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
        assert!(
            err.contains("secret file")
                && err.contains(secret.to_str().unwrap())
                && err.contains(reason),
            "{args:?}: {err}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{args:?} took {:?}",
            start.elapsed()
        );
        no_leftovers(d, &tmp);
    }
    // The right passphrase, in a file of exactly 64 KiB with the rest of
    // it: refused by QEMU as a wrong password, so it did reach qemu-nbd.
    let max = d.join("max");
    let mut bytes = b"correct horse".to_vec();
    bytes.resize(64 << 10, b'y');
    std::fs::write(&max, bytes).unwrap();
    let out = run_timeout(
        &[
            "--secret-file",
            max.to_str().unwrap(),
            luks.to_str().unwrap(),
        ],
        None,
        LIMIT,
    );
    assert!(stderr(&out).contains("password"), "{}", stderr(&out));
    no_leftovers(d, &tmp);
}

/// The mode of `path`'s permission bits.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

/// The private directory is 0700 and the passphrase in it 0600 while
/// qemu-nbd starts (a slow key derivation keeps it starting); a run killed
/// then leaves the directory, which the next run removes; once connected
/// nothing is left on disk, so a run killed later leaves nothing.
#[test]
fn private_directory_is_0700_and_no_kill_leaves_it() {
    let _serial = serial();
    if !require(&["qemu-nbd"]) {
        return;
    }
    let (dir, tmp) = scratch();
    let d = dir.path();
    let raw = image(d, "k.raw", "1m:r");
    let luks = d.join("k.luks");
    qemu_img(&[
        "convert",
        "-q",
        "--object",
        "secret,id=sec0,data=correct horse",
        "-O",
        "luks",
        "-o",
        "key-secret=sec0,iter-time=1500",
        raw.to_str().unwrap(),
        luks.to_str().unwrap(),
    ]);
    let secret = d.join("secret");
    std::fs::write(&secret, "correct horse").unwrap();
    let spawn = |img: &Path, extra: &[&str]| {
        blksum()
            .args(extra)
            .arg(img)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut child = spawn(&luks, &["--secret-file", secret.to_str().unwrap()]);
    let start = Instant::now();
    let private = loop {
        if let Some(p) = temp_leftovers(&tmp)
            .into_iter()
            .find(|p| p.join("secret").exists())
        {
            break p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no private directory seen"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let name = private.file_name().unwrap().to_str().unwrap().to_string();
    assert!(name.starts_with("blkimage-"), "{name}");
    assert_eq!(mode(&private), 0o700, "{}", private.display());
    assert_eq!(mode(&private.join("secret")), 0o600);
    // Killed while qemu-nbd starts: the directory stays behind...
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    while !processes_with(&format!("qemu-nbd.*{}", d.display())).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "qemu-nbd outlived blksum"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(private.exists());
    // ...until the next run that starts a qemu-nbd, which leaves nothing.
    let vdi = d.join("k.vdi");
    convert(&raw, &vdi, &["-O", "vdi"]);
    let out = run_timeout(&[vdi.to_str().unwrap()], None, LIMIT);
    assert!(out.status.success(), "{}", stderr(&out));
    no_leftovers(d, &tmp);

    // Killed while it hashes (connected): nothing is left.
    let big = image(d, "big.raw", "256m:r");
    let vdi = d.join("big.vdi");
    convert(&big, &vdi, &["-O", "vdi"]);
    std::fs::remove_file(&big).unwrap();
    // Killed at 1%: connected, hashing, 99% to go.
    let (mut child, mut progress) = spawn_with_progress(
        blksum()
            .args([
                "--progress=3",
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
            .stderr(Stdio::piped()),
    );
    assert!(progress.wait_for(1), "blksum ended before 1%");
    assert!(
        child.try_wait().unwrap().is_none(),
        "blksum ended too soon to test"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    while !processes_with(&format!("qemu-nbd.*{}", d.display())).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "qemu-nbd outlived blksum"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    no_leftovers(d, &tmp);
}
