//! The `vnbd` target: `fuzz_checks::vnbd::check` (fuzz-checks/src/vnbd.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::vnbd::check(data));
