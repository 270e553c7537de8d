//! blksync stopped at any point: killed (SIGKILL) at random moments, or
//! asked to stop (SIGINT, SIGTERM). Whatever the moment, a state left
//! behind is DST's map (it never claims a block not written), and the next
//! run brings DST to SRC's content (checked with qemu-img compare and
//! blksum).

mod common;

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

/// Send `sig` after `delay`; the exit code, or None if the run had ended
/// before (the signal came too late to test anything), and how long it
/// took to stop once signalled.
fn signal_after(mut child: Child, delay: Duration, sig: i32) -> Option<(i32, Duration)> {
    std::thread::sleep(delay);
    if child.try_wait().unwrap().is_some() {
        return None;
    }
    let t = Instant::now();
    // SAFETY: kill on the pid of our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, sig) };
    let status = child.wait_with_output().unwrap().status;
    if status.success() {
        // It ended between the check and the signal.
        return None;
    }
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap());
    Some((code, t.elapsed()))
}

/// Change SRC (a 32 MiB qcow2 image) at random places, data of `pattern`
/// and written zeros, then run blksync with `args` and SIGKILL it after a
/// random part of `span` microseconds: true if it was killed (false if it
/// ended first).
fn change_then_kill(rng: &mut Rng, src: &Path, pattern: u64, args: &[&str], span: u64) -> bool {
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
    let delay = Duration::from_micros(rng.below(span));
    match signal_after(spawn(args), delay, libc::SIGKILL) {
        Some((code, _)) => {
            assert_eq!(code, 128 + libc::SIGKILL);
            true
        }
        None => false,
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
    // How long a first copy takes here, to spread the kills over it.
    let t = Instant::now();
    // (--checksum: it hashes SRC while copying, as the killed runs with a
    // state do; a plain copy is faster.)
    let probe = run(
        BLKSYNC,
        &[s(&src), s(&d.join("probe.raw")), "-t", "1", "--checksum"],
    );
    assert_eq!(probe.code, 0, "{}", probe.stderr);
    let span = (t.elapsed().as_micros() as u64 * 5 / 4).max(1000);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut killed = 0;
    for seed in [1u64, 2, 3, 4, 5] {
        if Instant::now() > deadline {
            eprintln!("time bound reached after {killed} kills");
            break;
        }
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
            let delay = Duration::from_micros(rng.below(span));
            if let Some((code, _)) = signal_after(spawn(&args), delay, libc::SIGKILL) {
                assert_eq!(code, 128 + libc::SIGKILL);
                killed += 1;
            }
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
    let t = Instant::now();
    let probe = run(
        BLKSYNC,
        &[s(&src), s(&d.join("probe.raw")), "-t", "1", "--checksum"],
    );
    assert_eq!(probe.code, 0, "{}", probe.stderr);
    let span = (t.elapsed().as_micros() as u64 * 3 / 2).max(1000);
    let mut rng = Rng(0x5eed);
    let mut killed = 0;
    for round in 0..8u64 {
        let args = [s(&src), &server.url, "--state", s(&state), "-t", "1"];
        if change_then_kill(&mut rng, &src, 0x20 + round, &args, span) {
            killed += 1;
        }
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
    let t = Instant::now();
    let probe = blksync().args(args).output().unwrap();
    assert!(
        probe.status.success(),
        "{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let span = (t.elapsed().as_micros() as u64 * 3 / 2).max(1000);
    let mut rng = Rng(0xd57);
    let mut killed = 0;
    for round in 0..6u64 {
        if change_then_kill(&mut rng, &src, 0x40 + round, &args, span) {
            killed += 1;
        }
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
    let mut tested = 0;
    for (sig, want) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        match signal_after(spawn(&args), Duration::from_millis(150), sig) {
            Some((code, took)) => {
                assert_eq!(code, want, "first copy, signal {sig}");
                assert!(took < Duration::from_secs(3), "took {took:?} to stop");
                tested += 1;
            }
            None => eprintln!("first copy ended before signal {sig}: not tested"),
        }
        state_is_truthful(d, &dst, &state);
    }
    finish_and_check(d, &src, &dst, &state);
    write(&src, "qcow2", &["write -P 0x32 100M 300M"]);
    match signal_after(spawn(&args), Duration::from_millis(150), libc::SIGTERM) {
        Some((code, _)) => {
            assert_eq!(code, 143, "update");
            tested += 1;
        }
        None => eprintln!("update ended before SIGTERM: not tested"),
    }
    state_is_truthful(d, &dst, &state);
    finish_and_check(d, &src, &dst, &state);
    eprintln!("{tested} signalled runs tested");
}
