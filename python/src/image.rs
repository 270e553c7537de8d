//! What every function on an image shares (`checksum()`, the maps', the
//! bitmaps'): the image's name, how to open it from the keyword arguments,
//! running the work so that Ctrl-C stops it, and its errors as OSError.
//!
//! The work runs on a thread of its own while the caller waits in short
//! slices with the GIL released, taking it back between slices to run
//! Python's signal handlers: Ctrl-C then sets the reader's cancel flag, the
//! run stops between reads, its qemu-nbd (if any) is stopped and its
//! private directory removed, and only then is KeyboardInterrupt raised.

use blkimage::{Format, OpenOptions};
use crossbeam_channel::RecvTimeoutError;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyUserWarning, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often a waiting call looks for signals (Ctrl-C).
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// A raw file hashed at QEMU's size, not its own: a UserWarning naming
/// both sizes, as blksum says it on standard error.
pub fn warn_rounded(
    py: Python<'_>,
    image: &std::path::Path,
    rounded: Option<blkimage::Rounded>,
) -> PyResult<()> {
    warn_note(py, image, rounded)
}

/// A note on how `image` was read (a raw file's size rounded up, a
/// compressed image decompressed into a temporary file): a UserWarning,
/// as blksum says it on standard error.
pub fn warn_note(
    py: Python<'_>,
    image: &std::path::Path,
    note: Option<impl std::fmt::Display>,
) -> PyResult<()> {
    if let Some(r) = note {
        // A path holds no NUL; a name that did would only lose the warning.
        if let Ok(msg) = std::ffi::CString::new(format!("{}: {r}", image.display())) {
            PyErr::warn(py, py.get_type::<PyUserWarning>().as_any(), &msg, 1)?;
        }
    }
    Ok(())
}

/// A path or URL as blkimage takes it (UTF-8 here).
pub fn image_name(image: &std::path::Path) -> PyResult<String> {
    image
        .to_str()
        .map(str::to_string)
        .ok_or_else(|| PyValueError::new_err(format!("{image:?}: image names must be UTF-8")))
}

/// The keywords every function on an image takes, how to open it:
/// `format`, `cache`, `no_backing`, `force_share`, `secret_file`,
/// `timeout`, `tls_certificates`, `headers`, `retries`, `chain` and `size`. Each function
/// takes them as `**options` and reads them here, so that they are
/// written (and checked) once: PyO3 has no way to share keyword
/// parameters between signatures, so the few lines Python would do for
/// `**kwargs` (an unknown keyword is a TypeError) are done by hand.
pub struct OpenArgs {
    format: Option<String>,
    cache: Option<bool>,
    no_backing: bool,
    force_share: bool,
    secret_file: Option<PathBuf>,
    timeout: Option<f64>,
    tls_certificates: Option<PathBuf>,
    headers: Vec<(String, String)>,
    retries: Option<u32>,
    chain: bool,
    size: Option<u64>,
}

impl OpenArgs {
    /// The keywords of `function` (named in a TypeError) from `options`.
    pub fn new(function: &str, options: Option<&Bound<'_, PyDict>>) -> PyResult<OpenArgs> {
        let mut args = OpenArgs {
            format: None,
            cache: None,
            no_backing: false,
            force_share: false,
            secret_file: None,
            timeout: None,
            tls_certificates: None,
            headers: Vec::new(),
            retries: None,
            chain: false,
            size: None,
        };
        for (key, value) in options.into_iter().flat_map(|d| d.iter()) {
            let key: String = key.extract()?;
            if value.is_none() {
                // None is every keyword's default.
                if !KEYWORDS.contains(&key.as_str()) {
                    return Err(unexpected(function, &key));
                }
                continue;
            }
            let typed = |e: PyErr| {
                PyTypeError::new_err(format!(
                    "{function}() argument '{key}': {}",
                    e.value(value.py())
                ))
            };
            match key.as_str() {
                "format" => args.format = Some(value.extract().map_err(typed)?),
                "cache" => args.cache = Some(value.extract().map_err(typed)?),
                "no_backing" => args.no_backing = value.extract().map_err(typed)?,
                "force_share" => args.force_share = value.extract().map_err(typed)?,
                "secret_file" => args.secret_file = Some(value.extract().map_err(typed)?),
                "timeout" => args.timeout = Some(value.extract().map_err(typed)?),
                "tls_certificates" => args.tls_certificates = Some(value.extract().map_err(typed)?),
                "headers" => args.headers = headers(&value)?,
                "retries" => args.retries = Some(retries(value.extract().map_err(typed)?)?),
                "chain" => args.chain = value.extract().map_err(typed)?,
                "size" => args.size = Some(value.extract().map_err(typed)?),
                _ => return Err(unexpected(function, &key)),
            }
        }
        Ok(args)
    }

