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
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A file's identity: device and inode, links followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ident {
    dev: u64,
    ino: u64,
}

fn ident(path: &Path) -> Option<Ident> {
    std::fs::metadata(path).ok().map(|m| Ident {
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// What a name will write or read: an existing file, or a name not yet
/// taken in a directory (two names for one missing file are the same
/// file once one of them is created).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Key {
    File(Ident),
    Missing(Ident, std::ffi::OsString),
}

fn key(path: &Path) -> Option<Key> {
    if let Some(id) = ident(path) {
        return Some(Key::File(id));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    Some(Key::Missing(ident(dir)?, path.file_name()?.to_owned()))
}

/// An input of the run, by the name the user gave (an NBD URL or `-` has
/// no file to alias and is skipped).
pub struct Input<'a> {
    /// The name as given.
    pub name: &'a std::ffi::OsStr,
    /// How messages call it: "SRC", "DST", "the image".
    pub role: &'a str,
}

/// A file the run will write (or create and lock).
pub struct Output<'a> {
    /// Where it will be written.
    pub path: &'a Path,
    /// What it is, for messages: "the map", "the state".
    pub what: &'a str,
    /// Whether existing contents may be replaced: an output replaces only
    /// an empty file or one of its own kind (which this tells from its
    /// first bytes). `None`: never written, only opened (a lock file).
    pub own_kind: Option<fn(&[u8]) -> bool>,
}

/// Check, before anything is written, that no output can destroy data:
/// each must be missing or a regular file (not a link, device, FIFO or
/// directory), not the same file as an input, and empty or of its own kind.
pub fn check_outputs(outputs: &[Output<'_>], inputs: &[Input<'_>]) -> Result<(), String> {
    let inputs: Vec<(Key, &Input<'_>)> = inputs
        .iter()
        .filter(|i| i.name != "-" && !i.name.to_str().is_some_and(blkimage::nbd::is_url))
        .filter_map(|i| key(Path::new(i.name)).map(|k| (k, i)))
        .collect();
    for out in outputs {
        check_output(out, &inputs)?;
    }
    // Two outputs of one run must be two files (a state named as its own
    // side record would have one overwrite the other).
    for (i, a) in outputs.iter().enumerate() {
        for b in &outputs[i + 1..] {
            if let (Some(x), Some(y)) = (key(a.path), key(b.path))
                && x == y
            {
                return Err(format!(
                    "{}: {} and {} are the same file",
                    a.path.display(),
                    a.what,
                    b.what
                ));
            }
        }
    }
    Ok(())
}

fn check_output(out: &Output<'_>, inputs: &[(Key, &Input<'_>)]) -> Result<(), String> {
    let name = out.path.display();
    let aliased = |k: &Key| -> Result<(), String> {
        match inputs.iter().find(|(id, _)| id == k) {
            Some((_, input)) => Err(format!(
                "{name}: is {} ({}): {} would replace it",
                input.role,
                input.name.to_string_lossy(),
                out.what
            )),
            None => Ok(()),
        }
    };
    let meta = match std::fs::symlink_metadata(out.path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return key(out.path).map_or(Ok(()), |k| aliased(&k));
        }
        Err(e) => return Err(format!("{name}: {}", crate::units::reason(&e))),
    };
    let ft = meta.file_type();
    if ft.is_symlink() {
        return Err(format!(
            "{name}: a symbolic link: {} is written only in place of a regular file \
             (name the file it points to)",
            out.what
        ));
    }
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_fifo() {
            "a FIFO"
        } else {
            "not a regular file"
        };
        return Err(format!(
            "{name}: {kind}: {} is written only in place of a regular file",
            out.what
        ));
    }
    aliased(&Key::File(Ident {
        dev: meta.dev(),
        ino: meta.ino(),
    }))?;
    if let Some(own_kind) = out.own_kind
        && meta.len() > 0
    {
        let mut prefix = [0u8; 16];
        let n = File::open(out.path)
            .and_then(|f| read_prefix(&f, &mut prefix))
            .map_err(|e| format!("{name}: {}", crate::units::reason(&e)))?;
        if !own_kind(&prefix[..n]) {
            return Err(format!(
                "{name}: exists and is not {}: not replaced (remove it first if it is not needed)",
                out.what
            ));
        }
    }
    Ok(())
}

fn read_prefix(f: &File, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64)? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// An exclusive advisory lock (flock) held until dropped.
#[derive(Debug)]
pub struct Lock {
    _file: File,
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
            return Ok(Lock { _file: file });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(format!("{name}: cannot lock: {}", crate::units::reason(&e)));
        }
        match wait {
            Wait::No => {
                return Err(format!(
                    "{name}: in use by {} (--wait waits for it)",
                    holder(&file)
                ));
            }
            Wait::Until(cancel) => {
                if cancel.load(Ordering::Relaxed) {
                    return Err(format!(
                        "{name}: {}",
                        crate::units::reason(&blkimage::interrupted())
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
        .map_err(|e| format!("{}: {}", path.display(), crate::units::reason(&e)))
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

    fn out<'a>(path: &'a Path) -> Output<'a> {
        Output {
            path,
            what: "the map",
            own_kind: Some(blkmap::is_map),
        }
    }

    #[test]
    fn outputs_that_would_destroy_data_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("a.raw");
        std::fs::write(&img, b"data").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&img, &link).unwrap();
        let hard = dir.path().join("hard");
        std::fs::hard_link(&img, &hard).unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, b"not a map").unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, b"").unwrap();
        let map = dir.path().join("m");
        std::fs::write(&map, blkmap::MAGIC).unwrap();
        let img_name = img.as_os_str();
        let inputs = [Input {
            name: img_name,
            role: "the image",
        }];

        let e = check_outputs(&[out(&img)], &inputs).unwrap_err();
        assert!(e.contains("is the image"), "{e}");
        let e = check_outputs(&[out(&hard)], &inputs).unwrap_err();
        assert!(e.contains("is the image"), "{e}");
        let e = check_outputs(&[out(&link)], &inputs).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        let e = check_outputs(&[out(dir.path())], &inputs).unwrap_err();
        assert!(e.contains("a directory"), "{e}");
        let e = check_outputs(&[out(&other)], &inputs).unwrap_err();
        assert!(e.contains("not the map"), "{e}");
        let e = check_outputs(&[out(&map), out(&map)], &inputs).unwrap_err();
        assert!(e.contains("same file"), "{e}");
        assert!(check_outputs(&[out(&empty)], &inputs).is_ok());
        assert!(check_outputs(&[out(&map)], &inputs).is_ok());
        assert!(check_outputs(&[out(&dir.path().join("new"))], &inputs).is_ok());
        // A missing input (a DST to create) and an output of the same name.
        let new = dir.path().join("new");
        let e = check_outputs(
            &[out(&new)],
            &[Input {
                name: new.as_os_str(),
                role: "DST",
            }],
        )
        .unwrap_err();
        assert!(e.contains("is DST"), "{e}");
        assert_eq!(std::fs::read(&img).unwrap(), b"data");
    }

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
