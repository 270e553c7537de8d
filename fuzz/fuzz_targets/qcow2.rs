//! The `qcow2` target: `fuzz_checks::qcow2::check` (fuzz-checks/src/qcow2.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::qcow2::check(data));
