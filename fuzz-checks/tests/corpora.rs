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

/// The fuzz workspace: its targets and their committed corpora.
fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// Files of `dir`, in name order.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Run `check` on each input of `target`'s corpus; fail naming every input
/// whose check panicked.
fn replay(target: &str, check: fn(&[u8])) {
    let files = files(&fuzz_dir().join("seeds").join(target));
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
        $(#[test] fn $name() { replay(stringify!($name), fuzz_checks::$name::check) })*

        /// A test here for every fuzz target (fuzz/fuzz_targets/NAME.rs),
        /// and none for a target that is not there.
        #[test]
        fn every_target_is_replayed() {
            let mut tested = vec![$(stringify!($name)),*];
            tested.sort();
            let targets: Vec<String> = files(&fuzz_dir().join("fuzz_targets"))
                .iter()
                .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
                .collect();
            assert_eq!(tested, targets);
        }
    };
}

targets!(qcow2 nbd_reply nbd_transmission nbd_handshake blkmap fidx check_file state record http_reply http_direct vnbd compressed pbs_blob pbs_manifest);
