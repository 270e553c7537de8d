//! What the commands print, written one way: checksum lines (plain,
//! `--tag`, `--zero`), one JSON document (`--json`, `--output json`), and
//! the other text a command prints, all through [`Stdout`].
//!
//! Standard output never panics here. Rust ignores SIGPIPE, so a reader
//! that went away (`blkmap bitmaps IMAGE | head -1`) turns each later
//! write into an error that `println!` would panic on. A closed pipe ends
//! the command quietly with exit status 1 (the reader has what it wanted;
//! the shell's pipeline status says the rest); any other failure, a full
//! disk say, is said, naming standard output. Each print is flushed at
//! once, with the progress bars cleared while it is written, so that a
//! line is out as soon as its input is done.
//!
//! Standard error never panics either ([`say!`](crate::say), [`Stderr`]):
//! `cmd 2>&1 | head -1` closes it as soon as the first line is out, and
//! `eprintln!` would then panic (exit 101) at the next message. A message
//! that cannot be written is dropped; the command goes on and ends with
//! the status it would have had.
//!
//! What a document holds (its keys, their order, its `schema`) is the
//! command's own: each command documents and builds its document; this
//! module only writes it.

use crate::progress::Progress;
use blkhash::{Algorithm, Construction};
use std::ffi::OsStr;
use std::io::{self, Write};
use std::process::ExitCode;

/// Standard error, for messages: a write that fails (a reader that went
/// away, `cmd 2>&1 | head -1`) is dropped, never an error nor a panic, so
/// a library that writes its messages to it (blksum's `--check`) ends as
/// it would have, with its own status.
///
/// ```
/// use std::io::Write;
/// writeln!(blkcli::output::Stderr, "blksum: a message").unwrap();
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

/// Write `args` and a newline to standard error as one write, dropped if
/// it cannot be written ([`Stderr`]): what [`say!`](crate::say) calls.
pub fn say_line(args: std::fmt::Arguments<'_>) {
    // One buffer, one write: lines of several threads stay whole.
    let line = format!("{args}\n");
    let _ = io::stderr().lock().write_all(line.as_bytes());
}

/// `eprintln!` that never panics: a line on standard error, dropped if it
/// cannot be written (a reader that went away). Every message of the
/// commands goes through it (the crates deny `clippy::print_stderr`).
///
/// ```
/// blkcli::say!("blkmap: {}: interrupted", "disk.img");
/// ```
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::say_line(format_args!($($arg)*))
    };
}

/// Standard output could not be written; the failure was said (unless
/// the reader went away). The command ends with its failure status.
#[derive(Debug)]
pub struct Failed;

/// What a command prints its results as.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Form {
    /// Lines: checksum lines, or the command's own (blkdiff's ranges).
    #[default]
    Lines,
    /// One JSON document for the whole run.
    Json,
}

impl Form {
    /// The form `--json` and `--output FORMAT` ask for: `--output`
    /// takes qemu-img's names, `human` (lines) and `json`.
    ///
    /// ```
    /// use blkcli::output::Form;
    /// assert_eq!(Form::from_flags(false, None), Form::Lines);
    /// assert_eq!(Form::from_flags(false, Some("human")), Form::Lines);
    /// assert_eq!(Form::from_flags(false, Some("json")), Form::Json);
    /// assert_eq!(Form::from_flags(true, None), Form::Json);
    /// ```
    pub fn from_flags(json: bool, output: Option<&str>) -> Form {
        match json || output == Some("json") {
            true => Form::Json,
            false => Form::Lines,
        }
    }
}

/// How a checksum line is written: as `sha256sum` writes it, or with
/// `--tag` naming the digest and block size; ended by a newline, or by a
/// NUL with `--zero` (the name then written as it is, unescaped). The
/// line formats themselves are [`crate::lines`]'.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineStyle {
    /// `--tag`: `blkhash/DIGEST[/BLOCK] (NAME) = HEX`.
    pub tag: bool,
    /// `--zero`: the line ends with a NUL, the name unescaped.
    pub zero: bool,
}

