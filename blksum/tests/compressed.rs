//! Compressed images (gzip, xz, zstd) read as the image they hold: files
//! written by the real `gzip`, `xz` and `zstd` from images qemu-img and
//! qemu-io made, raw and qcow2 inside, from a file, standard input and
//! HTTP (nginx with ranges, Python's http.server without); each checksum
//! is blksum's of the image decompressed. Bad input (cut short, a bad
//! check, garbage after the data, a bomb, a TMPDIR without room) ends in
//! exit 1 naming the file, no checksum.

use crate::common;

use common::qemu::{qemu_img, qemu_io, run_timeout};
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Far above any run here: a hang fails the test.
const LIMIT: Duration = Duration::from_secs(120);

/// The compressors, as their CLIs are run: the file name's suffix and the
/// command line writing FILE.SUFFIX (`-k`: the input kept).
const COMPRESSORS: &[(&str, &[&str])] = &[
    ("gz", &["gzip", "-k", "-f"]),
    ("xz", &["xz", "-k", "-f"]),
    // Several blocks, decoded on several threads.
    ("T0.xz", &["xz", "-k", "-f", "-T0", "--block-size=1MiB"]),
    ("zst", &["zstd", "-q", "-k", "-f"]),
];

fn ready() -> bool {
    require(&["qemu-img", "qemu-io", "gzip", "xz", "zstd"])
}

/// Compress `file` with `cmd` (one of [`COMPRESSORS`]) into FILE.`suffix`.
fn compress(file: &Path, suffix: &str, cmd: &[&str]) -> PathBuf {
    let out = file.with_file_name(format!(
        "{}.{suffix}",
        file.file_name().unwrap().to_str().unwrap()
    ));
    let status = Command::new(cmd[0])
        .args(&cmd[1..])
        .arg("-c")
        .arg(file)
        .stdout(std::fs::File::create(&out).unwrap())
        .status()
        .unwrap();
    assert!(status.success(), "{cmd:?}");
    out
}

/// A 9 MiB raw image (not a multiple of 1 MiB) with data, zeros and
/// holes, written by qemu-io, and its qcow2 conversion by qemu-img.
fn images(dir: &Path) -> (PathBuf, PathBuf) {
    let raw = dir.join("disk.raw");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "raw",
        raw.to_str().unwrap(),
        "9437696",
    ]);
    qemu_io(
        &raw,
        "raw",
        &[
            "write -P 0x11 0 64k",
            "write -P 0x22 1M 1536k",
            "write -z 4M 1M",
            "write -P 0x33 7M 513k",
            "write -P 0x44 9436672 1024",
        ],
    );
    let qcow2 = dir.join("disk.qcow2");
    qemu_img(&[
        "convert",
        "-q",
        "-f",
        "raw",
        "-O",
        "qcow2",
        raw.to_str().unwrap(),
        qcow2.to_str().unwrap(),
    ]);
    (raw, qcow2)
}

/// blksum ARGS, which must succeed: its checksum and standard error.
fn sum(args: &[&str]) -> (String, String) {
    let out = run_timeout(args, None, LIMIT);
    assert!(out.status.success(), "blksum {args:?}: {}", stderr(&out));
    let line = stdout(&out);
    (
        line.split_whitespace().next().unwrap().to_string(),
        stderr(&out),
    )
}

/// blksum ARGS, which must fail with exit 1 and no checksum; its stderr.
fn fails(args: &[&str]) -> String {
    let out = run_timeout(args, None, LIMIT);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "blksum {args:?}: {err}");
    assert!(out.stdout.is_empty(), "checksum printed: {}", stdout(&out));
    assert!(!err.contains("panicked"), "{err}");
    err
}

