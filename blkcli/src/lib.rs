//! What the blkhash commands (`blksum`, `blkmap`, `blkdiff`, `blksync`)
//! share, written once: the input options ([`args`]), checksum lines as `sha256sum` writes and reads them
//! ([`lines`]), stopping on Ctrl-C and SIGTERM ([`signals`]), and the guards
//! that keep an output from destroying data and two runs from writing one
//! destination ([`guard`]), the manual pages and completions ([`manual`]),
//! `-h` as a summary ([`help`]), what the commands print (checksum
//! lines with `--tag` or `--zero`, JSON documents, standard output that
//! never panics: [`output`]), progress ([`progress`]), and the options named in the
//! libraries' errors ([`hints`]). The commands only parse, wire and print.

// Every public item says what it is (cargo doc is part of the API).
#![warn(missing_docs)]
// Messages go through `say!`, which never panics on a closed standard error.
#![deny(clippy::print_stderr)]

pub mod args;
pub mod help;
pub mod hints;
pub use blkjob::guard;
pub mod lines;
pub mod manual;
pub mod output;
pub mod progress;
pub mod signals;
pub mod units;

/// An input's name as every output line and message shows it: as given,
/// with the password of a URL (`https://user:password@host/...`) replaced
/// by `***` ([`blkimage::http::redact`]).
///
/// ```
/// use std::ffi::OsStr;
/// assert_eq!(blkcli::shown(OsStr::new("https://u:pw@h/d.qcow2")), OsStr::new("https://u:***@h/d.qcow2"));
/// assert_eq!(blkcli::shown(OsStr::new("disk.img")), OsStr::new("disk.img"));
/// ```
pub fn shown(name: &std::ffi::OsStr) -> std::borrow::Cow<'_, std::ffi::OsStr> {
    use std::borrow::Cow;
    match name.to_str().map(blkimage::http::redact) {
        Some(Cow::Owned(s)) => Cow::Owned(s.into()),
        _ => Cow::Borrowed(name),
    }
}

/// [`shown`] as text, for messages (invalid UTF-8 replaced).
pub fn shown_lossy(name: &std::ffi::OsStr) -> String {
    shown(name).to_string_lossy().into_owned()
}

/// `n` and the noun for it, as English has it: "1 range", "2 ranges".
///
/// ```
/// assert_eq!(blkcli::plural(1u64, "line is", "lines are"), "1 line is");
/// assert_eq!(blkcli::plural(0u64, "range", "ranges"), "0 ranges");
/// ```
pub fn plural(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}
