//! The `fidx` target: `fuzz_checks::fidx::check` (fuzz-checks/src/fidx.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::fidx::check(data));