#[test]
fn each_compression_of_raw_and_qcow2_is_the_image() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (raw, qcow2) = images(dir.path());
    let r = raw.to_str().unwrap();
    for params in [
        &[][..],
        &["--digest", "blake3", "--block-size", "64k"],
        &["--digest", "sha1", "--block-size", "4m"],
    ] {
        let (want, _) = sum(&[params, &[r]].concat());
        for (suffix, cmd) in COMPRESSORS {
            for image in [&raw, &qcow2] {
                let c = compress(image, suffix, cmd);
                let name = c.to_str().unwrap();
                let (got, err) = sum(&[params, &[name]].concat());
                assert_eq!(got, want, "{name} {params:?}");
                if image == &raw {
                    assert_eq!(err, "", "{name}");
                } else {
                    // Said once, naming the directory and the space taken.
                    let tmp = std::env::temp_dir();
                    let note = format!(
                        "blksum: {name}: {}-compressed: decompressed into an unnamed \
                         temporary file in {}, ",
                        cmd[0],
                        tmp.display()
                    );
                    assert!(err.starts_with(&note), "{err}");
                    assert_eq!(err.lines().count(), 1, "{err}");
                }
            }
        }
    }
}

#[test]
fn standard_input_and_pipes_are_probed_too() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (raw, qcow2) = images(dir.path());
    let (want, _) = sum(&[raw.to_str().unwrap()]);
    for (suffix, cmd) in COMPRESSORS {
        for image in [&raw, &qcow2] {
            let c = compress(image, suffix, cmd);
            let out = run_pipe(&["-"], &c);
            assert!(out.status.success(), "{c:?}: {}", stderr(&out));
            assert_eq!(stdout(&out), format!("{want}  -\n"), "{c:?}");
        }
    }
}

#[test]
fn a_forced_raw_format_hashes_the_bytes_of_the_file() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (raw, _) = images(dir.path());
    for (suffix, cmd) in COMPRESSORS {
        let c = compress(&raw, suffix, cmd);
        let mut bytes = std::fs::read(&c).unwrap();
        // Standard input: its bytes as they come.
        let out = run(&["-f", "raw", "-"], Some(&c));
        assert_eq!(
            stdout(&out),
            format!("{}  -\n", blkhash::hash(&bytes).to_hex())
        );
        // A file: QEMU's size, rounded up to 512.
        bytes.resize(bytes.len().next_multiple_of(512), 0);
        let (got, _) = sum(&["-f", "raw", c.to_str().unwrap()]);
        assert_eq!(got, blkhash::hash(&bytes).to_hex(), "{c:?}");
    }
}

#[test]
fn members_streams_and_frames_one_after_the_other_are_one_image() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let a = image(d, "a", "1m:r");
    let b = image(d, "b", "1m:0 1m:- 3000:t");
    let both = d.join("both");
    let mut whole = std::fs::read(&a).unwrap();
    whole.extend(std::fs::read(&b).unwrap());
    std::fs::write(&both, &whole).unwrap();
    let (want, _) = sum(&[both.to_str().unwrap()]);
    for (suffix, cmd) in COMPRESSORS {
        let mut cat = std::fs::read(compress(&a, suffix, cmd)).unwrap();
        cat.extend(std::fs::read(compress(&b, suffix, cmd)).unwrap());
        if suffix.ends_with("xz") {
            // Stream padding, which xz accepts between streams.
            cat.extend([0u8; 8]);
        }
        let p = d.join(format!("cat.{suffix}"));
        std::fs::write(&p, &cat).unwrap();
        let (got, _) = sum(&[p.to_str().unwrap()]);
        assert_eq!(got, want, "{suffix}");
    }
}

