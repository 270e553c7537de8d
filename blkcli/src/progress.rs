//! `-p`/`--progress[=FD]`: how far the run is, as every command shows it.
//!
//! - On a terminal: one bar per input being hashed (several with `--jobs`),
//!   each with its own size, rate and time left, so the time left is right
//!   from the start; bars are cleared before any line is printed, and when
//!   their input ends.
//! - With standard error not a terminal: a line `blksum: NAME: N%` at each
//!   tenth (`blksum: NAME: 30%`, with the command's name; every tenth, also
//!   those a run of holes or zeros passes in one step), so a log shows
//!   the run moving, and `blksum: NAME: 100%` once the input is hashed
//!   ([`InputProgress::finish`]; never for one that failed): the tenths
//!   count bytes handed to the digest workers, which reach the size before
//!   the last ones are digested and the image is checked.
//! - `--progress=FD`: lines `N/100` on that descriptor as the whole run's
//!   percentage grows, as nbdcopy's `--progress=FD` writes them, for
//!   programs that drive blksum. Inputs weigh the same; with `--check`
//!   (images unknown ahead) each image counts from 0 to 100 on its own.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::fs::File;
use std::io::{IsTerminal, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The run's progress displays (none without `-p`).
pub struct Progress {
    /// The command, for the log lines.
    command: &'static str,
    bars: Option<MultiProgress>,
    /// `-p` with standard error not a terminal: log lines.
    lines: bool,
    fd: Option<Mutex<FdState>>,
    next_slot: AtomicUsize,
}

struct FdState {
    out: File,
    /// Each started input's fraction done, by slot.
    fractions: Vec<f64>,
    /// Inputs in the run, when known.
    inputs: Option<usize>,
    /// The last percentage written.
    last: Option<u32>,
}

impl FdState {
    fn report(&mut self, slot: usize, fraction: f64) {
        if self.fractions.len() <= slot {
            self.fractions.resize(slot + 1, 0.0);
        }
        self.fractions[slot] = fraction.clamp(0.0, 1.0);
        let percent = match self.inputs {
            Some(n) if n > 0 => self.fractions.iter().sum::<f64>() / n as f64,
            _ => self.fractions[slot],
        };
        let percent = (percent * 100.0).floor() as u32;
        // Per input without a known count: each counts up from 0 again.
        let restart = self.inputs.is_none() && fraction == 0.0;
        if self.last.is_none_or(|last| percent > last) || restart {
            self.last = Some(percent);
            // A reader that went away must not stop the hashing.
            let _ = writeln!(self.out, "{percent}/100").and_then(|_| self.out.flush());
        }
    }
}

/// How `-p` was given: not at all, bare, or with a descriptor.
pub type ProgressArg = Option<Option<RawFd>>;

/// `-p`/`--progress[=FD]`, flattened into each command's arguments.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ProgressArgs {
    /// Show progress: on a terminal, a bar per input on standard error
    /// (bytes, rate, time left); otherwise a line at each tenth, and 100%
    /// once the input is hashed. With =FD, lines "N/100" on file descriptor
    /// FD instead, as nbdcopy writes them, for programs (the whole run's
    /// percentage; with blksum --check, each image's).
    #[arg(short, long, value_name = "FD", num_args = 0..=1, require_equals = true)]
    pub progress: Option<Option<i32>>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("command", &self.command)
            .field("bars", &self.bars.is_some())
            .field("lines", &self.lines)
            .field("fd", &self.fd.is_some())
            .finish()
    }
}

impl Progress {
    /// Displays for `arg` of `command`; `inputs`: the number of inputs,
    /// when known. A descriptor that is not open is an error.
    pub fn new(
        command: &'static str,
        arg: ProgressArg,
        inputs: Option<usize>,
    ) -> Result<Progress, String> {
        let mut p = Progress {
            command,
            bars: None,
            lines: false,
            fd: None,
            next_slot: AtomicUsize::new(0),
        };
        match arg {
            None => {}
            Some(None) if std::io::stderr().is_terminal() => {
                p.bars = Some(MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
            }
            Some(None) => p.lines = true,
            Some(Some(fd)) => {
                // SAFETY: fcntl only asks whether fd is open.
                if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                    return Err(format!("--progress={fd}: not an open file descriptor"));
                }
                // SAFETY: fd is open and, given to us for this, ours to write and close.
                let out = unsafe { File::from_raw_fd(fd) };
                p.fd = Some(Mutex::new(FdState {
                    out,
                    fractions: Vec::new(),
                    inputs,
                    last: None,
                }));
            }
        }
        Ok(p)
    }

