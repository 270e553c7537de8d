"""map_range() and merge(): an image hashed in parts by several processes
(concurrent.futures, a dask.distributed cluster), over files and one NBD
export, merges to checksum(); parts that do not make a map are refused."""

import concurrent.futures
import random
import subprocess
import time
import warnings

import pytest

import blkhash
from conftest import need

RECIPE = "3m:r 2m:- 1m:0 2m:t 700000:r"


@pytest.fixture
def qcow2(images, tmp_path):
    need("qemu-img", "qemu-utils")
    out = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", "-c",
                    images(RECIPE), out], check=True)
    return out


def map_part(image, out, k, n, **kw):
    """A module-level function: process pools and dask pickle it."""
    return blkhash.map_range(str(image), str(out), part=(k, n), **kw)


def test_parts_in_any_order_merge_to_the_checksum(images, tmp_path):
    raw = images(RECIPE)
    rng = random.Random(5)
    for digest, bs in [("sha256", 65536), ("blake3", 4096), ("md5", 512)]:
        size = blkhash_size(raw)
        cuts = sorted({rng.randrange(0, size // bs + 1) * bs for _ in range(3)} | {0, size})
        parts = []
        for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
            p = tmp_path / f"{digest}-{i}.part"
            assert blkhash.map_range(raw, p, offset=a, length=b - a, digest=digest,
                                     block_size=bs) == (a, b - a)
            parts.append(p)
        rng.shuffle(parts)
        out = tmp_path / f"{digest}.map"
        want = blkhash.checksum(raw, digest=digest, block_size=bs)
        assert blkhash.merge(parts, out) == want
        assert blkhash.merge([out]) == want  # a whole map alone


def blkhash_size(raw):
    # Opened by path, a raw image's size is rounded up to 512, as QEMU.
    n = raw.stat().st_size
    return n + (-n % 512)


def test_odd_size_is_rounded_up_with_a_warning(tmp_path):
    """A raw file of 1000 bytes is mapped as QEMU (and blkmap) see it, 1024
    bytes, with the UserWarning checksum() gives, once per part; the parts
    merge to checksum()'s checksum. A size QEMU need not round: no warning."""
    small = tmp_path / "small"
    small.write_bytes(random.Random(3).randbytes(1000))
    parts = [tmp_path / "small.0.part", tmp_path / "small.1.part"]
    want = (f"{small}: 1000 bytes, hashed as 1024 (a raw image's size is rounded up to a "
            "multiple of 512, as QEMU does; standard input is hashed as it is)")
    for k, part in enumerate(parts, 1):
        with pytest.warns(UserWarning) as caught:
            assert blkhash.map_range(small, part, part=(k, 2), block_size=512) == (
                [(0, 512), (512, 512)][k - 1])
        assert [str(w.message) for w in caught] == [want]
    with pytest.warns(UserWarning):
        whole = blkhash.checksum(small, block_size=512)
    assert blkhash.merge(parts, tmp_path / "small.map") == whole
    even = tmp_path / "even"
    even.write_bytes(bytes(1024))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        blkhash.map_range(even, tmp_path / "even.part", block_size=512)


def test_process_pool_on_a_compressed_qcow2(qcow2, tmp_path):
    n = 4
    outs = [tmp_path / f"p{k}" for k in range(1, n + 1)]
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
        ranges = list(pool.map(map_part, [qcow2] * n, outs, range(1, n + 1), [n] * n))
    # The parts tile the image in order.
    assert ranges[0][0] == 0
    assert all(a[0] + a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert blkhash.merge(outs[::-1]) == blkhash.checksum(qcow2)


def test_threads_on_one_nbd_export(images, tmp_path, serve):
    need("qemu-nbd", "qemu-utils")
    raw = images(RECIPE)
    sock = tmp_path / "nbd.sock"
    # One export, four clients at once: --shared=4 (extra connections each
    # client would open are given up when the server has no room).
    serve(["qemu-nbd", "--persistent", "--read-only", "--format=raw", "--shared=4",
           f"--socket={sock}", str(raw)], sock)
    url = f"nbd+unix:///?socket={sock}"
    outs = [tmp_path / f"n{k}" for k in range(1, 5)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda k: blkhash.map_range(url, outs[k - 1], part=(k, 4)), range(1, 5)))
    assert blkhash.merge(outs) == blkhash.checksum(raw)


def test_dask_local_cluster(qcow2, tmp_path):
    distributed = pytest.importorskip("distributed")
    n = 3
    outs = [str(tmp_path / f"d{k}") for k in range(1, n + 1)]
    # dask's temporary directory in tmp_path: its default, the system's,
    # keeps a dask-scratch-space behind (passing the workers a
    # local_directory alone does not prevent it; this does).
    import dask
    with dask.config.set({"temporary-directory": str(tmp_path / "dask")}), \
            distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                     dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        futures = client.map(map_part, [qcow2] * n, outs, range(1, n + 1), [n] * n)
        client.gather(futures)
    out = tmp_path / "disk.map"
    assert blkhash.merge(outs, out) == blkhash.checksum(qcow2)
    assert out.stat().st_size > 0


def test_parts_that_do_not_make_a_map(images, tmp_path):
    raw = images(RECIPE)
    a = tmp_path / "a"
    b = tmp_path / "b"
    blkhash.map_range(raw, a, offset=0, length=1 << 20)
    blkhash.map_range(raw, b, offset=2 << 20)
    with pytest.raises(ValueError, match=r"a gap: bytes 1048576\+1048576 are in no part"):
        blkhash.merge([a, b])
    with pytest.raises(ValueError, match="overlap"):
        blkhash.merge([a, a, b])
    rest = tmp_path / "rest"
    blkhash.map_range(raw, rest, offset=1 << 20)
    damaged = tmp_path / "damaged"
    data = bytearray(rest.read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="damaged block map"):
        blkhash.merge([a, damaged])
    with pytest.raises(FileNotFoundError):
        blkhash.merge([a, tmp_path / "missing"])
    with pytest.raises(ValueError, match="block boundary"):
        blkhash.map_range(raw, tmp_path / "c", offset=100)
    with pytest.raises(ValueError, match="not both"):
        blkhash.map_range(raw, tmp_path / "c", offset=65536, part=(1, 2))
    with pytest.raises(ValueError, match="k from 1 to n"):
        blkhash.map_range(raw, tmp_path / "c", part=(3, 2))
    with pytest.raises(ValueError, match="standard input"):
        blkhash.map_range("-", tmp_path / "c")
    assert not (tmp_path / "c").exists()


def test_outputs_that_would_destroy_data_are_refused(images, tmp_path):
    """map_range() and merge() refuse the outputs blkmap refuses, with its
    words, and leave them as they were."""
    import os
    import stat
    raw = images(RECIPE)
    img = tmp_path / "img"
    img.write_bytes(raw.read_bytes())
    before = img.read_bytes()
    with pytest.raises(FileExistsError, match=r"is the image \(.*img\): a block map would replace it"):
        blkhash.map_range(img, img, part=(1, 2))
    hard = tmp_path / "hard"
    os.link(img, hard)
    with pytest.raises(FileExistsError, match="is the image"):
        blkhash.map_range(img, hard)
    # A device node made here, so that a failure cannot break the machine's.
    dev = tmp_path / "full"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    with pytest.raises(OSError, match="a character device: a block map is written only in place of a regular file"):
        blkhash.map_range(img, dev)
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    with pytest.raises(IsADirectoryError, match="a directory"):
        blkhash.map_range(img, tmp_path)
    link = tmp_path / "link"
    p1, p2 = tmp_path / "p1", tmp_path / "p2"
    blkhash.map_range(img, p1, part=(1, 2))
    blkhash.map_range(img, p2, part=(2, 2))
    os.symlink(p1, link)
    with pytest.raises(OSError, match="a symbolic link"):
        blkhash.map_range(img, link, part=(1, 2))
    with pytest.raises(OSError, match="/proc/self/fd/1: a symbolic link"):
        blkhash.map_range(img, "/proc/self/fd/1")
    assert os.path.islink(link)
    # merge(): not over the image, another file, a device, a link, a part.
    other = tmp_path / "notes.txt"
    other.write_text("keep me\n")
    with pytest.raises(FileExistsError, match="exists and is not a block map: not replaced"):
        blkhash.merge([p1, p2], img)
    with pytest.raises(FileExistsError, match="exists and is not a block map"):
        blkhash.merge([p1, p2], other)
    with pytest.raises(OSError, match="a character device"):
        blkhash.merge([p1, p2], dev)
    with pytest.raises(OSError, match="a symbolic link"):
        blkhash.merge([p1, p2], link)
    with pytest.raises(FileExistsError, match=r"is a part \(.*p1\): a block map would replace it"):
        blkhash.merge([p1, p2], p1)
    assert img.read_bytes() == before
    assert other.read_text() == "keep me\n"
    assert stat.S_ISCHR(os.lstat(dev).st_mode)
    # What may be replaced: a map, an empty file, a missing name.
    m = tmp_path / "m"
    assert blkhash.merge([p1, p2], m) == blkhash.checksum(img)
    assert blkhash.merge([p2, p1], m) == blkhash.checksum(img)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    blkhash.map_range(img, empty, part=(1, 2))
    assert blkhash.merge([empty, p2]) == blkhash.checksum(img)


def huge_zero_part(path):
    """A 105-byte part claiming all of an image of 2**64 - 64 KiB zeros:
    its checksum is 2**48 zero-block digests to hash."""
    import hashlib
    import struct
    size = 2**64 - 65536
    body = (b"\x89BKM\r\n\x1a\n" + struct.pack("<II", 1, 1) + b"sha256".ljust(16, b"\0")
            + struct.pack("<IIQ", 32, 65536, size) + struct.pack("<QQ", 0, size)
            + b"Z" + struct.pack("<Q", size // 65536))
    path.write_bytes(body + hashlib.sha256(body).digest())


def test_ctrl_c_stops_a_merge_of_a_huge_zero_image(tmp_path):
    import signal
    import sys
    part = tmp_path / "huge.part"
    huge_zero_part(part)
    out = tmp_path / "out.map"
    # Ctrl-C raises KeyboardInterrupt in the child whatever it inherits: a
    # test runner started in the background (bash: "&" without job control)
    # passes SIGINT on ignored, and Python then leaves it ignored.
    code = ("import signal, sys, blkhash\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "print('ready', flush=True)\n"
            "try:\n"
            f"    blkhash.merge([{str(part)!r}], {str(out)!r})\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', flush=True)\n"
            "    sys.exit(3)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        # The merge starts right after "ready" and runs for hours: the pause
        # makes it all but sure that the signal comes during the merge (one
        # that came before it would pass too, so the pause costs no flake).
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 3
        assert proc.stdout.read() == "interrupted\n"
    finally:
        proc.kill()
        proc.wait()
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["huge.part"]