    /// The keywords of a function that takes no `cache` (it reads through
    /// the page cache): `cache` given is a TypeError.
    pub fn without_cache(self, function: &str) -> PyResult<OpenArgs> {
        match self.cache {
            Some(_) => Err(unexpected(function, "cache")),
            None => Ok(self),
        }
    }

    /// How to open `name`; `cache` unless the caller said otherwise.
    pub fn options(self, name: &str, cache: bool) -> PyResult<OpenOptions> {
        let format: Option<Format> = self
            .format
            .map(|f| f.parse().map_err(PyValueError::new_err))
            .transpose()?;
        if blkimage::nbd::is_url(name) && matches!(format, Some(f) if f != Format::Raw) {
            return Err(PyValueError::new_err(
                "an NBD export is read as raw bytes (only format='raw' applies)",
            ));
        }
        let timeout = match self.timeout {
            None => None,
            Some(t) if t > 0.0 && t <= 1e6 => Some(Duration::from_secs_f64(t)),
            Some(t) => {
                return Err(PyValueError::new_err(format!(
                    "timeout is seconds, more than 0 and at most 1000000, not {t}"
                )));
            }
        };
        Ok(OpenOptions {
            cache: self.cache.unwrap_or(cache),
            // Copied, not mapped: a mapped file that shrinks raises SIGBUS,
            // and the host interpreter owns that signal's handler
            // (blkimage::mapped says why).
            map: blkimage::MapReads::Never,
            format,
            no_backing: self.no_backing,
            force_share: self.force_share,
            secret_file: self.secret_file,
            keyfile: None,
            nbd: blkimage::nbd::NbdOptions {
                timeout,
                tls_certificates: self.tls_certificates.clone(),
                ..Default::default()
            },
            http: blkimage::http::HttpOptions {
                timeout,
                tls_certificates: self.tls_certificates,
                headers: self.headers,
                retries: self.retries.unwrap_or(blkimage::http::DEFAULT_RETRIES),
            },
            random_access: false,
            chain: self.chain,
            size: self.size,
            // The job sets it from the construction.
            exact_size: false,
        })
    }
}

/// The keywords [`OpenArgs`] reads.
const KEYWORDS: &[&str] = &[
    "format",
    "cache",
    "no_backing",
    "force_share",
    "secret_file",
    "timeout",
    "tls_certificates",
    "headers",
    "retries",
    "chain",
    "size",
];

/// Python's own words for a keyword a function does not take.
fn unexpected(function: &str, key: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{function}() got an unexpected keyword argument '{key}'"
    ))
}

/// `headers`: a mapping of names to values, each checked as `--header`
/// checks it.
fn headers(h: &Bound<'_, PyAny>) -> PyResult<Vec<(String, String)>> {
    let h = h
        .cast::<pyo3::types::PyMapping>()
        .map_err(|_| PyValueError::new_err("headers is a mapping of names to values (a dict)"))?;
    let mut parsed = Vec::new();
    for item in h.items()?.iter() {
        let (name, value): (String, String) = item.extract()?;
        parsed.push(
            blkimage::http::parse_header(&format!("{name}: {value}"))
                .map_err(PyValueError::new_err)?,
        );
    }
    Ok(parsed)
}

/// `retries`: 0 to 100.
fn retries(n: i64) -> PyResult<u32> {
    u32::try_from(n)
        .ok()
        .filter(|&n| n <= 100)
        .ok_or_else(|| PyValueError::new_err(format!("retries must be 0 to 100, not {n}")))
}