    /// Run `f` (which prints) with the bars out of the way.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bars {
            Some(m) => m.suspend(f),
            None => f(),
        }
    }

    /// Run `f` on the input `name` of `size` bytes (when known), giving it
    /// the callback that counts the bytes done; the input's progress ends
    /// at 100% only if `f` succeeds.
    pub fn track<T>(
        &self,
        name: &str,
        size: Option<u64>,
        f: impl FnOnce(&mut dyn FnMut(u64)) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let mut shown = self.start(name, size);
        let result = f(&mut |n| shown.inc(n));
        if result.is_ok() {
            shown.finish();
        }
        result
    }

    /// An input starts: `size` when known (not for a stream).
    pub fn start(&self, name: &str, size: Option<u64>) -> InputProgress<'_> {
        let bar = self.bars.as_ref().map(|m| {
            let style = match size {
                Some(_) => {
                    "{msg:20!} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}"
                }
                None => "{msg:20!} {spinner} {bytes} {binary_bytes_per_sec}",
            };
            // Added first: a bar drawn before it joins the others would
            // draw on its own and be left on the screen.
            let bar = m.add(ProgressBar::new(size.unwrap_or(0)));
            bar.set_style(
                ProgressStyle::with_template(style)
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.set_message(name.to_string());
            bar
        });
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let input = InputProgress {
            run: self,
            bar,
            name: name.to_string(),
            size,
            done: 0,
            slot,
            tenth: 0,
        };
        input.report_fd(0.0);
        input
    }
}

/// One input's progress; clears its bar when dropped.
pub struct InputProgress<'a> {
    run: &'a Progress,
    bar: Option<ProgressBar>,
    name: String,
    size: Option<u64>,
    done: u64,
    slot: usize,
    /// Tenths logged so far (`-p` without a terminal).
    tenth: u64,
}

impl InputProgress<'_> {
    /// `n` more guest bytes are done (read, or known zeros or holes).
    pub fn inc(&mut self, n: u64) {
        self.done += n;
        if let Some(bar) = &self.bar {
            if self.size.is_none() {
                bar.inc_length(n);
            }
            bar.inc(n);
        }
        if let Some(size) = self.size.filter(|&s| s > 0) {
            self.report_fd(self.done as f64 / size as f64);
            // 100% waits for `finish`: the bytes are passed on, not yet
            // digested or checked.
            let tenth = (self.done.saturating_mul(10) / size).min(9);
            // Every tenth, those a hole passes in one step too, so a log
            // reads the same whatever the image holds.
            while self.run.lines && self.tenth < tenth {
                self.tenth += 1;
                crate::say!("{}: {}: {}%", self.run.command, self.name, self.tenth * 10);
            }
        }
    }

    /// The input was hashed: with `-p` and no terminal, its `100%` line
    /// (also for a stream or an empty image, which had no tenths), so that
    /// every input that succeeds ends its log at 100%.
    pub fn finish(&mut self) {
        if self.run.lines && self.tenth < 10 {
            self.tenth = 10;
            crate::say!("{}: {}: 100%", self.run.command, self.name);
        }
    }

    fn report_fd(&self, fraction: f64) {
        if let Some(fd) = &self.run.fd {
            fd.lock()
                .expect("progress lock")
                .report(self.slot, fraction);
        }
    }
}

impl Drop for InputProgress<'_> {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
            if let Some(m) = &self.run.bars {
                m.remove(&bar);
            }
        }
        // Done, whether hashed or failed: the run moves on.
        self.report_fd(1.0);
    }
}

/// blksync's progress bar on standard error: SRC bytes compared, and in its
/// message blocks compared, blocks written and bytes saved (compared but
/// not written); for a first copy, which compares nothing, SRC bytes
/// copied and blocks written. Drawn only when enabled.
pub struct SyncBar {
    enabled: bool,
    shown: std::sync::OnceLock<(ProgressBar, u64, bool)>,
}

impl SyncBar {
    /// A bar drawn if `enabled`.
    pub fn new(enabled: bool) -> SyncBar {
        SyncBar {
            enabled,
            shown: std::sync::OnceLock::new(),
        }
    }
}

impl blkjob::sync::Progress for SyncBar {
    fn start(&self, size: u64, block_size: usize, compares: bool) {
        if !self.enabled {
            return;
        }
        let bar = ProgressBar::new(size).with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:25}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        let _ = self.shown.set((bar, block_size as u64, compares));
    }

    fn update(&self, c: &blkjob::sync::Counts) {
        use blkjob::sync::Counts;
        if let Some((bar, block_size, compares)) = self.shown.get() {
            let compared = Counts::get(&c.compared);
            let changed = Counts::get(&c.written) + Counts::get(&c.zeroed);
            bar.set_position(compared);
            bar.set_message(match compares {
                true => format!(
                    "{} blocks compared, {} written, {} saved",
                    compared.div_ceil(*block_size),
                    changed.div_ceil(*block_size),
                    indicatif::HumanBytes(compared.saturating_sub(changed)),
                ),
                false => format!(
                    "{} blocks read, {} written",
                    compared.div_ceil(*block_size),
                    changed.div_ceil(*block_size),
                ),
            });
        }
    }

    fn finish(&self) {
        if let Some((bar, ..)) = self.shown.get() {
            bar.finish_and_clear();
        }
    }
}
