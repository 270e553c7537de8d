//! The fuzz regression of the test command: every committed corpus input
//! (`fuzz/seeds/TARGET/`: what long libFuzzer runs ended with, minimized,
//! and small valid inputs made by qemu-img, blkmap and the protocols'
//! specs) through its target's check, once, a test per target. The same
//! checks as `scripts/fuzz.sh 0`, without its separate sanitizer build of
//! the fuzz workspace (what made the step take minutes): a panic, a failed
//! assertion or a hang (libtest names a test running over 60 s) fails here;
//! a memory error that only the address sanitizer sees needs
//! `scripts/fuzz.sh`.

use std::path::{Path, PathBuf};

/// Inputs of `fuzz/seeds/TARGET`, in name order.
fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/seeds")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Run `target`'s check on each of its inputs; fail naming every input
/// whose check panicked.
fn replay(target: &str) {
    let (_, check) = fuzz_checks::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .expect("a target of fuzz_checks::TARGETS");
    let files = inputs(target);
    assert!(!files.is_empty(), "fuzz/seeds/{target} holds no input");
    let failed: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let data = std::fs::read(f).unwrap();
            std::panic::catch_unwind(|| check(&data))
                .is_err()
                .then(|| f.display().to_string())
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: {} of {} inputs failed its check (the panics above): {failed:?}",
        failed.len(),
        files.len()
    );
    eprintln!("{target}: {} inputs", files.len());
}

macro_rules! targets {
    ($($name:ident)*) => {
        $(#[test] fn $name() { replay(stringify!($name)) })*

        /// No target without its test, no test without its target.
        #[test]
        fn every_target_is_replayed() {
            let tested = [$(stringify!($name)),*];
            let mut all: Vec<&str> = fuzz_checks::TARGETS.iter().map(|(n, _)| *n).collect();
            all.sort();
            let mut tested = tested.to_vec();
            tested.sort();
            assert_eq!(tested, all);
        }
    };
}

targets!(qcow2 nbd_reply nbd_transmission nbd_handshake blkmap check_file state record http_reply);
