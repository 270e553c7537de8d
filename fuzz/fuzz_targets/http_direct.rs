//! The `http_direct` target: `fuzz_checks::http_direct::check` (fuzz-checks/src/http_direct.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::http_direct::check(data));
