//! blksync stopped at any point: killed (SIGKILL) at random moments, or
//! asked to stop (SIGINT, SIGTERM). Whatever the moment, a state left
//! behind is DST's map (it never claims a block not written), and the next
//! run brings DST to SRC's content (checked with qemu-img compare and
//! blksum).
//!
//! The moments are points of the run the test sees it reach, a random
//! number of bytes read (its `rchar` in /proc/PID/io: SRC's data, mostly),
//! never a time after its start: the same points, and every run stopped
//! before it ends, on a fast machine and on a loaded one.

use crate::common;

use blkmap::Map;
use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A small deterministic generator (xorshift64*): seeds make failures
/// reproducible without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

thread_local! {
    /// The TMPDIR of this thread's blksync runs, if its test chose one.
    static TMPDIR: std::cell::RefCell<Option<std::path::PathBuf>> =
        const { std::cell::RefCell::new(None) };
}

/// blksync, with this thread's TMPDIR if its test chose one (a private
/// directory, so that it sees what its own runs leave and no other's).
fn blksync() -> Command {
    let mut cmd = Command::new(BLKSYNC);
    TMPDIR.with(|t| {
        if let Some(d) = &*t.borrow() {
            cmd.env("TMPDIR", d);
        }
    });
    cmd
}

fn spawn(args: &[&str]) -> Child {
    blksync()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Bytes process `pid` has read so far: the `rchar` of /proc/PID/io,
/// every read and pread (SRC's, DST's, the state's).
fn bytes_read(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))?
        .parse()
        .ok()
}

/// Whether process `pid` has a child (blksync's private qemu-nbd): a
/// process whose parent it is, in /proc/*/stat.
fn has_child(pid: u32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read_to_string(e.path().join("stat")).is_ok_and(|stat| {
            // "PID (COMM) STATE PPID ...": COMM may hold spaces, not ")".
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.split(' ').nth(1))
                .is_some_and(|ppid| ppid == pid.to_string())
        })
    })
}

/// Send `sig` once the run has read `bytes`: its exit code, and how long it
/// took to stop once signalled. Every run reads all of SRC's data, and
/// `bytes` is at most half of it: a run that ends before the signal (or
/// never gets there) fails the test, with its error output.
fn signal_at(child: Child, bytes: u64, sig: i32) -> (i32, Duration) {
    signal_when(child, sig, &format!("byte {bytes}"), |pid| {
        bytes_read(pid).is_some_and(|n| n >= bytes)
    })
}

