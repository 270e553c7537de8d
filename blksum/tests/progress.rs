//! `-p` as users see it: the bar in a real terminal (tmux), the log lines
//! without one, and `--progress=FD` as programs read it.

use crate::common;

use common::nbd::{Listen, nbdkit};
use common::*;
use std::process::Command;
use std::time::{Duration, Instant};

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(args)
        .output()
        .expect("tmux runs (scripts/setup.sh installs it)");
    assert!(out.status.success(), "tmux {args:?}: {}", stderr(&out));
    stdout(&out)
}

/// Capture the pane until `done` holds for it (or 60 s pass).
fn wait_for(session: &str, done: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let screen = tmux(&["capture-pane", "-p", "-t", session]);
        if done(&screen) {
            return screen;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out; screen:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Session(String);

impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

#[test]
fn the_bar_shows_while_hashing_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let small = image(dir.path(), "small.img", "1m:r");
    // A slow export: every read waits, so the bar is on screen a while.
    let sock = dir.path().join("nbd.sock");
    let server = nbdkit(
        Listen::Unix(&sock),
        &["--filter=delay", "pattern", "size=24M", "rdelay=200ms"],
    );
    let session = Session(format!("blksum-progress-{}", std::process::id()));
    let cmd = format!(
        "{} -p -t 1 --read-size 1m --queue-depth 1 {} '{}'; echo EXIT=$?; sleep 120",
        env!("CARGO_BIN_EXE_blksum"),
        small.display(),
        server.url
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session.0,
        "-x",
        "160",
        "-y",
        "20",
        &cmd,
    ]);

    // While the export is read: the first checksum line, and below it one
    // bar for the export with its size and time left.
    let running = wait_for(&session.0, |s| {
        s.contains("ETA") && s.contains("/24.00 MiB")
    });
    let lines: Vec<&str> = running.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 2, "one checksum line and one bar:\n{running}");
    assert!(lines[0].ends_with("small.img"), "{running}");
    assert!(lines[1].contains("nbd+unix"), "{running}");

    // Done: the two checksum lines, and no bar left above or between them.
    let done = wait_for(&session.0, |s| s.contains("EXIT="));
    let lines: Vec<&str> = done.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 3, "{done}");
    assert!(
        lines[0].contains("small.img") && lines[1].contains("nbd+unix"),
        "{done}"
    );
    assert_eq!(lines[2], "EXIT=0", "{done}");
    // The bar's words, not the names': a temporary directory's random name
    // may end in "B" (".tmp9LR6lB/small.img" holds "B/s").
    let bare = done
        .replace(&small.display().to_string(), "IMAGE")
        .replace(&server.url, "URL");
    assert!(
        !bare.contains("ETA") && !bare.contains("B/s"),
        "a stale bar:\n{done}"
    );
}

#[test]
fn ctrl_c_clears_the_bar_before_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let server = nbdkit(
        Listen::Unix(&sock),
        &["--filter=delay", "pattern", "size=64M", "rdelay=200ms"],
    );
    let session = Session(format!("blksum-progress-int-{}", std::process::id()));
    // The terminal's own echo of ^C lands past the bar, which indicatif
    // draws to the right edge, and so one line below it, where the bar's
    // clearing cannot reach: that echo is off here, as `stty -echoctl`.
    let cmd = format!(
        "stty -echoctl; {} -p -t 1 --queue-depth 1 '{}'; echo EXIT=$?; sleep 120",
        env!("CARGO_BIN_EXE_blksum"),
        server.url
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session.0,
        "-x",
        "160",
        "-y",
        "20",
        &cmd,
    ]);
    wait_for(&session.0, |s| s.contains("ETA"));
    tmux(&["send-keys", "-t", &session.0, "C-c"]);
    let done = wait_for(&session.0, |s| s.contains("EXIT="));
    let lines: Vec<&str> = done.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 2, "{done}");
    assert!(lines[0].ends_with(": interrupted"), "{done}");
    assert_eq!(lines[1], "EXIT=130", "{done}");
}

