//! `blkhash.update_map()`, `blkhash.dirty_ranges()` and
//! `blkhash.bitmaps()`: QEMU dirty bitmaps, as `blkmap --base
//! --dirty-bitmap` and `blkmap bitmaps` use them.

use crate::image::{OpenArgs, image_name, os_error, run_cancellable};
use crate::{check_threads, maps::refused};
use blkjob::JobSpec;
use blkjob::incremental::{self, Base};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// The job for `image` of `function` with the keyword arguments every
/// image function takes, the NBD options set by `nbd`. `threads: None`:
/// a function that reads only bitmaps, through the page cache (it takes
/// neither `threads` nor `cache`).
fn spec(
    function: &str,
    name: &str,
    threads: Option<Option<i64>>,
    options: Option<&Bound<'_, PyDict>>,
    nbd: impl FnOnce(&mut blkimage::nbd::NbdOptions),
) -> PyResult<JobSpec> {
    let args = OpenArgs::new(function, options)?;
    let mut open = match threads {
        Some(_) => args.options(name, false)?,
        None => args.without_cache(function)?.options(name, true)?,
    };
    nbd(&mut open.nbd);
    Ok(JobSpec {
        threads: Some(check_threads(threads.flatten())?),
        open,
        ..Default::default()
    })
}

/// Update the map ``base`` of ``image`` (saved by ``map_range()``,
/// ``merge()`` or ``blkmap`` when the dirty bitmap ``bitmap`` was created
/// or last cleared) to the image's map now, written atomically to ``out``
/// (which may be ``base``), and return the image's checksum in hexadecimal,
/// as ``checksum()`` gives it. Only the blocks the bitmap marks dirty are
/// read; every other digest is ``base``'s, checked first: same size,
/// digest and block size; the files the image reads besides itself
/// (backing chain, data file) the ones ``base`` recorded, unchanged (or the
/// same NBD export); clean blocks whose allocation now contradicts
/// ``base`` read and equal to it; 16 clean blocks read again must hold
/// what ``base`` says. With ``verify=True`` every clean block is read too,
/// and any that changed without the bitmap marking it is an error (nothing
/// written); a ``base`` written before maps recorded their image needs it. ``image``
/// is a qcow2 image (its persistent bitmap) or an NBD URL whose server
/// offers ``qemu:dirty-bitmap:NAME``; the other options are
/// ``checksum()``'s. Raises OSError (nothing written) for a bitmap that is
/// missing, in use (inconsistent) or disabled, a ``base`` that is not the
/// image's earlier map, or an image that cannot be read; ValueError for a
/// bad argument.
#[pyfunction]
#[pyo3(
    text_signature = "(image, base, bitmap, out, *, verify=False, format=None, cache=False, \
    threads=None, no_backing=False, force_share=False, secret_file=None, timeout=None, \
    tls_certificates=None, headers=None, retries=None)"
)]
#[pyo3(signature = (image, base, bitmap, out, *, verify = false, threads = None, **options))]
#[allow(clippy::too_many_arguments)]
pub fn update_map(
    py: Python<'_>,
    image: PathBuf,
    base: PathBuf,
    bitmap: String,
    out: PathBuf,
    verify: bool,
    threads: Option<i64>,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let name = image_name(&image)?;
    let spec = spec("update_map", &name, Some(threads), options, |nbd| {
        nbd.dirty_bitmap = Some(bitmap.clone())
    })?;
    let base_name = base.display().to_string();
    let old = blkmap::Map::load(&base).map_err(|e| os_error(&base_name, &e.into()))?;
    let job = spec
        .resolve(Some((old.algorithm(), old.block_size())))
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?;
    // Before anything is read: `out` must not replace what it would destroy.
    let image_input = blkmap::guard::Input {
        name: image.as_os_str(),
        role: "the image",
    };
    blkmap::guard::check_outputs(&[blkmap::guard::Output::map(&out)], &[image_input])
        .map_err(|e| refused(&e))?;
    let shown = name.clone();
    run_cancellable(py, &shown, move |cancel| {
        let job = job.with_cancel(cancel);
        let src = blkjob::seekable(job.open(&name)?, "update_map")?;
        let base = Base {
            map: &old,
            name: &base_name,
        };
        let opened = std::ffi::OsStr::new(&name);
        let updated =
            incremental::update_map(src, opened, &base, &bitmap, verify, &job, &mut |_| {})?;
        let image_input = blkmap::guard::Input {
            name: image.as_os_str(),
            role: "the image",
        };
        updated.map.save_guarded(&out, &[image_input])?;
        Ok(updated.map.checksum().to_hex())
    })
}

