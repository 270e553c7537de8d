"""Fast checksums of disk images, byte-identical to blkhash 0.11 (blksum).

``new()`` makes a hashlib-like hasher fed with bytes; ``checksum()`` hashes
an image (a file, a qcow2 or other QEMU image, an NBD or HTTP(S) URL).
"""

import os
import sys
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple, Union, final

if sys.version_info >= (3, 12):
    from collections.abc import Buffer as _Buffer
else:
    # Anything with the buffer protocol: bytes, bytearray, memoryview,
    # mmap.mmap, array.array...
    from typing_extensions import Buffer as _Buffer

__version__: str
__all__ = [
    "Hasher",
    "new",
    "checksum",
    "map_range",
    "merge",
    "update_map",
    "dirty_ranges",
    "bitmaps",
    "algorithms_available",
    "algorithms_guaranteed",
    "__version__",
]

#: The digest names ``blksum --list-digests`` prints: each one but
#: ``blake3`` and ``null`` a name ``hashlib.new()`` takes for the same
#: digest. ``new()`` and ``checksum()`` take these and other spellings:
#: hashlib's (``sha3_256``, ``shake_128``), OpenSSL's (``SHA2-256``), and
#: ``blake2b-256`` (BLAKE2b with a 32-byte output, oVirt imageio's
#: ``blake2b``, also taken as ``blake2b``), which no hashlib name means.
algorithms_available: FrozenSet[str]
#: The same as ``algorithms_available``: every digest is built in.
algorithms_guaranteed: FrozenSet[str]

@final
class Hasher:
    """A blkhash hasher, used like a hashlib object.

    Its digest is the blkhash checksum of the bytes given. Unlike a hashlib
    object it cannot continue after ``digest()`` or ``hexdigest()`` (both
    may be called again; ``update()`` and ``zero()`` then raise ValueError)
    and cannot be copied. Calls on one hasher from several threads are
    serialized; the GIL is released while hashing.
    """

    def __new__(
        cls,
        name: str = "sha256",
        data: Optional[_Buffer] = None,
        *,
        block_size: int = 65536,
        threads: Optional[int] = None,
    ) -> "Hasher": ...
    @property
    def name(self) -> str:
        """The digest's name, as ``new()`` takes it."""
    @property
    def digest_size(self) -> int:
        """The size of the checksum in bytes."""
    @property
    def block_size(self) -> int:
        """The blkhash block size in bytes (not the digest's internal block size)."""
    @property
    def threads(self) -> int:
        """The number of digest worker threads."""
    def update(self, data: _Buffer) -> None:
        """Add the bytes of ``data`` (read in place from 1 MiB on, else copied), GIL released."""
    def zero(self, length: int) -> None:
        """Add ``length`` bytes known to be zeros: nothing is read or allocated.

        Ctrl-C stops it promptly (KeyboardInterrupt); the hasher then holds
        part of the zeros and raises RuntimeError instead of a digest.
        OverflowError, nothing added, past 2**64 - 1 bytes in all (also from
        ``update()``).
        """
    def digest(self) -> bytes:
        """The checksum; the first call finishes the hasher."""
    def hexdigest(self) -> str:
        """The checksum in lowercase hexadecimal, as blksum prints it."""
    def copy(self) -> "Hasher":
        """Not supported: raises NotImplementedError (the state lives in worker threads)."""

def new(
    name: str = "sha256",
    data: Optional[_Buffer] = None,
    *,
    block_size: int = 65536,
    threads: Optional[int] = None,
) -> Hasher:
    """A new hasher for the digest ``name``; ValueError for bad arguments,
    OSError (BlockingIOError, EAGAIN) if the system will not start its
    worker threads.

    It hashes the bytes given, exactly: for a file whose size is not a
    multiple of 512 that is not ``checksum(path)``, which hashes it rounded
    up to 512 with zeros, as QEMU (and blksum) see it.
    """

def checksum(
    image: Union[str, "os.PathLike[str]"],
    *,
    digest: str = "sha256",
    block_size: int = 65536,
    format: Optional[str] = None,
    cache: bool = False,
    threads: Optional[int] = None,
    no_backing: bool = False,
    force_share: bool = False,
    secret_file: Optional[Union[str, "os.PathLike[str]"]] = None,
    timeout: Optional[float] = None,
    tls_certificates: Optional[Union[str, "os.PathLike[str]"]] = None,
    read_size: int = 1048576,
    queue_depth: int = 16,
    headers: Optional[Dict[str, str]] = None,
    retries: Optional[int] = None,
    chain: bool = False,
    size: Optional[int] = None,
) -> str:
    """The hex checksum of an image (path, NBD URL, HTTP(S) URL, or "-"), as blksum prints it.

    An HTTP(S) URL of a raw or qcow2 image is read by range requests (only
    what a qcow2 image holds); ``headers`` (a dict, for a bearer token) go to
    the URL's host, ``retries`` (None: 4) bound the tries of a request that
    failed on the way, ``tls_certificates`` names the CAs to trust (a PEM
    file, or a directory: with ``ca-cert.pem`` as for ``nbds://``, or of CA
    certificates). ``chain=True`` reads ``image`` as a chain of image files
    named oldest first between commas (``"full.qcow2,inc1.qcow2"``), each
    over the one before as if chained with ``qemu-img rebase -u``;
    ``size`` hashes only the image's first ``size`` bytes (a block device
    larger than the image written to it). The other functions on an image take the same keywords. A file that changes while it is read
    raises OSError ("changed while it was read"); a password in the URL is
    shown as ``***`` in every message.

    A raw file's size is rounded up to a multiple of 512 with zeros, as QEMU
    and blksum see it (standard input, ``"-"``, and ``new(data)`` hash the
    exact bytes): such a file raises a ``UserWarning`` naming both sizes.

    ``read_size``: bytes per read, a multiple of 4096 up to 256 MiB;
    ``queue_depth``: reads queued ahead of the digest workers, 1 to 128.
    Whatever both ask for, the reads in flight hold at most 256 MiB of
    buffers (or one read, two when read ahead of the digest threads, when
    a read is larger): the depths are cut to fit.

    Raises ValueError for a bad argument, OSError if the image cannot be
    read (or its threads cannot start), KeyboardInterrupt on Ctrl-C after
    the run stopped and cleaned up.
    """

