//! The `record` target: `fuzz_checks::record::check` (fuzz-checks/src/record.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::record::check(data));