/// The guest ranges the dirty bitmap ``bitmap`` of ``image`` marks, as a
/// list of ``(offset, length)`` in bytes, in order, merged: what a backup
/// tool copies. ``image`` is a qcow2 image or an NBD URL whose server
/// offers ``qemu:dirty-bitmap:NAME``; the other options are
/// ``checksum()``'s. A bitmap split into more than 4,194,304 runs gives
/// fewer, wider ranges that still cover every dirty byte (memory stays
/// bounded). Raises OSError for a bitmap that is missing, in use
/// (inconsistent) or disabled (it may not mark every write), or an image
/// that cannot be read.
#[pyfunction]
#[pyo3(
    text_signature = "(image, bitmap, *, format=None, no_backing=False, force_share=False, \
    secret_file=None, timeout=None, tls_certificates=None, headers=None, retries=None)"
)]
#[pyo3(signature = (image, bitmap, **options))]
pub fn dirty_ranges(
    py: Python<'_>,
    image: PathBuf,
    bitmap: String,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Vec<(u64, u64)>> {
    let name = image_name(&image)?;
    let spec = spec("dirty_ranges", &name, None, options, |nbd| {
        nbd.dirty_bitmap = Some(bitmap.clone())
    })?;
    let shown = name.clone();
    run_cancellable(py, &shown, move |_| {
        let src = blkjob::seekable(blkimage::open(&name, &spec.open)?, "dirty_ranges")?;
        let dirty = incremental::dirty(&*src, &bitmap)?;
        Ok(dirty
            .ranges
            .iter()
            .map(|r| (r.start, r.end - r.start))
            .collect())
    })
}

/// The dirty bitmaps of ``image`` (a qcow2 image, or an NBD URL: its
/// ``qemu:dirty-bitmap:`` contexts), a dict each: ``name``,
/// ``granularity`` (bytes per bit), ``in_use`` (the writer died: the
/// bitmap is refused), ``enabled`` (it records writes); an NBD server says
/// only the name (the rest None). An image format without bitmaps (raw)
/// gives an empty list. Raises OSError if the image cannot be read.
#[pyfunction]
#[pyo3(
    text_signature = "(image, *, format=None, no_backing=False, force_share=False, \
    secret_file=None, timeout=None, tls_certificates=None, headers=None, retries=None)"
)]
#[pyo3(signature = (image, **options))]
pub fn bitmaps(
    py: Python<'_>,
    image: PathBuf,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<Vec<Py<PyDict>>> {
    let name = image_name(&image)?;
    let spec = spec("bitmaps", &name, None, options, |nbd| {
        nbd.list_bitmaps = true
    })?;
    let shown = name.clone();
    let list = run_cancellable(py, &shown, move |_| {
        let src = blkjob::seekable(blkimage::open(&name, &spec.open)?, "bitmaps")?;
        src.bitmaps()
    })?;
    (list.into_iter())
        .map(|b| {
            let d = PyDict::new(py);
            d.set_item("name", b.name)?;
            d.set_item("granularity", b.granularity)?;
            d.set_item("in_use", b.in_use)?;
            d.set_item("enabled", b.enabled)?;
            Ok(d.unbind())
        })
        .collect()
}