/// `data` written to `dir`/`name`; its path.
fn write(dir: &Path, name: &str, data: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn bad_input_is_an_error_naming_the_file() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (raw, qcow2) = images(d);
    for (suffix, cmd) in COMPRESSORS {
        for image in [&raw, &qcow2] {
            let good = std::fs::read(compress(image, suffix, cmd)).unwrap();
            let kind = cmd[0];
            // Cut short, anywhere: never a checksum.
            for cut in [good.len() / 3, good.len() - 1] {
                let p = write(d, "cut", &good[..cut]);
                let err = fails(&[&p]);
                assert!(err.starts_with(&format!("blksum: {p}: {kind}: ")), "{err}");
            }
            // Bytes after the data.
            let mut tail = good.clone();
            tail.extend(b"garbage");
            let p = write(d, "tail", &tail);
            let err = fails(&[&p]);
            assert!(err.contains("garbage after the compressed data"), "{err}");
            // A flipped byte at the end: the check, the CRC or the length.
            let mut flipped = good.clone();
            let at = good.len() - 6;
            flipped[at] ^= 0x55;
            let p = write(d, "flipped", &flipped);
            let err = fails(&[&p]);
            assert!(err.starts_with(&format!("blksum: {p}: ")), "{err}");
        }
    }
    // xz's stream padding must be a multiple of 4 bytes.
    let mut padded = std::fs::read(compress(&raw, "xz", &["xz", "-k", "-f"])).unwrap();
    padded.extend([0u8; 3]);
    let p = write(d, "padded.xz", &padded);
    assert!(fails(&[&p]).contains("multiple of 4"));
    // Zeros after the last gzip member are ignored, as gzip -d does.
    let mut zeros = std::fs::read(compress(&raw, "gz", &["gzip", "-k", "-f"])).unwrap();
    zeros.extend([0u8; 100]);
    let p = write(d, "zeros.gz", &zeros);
    assert_eq!(sum(&[&p]).0, sum(&[raw.to_str().unwrap()]).0);
}

#[test]
fn a_qcow2_image_followed_by_endless_zeros_is_a_bomb() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let small = d.join("small.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", small.to_str().unwrap(), "1M"]);
    // 1 MiB of virtual size, then 300 MiB of zeros: more than any qcow2
    // image of 1 MiB can take (its bound: 256 MiB and a little).
    let bomb = d.join("bomb.qcow2.zst");
    let sh = format!(
        "(cat {} && head -c 300M /dev/zero) | zstd -q -c > {}",
        small.display(),
        bomb.display()
    );
    assert!(
        Command::new("sh")
            .args(["-c", &sh])
            .status()
            .unwrap()
            .success()
    );
    assert!(std::fs::metadata(&bomb).unwrap().len() < 1 << 20);
    let b = bomb.to_str().unwrap();
    let err = fails(&[b]);
    assert!(err.contains("decompression bomb"), "{err}");
    assert!(err.starts_with(&format!("blksum: {b}: ")), "{err}");
}

#[test]
fn a_tmpdir_without_room_is_named_with_the_file() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (_, qcow2) = images(dir.path());
    let c = compress(&qcow2, "gz", &["gzip", "-k", "-f"]);
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    // A file size limit of 1 MiB, and SIGXFSZ ignored (as a shell's
    // `ulimit -f` with `trap '' XFSZ`): the write past it fails with EFBIG.
    let mut cmd = blksum();
    cmd.arg(&c)
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit and signal are async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = cmd.output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty());
    assert!(
        err.starts_with(&format!("blksum: {}: ", c.display())),
        "{err}"
    );
    assert!(err.contains(&format!("in {}", tmp.display())), "{err}");
    assert!(err.contains("TMPDIR"), "{err}");
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0);
}

#[test]
fn urls_with_and_without_ranges_are_read_as_streams() {
    if !ready() || !testkit::http::have_nginx() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (raw, qcow2) = images(dir.path());
    let (want, _) = sum(&[raw.to_str().unwrap()]);
    let mut names = Vec::new();
    for (suffix, cmd) in COMPRESSORS {
        for image in [&raw, &qcow2] {
            let c = compress(image, suffix, cmd);
            names.push(c.file_name().unwrap().to_str().unwrap().to_string());
        }
    }
    let nginx = testkit::http::Nginx::start(dir.path(), None, "");
    let python = testkit::http::PythonServer::start(dir.path());
    for base in [&nginx.url, &python.url] {
        for name in &names {
            let url = format!("{base}/{name}");
            let (got, _) = sum(&[&url]);
            assert_eq!(got, want, "{url}");
        }
    }
    // A file cut short over HTTP fails as a local one does.
    let good = std::fs::read(dir.path().join(&names[0])).unwrap();
    write(dir.path(), "cut.gz", &good[..good.len() / 2]);
    for base in [&nginx.url, &python.url] {
        let url = format!("{base}/cut.gz");
        let err = fails(&[&url]);
        assert!(err.contains("truncated"), "{err}");
    }
}
