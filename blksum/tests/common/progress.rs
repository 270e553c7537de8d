//! A run's `--progress=3` lines (`N/100`), read as blksum writes them: the
//! tests that stop a run midway stop it at a point they saw it reach, not
//! after a sleep, whatever the machine's speed or load.

use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

/// How long a run may take to reach a percentage before the test fails
/// (a hang, not a slow machine: the runs waited for take seconds).
pub const PROGRESS_LIMIT: Duration = Duration::from_secs(300);

/// The percentages a run writes on its descriptor 3.
pub struct ProgressFd {
    lines: Receiver<u32>,
    /// The highest percentage read so far.
    pub last: Option<u32>,
    /// The descriptor was closed: the run ended.
    pub closed: bool,
}

/// Spawn `cmd` (which must include `--progress=3`) with descriptor 3 the
/// write end of a pipe whose lines a thread of ours reads.
pub fn spawn_with_progress(cmd: &mut Command) -> (Child, ProgressFd) {
    let (reader, writer) = std::io::pipe().unwrap();
    let writer = OwnedFd::from(writer);
    let fd = writer.as_raw_fd();
    // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 gives fd 3 without close-on-exec; if the pipe is fd 3
            // already, clear the flag it was created with.
            let r = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if r < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("the command runs");
    // Ours closed, the run holds the only write end: its exit ends the lines.
    drop(writer);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(reader);
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
            // A line cut short is a run killed while it wrote it.
            let Some(whole) = line.strip_suffix('\n') else {
                return;
            };
            let n = whole
                .strip_suffix("/100")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("not a progress line: {whole:?}"));
            if tx.send(n).is_err() {
                return;
            }
            line.clear();
        }
    });
    let progress = ProgressFd {
        lines: rx,
        last: None,
        closed: false,
    };
    (child, progress)
}

impl ProgressFd {
    /// Block until the run writes a percentage of at least `percent`: true;
    /// false if it closed the descriptor first (it ended). Panics after
    /// [`PROGRESS_LIMIT`].
    pub fn wait_for(&mut self, percent: u32) -> bool {
        let deadline = Instant::now() + PROGRESS_LIMIT;
        while self.last.is_none_or(|l| l < percent) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(n) => self.last = Some(n),
                Err(RecvTimeoutError::Disconnected) => {
                    self.closed = true;
                    return false;
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "no progress to {percent}% within {PROGRESS_LIMIT:?} (last: {:?})",
                    self.last
                ),
            }
        }
        true
    }

    /// The highest percentage written so far, without waiting.
    pub fn poll(&mut self) -> Option<u32> {
        loop {
            match self.lines.try_recv() {
                Ok(n) => self.last = Some(n),
                Err(TryRecvError::Empty) => return self.last,
                Err(TryRecvError::Disconnected) => {
                    self.closed = true;
                    return self.last;
                }
            }
        }
    }
}
