//! What `blksum` reads and writes that is not an image: checksum lines
//! ([`blkcli::lines`]) and checksum files checked against images ([`check`]). A
//! library so that the parsers of these untrusted bytes can be fuzzed
//! (`fuzz/fuzz_targets/check_file.rs`); the command is `src/main.rs`.

// Every public item says what it is (cargo doc is part of the API).
#![warn(missing_docs)]
// Messages go through blkcli::say!, which never panics on a closed
// standard error (`cmd 2>&1 | head -1`).
#![deny(clippy::print_stderr)]

pub mod check;
