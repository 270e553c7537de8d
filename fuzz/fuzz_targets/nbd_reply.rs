//! The `nbd_reply` target: `fuzz_checks::nbd_reply::check` (fuzz-checks/src/nbd_reply.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::nbd_reply::check(data));
