//! The first SIGINT or SIGTERM stops any run, even one blocked in a read
//! that never returns, with the documented message and status.

mod common;

use common::*;
use std::net::TcpListener;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Send `sig` to `child` once it has run `after`, and wait for it: its
/// exit status, stderr, and how long it took to exit after the signal.
fn signal_after(mut child: Child, sig: i32, after: Duration) -> (Option<i32>, String, Duration) {
    std::thread::sleep(after);
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
    // Connections are kept open (and the listener too) until the test ends.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        while let Ok((c, _)) = listener.accept() {
            held.push(c);
        }
    });
    for (sig, status) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let child = spawn(&[&url]);
        let (code, err, took) = signal_after(child, sig, Duration::from_millis(500));
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
    let (code, err, took) = signal_after(child, libc::SIGTERM, Duration::from_millis(300));
    assert_eq!(code, Some(143), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}
