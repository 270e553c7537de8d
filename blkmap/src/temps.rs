//! The files a run makes that must not outlive it: a map's temporary file
//! before its rename ([`crate::Pending`]), a lock file (blkjob's guard).
//! Their owners remove them when dropped; a process that exits without
//! unwinding (a command's second signal, or the grace period after the
//! first one run out: blkcli's signals) skips those destructors, and
//! calls [`remove_all`] instead, so an interrupted command leaves none
//! behind (`.OUT.tmp-PID-0` stayed after `blkmap - OUT` waiting on its
//! standard input was stopped by SIGTERM).
//!
//! A file is recorded with its identity (device and inode) and removed
//! only if its name still holds it: a temporary file renamed over its
//! target, or a lock file another run made since, is left alone.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// A recorded file: its name and identity (device, inode).
struct Temporary {
    path: PathBuf,
    id: (u64, u64),
}

static TEMPORARIES: Mutex<Vec<Temporary>> = Mutex::new(Vec::new());

/// The list, even if a thread panicked while holding it (the list is
/// whole after every operation).
fn temporaries() -> MutexGuard<'static, Vec<Temporary>> {
    TEMPORARIES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Record `path`, open as `file`, as a file to remove if the process
/// exits without unwinding; [`forget`] it once it is removed or kept, or
/// before `file` is closed (while it is open, no other file has its
/// identity). A
/// file whose identity cannot be read is not recorded (its owner still
/// removes it when dropped).
pub fn record(path: &Path, file: &File) {
    if let Some(t) = temporary(path, file) {
        temporaries().push(t);
    }
}

fn temporary(path: &Path, file: &File) -> Option<Temporary> {
    let m = file.metadata().ok()?;
    Some(Temporary {
        path: path.to_path_buf(),
        id: (m.dev(), m.ino()),
    })
}

/// Forget `path` (renamed into place, removed, or no longer this run's).
pub fn forget(path: &Path) {
    temporaries().retain(|t| t.path != path);
}

/// Remove every recorded file whose name still holds it, and forget them
/// all: for a process about to exit without running destructors.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join(".map.tmp-1-0");
/// let file = std::fs::File::create(&path).unwrap();
/// blkmap::temps::record(&path, &file);
/// blkmap::temps::remove_all();
/// assert!(!path.exists());
/// ```
pub fn remove_all() {
    remove(temporaries().drain(..));
}

/// Remove each of `ts` whose name still holds it.
fn remove(ts: impl Iterator<Item = Temporary>) {
    for t in ts {
        let same = std::fs::symlink_metadata(&t.path).is_ok_and(|m| (m.dev(), m.ino()) == t.id);
        if same {
            let _ = std::fs::remove_file(&t.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The process-wide list is left alone here: other tests' temporary
    // files are in it while they run.
    #[test]
    fn only_files_their_names_still_hold_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        // Kept open, as their owners keep them: no other file takes
        // their inodes.
        let (fa, fb) = (File::create(&a).unwrap(), File::create(&b).unwrap());
        let (ta, tb) = (temporary(&a, &fa).unwrap(), temporary(&b, &fb).unwrap());
        // b replaced by another file under its name (another run's).
        std::fs::remove_file(&b).unwrap();
        std::fs::write(&b, "another run's").unwrap();
        remove([ta, tb].into_iter());
        assert!(!a.exists());
        assert_eq!(std::fs::read_to_string(&b).unwrap(), "another run's");
    }

    #[test]
    fn forgotten_files_are_not_in_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        record(&a, &File::create(&a).unwrap());
        assert!(temporaries().iter().any(|t| t.path == a));
        forget(&a);
        assert!(!temporaries().iter().any(|t| t.path == a));
    }
}
