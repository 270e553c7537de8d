//! The `blkhash` Python package: a thin layer over the blkhash and blkimage
//! crates. `blkhash.new()` is the construction as a hashlib-like object
//! (`hasher.rs`); `blkhash.checksum()` hashes an image as blksum does
//! (`checksum.rs`), the maps' and bitmaps' functions make and update block
//! maps (`maps.rs`, `bitmaps.rs`), all through what `image.rs` shares
//! (names, options, cancelling, errors). Nothing here but translating
//! arguments, buffers and errors.

mod bitmaps;
mod buffer;
mod checksum;
mod hasher;
mod image;
mod maps;

use blkhash::{Algorithm, Construction};
use blkjob::JobError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyFrozenSet;

/// A digest by name (as OpenSSL spells it, any case).
fn parse_digest(name: &str) -> PyResult<Algorithm> {
    name.parse().map_err(|_| {
        PyValueError::new_err(format!(
            "unknown digest '{name}' (see blkhash.algorithms_available)"
        ))
    })
}

/// A construction by name: blkhash (blkhash 0.11's), imageio (oVirt
/// imageio's checksum API) or pbs (a Proxmox Backup Server index_csum).
fn parse_construction(name: &str) -> PyResult<Construction> {
    name.parse()
        .map_err(|e: blkhash::UnknownConstruction| PyValueError::new_err(e.to_string()))
}

/// The digest and block size asked for, else the construction's defaults.
fn params(
    construction: Construction,
    digest: Option<&str>,
    block_size: Option<i64>,
) -> PyResult<(Algorithm, usize)> {
    let alg = match digest {
        Some(d) => parse_digest(d)?,
        None => construction.default_algorithm(),
    };
    let bs = match block_size {
        Some(n) => check_block_size(n)?,
        None => construction.default_block_size(),
    };
    Ok((alg, bs))
}

/// `n` where the library's rule `bad` wants a count or a size: a negative
/// `n` breaks the rule too, and is named in its words.
fn non_negative(n: i64, bad: fn(u64) -> JobError) -> PyResult<usize> {
    usize::try_from(n).map_err(|_| {
        let msg = bad(0).to_string();
        let rule = msg.rsplit_once(", not ").map_or(msg.as_str(), |(r, _)| r);
        PyValueError::new_err(format!("{rule}, not {n}"))
    })
}

/// A library rule broken: ValueError with its message.
fn value_error(e: JobError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// A block size: a multiple of 512 from 512 to 64 MiB (the library's rule).
fn check_block_size(n: i64) -> PyResult<usize> {
    blkjob::check_block_size(non_negative(n, JobError::BlockSize)?).map_err(value_error)
}

/// Digest threads: 1 to 128, or None for one per core.
fn check_threads(n: Option<i64>) -> PyResult<usize> {
    let Some(n) = n else {
        return Ok(blkhash::default_threads());
    };
    let threads = non_negative(n, |v| JobError::Threads(v as usize))?;
    let spec = blkjob::JobSpec {
        threads: Some(threads),
        ..Default::default()
    };
    spec.build().map_err(value_error)?;
    Ok(threads)
}

/// A new blkhash hasher for the digest ``name`` (one of
/// ``algorithms_available``, or another spelling blksum's ``-d`` takes:
/// hashlib's ``"shake_128"``, ``"blake2b-256"``), cutting data into blocks of ``block_size``
/// bytes (a multiple of 512 from 512 to 64 MiB) digested by ``threads``
/// worker threads (default: one per core). ``data``, if given, is added
/// first. ``construction`` says how block digests become the checksum:
/// ``"blkhash"`` (blkhash 0.11's, the default), ``"imageio"`` (oVirt
/// imageio's checksum API: no length at the end; blake2b-256 and 4 MiB
/// blocks unless ``name`` and ``block_size`` are given) or ``"pbs"`` (a
/// Proxmox Backup Server index_csum: imageio's with sha256 and 4 MiB).
/// Raises ValueError for an unknown digest or construction (or a digest
/// imageio does not compute with ``"imageio"``) or a bad size
/// or count, OSError (BlockingIOError, EAGAIN) if the system will not
/// start the worker threads (its limit on threads).
#[pyfunction]
#[pyo3(
    text_signature = "(name=None, data=None, *, block_size=None, threads=None, construction='blkhash')"
)]
#[pyo3(signature = (name = None, data = None, *, block_size = None, threads = None, construction = "blkhash"))]
fn new(
    py: Python<'_>,
    name: Option<&str>,
    data: Option<&Bound<'_, PyAny>>,
    block_size: Option<i64>,
    threads: Option<i64>,
    construction: &str,
) -> PyResult<hasher::PyHasher> {
    hasher::PyHasher::py_new(py, name, data, block_size, threads, construction)
}

/// Fast checksums of disk images, byte-identical to blkhash 0.11 (blksum).
///
/// ``new()`` makes a hashlib-like hasher fed with bytes; ``checksum()``
/// hashes an image (a file, a qcow2 or other QEMU image, an NBD URL).
#[pymodule]
#[pyo3(name = "blkhash")]
fn blkhash_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<hasher::PyHasher>()?;
    m.add_function(wrap_pyfunction!(new, m)?)?;
    m.add_function(wrap_pyfunction!(checksum::checksum, m)?)?;
    m.add_function(wrap_pyfunction!(maps::map_range, m)?)?;
    m.add_function(wrap_pyfunction!(maps::merge, m)?)?;
    m.add_function(wrap_pyfunction!(bitmaps::update_map, m)?)?;
    m.add_function(wrap_pyfunction!(bitmaps::dirty_ranges, m)?)?;
    m.add_function(wrap_pyfunction!(bitmaps::bitmaps, m)?)?;
    // The names blksum --list-digests prints (hashlib's, as libblkhash 0.11
    // lists OpenSSL's); new() takes the others too. Every digest is built
    // in, so both sets are the same.
    let names: Vec<&str> = Algorithm::listed().map(|a| a.name()).collect();
    m.add("algorithms_available", PyFrozenSet::new(py, &names)?)?;
    m.add("algorithms_guaranteed", PyFrozenSet::new(py, &names)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
