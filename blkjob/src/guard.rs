//! What keeps the commands from destroying data: an output (a map, a
//! state, a side record, a lock file) never replaces an input or anything
//! but a file of its own kind, and one run at a time writes a DST or a
//! state.
//!
//! Outputs are written atomically (a new temporary file renamed over the
//! name), so whatever the name pointed to is gone afterwards: a name that is
//! also an input (directly, through another name or a link), a device node
//! or a FIFO would be replaced. The checks run before anything is written;
//! a file that is neither empty nor an output of the same kind is refused
//! too, which also covers files the commands read without being named (a
//! qcow2 image's backing file given as the map to write).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use blkmap::guard::{Input, Output};

/// Check, before anything is written, that no output can destroy data
/// ([`blkmap::guard::check_outputs`], whose checks the map-writing
/// functions repeat: every front end refuses the same outputs); the
/// refusal as the line to print.
pub fn check_outputs(outputs: &[Output<'_>], inputs: &[Input<'_>]) -> Result<(), String> {
    blkmap::guard::check_outputs(outputs, inputs).map_err(|e| e.to_string())
}

/// An exclusive advisory lock (flock) held until dropped; a lock file made
/// by [`lock_file`] is removed then.
#[derive(Debug)]
pub struct Lock {
    file: File,
    /// The lock file to remove when the lock is released.
    remove: Option<std::path::PathBuf>,
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Removed while still locked: a run waiting on this file finds, once
        // it holds the lock, that the name is gone, and locks a new file.
        if let Some(p) = &self.remove {
            if same_file(&self.file, p) {
                let _ = std::fs::remove_file(p);
            }
            blkmap::temps::forget(p);
        }
    }
}

/// Whether `path` names the open `file` now.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// Lock the lock file `path` for this run, created if missing and removed
/// when the lock is dropped, so that no file stays behind. Another run
/// holding it makes this fail at once naming that process, or wait with
/// [`Wait::Until`]; `name` is how messages call what is locked.
pub fn lock_file(path: &Path, name: &str, wait: Wait<'_>) -> Result<Lock, String> {
    loop {
        let mut lock = lock(open_lock_file(path)?, name, wait)?;
        // The holder before us may have removed the name after we opened
        // it: a lock on a removed file keeps nobody out, so lock anew.
        if same_file(&lock.file, path) {
            lock.remove = Some(path.to_path_buf());
            // Removed at an exit that skips the lock's drop (a signal's).
            blkmap::temps::record(path, &lock.file);
            return Ok(lock);
        }
    }
}

/// How to take a lock that another run holds.
#[derive(Clone, Copy, Debug)]
pub enum Wait<'a> {
    /// Fail at once, naming the holder.
    No,
    /// Wait until it is free, or until `cancel` is set (Ctrl-C).
    Until(&'a AtomicBool),
}

/// Lock `file` (opened from `name`) for this run. Another holder makes it
/// fail at once naming that process, or wait with [`Wait::Until`].
pub fn lock(file: File, name: &str, wait: Wait<'_>) -> Result<Lock, String> {
    loop {
        // SAFETY: flock on an open descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(Lock { file, remove: None });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(format!("{name}: cannot lock: {}", crate::reason(&e)));
        }
        match wait {
            Wait::No => {
                return Err(format!("{name}: in use by {}", holder(&file)));
            }
            Wait::Until(cancel) => {
                if cancel.load(Ordering::Relaxed) {
                    return Err(format!(
                        "{name}: {}",
                        crate::reason(&blkimage::interrupted())
                    ));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Open the lock file `path` (created empty if missing, never truncated or
/// followed if it is a link) to lock it.
pub fn open_lock_file(path: &Path) -> Result<File, String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("{}: {}", path.display(), crate::reason(&e)))
}

/// Who holds a lock on `file`: "blksync (pid 123)", from /proc/locks.
fn holder(file: &File) -> String {
    let Ok(meta) = file.metadata() else {
        return "another process".into();
    };
    let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let me = std::process::id();
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let pid = locks.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 8611 fe:00:10011089 0 EOF"
        let f: Vec<&str> = l.split_whitespace().collect();
        let pid: u32 = f.get(4)?.parse().ok()?;
        let mut id = f.get(5)?.split(':');
        let ma = u32::from_str_radix(id.next()?, 16).ok()?;
        let mi = u32::from_str_radix(id.next()?, 16).ok()?;
        let ino: u64 = id.next()?.parse().ok()?;
        (f.get(1) == Some(&"FLOCK") && (ma, mi, ino) == (major, minor, meta.ino()) && pid != me)
            .then_some(pid)
    });
    match pid {
        Some(pid) => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            match comm.trim() {
                "" => format!("process {pid}"),
                c => format!("{c} (pid {pid})"),
            }
        }
        None => "another process".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.lock");
        // flock locks belong to open file descriptions: two opens in one
        // process conflict as two processes do.
        let held = lock(open_lock_file(&p).unwrap(), "x", Wait::No).unwrap();
        let e = lock(open_lock_file(&p).unwrap(), "x", Wait::No).unwrap_err();
        assert!(e.contains("x: in use by"), "{e}");
        let cancel = AtomicBool::new(true);
        let e = lock(open_lock_file(&p).unwrap(), "x", Wait::Until(&cancel)).unwrap_err();
        assert!(e.contains("interrupted"), "{e}");
        drop(held);
        lock(open_lock_file(&p).unwrap(), "x", Wait::No).unwrap();
    }
}
