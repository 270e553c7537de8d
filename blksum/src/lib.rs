//! What `blksum` reads and writes that is not an image: checksum lines
//! ([`lines`]) and checksum files checked against images ([`check`]). A
//! library so that the parsers of these untrusted bytes can be fuzzed
//! (`fuzz/fuzz_targets/check_file.rs`); the command is `src/main.rs`.

pub mod check;
