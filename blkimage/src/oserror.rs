//! I/O errors that say what was being done and keep the system's errno.
//!
//! `io::Error::new(e.kind(), format!("cannot connect to X: {e}"))` reads
//! well but drops the errno: a front end that reports errors by number
//! (Python's `OSError.errno`, the C library's return values) then has
//! none. [`with_context`] keeps the original error as the source, and
//! [`errno`] finds it again under any number of contexts.

use std::error::Error;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// A message that already includes its cause's text, the cause, and the
/// file the message is about, if it names one.
#[derive(Debug)]
struct Context {
    message: String,
    source: io::Error,
    path: Option<PathBuf>,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl Error for Context {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&self.source)
    }
}

/// `e` said as `message` (which should include `e`'s text), of `e`'s kind,
/// with `e` kept as its source so that [`errno`] still finds its errno.
///
/// ```
/// use std::io;
/// let e = io::Error::from_raw_os_error(111);
/// let shown = format!("cannot connect to localhost:10809: {e}");
/// let e = blkimage::with_context(e, shown);
/// assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
/// assert!(e.to_string().starts_with("cannot connect to localhost:10809: "));
/// assert_eq!(blkimage::errno(&e), Some(111));
/// ```
pub fn with_context(e: io::Error, message: impl Into<String>) -> io::Error {
    wrapped(e, message.into(), None)
}

/// [`with_context`] for a message about the file `path` (a backing file, a
/// stream's parent): [`file()`] finds it again, so that a front end that
/// reports errors with a file name (Python's `OSError.filename`) names the
/// file the error is about, not only the image it was asked to open.
///
/// ```
/// use std::io;
/// let e = io::Error::from_raw_os_error(libc::ENOENT);
/// let e = blkimage::with_file(e, "qcow2: backing file 'base.img': No such file", "base.img");
/// let e = blkimage::with_context(e, "top.qcow2: qcow2: backing file 'base.img': No such file");
/// assert_eq!(blkimage::errno(&e), Some(libc::ENOENT));
/// assert_eq!(blkimage::file(&e), Some(std::path::Path::new("base.img")));
/// ```
pub fn with_file(e: io::Error, message: impl Into<String>, path: impl Into<PathBuf>) -> io::Error {
    wrapped(e, message.into(), Some(path.into()))
}

/// `e` under `message` (and the file it is about), of `e`'s kind.
fn wrapped(e: io::Error, message: String, path: Option<PathBuf>) -> io::Error {
    let kind = e.kind();
    let source = e;
    io::Error::new(
        kind,
        Context {
            message,
            source,
            path,
        },
    )
}

/// The file `e` is about: the innermost one named with [`with_file`] under
/// its contexts (the file that failed, when an image's chain names
/// another); `None` if none was.
pub fn file(e: &io::Error) -> Option<&Path> {
    let mut found = None;
    let mut next = e.get_ref().map(|inner| inner as &(dyn Error + 'static));
    while let Some(err) = next {
        if let Some(c) = err.downcast_ref::<Context>() {
            found = c.path.as_deref().or(found);
        }
        next = match err.downcast_ref::<io::Error>() {
            Some(io) => io.get_ref().map(|i| i as &(dyn Error + 'static)),
            None => err.source(),
        };
    }
    found
}

/// The errno the system gave for `e`, under any contexts added with
/// [`with_context`] (or any other error whose source chain holds an
/// `io::Error` that has one); `None` for errors the system did not give.
pub fn errno(e: &io::Error) -> Option<i32> {
    if let Some(n) = e.raw_os_error() {
        return Some(n);
    }
    let mut next = e.get_ref().map(|inner| inner as &(dyn Error + 'static));
    while let Some(err) = next {
        if let Some(n) = err
            .downcast_ref::<io::Error>()
            .and_then(io::Error::raw_os_error)
        {
            return Some(n);
        }
        next = err.source();
    }
    None
}

/// True if `e` is, or has under contexts added with [`with_context`] (or
/// any other error's source chain), the typed error `T`: a front end
/// finds the library's typed errors (to name its own option) however deep
/// the library put them.
///
/// ```
/// use std::io;
/// let e = io::Error::new(io::ErrorKind::InvalidInput, blkimage::nbd::RawOnly);
/// let e = blkimage::with_context(e, "backing file b.img: an NBD export");
/// assert!(blkimage::caused_by::<blkimage::nbd::RawOnly>(&e));
/// assert!(!blkimage::caused_by::<blkimage::PassphraseNeeded>(&e));
/// ```
pub fn caused_by<T: Error + 'static>(e: &io::Error) -> bool {
    cause::<T>(e).is_some()
}

/// The typed error `T` in `e` or under its contexts, as [`caused_by`]
/// finds it.
pub fn cause<T: Error + 'static>(e: &io::Error) -> Option<&T> {
    let mut next = e.get_ref().map(|inner| inner as &(dyn Error + 'static));
    while let Some(err) = next {
        if let Some(t) = err.downcast_ref::<T>() {
            return Some(t);
        }
        // An io::Error's source() skips its own inner error: step into it.
        next = match err.downcast_ref::<io::Error>() {
            Some(io) => io.get_ref().map(|i| i as &(dyn Error + 'static)),
            None => err.source(),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_is_found_under_contexts() {
        let e = with_context(io::Error::from_raw_os_error(libc::ENOENT), "inner");
        let e = with_context(e, "outer: inner");
        assert_eq!(e.to_string(), "outer: inner");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(errno(&e), Some(libc::ENOENT));
        assert_eq!(errno(&io::Error::other("no errno")), None);
    }
}
