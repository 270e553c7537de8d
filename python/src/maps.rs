//! `blkhash.map_range()` and `blkhash.merge()`: an image hashed in parts
//! (on several processes or hosts) and the parts merged into its map, as
//! `blkmap --range` and `blkmap merge` do.

use crate::image::{OpenArgs, image_name, os_error, run_cancellable, warn_rounded};
use crate::{check_threads, params, parse_construction, value_error};
use blkjob::{JobSpec, Span};
use blkmap::MapError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// Hash part of ``image`` into the part file ``out`` (written atomically)
/// and return the ``(offset, length)`` in bytes it covers. The part is
/// ``offset``/``length`` (``length`` None: to the end of the image), or
/// ``part=(k, n)``, the k-th of n parts of about equal size (k from 1).
/// ``offset`` is a multiple of ``block_size``; so is ``length`` unless the
/// range reaches the end of the image. Parts that cover the image once
/// merge into its map (``merge()``), whatever process or host made them.
/// ``image`` and the other options are ``checksum()``'s (not ``"-"``: a
/// pipe cannot seek); a raw file whose size is not a multiple of 512 is
/// mapped at QEMU's size, with ``checksum()``'s UserWarning. Raises
/// ValueError for a bad argument or range,
/// OSError if the image cannot be read or ``out`` written.
#[pyfunction]
#[pyo3(
    text_signature = "(image, out, *, offset=0, length=None, part=None, digest=None, \
    block_size=None, construction='blkhash', format=None, cache=False, threads=None, no_backing=False, \
    force_share=False, secret_file=None, timeout=None, tls_certificates=None, headers=None, \
    retries=None, chain=False, size=None)"
)]
#[pyo3(signature = (
    image, out, *, offset = 0, length = None, part = None, digest = None,
    block_size = None, construction = "blkhash", threads = None, **options
))]
#[allow(clippy::too_many_arguments)]
pub fn map_range(
    py: Python<'_>,
    image: PathBuf,
    out: PathBuf,
    offset: u64,
    length: Option<u64>,
    part: Option<(u64, u64)>,
    digest: Option<&str>,
    block_size: Option<i64>,
    construction: &str,
    threads: Option<i64>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<(u64, u64)> {
    let name = image_name(&image)?;
    let span = span_of(offset, length, part)?;
    // The construction gives the defaults; a part keeps block digests,
    // whatever construction its checksum is later computed in.
    let construction = parse_construction(construction)?;
    let (alg, bs) = params(construction, digest, block_size)?;
    let spec = JobSpec {
        construction,
        digest: Some(alg),
        block_size: Some(bs),
        threads: Some(check_threads(threads)?),
        open: OpenArgs::new("map_range", options)?.options(&name, false)?,
        ..Default::default()
    };
    let job = spec.build().map_err(value_error)?;
    if name == "-" {
        return Err(PyValueError::new_err(
            "map_range needs an image that can seek, not standard input",
        ));
    }
    // Before anything is read: `out` must not replace what it would destroy
    // (the map-writing function checks again as it writes).
    let image_input = blkmap::guard::Input {
        name: image.as_os_str(),
        role: "the image",
    };
    blkmap::guard::check_outputs(&[blkmap::guard::Output::map(&out)], &[image_input])
        .map_err(|e| refused(&e))?;
    let shown = name.clone();
    // A range that does not fit the image is a bad argument (ValueError),
    // known only once the image is open.
    let warn_name = image.clone();
    let done = run_cancellable(py, &shown, move |cancel| {
        hash_range(&job.with_cancel(cancel), &name, &image, &out, span)
    })?;
    let (range, rounded) = done.map_err(|why| PyValueError::new_err(format!("{shown}: {why}")))?;
    warn_rounded(py, &warn_name, rounded)?;
    Ok(range)
}

/// The range hashed, and the raw file's size rounded up to QEMU's, if it
/// was.
type Hashed = ((u64, u64), Option<blkimage::Rounded>);

/// Hash the part `span` of the image `name` (the path `image`) into the
/// part file `out`, written as it is made: memory does not grow with the
/// part. The range and the rounding, or why the range does not fit the
/// image (a bad argument, known only once the image is open).
fn hash_range(
    job: &blkjob::Job,
    name: &str,
    image: &std::path::Path,
    out: &std::path::Path,
    span: Span,
) -> std::io::Result<Result<Hashed, String>> {
    let input = job.open(name)?;
    // Asked of the image, not of the range's window over it.
    let rounded = input.rounded();
    let src = blkjob::seekable(input, "map_range")?;
    let checked = span
        .resolve(src.size(), job.block_size())
        .map(|(offset, len)| blkmap::Range { offset, len })
        .and_then(|r| {
            blkmap::check_range(src.size(), job.block_size(), r).map_err(|e| e.to_string())?;
            Ok(r)
        });
    let range = match checked {
        Ok(r) => r,
        Err(why) => return Ok(Err(why)),
    };
    let inputs = [blkmap::guard::Input {
        name: image.as_os_str(),
        role: "the image",
    }];
    let out = blkjob::Out {
        path: out,
        inputs: &inputs,
    };
    let name = std::ffi::OsStr::new(name);
    blkjob::map_range_to(name, src, range, job, &mut |_| {}, out)?;
    Ok(Ok(((range.offset, range.len), rounded)))
}

/// The part asked for: ``offset``/``length``, or ``part=(k, n)``.
fn span_of(offset: u64, length: Option<u64>, part: Option<(u64, u64)>) -> PyResult<Span> {
    match part {
        Some(_) if offset != 0 || length.is_some() => Err(PyValueError::new_err(
            "give part=(k, n) or offset and length, not both",
        )),
        Some((index, count)) if index == 0 || index > count => Err(PyValueError::new_err(format!(
            "part ({index}, {count}): k from 1 to n"
        ))),
        Some((index, count)) => Ok(Span::Part { index, count }),
        None => Ok(Span::Range {
            offset,
            len: length,
        }),
    }
}

/// Merge the part files ``parts`` (from ``map_range()`` or ``blkmap
/// --range``, in any order) into the image's map, written atomically to
/// ``out`` if given, and return the image's checksum in hexadecimal, as
/// ``checksum()`` gives it for the whole image, in ``construction``
/// (``"blkhash"``, ``"imageio"`` or ``"pbs"``: the map keeps the block
/// digests, any construction follows from them). The parts must cover the
/// image exactly once and agree on its size, the digest and the block size.
/// They are read as streams: memory stays about 1 MiB per part whatever
/// the image's size. A single Proxmox Backup Server fixed index (a
/// ``.fidx``, probed by its magic) is read as the map of the disk it backed
/// up, its length and index_csum checked (with ``construction="pbs"`` the
/// result is its index_csum), when no ``out`` is given. Raises ValueError
/// naming the parts and offsets for a gap, an overlap, a mismatch or a
/// damaged part or index; OSError if a part cannot be read or ``out``
/// written.
#[pyfunction]
#[pyo3(signature = (parts, out = None, *, construction = "blkhash"))]
pub fn merge(
    py: Python<'_>,
    parts: Vec<PathBuf>,
    out: Option<PathBuf>,
    construction: &str,
) -> PyResult<String> {
    let construction = parse_construction(construction)?;
    let shown = out
        .as_ref()
        .map(|o| o.display().to_string())
        .unwrap_or_else(|| "merge".into());
    if let Some(out) = &out {
        let inputs: Vec<_> = parts
            .iter()
            .map(|p| blkmap::guard::Input {
                name: p.as_os_str(),
                role: "a part",
            })
            .collect();
        blkmap::guard::check_outputs(&[blkmap::guard::Output::map(out)], &inputs)
            .map_err(|e| refused(&e))?;
    }
    // On a thread of its own, so that Ctrl-C stops a merge of parts that
    // claim a huge image of zeros (one digest per block to compute).
    let result = run_cancellable(py, &shown, move |cancel| {
        if let ([fidx], None) = (&parts[..], &out)
            && blkmap::is_fidx_file(fidx)
        {
            let name = fidx.display().to_string();
            let sum = blkmap::open_fidx(fidx).and_then(|mut r| r.checksum_in(construction));
            return Ok(sum
                .map(|s| s.to_hex())
                .map_err(|e| blkmap::MapError::from(e).of(&name)));
        }
        let merged = blkmap::merge_files_until(&parts, out.as_deref(), &cancel);
        Ok(match (merged, &out) {
            (Ok(h), _) if construction == blkhash::Construction::Blkhash => Ok(h
                .checksum
                .as_ref()
                .map(blkhash::Checksum::to_hex)
                .unwrap_or_default()),
            // Another construction: from the merged map's digests, or the parts'.
            (Ok(_), Some(out)) => {
                blkmap::checksum_files_until(&[out], construction, &cancel).map(|h| {
                    h.checksum
                        .as_ref()
                        .map(blkhash::Checksum::to_hex)
                        .unwrap_or_default()
                })
            }
            (Ok(_), None) => blkmap::checksum_files_until(&parts, construction, &cancel).map(|h| {
                h.checksum
                    .as_ref()
                    .map(blkhash::Checksum::to_hex)
                    .unwrap_or_default()
            }),
            (Err(e), _) => Err(e),
        })
    })?;
    match result {
        Ok(hex) => Ok(hex),
        Err(MapError::Io(e)) => Err(os_error(&shown, &e)),
        Err(MapError::In(name, e)) if matches!(*e, MapError::Io(_)) => {
            let MapError::Io(e) = *e else { unreachable!() };
            Err(os_error(&name, &e))
        }
        Err(e) => Err(PyValueError::new_err(e.to_string())),
    }
}

/// An output the guard refused, as the OSError subclass Python code
/// expects: the message names the output and why.
pub(crate) fn refused(e: &std::io::Error) -> PyErr {
    use pyo3::exceptions::{PyFileExistsError, PyIsADirectoryError, PyOSError};
    let msg = e.to_string();
    match e.kind() {
        std::io::ErrorKind::AlreadyExists => PyFileExistsError::new_err(msg),
        std::io::ErrorKind::IsADirectory => PyIsADirectoryError::new_err(msg),
        _ => PyOSError::new_err(msg),
    }
}