/// Send `sig` once `now(pid)` holds (`what`, for the message), as
/// [`signal_at`] does.
fn signal_when(
    mut child: Child,
    sig: i32,
    what: &str,
    mut now: impl FnMut(u32) -> bool,
) -> (i32, Duration) {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut ended = false;
    while !now(child.id()) {
        if child.try_wait().unwrap().is_some() {
            // Reaped: its pid may be another process's by now.
            ended = true;
            break;
        }
        assert!(Instant::now() < deadline, "the run never got to {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
    let t = Instant::now();
    if !ended {
        // SAFETY: kill on the pid of our own child, not yet reaped.
        unsafe { libc::kill(child.id() as i32, sig) };
    }
    let out = child.wait_with_output().unwrap();
    let took = t.elapsed();
    use std::os::unix::process::ExitStatusExt;
    let status = out.status;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap());
    assert!(
        code == 128 + sig,
        "the run was not stopped by the signal at {what} ({status}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (code, took)
}

/// Change SRC (a 32 MiB qcow2 image) at random places, data of `pattern`
/// and written zeros, then run blksync with `args` and SIGKILL it once it
/// has read a random number of bytes below `span`, or, one time in three
/// with `served` (blksync serves DST with a qemu-nbd of its own), once it
/// has started that server (while it starts, or just after).
fn change_then_kill(
    rng: &mut Rng,
    src: &Path,
    pattern: u64,
    args: &[&str],
    span: u64,
    served: bool,
) {
    let off = rng.below(30) * MIB;
    let cmds = [
        format!(
            "write -P {pattern} {off} {}",
            64 * 1024 * (1 + rng.below(32))
        ),
        format!("write -z {}M 1M", rng.below(31)),
    ];
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    write(src, "qcow2", &cmds);
    if served && rng.below(3) == 0 {
        signal_when(spawn(args), libc::SIGKILL, "starting qemu-nbd", has_child);
    } else {
        signal_at(spawn(args), rng.below(span), libc::SIGKILL);
    }
}

/// What a stopped run may leave: no state, or one that is DST's map.
fn state_is_truthful(dir: &Path, dst: &Path, state: &Path) {
    if !state.exists() {
        return;
    }
    let saved = Map::load(state).expect("a state left behind loads (it is saved atomically)");
    let m = dir.join("truth.map");
    sh(BLKMAP, &[s(dst), s(&m)]);
    assert_eq!(
        Map::load(&m).unwrap(),
        saved,
        "the state left behind is not DST's map"
    );
}

fn finish_and_check(dir: &Path, src: &Path, dst: &Path, state: &Path) {
    let out = run(
        BLKSYNC,
        &[s(src), s(dst), "--state", s(state), "--checksum"],
    );
    assert_eq!(out.code, 0, "rerun: {}", out.stderr);
    assert!(same(src, dst), "qemu-img compare: DST differs from SRC");
    let sum = checksum(dir, src);
    assert_eq!(sum, checksum(dir, dst), "blksum: DST differs from SRC");
    assert!(out.stdout.starts_with(&sum));
    state_is_truthful(dir, dst, state);
}

/// SIGKILL at random moments of first copies and updates, several seeds;
/// each run is killed, then the state checked, then the next run (killed
/// too, or not) must finish the job.
#[test]
fn killed_at_random_points_then_rerun() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 64 * MIB;
    let src = src_qcow2(d, size, &["write -P 0x11 0 40M", "write -P 0x12 48M 8M"]);
    // Kills spread over the first half of the 48 MiB of SRC's data that
    // every run reads.
    let span = 24 * MIB;
    let mut killed = 0;
    for seed in [1u64, 2, 3, 4, 5] {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let dst = d.join(format!("dst{seed}.raw"));
        let state = d.join(format!("dst{seed}.map"));
        let args = [s(&src), s(&dst), "--state", s(&state), "-t", "1"];
        for round in 0..3 {
            // Change SRC between rounds: scattered data, zeros, discards.
            let off = rng.below(60) * MIB + rng.below(16) * 4096;
            let cmds = [
                format!(
                    "write -P {} {off} {}",
                    0x20 + round,
                    64 * 1024 * (1 + rng.below(64))
                ),
                format!("write -z {}M 1M", rng.below(63)),
                format!("discard {}M 64k", rng.below(63)),
            ];
            let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
            write(&src, "qcow2", &cmds);
            signal_at(spawn(&args), rng.below(span), libc::SIGKILL);
            killed += 1;
            state_is_truthful(d, &dst, &state);
        }
        finish_and_check(d, &src, &dst, &state);
    }
    eprintln!("{killed} runs killed");
}

/// The same with an NBD DST (a qcow2 image through qemu-nbd): blksync
/// killed at random moments, the server too after some of the kills (it
/// loses what it had not flushed); a state left behind is the export's
/// map, read through a fresh server, and the next run finishes the job.
#[test]
fn killed_at_random_points_nbd_dst() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    // blksync's TMPDIR, where its private qemu-nbd's directory lives.
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    TMPDIR.with(|t| *t.borrow_mut() = Some(tmp.clone()));
    let size = 32 * MIB;
    let (src, dst, state) =
        qcow2_src_dst(d, size, &["write -P 0x11 0 20M", "write -P 0x12 24M 4M"]);
    let Some(mut server) = qemu_nbd(d, &dst, &[]) else {
        return;
    };
    // Kills spread over the first half of SRC's 24 MiB of data.
    let span = 12 * MIB;
    let mut rng = Rng(0x5eed);
    let mut killed = 0;
    for round in 0..8u64 {
        let args = [s(&src), &server.url, "--state", s(&state), "-t", "1"];
        change_then_kill(&mut rng, &src, 0x20 + round, &args, span, false);
        killed += 1;
        if round % 2 == 1 {
            drop(server); // SIGKILL: unflushed writes are lost
            server = qemu_nbd(d, &dst, &[]).unwrap();
        }
        if state.exists() {
            let saved = Map::load(&state).expect("a state left behind loads");
            let m = d.join("truth.map");
            sh(BLKMAP, &[&server.url, s(&m)]);
            assert_eq!(
                Map::load(&m).unwrap(),
                saved,
                "the state left behind is not DST's map"
            );
        }
    }
    let out = run(
        BLKSYNC,
        &[s(&src), &server.url, "--state", s(&state), "--verify"],
    );
    assert_eq!(out.code, 0, "rerun: {}", out.stderr);
    drop(server);
    assert!(same(&src, &dst), "qemu-img compare: DST differs from SRC");
    assert_eq!(checksum(d, &src), checksum(d, &dst));
    eprintln!("{killed} runs killed");
}

