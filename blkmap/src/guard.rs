//! What keeps an output from destroying data: a map, a part, a checkpoint
//! or a state never replaces an input, nor anything but an empty file or a
//! file of its own kind.
//!
//! Outputs are written atomically (a new temporary file renamed over the
//! name), so whatever the name pointed to is gone afterwards: a name that is
//! also an input (directly, through another name or a link), a device node
//! or a FIFO would be replaced. The map-writing functions of this crate
//! ([`crate::Map::save_guarded`], [`crate::Part::save_guarded`],
//! [`crate::merge_files`]) run these checks themselves, so every front end
//! (the commands, the Python package) refuses the same outputs with the
//! same words; a command also runs them before it reads anything, so that
//! a refusal does not come after hours of hashing.
//!
//! ```
//! use blkmap::guard::{Input, Output, check_outputs};
//! let dir = tempfile::tempdir().unwrap();
//! let img = dir.path().join("disk.img");
//! std::fs::write(&img, b"an image").unwrap();
//! let out = Output { path: &img, what: "a block map", own_kind: Some(blkmap::is_map) };
//! let input = Input { name: img.as_os_str(), role: "the image" };
//! let e = check_outputs(&[out], &[input]).unwrap_err();
//! assert!(e.to_string().contains("is the image"));
//! ```

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

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

/// An input of the run, by the name the user gave. Standard input (`-`)
/// and URLs (`nbd://...`: any name with `://`) name no file and are
/// skipped.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// The name as given.
    pub name: &'a OsStr,
    /// How messages call it: "SRC", "DST", "the image", "a part".
    pub role: &'a str,
}

impl Input<'_> {
    fn is_file(&self) -> bool {
        self.name != "-" && !self.name.as_encoded_bytes().windows(3).any(|w| w == b"://")
    }
}

/// A file the run will write (or create and lock).
#[derive(Clone, Copy, Debug)]
pub struct Output<'a> {
    /// Where it will be written.
    pub path: &'a Path,
    /// What it is, for messages: "a block map", "the state".
    pub what: &'a str,
    /// Whether existing contents may be replaced: an output replaces only
    /// an empty file or one of its own kind (which this tells from its
    /// first bytes). `None`: never written, only opened (a lock file).
    pub own_kind: Option<fn(&[u8]) -> bool>,
}