#[test]
fn without_a_terminal_a_line_per_tenth() {
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path(), "a.img", "4m:r");
    let out = run(&["-p", "--read-size", "256k", img.to_str().unwrap()], None);
    assert!(out.status.success());
    let err = stderr(&out);
    let want: Vec<String> = (1..=10)
        .map(|t| format!("blksum: {}: {}%", img.display(), t * 10))
        .collect();
    assert_eq!(err.lines().collect::<Vec<_>>(), want, "{err}");
}

/// The percentages of `name`'s progress lines in `err`.
fn percents(err: &str, name: &str) -> Vec<u32> {
    let prefix = format!("blksum: {name}: ");
    err.lines()
        .filter_map(|l| l.strip_prefix(&prefix)?.strip_suffix('%'))
        .map(|p| p.parse().unwrap())
        .collect()
}

#[test]
fn without_a_terminal_every_input_that_succeeds_ends_at_100() {
    if !require(&["qemu-img", "qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Data first, then a long run of holes: the last tenths come in one step.
    let raw = image(d, "a.raw", "2m:r 6m:-");
    let qcow2 = d.join("a.qcow2");
    common::qemu::qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "qcow2",
        raw.to_str().unwrap(),
        qcow2.to_str().unwrap(),
    ]);
    let sock = d.join("nbd.sock");
    let server = common::nbd::qemu_nbd(&qcow2, "qcow2", Listen::Unix(&sock), None);
    for name in [raw.to_str().unwrap(), qcow2.to_str().unwrap(), &server.url] {
        let out = run(&["-p", "--read-size", "256k", name], None);
        let err = stderr(&out);
        assert!(out.status.success(), "{name}: {err}");
        let seen = percents(&err, name);
        // Every tenth, those the holes pass in one step too.
        let tenths: Vec<u32> = (1..=10).map(|t| t * 10).collect();
        assert_eq!(seen, tenths, "{name}: {err}");
        assert_eq!(
            err.lines().count(),
            seen.len(),
            "{name}: only progress: {err}"
        );
    }
    // A stream (size unknown, no tenths) and an empty file end at 100% too.
    let out = run(&["-p"], Some(&raw));
    assert_eq!(stderr(&out), "blksum: -: 100%\n");
    let empty = image(d, "empty", "");
    let out = run(&["-p", empty.to_str().unwrap()], None);
    assert_eq!(stderr(&out), format!("blksum: {}: 100%\n", empty.display()));
}

#[test]
fn without_a_terminal_an_input_that_fails_never_says_100() {
    // A server that answers the first read with garbage: blksum fails
    // after the reads were handed out.
    let server = testkit::hostile::Hostile::start(
        vec![7; 4 << 20],
        testkit::hostile::Misbehave::BadReplyMagic,
    );
    let out = run(&["-p", &server.url], None);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("100%"), "{err}");
}

#[test]
fn progress_fd_writes_the_runs_percentage_as_nbdcopy() {
    let dir = tempfile::tempdir().unwrap();
    let a = image(dir.path(), "a.img", "4m:r");
    let b = image(dir.path(), "b.img", "2m:r 2m:-");
    let fd_file = dir.path().join("progress");
    // blksum --progress=3 3>FILE, through the shell that sets up fd 3.
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} --progress=3 --read-size 256k {} {} 3>{} >/dev/null",
            env!("CARGO_BIN_EXE_blksum"),
            a.display(),
            b.display(),
            fd_file.display()
        ))
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&fd_file).unwrap();
    let percents: Vec<u32> = text
        .lines()
        .map(|l| {
            l.strip_suffix("/100")
                .unwrap_or_else(|| panic!("{l:?}"))
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(percents.first(), Some(&0), "{text}");
    assert_eq!(percents.last(), Some(&100), "{text}");
    assert!(percents.windows(2).all(|w| w[0] < w[1]), "rising: {text}");
    // Two inputs of one weight each: the first one done is 50.
    assert!(percents.contains(&50), "{text}");

    let out = run(&["--progress=9", a.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--progress=9: not an open file descriptor"));
}
