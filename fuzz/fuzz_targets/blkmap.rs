//! The `blkmap` target: `fuzz_checks::blkmap::check` (fuzz-checks/src/blkmap.rs says
//! what it checks; `cargo test -p blkhash-fuzz-checks` replays the corpora).

#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::blkmap::check(data));
