//! `blkhash.checksum()`: an image's checksum, as blksum computes it (on
//! a thread of its own, cancelled by Ctrl-C: [`crate::image`]).

use crate::image::{OpenArgs, image_name, run_cancellable, warn_note, warn_rounded};
use crate::{non_negative, params, parse_construction, value_error};
use blkjob::{JobError, JobSpec};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// The blkhash checksum of ``image`` in hexadecimal, as ``blksum`` prints
/// it. ``image`` is a path (str or os.PathLike: a raw file or block device,
/// a qcow2 image read natively, another format QEMU reads through a private
/// qemu-nbd), an NBD URL (``nbd://host/export``,
/// ``nbd+unix:///export?socket=PATH``, ``nbds://`` for TLS), an HTTP(S) URL
/// of a raw or qcow2 image (read by range requests: only what a qcow2
/// image holds is fetched; the file's version is checked on every reply
/// and OSError "changed while it was read" raised if it changes), or
/// ``"-"`` for standard input.
///
/// A raw file is hashed at the size QEMU gives it, rounded up to a multiple
/// of 512 with zeros, as blksum and the reference hash it: the checksum of a
/// 1000-byte file is that of its bytes and 24 zeros, not
/// ``new(data).hexdigest()`` (nor that of ``"-"`` reading it, which hashes
/// the exact bytes). Such a file raises a ``UserWarning`` naming both sizes,
/// as blksum says it on standard error (``warnings.filterwarnings`` silences
/// it or makes it an error). With ``construction="imageio"`` or ``"pbs"`` it
/// is hashed at its exact size, as oVirt imageio and Proxmox's backup
/// client read a file.
///
/// The options are blksum's:
///
/// - ``digest``: one of ``algorithms_available``, or another spelling
///   blksum's ``-d`` takes (hashlib's ``"sha3_256"``, ``"blake2b-256"``,
///   oVirt imageio's ``"blake2b"``) [default: sha256, or blake2b-256 with
///   ``construction="imageio"``, which takes the digests imageio computes];
/// - ``block_size``: a multiple of 512 from 512 to 64 MiB [default: 64
///   KiB, or 4 MiB with ``construction="imageio"`` or ``"pbs"``];
/// - ``construction``: how block digests become the checksum:
///   ``"blkhash"`` (blkhash 0.11's, blksum's default), ``"imageio"`` (oVirt
///   imageio's checksum API) or ``"pbs"`` (a Proxmox Backup Server
///   index_csum), as ``blksum --construction``;
/// - ``format``: "raw", "qcow2", or another QEMU format name (vmdk, vdi,
///   vhdx, vpc, qed, parallels, dmg, qcow, bochs, cloop, luks); None probes;
/// - ``cache``: read through the page cache (else direct I/O);
/// - ``threads``: digest threads, 1 to 128 (None: one per core);
/// - ``no_backing``: refuse qcow2 images that name other files;
/// - ``force_share``: read an image another process has open for writing
///   (QEMU's image locks ignored, as ``qemu-img -U``; else OSError "in use");
/// - ``secret_file``: the passphrase file of a LUKS image;
/// - ``timeout``: seconds an NBD or HTTP server may stay silent or take
///   for a reply (an HTTP request then is tried again);
/// - ``tls_certificates``: the certificates directory for ``nbds://`` and
///   ``https://`` (its ``ca-cert.pem``, and ``client-cert.pem`` with
///   ``client-key.pem``; None: the system's CAs);
/// - ``headers``: HTTP(S) headers, a dict of names to values, sent to the
///   URL's host (not to another host it redirects to), as
///   ``{"Authorization": "Bearer TOKEN"}``; a user and password in the URL
///   are sent as basic auth, and never shown in messages (``***``);
/// - ``retries``: HTTP(S) tries after the first for a request that failed
///   on the way (a reset connection, a timeout, 502, 503...), 0 to 100
///   (None: 4);
/// - ``chain``: ``image`` is a chain of image files named oldest first
///   between commas, ``"full.qcow2,inc1.qcow2"``, each read over the one
///   before as if chained with ``qemu-img rebase -u``: the disk as of the
///   last (backups written as standalone qcow2 files; as ``blksum
///   --chain``);
/// - ``size``: hash only the image's first ``size`` bytes, as an image of
///   that size (a block device larger than the image written to it; as
///   ``blksum --size``);
/// - ``read_size``: bytes per read, a multiple of 4096 up to 256 MiB;
/// - ``queue_depth``: reads queued ahead of the digest workers, 1 to 128.
///
/// Whatever ``read_size`` and ``queue_depth`` ask for, the reads in flight
/// hold at most 256 MiB of buffers (or one read, two when read ahead of
/// the digest threads, when a read is larger): the depths are cut to fit.
///
/// The GIL is released while hashing. Raises ValueError for a bad argument,
/// OSError if the image cannot be read, with the reason blksum prints
/// (``errno`` and ``filename`` set where the system gave an errno), and
/// KeyboardInterrupt on Ctrl-C, once the run has stopped between reads and
/// cleaned up (a second Ctrl-C raises at once, leaving the run to end on
/// its own).
#[pyfunction]
#[pyo3(
    text_signature = "(image, *, digest=None, block_size=None, construction='blkhash', format=None, \
    cache=False, threads=None, no_backing=False, force_share=False, secret_file=None, \
    timeout=None, tls_certificates=None, read_size=1048576, queue_depth=16, headers=None, \
    retries=None, chain=False, size=None)"
)]
#[pyo3(signature = (
    image, *, digest = None, block_size = None, construction = "blkhash",
    threads = None, read_size = 1 << 20, queue_depth = 16, **options
))]
#[allow(clippy::too_many_arguments)]
pub fn checksum(
    py: Python<'_>,
    image: PathBuf,
    digest: Option<&str>,
    block_size: Option<i64>,
    construction: &str,
    threads: Option<i64>,
    read_size: i64,
    queue_depth: i64,
    options: Option<&Bound<'_, PyDict>>,
) -> PyResult<String> {
    let name = image_name(&image)?;
    let open = OpenArgs::new("checksum", options)?.options(&name, false)?;
    let construction = parse_construction(construction)?;
    let (alg, bs) = params(construction, digest, block_size)?;
    let spec = JobSpec {
        construction,
        digest: Some(alg),
        block_size: Some(bs),
        threads: threads
            .map(|n| non_negative(n, |v| JobError::Threads(v as usize)))
            .transpose()?,
        read_size: Some(non_negative(read_size, JobError::ReadSize)?),
        queue_depth: Some(non_negative(queue_depth, |v| {
            JobError::QueueDepth(v as usize)
        })?),
        open,
        ..Default::default()
    };
    let job = spec.build().map_err(value_error)?;
    let hashed = run_cancellable(py, &name.clone(), move |cancel| {
        let job = job.with_cancel(cancel);
        blkjob::hash_named(&name, &job, &mut |_| {})
    })?;
    warn_rounded(py, &image, hashed.rounded)?;
    warn_note(py, &image, hashed.decompressed)?;
    Ok(hashed.checksum.to_hex())
}
