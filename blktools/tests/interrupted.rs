//! A command stopped by SIGTERM or SIGINT while a read never returns (a
//! pipe nobody writes to, a server that does not answer) exits once the
//! grace period is over, with 143 or 130, and leaves none of its
//! temporary or lock files behind: blkmap's `.OUT.tmp-PID-N`, blksync's
//! state being written and its lock file.

use crate::common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The names in `dir` but those in `keep`.
fn others(dir: &Path, keep: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect();
    names.sort();
    names
}

/// Wait until `dir` holds a name `ready` accepts (the run is under way,
/// its files made), then send `sig` to `child`: its exit status, its
/// standard error, and the names it had made.
fn stop_once(
    dir: &Path,
    mut child: Child,
    sig: i32,
    ready: impl Fn(&str) -> bool,
) -> (i32, String, Vec<String>) {
    let start = Instant::now();
    let made = loop {
        let names = others(dir, &[]);
        if names.iter().any(|n| ready(n)) {
            break names;
        }
        // A run that ended before its files were made says why.
        if let Some(st) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "exited ({st}) before it was ready: {names:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never ready: {names:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // SAFETY: a signal to our own child, not yet waited for.
    unsafe { libc::kill(child.id() as i32, sig) };
    let out = child.wait_with_output().unwrap();
    let code = out.status.code().unwrap_or(-1);
    (
        code,
        String::from_utf8_lossy(&out.stderr).into_owned(),
        made,
    )
}

#[test]
fn blkmap_of_a_silent_pipe_leaves_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        // Standard input a pipe whose writer stays open and silent after
        // its first bytes (opening a pipe reads them: is it compressed?).
        let (reader, mut writer) = std::io::pipe().unwrap();
        std::io::Write::write_all(&mut writer, &[0u8; 4096]).unwrap();
        let out = d.join("out.map");
        let child = Command::new(BLKMAP)
            .args(["-", s(&out)])
            .stdin(reader)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (got, err, made) = stop_once(d, child, sig, |n| n.starts_with(".out.map.tmp-"));
        drop(writer);
        assert_eq!(got, code, "{err}");
        assert!(err.contains("interrupted"), "{err}");
        assert_eq!(others(d, &[]), Vec::<String>::new(), "made {made:?}");
    }
}

#[test]
fn blksync_from_a_silent_server_leaves_no_state_file_or_lock() {
    let Some(dir) = scratch() else { return };
    let d = dir.path();
    let sock = d.join("silent.sock");
    // Each read answered after 60 s: the run waits in its first read.
    let Some(server) = nbdkit(&sock, &["--filter=delay", "pattern", "16M", "rdelay=60"]) else {
        return;
    };
    let keep = ["silent.sock", "dst.raw"];
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let dst = d.join("dst.raw");
        let state = d.join("dst.map");
        let child = Command::new(BLKSYNC)
            .args([&server.url, s(&dst), "--state", s(&state)])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (got, err, made) = stop_once(d, child, sig, |n| n.starts_with(".dst.map.tmp-"));
        assert_eq!(got, code, "{err}");
        assert!(made.contains(&"dst.map.lock".to_string()), "{made:?}");
        assert_eq!(
            others(d, &keep),
            Vec::<String>::new(),
            "made {made:?}: {err}"
        );
    }
}
