//! The `pbs_manifest` target: `fuzz_checks::pbs_manifest::check` (fuzz-checks/src/pbs_manifest.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::pbs_manifest::check(data));
