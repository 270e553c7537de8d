//! QEMU's tools and the other programs the tests run: the expected values
//! of image tests always come from them, never from our own readers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// True if `prog` is found on PATH.
pub fn have(prog: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {prog}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// True if every one of `progs` is installed; else says on standard error
/// that the test is skipped and what installs them.
pub fn require(progs: &[&str]) -> bool {
    let missing: Vec<&str> = progs.iter().copied().filter(|p| !have(p)).collect();
    if !missing.is_empty() {
        eprintln!(
            "{} missing: test skipped (scripts/setup.sh installs it)",
            missing.join(", ")
        );
    }
    missing.is_empty()
}

/// True if qemu-img and qemu-io are installed (see [`require`]).
pub fn have_qemu() -> bool {
    require(&["qemu-img", "qemu-io"])
}

/// A scratch directory for one test, removed when dropped.
pub fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temporary directory")
}

/// A scratch directory that another user can reach and read (mode 0755;
/// 0777 if `writable`), removed when dropped: for what a program run as
/// another user ([`thread_limited`]) reads or writes. It is made in the
/// temporary directory when every directory above it lets others through,
/// else in /tmp: a private TMPDIR (mode 0700, as `mktemp -d` makes it)
/// keeps other users out of all it holds.
pub fn open_scratch(writable: bool) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let tmp = std::env::temp_dir();
    let open = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
    let base = if tmp.ancestors().all(open) {
        tmp
    } else {
        PathBuf::from("/tmp")
    };
    let dir = tempfile::Builder::new()
        .prefix("open-scratch-")
        .tempdir_in(&base)
        .unwrap_or_else(|e| panic!("a scratch directory in {}: {e}", base.display()));
    let mode = if writable { 0o777 } else { 0o755 };
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
    dir
}

