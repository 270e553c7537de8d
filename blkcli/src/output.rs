//! Standard output, as every command writes it: never a panic. Rust
//! ignores SIGPIPE, so a reader that went away (`blkmap bitmaps IMAGE |
//! head -1`) turns each later write into an error that `println!` would
//! panic on. A closed pipe ends the command quietly with exit status 1 (the
//! reader has what it wanted; the shell's pipeline status says the rest);
//! any other failure, a full disk say, is said, naming standard output.

use std::io::{self, Write};
use std::process::ExitCode;

/// Standard output could not be written; the failure was said (unless
/// the reader went away). The command ends with its failure status.
#[derive(Debug)]
pub struct Failed;

/// Write to standard output with `write`, then flush it: `Ok` once it is
/// all out, else [`Failed`], said on standard error as `CMD: standard
/// output: REASON` unless the reader went away.
///
/// ```
/// let printed = blkcli::output::print("blkmap", |out| writeln!(out, "a line"));
/// assert!(printed.is_ok());
/// ```
pub fn print(
    cmd: &str,
    write: impl FnOnce(&mut dyn Write) -> io::Result<()>,
) -> Result<(), Failed> {
    let mut out = io::stdout().lock();
    write(&mut out)
        .and_then(|()| out.flush())
        .map_err(|e| failed(cmd, &e))
}

/// A write to standard output that failed with `e`, said as [`print()`]
/// says it.
pub fn failed(cmd: &str, e: &io::Error) -> Failed {
    if e.kind() != io::ErrorKind::BrokenPipe {
        eprintln!("{cmd}: standard output: {}", crate::units::reason(e));
    }
    Failed
}

/// [`print()`], as the command's exit code: 0 once it is all out, else 1.
pub fn print_code(cmd: &str, write: impl FnOnce(&mut dyn Write) -> io::Result<()>) -> ExitCode {
    match print(cmd, write) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failed) => ExitCode::FAILURE,
    }
}
