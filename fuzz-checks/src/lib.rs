//! What each fuzz target checks of one input, as plain functions: the
//! cargo-fuzz targets in `fuzz/fuzz_targets/` call them under libFuzzer
//! (with the address sanitizer, `scripts/fuzz.sh`), and this crate's test
//! replays every committed corpus input through them in the ordinary test
//! build (`cargo test -p blkhash-fuzz-checks`), so the test command runs the
//! regression without building the fuzz workspace. Each `check` panics on a
//! bug; errors from the code under test are expected and fine.

pub mod blkmap;
pub mod check_file;
pub mod http_reply;
pub mod nbd_handshake;
pub mod nbd_reply;
pub mod nbd_transmission;
pub mod qcow2;
pub mod record;
pub mod state;

/// A target's check of one input.
pub type Check = fn(&[u8]);

/// Every target by name (its corpus is `fuzz/seeds/NAME/`) and its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("qcow2", qcow2::check),
    ("nbd_reply", nbd_reply::check),
    ("nbd_transmission", nbd_transmission::check),
    ("nbd_handshake", nbd_handshake::check),
    ("blkmap", blkmap::check),
    ("check_file", check_file::check),
    ("state", state::check),
    ("record", record::check),
    ("http_reply", http_reply::check),
];