/// Run `work` on a thread of its own while the caller waits in short
/// slices with the GIL released, running Python's signal handlers between
/// them: a handler that raises (Ctrl-C) sets the cancel flag `work` is
/// given, and is raised once `work` has stopped. `work`'s error is an
/// OSError naming `name`.
pub fn run_cancellable<T: Send + 'static>(
    py: Python<'_>,
    name: &str,
    work: impl FnOnce(Arc<AtomicBool>) -> io::Result<T> + Send + 'static,
) -> PyResult<T> {
    let cancel = Arc::new(AtomicBool::new(false));
    let (tx, rx) = crossbeam_channel::bounded(1);
    let flag = cancel.clone();
    let worker = std::thread::Builder::new()
        .name("blkhash-run".into())
        .spawn(move || {
            let result = work(flag);
            // The receiver may be gone only if the caller panicked.
            let _ = tx.send(());
            result
        })
        .map_err(|e| {
            let e = io::Error::new(e.kind(), format!("cannot start a hashing thread: {e}"));
            os_error(name, &e)
        })?;
    let done = || py.detach(|| rx.recv_timeout(SIGNAL_POLL)) != Err(RecvTimeoutError::Timeout);
    while !done() {
        // Signal handlers run here (only on the main thread); one that
        // raises (Ctrl-C: KeyboardInterrupt) stops the run.
        if let Err(e) = py.check_signals() {
            cancel.store(true, Ordering::Relaxed);
            // Wait for the run to stop between reads and clean up (qemu-nbd,
            // its directory) before raising. A second signal that raises
            // (a server that never answers) returns at once, as blksum's
            // second Ctrl-C exits: the run then ends on its own.
            while !done() {
                py.check_signals()?;
            }
            let _ = py.detach(|| worker.join());
            return Err(e);
        }
    }
    match py.detach(|| worker.join()) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(os_error(name, &e)),
        Err(_) => Err(PyRuntimeError::new_err(format!(
            "{name}: internal error while hashing"
        ))),
    }
}

/// The OSError for `name` with blksum's reason: where the system gave an
/// errno (under any context the library added), `OSError(errno, reason,
/// filename)` (Python then picks the subclass, FileNotFoundError..., and
/// sets `filename`: the file the library said the error is about, a
/// backing file or a stream's missing parent, else `name`); else "NAME:
/// reason".
pub fn os_error(name: &str, e: &io::Error) -> PyErr {
    // A URL's password is never shown (https://user:***@host/...).
    let name = &*blkimage::http::redact(name);
    // The library's typed errors, with the keyword that helps (as
    // blkcli's hints add the commands' options).
    use blkimage::caused_by;
    if caused_by::<blkimage::PassphraseNeeded>(e) {
        return PyOSError::new_err(format!("{name}: {e}: give it with secret_file=PATH"));
    }
    if e.kind() == io::ErrorKind::ResourceBusy {
        return PyOSError::new_err(format!("{name}: {e}; force_share=True reads it anyway"));
    }
    if caused_by::<blkimage::nbd::NoCaCertificates>(e) {
        return PyOSError::new_err(format!(
            "{name}: {e} (tls_certificates=FILE or DIR, or tls-certificates=DIR in the URL)"
        ));
    }
    if caused_by::<blkimage::nbd::UnknownIssuer>(e) {
        return PyOSError::new_err(format!("{name}: {e} (tls_certificates=FILE or DIR)"));
    }
    if let Some(w) = blkimage::cause::<blkjob::incremental::ReadWhole>(e) {
        let or = if w.verify_helps() {
            "; or verify=True: every block read"
        } else {
            ""
        };
        return PyOSError::new_err(format!("{name}: {e} (map_range() makes a full map{or})"));
    }
    if let Some(u) = blkimage::cause::<blkimage::http::Unauthorized>(e) {
        let header = match u.wants_export_token() {
            true => blkimage::http::KUBEVIRT_EXPORT_TOKEN,
            false => "Authorization",
        };
        return PyOSError::new_err(format!("{name}: {e} (headers={{'{header}': ...}})"));
    }
    let reason = blkjob::reason(e);
    // The file the error is about, where the library named one (a missing
    // backing file or earlier stream), else the image asked for.
    let filename = match blkimage::file(e) {
        Some(f) => blkimage::http::redact(&f.to_string_lossy()).into_owned(),
        None => name.to_string(),
    };
    match blkimage::errno(e) {
        Some(errno) => PyOSError::new_err((errno, reason, filename)),
        // No errno: OSError's own formatting would then print "[Errno None]"
        // and drop the reason, so the message is blksum's line as it is.
        None => PyOSError::new_err(format!("{name}: {reason}")),
    }
}
