//! The `state` target: `fuzz_checks::state::check` (fuzz-checks/src/state.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::state::check(data));
