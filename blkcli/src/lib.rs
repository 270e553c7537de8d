//! What the blkhash commands (`blksum`, `blkmap`, `blkdiff`, `blksync`)
//! share, written once: the input options ([`args`]), checksum lines as `sha256sum` writes and reads them
//! ([`lines`]), stopping on Ctrl-C and SIGTERM ([`signals`]), and the guards
//! that keep an output from destroying data and two runs from writing one
//! destination ([`guard`]), the manual pages and completions ([`manual`]),
//! `-h` as a summary ([`help`]), standard output that never panics
//! ([`output`]), progress ([`progress`]), and the options named in the
//! libraries' errors ([`hints`]). The commands only parse, wire and print.

// Every public item says what it is (cargo doc is part of the API).
#![warn(missing_docs)]

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