/// Wait until no process has `path` on its command line (a private
/// qemu-nbd serving it, which exits on the parent-death SIGTERM).
fn wait_unserved(path: &Path) {
    assert!(
        unserved_within(path, Duration::from_secs(30)),
        "the private qemu-nbd outlived blksync by 30 s"
    );
}

/// True once no process has `path` on its command line, false after `limit`.
fn unserved_within(path: &Path, limit: Duration) -> bool {
    let t = Instant::now();
    loop {
        let serving = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == s(path).as_bytes()))
        });
        if !serving {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// After a served-image run was killed: its private qemu-nbd is gone, or
/// (killed while the server started, when qemu-nbd loses the SIGTERM its
/// parent's death sends) the server's private directory is still there and
/// the next run, which starts a server of its own, stops the orphan first.
fn served_run_cleaned_up(args: &[&str], dst: &Path, tmp: &Path) {
    if unserved_within(dst, Duration::from_secs(5)) {
        return;
    }
    let dirs = std::fs::read_dir(tmp).unwrap().count();
    assert!(dirs > 0, "a qemu-nbd outlived blksync after it was up");
    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let _ = blksync().args(&dry).output().unwrap();
    wait_unserved(dst);
}

/// The same with a qcow2 file as DST, which blksync serves itself with a
/// private qemu-nbd: killed at random moments, blksync takes the server
/// with it (SIGTERM from the kernel: qemu-nbd flushes and closes the
/// image), the image stays consistent (qemu-img check), a state left
/// behind is its map, and the next run finishes the job.
#[test]
fn killed_at_random_points_served_image_dst() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    // blksync's TMPDIR, where its private qemu-nbd's directory lives.
    let tmp = d.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    TMPDIR.with(|t| *t.borrow_mut() = Some(tmp.clone()));
    let size = 32 * MIB;
    let (src, dst, state) =
        qcow2_src_dst(d, size, &["write -P 0x11 0 20M", "write -P 0x12 24M 4M"]);
    let args = [s(&src), s(&dst), "--state", s(&state), "-t", "1"];
    // A first copy to the end, then kills spread over the first half of
    // SRC's 24 MiB of data.
    let first = blksync().args(args).output().unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let span = 12 * MIB;
    let mut rng = Rng(0xd57);
    let mut killed = 0;
    for round in 0..6u64 {
        change_then_kill(&mut rng, &src, 0x40 + round, &args, span, true);
        killed += 1;
        served_run_cleaned_up(&args, &dst, &tmp);
        let check = run("qemu-img", &["check", s(&dst)]);
        assert_eq!(
            check.code, 0,
            "qemu-img check: {}{}",
            check.stdout, check.stderr
        );
        state_is_truthful(d, &dst, &state);
    }
    let out = blksync()
        .args([s(&src), s(&dst), "--state", s(&state), "--verify"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rerun: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(same(&src, &dst), "qemu-img compare: DST differs from SRC");
    assert_eq!(checksum(d, &src), checksum(d, &dst));
    // Runs killed while their qemu-nbd started left its private directory;
    // the last run removed them, and its own.
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
    eprintln!("{killed} runs killed");
}

/// Ctrl-C and SIGTERM stop a run promptly with 130 and 143, during a first
/// copy (DST written while SRC is read) and during an update (SRC being
/// hashed, the state still in place and still true).
#[test]
fn sigint_and_sigterm_stop_promptly() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let src = src_qcow2(d, 512 * MIB, &["write -P 0x31 0 512M"]);
    let dst = d.join("dst.raw");
    let state = d.join("dst.map");
    let args = [s(&src), s(&dst), "--state", s(&state), "-t", "1"];
    // Signalled once 64 MiB of the 512 are read: well under way (its
    // handlers long installed), far from done.
    for (sig, want) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let (code, took) = signal_at(spawn(&args), 64 * MIB, sig);
        assert_eq!(code, want, "first copy, signal {sig}");
        // The grace period (2 s) bounds a stop that the flag does not make.
        assert!(took < Duration::from_secs(3), "took {took:?} to stop");
        state_is_truthful(d, &dst, &state);
    }
    finish_and_check(d, &src, &dst, &state);
    write(&src, "qcow2", &["write -P 0x32 100M 300M"]);
    let (code, took) = signal_at(spawn(&args), 64 * MIB, libc::SIGTERM);
    assert_eq!(code, 143, "update");
    assert!(took < Duration::from_secs(3), "took {took:?} to stop");
    state_is_truthful(d, &dst, &state);
    finish_and_check(d, &src, &dst, &state);
}

