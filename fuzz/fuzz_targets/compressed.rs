//! The `compressed` target: `fuzz_checks::compressed::check`
//! (fuzz-checks/src/compressed.rs says what it checks; `cargo test -p
//! blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::compressed::check(data));
