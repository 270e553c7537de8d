//! virtnbdbackup's streams written by virtnbdbackup's own writer (its
//! Python package, driven by `data/vnbd-stream.py` from a raw file
//! instead of an NBD export), and restored by its own `virtnbdrestore`
//! (libvirt's test driver standing in for a libvirtd: with `--sequence`
//! it only reads the streams and writes the disk through qemu-nbd).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The Python virtnbdbackup runs with (its script's first line), if it
/// imports virtnbdbackup's package and python-lz4; else says that the
/// test is skipped and why.
pub fn writer() -> Option<PathBuf> {
    let script = which("virtnbdbackup").and_then(|p| std::fs::read_to_string(p).ok());
    let python = script
        .as_deref()
        .and_then(|s| s.lines().next())
        .and_then(|l| l.strip_prefix("#!"))
        .map(|l| PathBuf::from(l.split_whitespace().next().unwrap_or("")));
    let ok = python.as_ref().is_some_and(|py| {
        Command::new(py)
            .args(["-c", "import libvirtnbdbackup.sparsestream, lz4.frame"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !ok {
        eprintln!("virtnbdbackup (its Python package) missing: test skipped");
        return None;
    }
    python
}

/// `prog` on PATH.
fn which(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// Write the stream `out` of the raw file `raw` with virtnbdbackup's
/// writer run by `python` ([`writer`]); `args` as `data/vnbd-stream.py`
/// takes them (`--compress 2`, `--incremental`, `--frames ...`). Panics
/// if it fails.
pub fn write_stream(python: &Path, raw: &Path, out: &Path, args: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/vnbd-stream.py");
    let o = Command::new(python)
        .arg(script)
        .arg(raw)
        .arg(out)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{python:?} runs: {e}"));
    assert!(
        o.status.success(),
        "vnbd-stream.py {out:?} {args:?}: {}",
        text(&o)
    );
}

/// The disk virtnbdrestore restores from the streams `files` (names in
/// `dir`, the full one first) into `dir/restored` (the disk's name, as the
/// meta data says, in it), with its temporary files and socket in `dir`;
/// `None` (the test skipped) where virtnbdrestore or libvirt's test driver
/// is missing. Returns once no process holds the restored image's lock:
/// virtnbdrestore ends its qemu-nbd without waiting for it.
pub fn virtnbdrestore(dir: &Path, files: &[&str], disk: &str) -> Option<PathBuf> {
    if !crate::tools::require(&["virtnbdrestore", "qemu-nbd", "qemu-img"]) {
        return None;
    }
    // virtnbdrestore wants the domain's configuration beside the streams
    // (and copies it); with --sequence it restores only the streams named.
    std::fs::write(
        dir.join("vmconfig.virtnbdbackup.0.xml"),
        format!(
            "<domain type='kvm'><name>restore</name><memory>65536</memory>\
             <os><type arch='x86_64'>hvm</type></os><devices><disk type='file' \
             device='disk'><driver name='qemu' type='qcow2'/><source \
             file='/nonexistent/{disk}'/><target dev='{disk}' bus='scsi'/></disk>\
             </devices></domain>"
        ),
    )
    .unwrap();
    let (out, tmp) = (dir.join("restored"), dir.join("tmp"));
    std::fs::create_dir_all(&tmp).unwrap();
    let o = Command::new("virtnbdrestore")
        .args(["-U", "test:///default", "--noprogress", "-i"])
        .arg(dir)
        .arg("-o")
        .arg(&out)
        .arg("--socketfile")
        .arg(dir.join("restore.sock"))
        .args(["--sequence", &files.join(",")])
        .env("TMPDIR", &tmp)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("virtnbdrestore runs: {e}"));
    if text(&o).contains("virConnectOpen") {
        eprintln!(
            "libvirt's test driver missing (virtnbdrestore -U test:///default): test skipped"
        );
        return None;
    }
    assert!(o.status.success(), "virtnbdrestore {files:?}: {}", text(&o));
    let img = out.join(disk);
    wait_unlocked(&img);
    Some(img)
}

/// Waits (at most a minute) until `qemu-img info` can open `img`.
fn wait_unlocked(img: &Path) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let o = Command::new("qemu-img")
            .arg("info")
            .arg(img)
            .output()
            .unwrap_or_else(|e| panic!("qemu-img runs: {e}"));
        if o.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(
            err.contains("lock") && std::time::Instant::now() < deadline,
            "qemu-img info {img:?}: {err}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn text(o: &Output) -> String {
    format!(
        "{:?}: {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
