//! The first SIGINT or SIGTERM stops any run, even one blocked in a read
//! that never returns, with the documented message and status.
//!
//! The signal is sent once the test has seen the run reach the read that
//! blocks (the server accepted its connection; it opened the FIFO), not
//! after a sleep: a signal before the handlers are installed would end a
//! slow-starting run by the default action instead.

use crate::common;

use common::*;
use std::net::TcpListener;
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// How long a run may take to reach the blocking read (a hang beyond it).
const START_LIMIT: Duration = Duration::from_secs(60);

/// Send `sig` to `child`, still running, and wait for it: its exit status,
/// stderr, and how long it took to exit after the signal.
fn signal(mut child: Child, sig: i32) -> (Option<i32>, String, Duration) {
    assert!(
        child.try_wait().unwrap().is_none(),
        "exited before the signal"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, sig) };
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if t.elapsed() > Duration::from_secs(15) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = t.elapsed();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        took,
    )
}

fn spawn(args: &[&str]) -> Child {
    blksum()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn one_signal_stops_a_run_blocked_on_a_silent_server() {
    // Accepts and never says a word (no --timeout).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("nbd://127.0.0.1:{}", listener.local_addr().unwrap().port());
    // Connections are kept open (and the listener too) until the test ends;
    // each accepted one is announced.
    let (accepted, connected) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((c, _)) = listener.accept() {
            held.push(c);
            let _ = accepted.send(());
        }
    });
    for (sig, status) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let child = spawn(&[&url]);
        // Connected: waiting for a greeting that never comes.
        connected
            .recv_timeout(START_LIMIT)
            .expect("blksum connects to the server");
        let (code, err, took) = signal(child, sig);
        assert_eq!(code, Some(status), "{err}");
        assert!(err.contains("blksum: interrupted"), "{err}");
        assert!(took < Duration::from_secs(5), "took {took:?}");
    }
}

#[test]
fn one_signal_stops_a_check_list_that_is_a_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("sums");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let child = spawn(&["-c", fifo.to_str().unwrap()]);
    // A writer that never writes. Opening for writing without blocking
    // fails (ENXIO) until blksum has the FIFO open for reading; then it
    // reads, and waits for lines that never come.
    let start = Instant::now();
    let _writer = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
        {
            Ok(w) => break w,
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {}
            Err(e) => panic!("{}: {e}", fifo.display()),
        }
        assert!(
            start.elapsed() < START_LIMIT,
            "blksum never opened the FIFO"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let (code, err, took) = signal(child, libc::SIGTERM);
    assert_eq!(code, Some(143), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// A checkpointed run stopped while it waits for a read that a server
/// answers only after a minute exits after the grace period, without
/// unwinding: its checkpoint's lock file and any temporary file are
/// removed all the same.
#[test]
fn a_stopped_checkpointed_run_leaves_no_lock_or_temporary_file() {
    if !require(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (sig, status) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        // A server of its own each time: the first run's reads still sleep
        // in the first one.
        let sock = dir.path().join(format!("slow-{sig}.sock"));
        let mut srv = testkit::nbd::nbdkit(
            testkit::nbd::Listen::Unix(&sock),
            &["--filter=delay", "pattern", "16M", "rdelay=60"],
        );
        // A checkpoint of its own each time: a fresh run, not a resumed one.
        let ck = dir.path().join(format!("disk-{sig}.ck"));
        let lock = dir.path().join(format!("disk-{sig}.ck.lock"));
        let mut child = spawn(&["--checkpoint", ck.to_str().unwrap(), &srv.url]);
        // The lock is taken once the export is open, before the reads.
        let start = Instant::now();
        while !lock.exists() {
            if let Some(st) = child.try_wait().unwrap() {
                let out = child.wait_with_output().unwrap();
                let server = srv.exited();
                panic!(
                    "exited ({st}): {} (the server: {})",
                    String::from_utf8_lossy(&out.stderr),
                    server.map_or("running".to_string(), |s| format!("exited, {s}"))
                );
            }
            assert!(start.elapsed() < START_LIMIT, "no lock file");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (code, err, _) = signal(child, sig);
        assert_eq!(code, Some(status), "{err}");
        let left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".lock") || n.contains(".tmp-"))
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}: {err}");
    }
}
