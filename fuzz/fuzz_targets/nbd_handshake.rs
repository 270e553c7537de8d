//! The `nbd_handshake` target: `fuzz_checks::nbd_handshake::check` (fuzz-checks/src/nbd_handshake.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::nbd_handshake::check(data));
