//! What each fuzz target checks of one input, as plain functions: the
//! cargo-fuzz targets in `fuzz/fuzz_targets/` call them under libFuzzer
//! (with the address sanitizer, `scripts/fuzz.sh`), and this crate's test
//! replays every committed corpus input through them in the ordinary test
//! build (`cargo test -p blkhash-fuzz-checks`), so the test command runs the
//! regression without building the fuzz workspace. Each `check` panics on a
//! bug; errors from the code under test are expected and fine. A module per
//! target, named as its `fuzz/fuzz_targets/` file and its corpus,
//! `fuzz/seeds/TARGET/`.

pub mod blkmap;
pub mod check_file;
pub mod compressed;
pub mod fidx;
pub mod http_direct;
pub mod http_reply;
pub mod nbd_handshake;
pub mod nbd_reply;
pub mod nbd_transmission;
pub mod pbs_blob;
pub mod pbs_manifest;
pub mod qcow2;
pub mod record;
pub mod state;
pub mod vnbd;