impl LineStyle {
    /// The line of `hex`, the checksum of `name` with `params` (the
    /// construction, digest and block size, named only by a tagged line),
    /// ended.
    ///
    /// ```
    /// use blkcli::output::LineStyle;
    /// use blkhash::{Algorithm, Construction};
    /// use std::ffi::OsStr;
    /// let name = OsStr::new("a\nb");
    /// let params = (Construction::Blkhash, Algorithm::Blake3, 4096);
    /// let line = |tag, zero| LineStyle { tag, zero }.line("ab12", name, params);
    /// assert_eq!(line(false, false), b"\\ab12  a\\nb\n");
    /// assert_eq!(line(true, false), b"\\blkhash/blake3/4k (a\\nb) = ab12\n");
    /// assert_eq!(line(false, true), b"ab12  a\nb\0");
    /// assert_eq!(line(true, true), b"blkhash/blake3/4k (a\nb) = ab12\0");
    /// ```
    pub fn line(
        self,
        hex: &str,
        name: &OsStr,
        params: (Construction, Algorithm, usize),
    ) -> Vec<u8> {
        let tag = self.tag.then_some(params);
        let mut line = match self.zero {
            true => crate::lines::format_line_zero(hex, name, tag),
            false => crate::lines::format_line_os(hex, name, tag),
        };
        line.push(if self.zero { 0 } else { b'\n' });
        line
    }
}

/// A command's standard output: every print flushed at once, the progress
/// bars (if any) cleared while it is written, and a failure said once as
/// `CMD: standard output: REASON` (not for a reader that went away).
#[derive(Clone, Copy)]
pub struct Stdout<'a> {
    cmd: &'a str,
    progress: Option<&'a Progress>,
}

impl<'a> Stdout<'a> {
    /// Standard output of the command `cmd` (the name its messages start
    /// with).
    pub fn new(cmd: &'a str) -> Self {
        Stdout {
            cmd,
            progress: None,
        }
    }

    /// The same, clearing `progress`'s bars while it writes.
    pub fn with_progress(self, progress: &'a Progress) -> Self {
        Stdout {
            progress: Some(progress),
            ..self
        }
    }

    /// Write with `write`, then flush: `Ok` once it is all out, else
    /// [`Failed`], said.
    ///
    /// ```
    /// let out = blkcli::output::Stdout::new("blkmap");
    /// assert!(out.write(|out| writeln!(out, "a line")).is_ok());
    /// ```
    pub fn write(
        &self,
        write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
    ) -> Result<(), Failed> {
        let print = || {
            let mut out = io::stdout().lock();
            write(&mut out).and_then(|()| out.flush())
        };
        let printed = match self.progress {
            Some(p) => p.suspend(print),
            None => print(),
        };
        printed.map_err(|e| failed(self.cmd, &e))
    }

    /// A checksum line, written as `style` says ([`LineStyle::line`]).
    pub fn checksum(
        &self,
        style: LineStyle,
        hex: &str,
        name: &OsStr,
        params: (Construction, Algorithm, usize),
    ) -> Result<(), Failed> {
        let line = style.line(hex, name, params);
        self.write(|out| out.write_all(&line))
    }

    /// A JSON document, indented, and a newline.
    ///
    /// ```
    /// let doc = serde_json::json!({"schema": 1});
    /// assert!(blkcli::output::Stdout::new("blksum").json(&doc).is_ok());
    /// ```
    pub fn json(&self, doc: &serde_json::Value) -> Result<(), Failed> {
        self.write(|out| writeln!(out, "{doc:#}"))
    }
}

/// Write to standard output with `write`, then flush it: [`Stdout::write`]
/// for a command without progress bars.
///
/// ```
/// let printed = blkcli::output::print("blkmap", |out| writeln!(out, "a line"));
/// assert!(printed.is_ok());
/// ```
pub fn print(
    cmd: &str,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), Failed> {
    Stdout::new(cmd).write(write)
}

/// A write to standard output that failed with `e`, said as [`print()`]
/// says it.
pub fn failed(cmd: &str, e: &io::Error) -> Failed {
    if e.kind() != io::ErrorKind::BrokenPipe {
        crate::say!("{cmd}: standard output: {}", crate::units::reason(e));
    }
    Failed
}

/// A print's result as the command's exit code: 0 once it is all out,
/// else 1.
///
/// ```
/// use blkcli::output::{Stdout, code};
/// assert_eq!(code(Stdout::new("blkmap").write(|out| writeln!(out, "a line"))), std::process::ExitCode::SUCCESS);
/// ```
pub fn code(printed: Result<(), Failed>) -> ExitCode {
    match printed {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed) => ExitCode::FAILURE,
    }
}

/// [`print()`], as the command's exit code: 0 once it is all out, else 1.
pub fn print_code(cmd: &str, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> ExitCode {
    code(print(cmd, write))
}

/// A writer that clears `progress`'s bars while it writes: for a library
/// that writes its own lines (blksum's `--check`), to standard output or
/// standard error.
pub struct Suspended<'a, W>(pub &'a Progress, pub W);

impl<W: Write> Write for Suspended<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (progress, w) = (self.0, &mut self.1);
        progress.suspend(|| w.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        self.1.flush()
    }
}
