//! blksync on real images: DST ends with SRC's content, only differing
//! blocks are written, and bad states are refused without touching DST.

use blkmap::Map;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BLKSYNC: &str = env!("CARGO_BIN_EXE_blksync");
const BLKMAP: &str = env!("CARGO_BIN_EXE_blkmap");
const MIB: u64 = 1 << 20;

fn have_qemu() -> bool {
    let ok = |c: &str| {
        Command::new(c)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let have = ok("qemu-img") && ok("qemu-io");
    if !have {
        eprintln!("qemu-img or qemu-io missing: test skipped");
    }
    have
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn sh(cmd: &str, args: &[&str]) -> i32 {
    let out = Command::new(cmd).args(args).output().unwrap();
    out.status.code().unwrap()
}

fn image(dir: &Path, name: &str, fmt: &str, size: u64, cmds: &[&str]) -> PathBuf {
    let p = dir.join(name);
    assert_eq!(
        sh(
            "qemu-img",
            &["create", "-q", "-f", fmt, s(&p), &size.to_string()]
        ),
        0
    );
    write(&p, fmt, cmds);
    p
}

fn write(p: &Path, fmt: &str, cmds: &[&str]) {
    let mut args = vec!["-f", fmt];
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(s(p));
    assert_eq!(sh("qemu-io", &args), 0);
}

/// blksync's exit status and its stderr.
fn sync(args: &[&str]) -> (i32, String) {
    let out = Command::new(BLKSYNC).args(args).output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Same guest content (`-s` would also compare allocation, which differs
/// between a qcow2 image and a raw file by design; sizes are checked
/// apart).
fn same(a: &Path, b: &Path) -> bool {
    sh("qemu-img", &["compare", "-q", s(a), s(b)]) == 0
}

fn written(stderr: &str) -> u64 {
    stderr
        .split(": ")
        .last()
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn sync_writes_only_the_differences() {
    if !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = image(
        d,
        "src.qcow2",
        "qcow2",
        16 * MIB,
        &["write -P 0x11 0 4M", "write -P 0x22 9M 1M"],
    );
    let dst = d.join("dst.raw");
    assert_eq!(
        sh("qemu-img", &["convert", "-O", "raw", s(&src), s(&dst)]),
        0
    );
    let state = d.join("dst.map");

    // Nothing to do; the state is created.
    let (code, err) = sync(&[s(&src), s(&dst), "--state", s(&state)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(written(&err), 0);
    assert!(Map::load(&state).is_ok());

    // Changed blocks, zeroed blocks, new data in a hole.
    write(
        &src,
        "qcow2",
        &[
            "write -P 0x55 1M 64k",
            "write -z 9M 512k",
            "write -P 0x66 14M 4k",
        ],
    );
    let (code, err) = sync(&[s(&src), s(&dst), "--state", s(&state), "--verify"]);
    assert_eq!(code, 0, "{err}");
    assert!(same(&src, &dst));
    assert_eq!(written(&err), 2 * 65536, "{err}");
    assert!(err.contains("524288 zeroed"), "{err}");
    // The state is DST's map now.
    let m = d.join("check.map");
    assert_eq!(sh(BLKMAP, &[s(&dst), s(&m)]), 0);
    assert_eq!(Map::load(&m).unwrap(), Map::load(&state).unwrap());

    // Without a state, DST is hashed.
    write(&src, "qcow2", &["write -P 0x77 3M 64k"]);
    let (code, err) = sync(&[s(&src), s(&dst)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(written(&err), 65536);
    assert!(same(&src, &dst));
}

#[test]
fn sync_resizes_regular_files() {
    if !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = image(
        d,
        "src.qcow2",
        "qcow2",
        8 * MIB,
        &["write -P 0x11 0 1M", "write -P 0x22 7M 64k"],
    );
    // Missing: created.
    let new = d.join("new.raw");
    assert_eq!(sync(&[s(&src), s(&new)]).0, 0);
    assert!(same(&src, &new));
    // Smaller and larger.
    for size in [2 * MIB, 12 * MIB + 512] {
        let dst = image(
            d,
            &format!("dst{size}.raw"),
            "raw",
            size,
            &["write -P 0x33 0 2M"],
        );
        let (code, err) = sync(&[s(&src), s(&dst)]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(std::fs::metadata(&dst).unwrap().len(), 8 * MIB);
        assert!(same(&src, &dst));
    }
}

#[test]
fn bad_states_refused_and_dst_untouched() {
    if !have_qemu() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let src = image(d, "src.qcow2", "qcow2", 4 * MIB, &["write -P 0x11 0 1M"]);
    let dst = image(d, "dst.raw", "raw", 4 * MIB, &["write -P 0x22 0 64k"]);
    let other = image(d, "other.raw", "raw", 2 * MIB, &[]);
    let before = std::fs::read(&dst).unwrap();
    let stale = d.join("stale.map");
    assert_eq!(sh(BLKMAP, &[s(&other), s(&stale)]), 0);
    let damaged = d.join("damaged.map");
    let mut bytes = std::fs::read(&stale).unwrap();
    bytes[50] ^= 1;
    std::fs::write(&damaged, bytes).unwrap();
    let blake3 = d.join("blake3.map");
    assert_eq!(sh(BLKMAP, &[s(&dst), s(&blake3), "-d", "blake3"]), 0);
    for (state, extra, msg) in [
        (&stale, None, "not its state"),
        (&damaged, None, "damaged"),
        (&blake3, Some("sha256"), "blake3"),
    ] {
        let mut args = vec![s(&src), s(&dst), "--state", s(state)];
        if let Some(dg) = extra {
            args.extend(["-d", dg]);
        }
        let (code, err) = sync(&args);
        assert_eq!(code, 1, "{msg}");
        assert!(err.contains("state refused") && err.contains(msg), "{err}");
        assert_eq!(std::fs::read(&dst).unwrap(), before);
    }
    // A pipe is not a SRC.
    let out = Command::new(BLKSYNC)
        .args(["-", s(&dst)])
        .stdin(std::fs::File::open(&other).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("random access"));
    // --dry-run writes nothing.
    let (code, _) = sync(&[s(&src), s(&dst), "-n"]);
    assert_eq!(code, 0);
    assert_eq!(std::fs::read(&dst).unwrap(), before);
}