/// Run `prog ARGS` in `cwd` (or here), standard input empty; panics with its
/// standard error unless it succeeds.
pub fn run_ok(prog: &str, args: &[&str], cwd: Option<&Path>) -> Output {
    let mut cmd = Command::new(prog);
    cmd.args(args).stdin(Stdio::null());
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("{prog} runs: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `qemu-img ARGS`, which must succeed.
pub fn qemu_img(args: &[&str]) -> Output {
    run_ok("qemu-img", args, None)
}

/// `qemu-img ARGS` run in `cwd` (relative backing names), which must succeed.
pub fn qemu_img_in(cwd: &Path, args: &[&str]) -> Output {
    run_ok("qemu-img", args, Some(cwd))
}

/// `qemu-io -f FMT -c CMD... IMG`, which must succeed.
pub fn qemu_io(img: &Path, fmt: &str, cmds: &[&str]) {
    qemu_io_at(None, img, fmt, cmds)
}

/// `qemu-io` run in `cwd`.
pub fn qemu_io_in(cwd: &Path, img: &Path, fmt: &str, cmds: &[&str]) {
    qemu_io_at(Some(cwd), img, fmt, cmds)
}

fn qemu_io_at(cwd: Option<&Path>, img: &Path, fmt: &str, cmds: &[&str]) {
    if cmds.is_empty() {
        return;
    }
    let mut args = vec!["-f", fmt];
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(img.to_str().unwrap());
    let out = run_ok("qemu-io", &args, cwd);
    // qemu-io reports failed commands on stdout/stderr but still exits 0.
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("failed") && !text.contains("error"),
        "qemu-io {cmds:?} {}: {text}",
        img.display()
    );
}

/// `qemu-img create -q -f FMT [OPTS] IMG SIZE`.
pub fn create(img: &Path, fmt: &str, opts: &[&str], size: &str) {
    let mut args = vec!["create", "-q", "-f", fmt];
    args.extend(opts);
    args.extend([img.to_str().unwrap(), size]);
    qemu_img(&args);
}

/// An image of `fmt` and `size` bytes at `img`, then qemu-io `cmds` (write,
/// write -z, discard...) run on it.
pub fn image_with(img: &Path, fmt: &str, size: u64, cmds: &[&str]) {
    create(img, fmt, &[], &size.to_string());
    qemu_io(img, fmt, cmds);
}

/// QEMU's view of `img` (any format, backing chain followed), as a raw file
/// `out`.
pub fn flatten(img: &Path, out: &Path) {
    let (img, out) = (img.to_str().unwrap(), out.to_str().unwrap());
    qemu_img(&["convert", "-q", "-O", "raw", img, out]);
}

/// QEMU's bytes of `img`: [`flatten`] into `scratch`, read, removed.
pub fn guest_bytes(img: &Path, scratch: &Path) -> Vec<u8> {
    flatten(img, scratch);
    let data = std::fs::read(scratch).unwrap();
    std::fs::remove_file(scratch).unwrap();
    data
}

/// Same guest content, as `qemu-img compare` sees it (`-s` would also
/// compare allocation, which differs between formats by design).
pub fn same_content(a: &Path, b: &Path) -> bool {
    Command::new("qemu-img")
        .args(["compare", "-q"])
        .args([a, b])
        .stdin(Stdio::null())
        .status()
        .expect("qemu-img runs")
        .success()
}

/// A command that runs `prog` as user `uid` (no such user need exist)
/// allowed `nproc` tasks, processes and threads together (RLIMIT_NPROC,
/// through `setpriv` and `prlimit`), so that starting one more thread fails
/// with EAGAIN as on a machine at its limit.
///
/// Root is exempt from RLIMIT_NPROC, hence another user; one that runs
/// nothing else, so the count starts at this process alone. Give each test
/// its own `uid`: tests running at once then never count against each
/// other's limit. Changing user needs root: otherwise this says on standard
/// error that the test is skipped and returns None. What the program reads
/// must be readable by `uid`: put it in an [`open_scratch`] directory.
pub fn thread_limited(prog: impl AsRef<std::ffi::OsStr>, uid: u32, nproc: u32) -> Option<Command> {
    // /proc/self belongs to the effective user.
    let euid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    if euid != 0 {
        eprintln!("not root: cannot run as a user of its own under a thread limit; test skipped");
        return None;
    }
    assert!(
        have("setpriv") && have("prlimit"),
        "setpriv and prlimit (util-linux) are needed: scripts/setup.sh installs them"
    );
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg("prlimit")
        .arg(format!("--nproc={nproc}"))
        .arg(prog.as_ref());
    Some(c)
}

/// `bin args` run under `ulimit -v KIB`: exit 0 with `want` at the start
/// of its output (the checksum), or exit 1 (2: blkdiff's trouble) saying
/// which buffer could not be had or which thread could not start, with
/// nothing on standard output; never an abort (exit 134:
/// "memory allocation of N bytes failed"), a panic or a signal.
///
/// One abort is glibc's, and is run again (up to twice): "failed to
/// register TLS destructor", its fatal error when its own small
/// allocation for a thread-local's destructor fails (Rust's standard
/// library registers one as a thread first spawns another). Met once, at
/// 64 MB in a loaded CI run; not in 180 runs at that limit here, where a
/// debugger shows the one registration of a run at its first spawn.
pub fn assert_clean_under_memory_limit(bin: &str, kib: u64, args: &[&str], want: &str) {
    use std::os::unix::process::ExitStatusExt;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut out = run_limited(bin, kib, args);
    for _ in 0..2 {
        if !text(&out.stderr).contains("failed to register TLS destructor") {
            break;
        }
        out = run_limited(bin, kib, args);
    }
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let said = format!("ulimit -v {kib}, {args:?}: {:?}: {stderr}", out.status);
    assert_eq!(out.status.signal(), None, "{said}");
    match out.status.code() {
        Some(0) => assert!(stdout.starts_with(want), "{said}: {stdout}"),
        Some(1 | 2) => {
            assert!(stdout.is_empty(), "{said}: {stdout}");
            assert!(
                stderr.contains("cannot allocate ") || stderr.contains("cannot start a "),
                "{said}"
            );
            assert!(!stderr.contains("panicked"), "{said}");
        }
        _ => panic!("{said}"),
    }
}

/// `bin args` under `ulimit -v KIB`.
fn run_limited(bin: &str, kib: u64, args: &[&str]) -> Output {
    let script = format!("ulimit -v {kib} && exec \"$0\" \"$@\"");
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(bin)
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// A program on PATH, or where Debian puts daemons (/usr/sbin, which a
/// user's PATH may lack): nginx, danted.
pub fn sbin_binary(name: &str) -> Option<std::path::PathBuf> {
    if have(name) {
        return Some(name.into());
    }
    let sbin = std::path::Path::new("/usr/sbin").join(name);
    sbin.exists().then_some(sbin)
}

/// Ask `child` to end (SIGTERM) and wait for it, killing it after 10 s.
/// Not SIGKILL first: a server then cleans up (nbdkit's sh plugin removes
/// its scripts from /tmp, danted ends the processes it started).
pub fn terminate(child: &mut std::process::Child) {
    use std::time::{Duration, Instant};
    if let Ok(None) = child.try_wait() {
        // SAFETY: kill(2) on our own child, not yet waited for.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let until = Instant::now() + Duration::from_secs(10);
        while let Ok(None) = child.try_wait() {
            if Instant::now() > until {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Wait until `child`, a server named `what`, accepts connections on
/// `port` of 127.0.0.1; a panic (with `log()`, what it said) if it exits
/// first or takes over 60 s.
pub fn wait_listening(
    child: &mut std::process::Child,
    port: u16,
    what: &str,
    log: impl Fn() -> String,
) {
    use std::time::{Duration, Instant};
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("{what} exited ({status}): {}", log());
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what} did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