def map_range(
    image: Union[str, "os.PathLike[str]"],
    out: Union[str, "os.PathLike[str]"],
    *,
    offset: int = 0,
    length: Optional[int] = None,
    part: Optional[Tuple[int, int]] = None,
    digest: str = "sha256",
    block_size: int = 65536,
    format: Optional[str] = None,
    cache: bool = False,
    threads: Optional[int] = None,
    no_backing: bool = False,
    force_share: bool = False,
    secret_file: Optional[Union[str, "os.PathLike[str]"]] = None,
    timeout: Optional[float] = None,
    tls_certificates: Optional[Union[str, "os.PathLike[str]"]] = None,
    headers: Optional[Dict[str, str]] = None,
    retries: Optional[int] = None,
    chain: bool = False,
    size: Optional[int] = None,
) -> Tuple[int, int]:
    """Hash part of ``image`` into the part file ``out``; return its ``(offset, length)``.

    The part is ``offset``/``length`` (None: to the end) or ``part=(k, n)``,
    the k-th of n about equal parts (k from 1). Parts that cover the image
    once merge into its map with ``merge()``. Raises ValueError for a bad
    argument or range, OSError if the image cannot be read.
    """

def merge(
    parts: Sequence[Union[str, "os.PathLike[str]"]],
    out: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> str:
    """Merge part files (any order) into the map ``out`` (if given); return the hex checksum.

    Raises ValueError for a gap, an overlap, a mismatch or damage (naming
    the parts), OSError if a part cannot be read or ``out`` written.
    """

def update_map(
    image: Union[str, "os.PathLike[str]"],
    base: Union[str, "os.PathLike[str]"],
    bitmap: str,
    out: Union[str, "os.PathLike[str]"],
    *,
    verify: bool = False,
    format: Optional[str] = None,
    cache: bool = False,
    threads: Optional[int] = None,
    no_backing: bool = False,
    force_share: bool = False,
    secret_file: Optional[Union[str, "os.PathLike[str]"]] = None,
    timeout: Optional[float] = None,
    tls_certificates: Optional[Union[str, "os.PathLike[str]"]] = None,
    headers: Optional[Dict[str, str]] = None,
    retries: Optional[int] = None,
) -> str:
    """Update ``base`` (the map when ``bitmap`` was created or cleared) to the map now, in ``out``; return the hex checksum.

    Only the blocks the dirty bitmap marks are read; ``base`` is checked
    first (size, digest, block size, the backing and data files it
    recorded unchanged, clean blocks whose allocation changed read, 16
    clean blocks read again). ``verify=True`` reads the clean blocks too
    (needed for a ``base`` that records nothing of its image). Raises
    OSError (nothing written) for a missing, in-use or disabled bitmap, a
    change the bitmap cannot have recorded, or a ``base`` that is not the
    image's earlier map.
    """

def dirty_ranges(
    image: Union[str, "os.PathLike[str]"],
    bitmap: str,
    *,
    format: Optional[str] = None,
    no_backing: bool = False,
    force_share: bool = False,
    secret_file: Optional[Union[str, "os.PathLike[str]"]] = None,
    timeout: Optional[float] = None,
    tls_certificates: Optional[Union[str, "os.PathLike[str]"]] = None,
    headers: Optional[Dict[str, str]] = None,
    retries: Optional[int] = None,
) -> List[Tuple[int, int]]:
    """The ``(offset, length)`` byte ranges the dirty bitmap marks, in order, merged.

    A bitmap split into more than 4,194,304 runs gives fewer, wider ranges
    that still cover every dirty byte (memory stays bounded).
    Raises OSError for a missing, in-use or disabled bitmap.
    """

def bitmaps(
    image: Union[str, "os.PathLike[str]"],
    *,
    format: Optional[str] = None,
    no_backing: bool = False,
    force_share: bool = False,
    secret_file: Optional[Union[str, "os.PathLike[str]"]] = None,
    timeout: Optional[float] = None,
    tls_certificates: Optional[Union[str, "os.PathLike[str]"]] = None,
    headers: Optional[Dict[str, str]] = None,
    retries: Optional[int] = None,
) -> List[Dict[str, Union[str, int, bool, None]]]:
    """The image's dirty bitmaps: ``name``, ``granularity``, ``in_use``, ``enabled`` (None where unknown)."""
