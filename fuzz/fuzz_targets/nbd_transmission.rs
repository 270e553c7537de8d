//! The `nbd_transmission` target: `fuzz_checks::nbd_transmission::check` (fuzz-checks/src/nbd_transmission.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::nbd_transmission::check(data));
