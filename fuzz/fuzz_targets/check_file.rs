//! The `check_file` target: `fuzz_checks::check_file::check` (fuzz-checks/src/check_file.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::check_file::check(data));