/// Incremental copies through SRC's dirty bitmap (`--dirty-bitmap`),
/// SIGKILLed at random points of the dirty data they read: a state left
/// behind is DST's map, and the next run with the bitmap (an update when
/// the state survived, a full comparison when the kill came after it was
/// removed) brings DST to SRC's content. The bitmap is never cleared: it
/// marks every change since the first copy, a superset of the changes
/// since any state saved after it.
#[test]
fn killed_at_random_points_with_a_dirty_bitmap() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let size = 64 * MIB;
    let src = src_qcow2(d, size, &["write -P 0x11 0 40M", "write -P 0x12 48M 8M"]);
    sh("qemu-img", &["bitmap", "--add", s(&src), "b"]);
    let dst = d.join("dst.raw");
    let state = d.join("dst.map");
    let first = run(BLKSYNC, &[s(&src), s(&dst), "--state", s(&state)]);
    assert_eq!(first.code, 0, "first copy: {}", first.stderr);
    let args = [
        s(&src),
        s(&dst),
        "--state",
        s(&state),
        "--dirty-bitmap",
        "b",
        "-t",
        "1",
    ];
    let mut rng = Rng(0x5eed_b175 | 1);
    for round in 0..4u64 {
        // 24 scattered MiB rewritten: the dirty data every run reads at
        // least once; kills spread over its first third.
        let cmds: Vec<String> = (0..24)
            .map(|k| format!("write -P {} {}M 1M", 0x30 + round, (k * 5 + round) % 63))
            .collect();
        let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
        write(&src, "qcow2", &cmds);
        signal_at(spawn(&args), rng.below(8 * MIB), libc::SIGKILL);
        state_is_truthful(d, &dst, &state);
        // SIGKILL leaves the bitmap as QEMU left it: not in use (qemu-io
        // closed the image); blksync only reads it.
        let out = run(BLKSYNC, &[&args[..], &["--checksum"]].concat());
        assert_eq!(out.code, 0, "rerun with the bitmap: {}", out.stderr);
        assert!(same(&src, &dst), "qemu-img compare: DST differs from SRC");
        let sum = checksum(d, &src);
        assert!(out.stdout.starts_with(&sum), "{} vs {sum}", out.stdout);
        state_is_truthful(d, &dst, &state);
    }
}
