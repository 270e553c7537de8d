//! Why a sync failed, as a type: the command prints it, a program can
//! match on it.

use crate::reason;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why [`run`](super::run) failed. Every message names the input or
/// output it is about.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Reading or writing `name` (SRC, DST, the state, standard output)
    /// failed.
    Io {
        /// What was read or written, as messages name it.
        name: String,
        /// The system's or the image reader's error.
        source: io::Error,
    },
    /// `name` cannot take part as given: a stream as SRC, a read-only
    /// export, sizes that differ, an image of another format than asked...
    Unusable {
        /// SRC or DST, as messages name it.
        name: String,
        /// Why, and what to do about it where there is something.
        why: String,
    },
    /// The state exists and does not describe DST (without
    /// `--force-rescan`).
    StateRefused {
        /// The state's path.
        state: PathBuf,
        /// How it differs from DST.
        why: String,
    },
    /// SRC's block `block` no longer held what was hashed when it was
    /// copied: SRC was written during the run.
    SrcChanged {
        /// SRC, as messages name it.
        src: String,
        /// The block's index.
        block: u64,
        /// The block's offset in bytes.
        offset: u64,
    },
    /// A file SRC reads (SRC itself, a backing or data file) was written
    /// during the run: DST holds blocks of more than one state of SRC (the
    /// state saved, if any, is DST's as written).
    SrcWritten {
        /// SRC, as messages name it.
        src: String,
        /// The file found written.
        file: PathBuf,
    },
    /// DST, hashed again after the copy (`--verify`), differs from SRC.
    VerifyFailed {
        /// DST, as messages name it.
        dst: String,
    },
    /// An output would destroy an input, or another run holds DST or the
    /// state (the guard's message names them).
    Guard(String),
    /// Another run holds DST or the state, and the request did not ask to
    /// wait for it (the message names the run).
    Busy(String),
    /// Stopped by the cancel flag (Ctrl-C, SIGTERM) between reads or
    /// writes.
    Interrupted,
}

impl Error {
    /// `name`'s I/O error.
    pub fn io(name: impl fmt::Display, source: io::Error) -> Error {
        Error::Io {
            name: name.to_string(),
            source,
        }
    }

    /// `name` cannot take part, for `why`.
    pub fn unusable(name: impl fmt::Display, why: impl fmt::Display) -> Error {
        Error::Unusable {
            name: name.to_string(),
            why: why.to_string(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { name, source } => write!(f, "{name}: {}", reason(source)),
            Error::Unusable { name, why } => write!(f, "{name}: {why}"),
            Error::StateRefused { state, why } => {
                write!(f, "{}: state refused: {why}", state.display())
            }
            Error::SrcChanged { src, block, offset } => write!(
                f,
                "{src}: SRC changed while it was copied (its block {block}, offset {offset}, no \
                 longer holds what was hashed): nothing claims DST holds SRC; rerun when SRC is \
                 not written"
            ),
            Error::SrcWritten { src, file } => write!(
                f,
                "{src}: SRC was written while it was copied ({} changed during the run): DST \
                 holds blocks of more than one state of SRC; run blksync again to finish the copy",
                file.display()
            ),
            Error::VerifyFailed { dst } => {
                write!(f, "{dst}: verification failed: checksum differs from SRC's")
            }
            Error::Guard(why) | Error::Busy(why) => f.write_str(why),
            Error::Interrupted => f.write_str("interrupted"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
