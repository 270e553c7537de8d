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
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyUserWarning, PyValueError};
use pyo3::prelude::*;
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
    if let Some(r) = rounded {
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

/// The keywords of HTTP(S) URLs: headers (a mapping of names to values,
/// each checked as `--header` checks it) and retries.
#[derive(Default)]
pub struct HttpArgs {
    headers: Vec<(String, String)>,
    retries: Option<u32>,
}

impl HttpArgs {
    /// From the keywords `headers` (None or a mapping) and `retries`.
    pub fn new(headers: Option<&Bound<'_, PyAny>>, retries: Option<i64>) -> PyResult<HttpArgs> {
        let mut parsed = Vec::new();
        if let Some(h) = headers {
            let h = h.cast::<pyo3::types::PyMapping>().map_err(|_| {
                PyValueError::new_err("headers is a mapping of names to values (a dict)")
            })?;
            for item in h.items()?.iter() {
                let (name, value): (String, String) = item.extract()?;
                parsed.push(
                    blkimage::http::parse_header(&format!("{name}: {value}"))
                        .map_err(PyValueError::new_err)?,
                );
            }
        }
        let retries = match retries {
            None => None,
            Some(n) => Some(u32::try_from(n).ok().filter(|&n| n <= 100).ok_or_else(|| {
                PyValueError::new_err(format!("retries must be 0 to 100, not {n}"))
            })?),
        };
        Ok(HttpArgs {
            headers: parsed,
            retries,
        })
    }
}

/// How to open `name`, from the keyword arguments every image function takes.
#[allow(clippy::too_many_arguments)]
pub fn open_options(
    name: &str,
    format: Option<&str>,
    cache: bool,
    no_backing: bool,
    force_share: bool,
    secret_file: Option<PathBuf>,
    timeout: Option<f64>,
    tls_certificates: Option<PathBuf>,
    http: HttpArgs,
) -> PyResult<OpenOptions> {
    let format: Option<Format> = format
        .map(|f| f.parse().map_err(PyValueError::new_err))
        .transpose()?;
    if blkimage::nbd::is_url(name) && matches!(format, Some(f) if f != Format::Raw) {
        return Err(PyValueError::new_err(
            "an NBD export is read as raw bytes (only format='raw' applies)",
        ));
    }
    let timeout = match timeout {
        None => None,
        Some(t) if t > 0.0 && t <= 1e6 => Some(Duration::from_secs_f64(t)),
        Some(t) => {
            return Err(PyValueError::new_err(format!(
                "timeout is seconds, more than 0 and at most 1000000, not {t}"
            )));
        }
    };
    Ok(OpenOptions {
        cache,
        // Copied, not mapped: a mapped file that shrinks raises SIGBUS,
        // and the host interpreter owns that signal's handler
        // (blkimage::mapped says why).
        map: false,
        format,
        no_backing,
        force_share,
        secret_file,
        nbd: blkimage::nbd::NbdOptions {
            timeout,
            tls_certificates: tls_certificates.clone(),
            ..Default::default()
        },
        http: blkimage::http::HttpOptions {
            timeout,
            tls_certificates,
            headers: http.headers,
            retries: http.retries.unwrap_or(blkimage::http::DEFAULT_RETRIES),
        },
    })
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
/// name)` (Python then picks the subclass,
/// FileNotFoundError..., and sets `filename`); else "NAME: reason".
pub fn os_error(name: &str, e: &io::Error) -> PyErr {
    // A URL's password is never shown (https://user:***@host/...).
    let name = &*blkimage::http::redact(name);
    if e.get_ref()
        .is_some_and(|inner| inner.is::<blkimage::PassphraseNeeded>())
    {
        return PyOSError::new_err(format!("{name}: {e}: give it with secret_file=PATH"));
    }
    if e.kind() == io::ErrorKind::ResourceBusy {
        return PyOSError::new_err(format!("{name}: {e}; force_share=True reads it anyway"));
    }
    if e.get_ref()
        .is_some_and(|inner| inner.is::<blkimage::nbd::NoCaCertificates>())
    {
        return PyOSError::new_err(format!(
            "{name}: {e} (tls_certificates=DIR, or tls-certificates=DIR in the URL)"
        ));
    }
    let reason = blkjob::reason(e);
    match blkimage::errno(e) {
        Some(errno) => PyOSError::new_err((errno, reason, name.to_string())),
        // No errno: OSError's own formatting would then print "[Errno None]"
        // and drop the reason, so the message is blksum's line as it is.
        None => PyOSError::new_err(format!("{name}: {reason}")),
    }
}
