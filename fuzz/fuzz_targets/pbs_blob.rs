//! The `pbs_blob` target: `fuzz_checks::pbs_blob::check` (fuzz-checks/src/pbs_blob.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::pbs_blob::check(data));