impl<'a> Output<'a> {
    /// A block map or a part written to `path`: it replaces only an empty
    /// file or another map.
    pub fn map(path: &'a Path) -> Output<'a> {
        Output {
            path,
            what: "a block map",
            own_kind: Some(crate::is_map),
        }
    }
}

/// A refusal: `kind` tells a program what kind of problem it is
/// ([`io::ErrorKind::AlreadyExists`] for a file that is an input or of
/// another kind, [`io::ErrorKind::IsADirectory`], [`io::ErrorKind::InvalidInput`]
/// for a link, device or FIFO), the message names the output and why.
fn refuse(kind: io::ErrorKind, msg: String) -> io::Error {
    io::Error::new(kind, msg)
}

/// An OS error's text without Rust's " (os error N)".
fn reason(e: &io::Error) -> String {
    let s = e.to_string();
    match s.rsplit_once(" (os error ") {
        Some((msg, _)) => msg.to_string(),
        None => s,
    }
}

/// Check, before anything is written, that no output can destroy data:
/// each must be missing or a regular file (not a link, device, FIFO or
/// directory), not the same file as an input, and empty or of its own kind;
/// and two outputs must be two files.
pub fn check_outputs(outputs: &[Output<'_>], inputs: &[Input<'_>]) -> io::Result<()> {
    let inputs: Vec<(Key, &Input<'_>)> = inputs
        .iter()
        .filter(|i| i.is_file())
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
                return Err(refuse(
                    io::ErrorKind::AlreadyExists,
                    format!(
                        "{}: {} and {} are the same file",
                        a.path.display(),
                        a.what,
                        b.what
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn check_output(out: &Output<'_>, inputs: &[(Key, &Input<'_>)]) -> io::Result<()> {
    let name = out.path.display();
    let aliased = |k: &Key| -> io::Result<()> {
        match inputs.iter().find(|(id, _)| id == k) {
            Some((_, input)) => Err(refuse(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{name}: is {} ({}): {} would replace it",
                    input.role,
                    input.name.to_string_lossy(),
                    out.what
                ),
            )),
            None => Ok(()),
        }
    };
    let meta = match std::fs::symlink_metadata(out.path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return key(out.path).map_or(Ok(()), |k| aliased(&k));
        }
        Err(e) => return Err(io::Error::new(e.kind(), format!("{name}: {}", reason(&e)))),
    };
    let ft = meta.file_type();
    if ft.is_symlink() {
        return Err(refuse(
            io::ErrorKind::InvalidInput,
            format!(
                "{name}: a symbolic link: {} is written only in place of a regular file \
                 (name the file it points to)",
                out.what
            ),
        ));
    }
    if !ft.is_file() {
        let (kind, err) = if ft.is_dir() {
            ("a directory", io::ErrorKind::IsADirectory)
        } else if ft.is_block_device() {
            ("a block device", io::ErrorKind::InvalidInput)
        } else if ft.is_char_device() {
            ("a character device", io::ErrorKind::InvalidInput)
        } else if ft.is_fifo() {
            ("a FIFO", io::ErrorKind::InvalidInput)
        } else {
            ("not a regular file", io::ErrorKind::InvalidInput)
        };
        return Err(refuse(
            err,
            format!(
                "{name}: {kind}: {} is written only in place of a regular file",
                out.what
            ),
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
            .map_err(|e| io::Error::new(e.kind(), format!("{name}: {}", reason(&e))))?;
        if !own_kind(&prefix[..n]) {
            return Err(refuse(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{name}: exists and is not {}: not replaced (remove it first if it is not needed)",
                    out.what
                ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn out(path: &Path) -> Output<'_> {
        Output::map(path)
    }

    fn refused(r: io::Result<()>) -> String {
        r.unwrap_err().to_string()
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
        std::fs::write(&map, crate::MAGIC).unwrap();
        let img_name = img.as_os_str();
        let inputs = [Input {
            name: img_name,
            role: "the image",
        }];

        let e = refused(check_outputs(&[out(&img)], &inputs));
        assert!(e.contains("is the image"), "{e}");
        let e = refused(check_outputs(&[out(&hard)], &inputs));
        assert!(e.contains("is the image"), "{e}");
        let e = refused(check_outputs(&[out(&link)], &inputs));
        assert!(e.contains("symbolic link"), "{e}");
        let e = check_outputs(&[out(dir.path())], &inputs).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::IsADirectory);
        assert!(e.to_string().contains("a directory"), "{e}");
        let e = refused(check_outputs(&[out(Path::new("/dev/null"))], &inputs));
        assert!(e.contains("a character device"), "{e}");
        let e = refused(check_outputs(&[out(&other)], &inputs));
        assert!(e.contains("not a block map"), "{e}");
        let e = refused(check_outputs(&[out(&map), out(&map)], &inputs));
        assert!(e.contains("same file"), "{e}");
        assert!(check_outputs(&[out(&empty)], &inputs).is_ok());
        assert!(check_outputs(&[out(&map)], &inputs).is_ok());
        assert!(check_outputs(&[out(&dir.path().join("new"))], &inputs).is_ok());
        // A missing input (a DST to create) and an output of the same name.
        let new = dir.path().join("new");
        let e = refused(check_outputs(
            &[out(&new)],
            &[Input {
                name: new.as_os_str(),
                role: "DST",
            }],
        ));
        assert!(e.contains("is DST"), "{e}");
        // Names of no file are no inputs.
        for name in ["-", "nbd+unix:///x?socket=/tmp/s"] {
            let i = Input {
                name: OsStr::new(name),
                role: "the image",
            };
            assert!(check_outputs(&[out(&map)], &[i]).is_ok());
        }
        assert_eq!(std::fs::read(&img).unwrap(), b"data");
    }
}
