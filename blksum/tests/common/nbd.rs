//! blksum over NBD: the servers come from `testkit::nbd`; here, blksum runs
//! that must succeed or fail within a time limit, and what blksum leaves in
//! its temporary directory.

#[allow(unused_imports)] // each test file uses a part
pub use testkit::nbd::*;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The private qemu-nbd directories (`blkimage-*`) in the system's
/// temporary directory; tests that check for leftovers should rather give
/// blksum a TMPDIR of their own (`use_tmpdir`, `temp_leftovers`).
pub fn blksum_temp_dirs() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = temp_leftovers(&std::env::temp_dir())
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("blkimage-"))
        })
        .collect();
    v.sort();
    v
}

/// The entries blksum left in `tmp` (its TMPDIR: see `use_tmpdir`).
pub fn temp_leftovers(tmp: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(tmp)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// How long one blksum run over NBD may take in the tests.
pub const NBD_LIMIT: Duration = Duration::from_secs(60);

/// blksum on one input, which must succeed: its checksum.
pub fn nbd_sum(args: &[&str]) -> String {
    let out = super::qemu::run_timeout(args, None, NBD_LIMIT);
    assert!(
        out.status.success(),
        "blksum {args:?}: {}",
        super::stderr(&out)
    );
    let text = super::stdout(&out);
    text.split_once("  ").expect("CHECKSUM  NAME").0.to_string()
}

/// blksum on one input, which must fail with exit 1, no checksum and no
/// panic: its error output (run_timeout waited for blksum to exit).
pub fn nbd_fails(args: &[&str]) -> String {
    let out = super::qemu::run_timeout(args, None, NBD_LIMIT);
    let err = super::stderr(&out);
    assert_eq!(out.status.code(), Some(1), "blksum {args:?}: {err}");
    assert!(
        out.stdout.is_empty(),
        "checksum printed: {}",
        super::stdout(&out)
    );
    assert!(!err.contains("panicked"), "{err}");
    err
}
