"""blkhash.new(): the hashlib-like object, against the model."""

import array
import hashlib
import mmap
import os
import random
import sys
import threading

import pytest

import blkhash
from conftest import model, model_available

BS = 65536


def sample(seed, size):
    """Data with runs of zeros, of one byte, and random bytes: every path
    of the hasher (zero blocks found, partial blocks, whole blocks)."""
    rnd = random.Random(seed)
    parts, n = [], 0
    while n < size:
        k = min(size - n, rnd.choice([1, 511, 4096, BS, 3 * BS + 7, 1 << 20]))
        kind = rnd.randrange(3)
        if kind == 0:
            parts.append(bytes(k))
        elif kind == 1:
            parts.append(bytes([rnd.randrange(1, 256)]) * k)
        else:
            parts.append(rnd.randbytes(k))
        n += k
    return b"".join(parts)


def test_attributes():
    h = blkhash.new("SHA512", block_size=4096, threads=3)
    assert h.name == "sha512"
    assert h.digest_size == 64
    assert h.block_size == 4096
    assert h.threads == 3
    assert isinstance(h, blkhash.Hasher)
    assert "sha512" in repr(h)
    assert len(h.digest()) == 64
    d = blkhash.Hasher("blake3")
    assert d.name == "blake3" and d.block_size == 65536 and d.threads >= 1


def test_algorithms_available():
    names = blkhash.algorithms_available
    assert isinstance(names, frozenset)
    assert {"sha256", "blake3", "md5", "sha3-256", "null"} <= names
    assert blkhash.algorithms_guaranteed == names
    # blkhash 0.11's contract: hashlib takes every listed name (but blake3
    # and null) for the same digest.
    for name in names - {"blake3", "null"}:
        ours = blkhash.new(name, block_size=512)
        theirs = hashlib.new(name)
        if theirs.digest_size:  # SHAKE's is the caller's
            assert ours.digest_size == theirs.digest_size, name
    assert "blake2b-256" not in names
    # Other spellings are taken: hashlib's, OpenSSL's, blake2b-256.
    for other, ours in [("blake2b-256", "blake2b-256"), ("shake_128", "shake128"),
                        ("sha3_256", "sha3-256"), ("SHA2-256", "sha256")]:
        assert blkhash.new(other).name == ours
    for name in names:
        h = blkhash.new(name)
        assert h.name == name
        h.update(b"x" * 100_000)
        assert len(h.digest()) == h.digest_size
        assert len(h.hexdigest()) == 2 * h.digest_size


@pytest.mark.parametrize("name", sorted(blkhash.algorithms_available - {"null"}))
def test_every_digest_against_model(name):
    if not model_available(name):
        pytest.skip(f"hashlib has no {name}")
    data = sample(1, 700_000)
    for bs in (512, 4096, BS):
        h = blkhash.new(name, block_size=bs)
        h.update(data)
        assert h.hexdigest() == model(data, name, bs), bs


def test_data_argument_and_empty():
    assert blkhash.new("sha256", b"abc").hexdigest() == model(b"abc")
    assert blkhash.new().hexdigest() == model(b"")
    h = blkhash.new()
    h.update(b"")
    h.zero(0)
    assert h.hexdigest() == model(b"")


@pytest.mark.parametrize("seed", range(6))
def test_split_anyhow(seed):
    """The checksum depends on the bytes only, however they are split into
    updates (small copied ones, large ones read in place) and zeros."""
    rnd = random.Random(seed)
    data = sample(seed, 5_000_000)
    bs = rnd.choice([512, 4096, BS, 1 << 20])
    h = blkhash.new(block_size=bs, threads=rnd.randrange(1, 5))
    pos = 0
    while pos < len(data):
        n = min(len(data) - pos, rnd.choice([1, 100, 4095, BS - 1, BS, 70_000, 1 << 20, 3 << 20]))
        chunk = data[pos:pos + n]
        if chunk.count(0) == n and rnd.random() < 0.5:
            h.zero(n)
        else:
            h.update(chunk)
        pos += n
    assert h.hexdigest() == model(data, "sha256", bs)


def test_zero_is_zeros():
    h = blkhash.new(block_size=4096)
    h.update(b"a" * 1000)
    h.zero(3 * 4096 + 17)
    h.update(b"b" * 5000)
    data = b"a" * 1000 + bytes(3 * 4096 + 17) + b"b" * 5000
    assert h.hexdigest() == model(data, "sha256", 4096)


def test_zero_terabyte_is_cheap():
    h = blkhash.new()
    h.zero(1 << 40)
    assert len(h.hexdigest()) == 64


def test_buffers_of_every_kind(tmp_path):
    data = sample(7, 3 * (1 << 20) + 12345)
    want = model(data)

    path = tmp_path / "data"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        h = blkhash.new()
        h.update(m)
        assert h.hexdigest() == want

    ints = array.array("I")
    ints.frombytes(data[: len(data) // 4 * 4])
    tail = data[len(data) // 4 * 4:]
    h = blkhash.new()
    h.update(ints)  # items of 4 bytes: hashed as their bytes, as hashlib does
    h.update(tail)
    assert h.hexdigest() == want

    for make in (bytes, bytearray, memoryview, lambda d: memoryview(bytearray(d))):
        h = blkhash.new()
        h.update(make(data))
        assert h.hexdigest() == want, make

    # Slices of a memoryview are read in place, at any offset.
    view = memoryview(data)
    h = blkhash.new()
    for i in range(0, len(data), 1_000_003):
        h.update(view[i:i + 1_000_003])
    assert h.hexdigest() == want


def test_buffer_reused_after_update():
    """The caller may refill its buffer as soon as update() returns."""
    chunks = [sample(s, 1 << 20) for s in range(8)]
    buf = bytearray(1 << 20)
    h = blkhash.new()
    for c in chunks:
        buf[:] = c
        h.update(buf)
    assert h.hexdigest() == model(b"".join(chunks))


def test_bad_buffers():
    h = blkhash.new()
    with pytest.raises(TypeError):
        h.update("text")
    with pytest.raises(TypeError):
        h.update(12)
    with pytest.raises(BufferError):
        h.update(memoryview(b"abcdef")[::2])
    h.update(b"ok")
    assert h.hexdigest() == model(b"ok")


def test_bytearray_cannot_shrink_while_hashed():
    """The buffer stays exported while the workers read it in place: with
    the GIL released, another thread's resize is refused, not a crash."""
    buf = bytearray(b"\x01") * (256 << 20)
    h = blkhash.new("sha3-512", threads=1)
    started = threading.Event()

    def work():
        started.set()
        h.update(buf)  # slow: one thread, a slow digest

    # With a switch interval longer than the test, the worker keeps the
    # GIL from started.set() until update releases it, the buffer exported:
    # this thread resumes only then, however the threads are scheduled.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        t = threading.Thread(target=work)
        t.start()
        started.wait()
    finally:
        sys.setswitchinterval(interval)
    with pytest.raises(BufferError):
        buf.clear()
    assert t.is_alive(), "the update finished too soon to tell"
    t.join()
    assert len(buf) == 256 << 20


def test_digest_twice_and_update_after():
    h = blkhash.new()
    h.update(b"data")
    d = h.digest()
    assert h.digest() == d
    assert h.hexdigest() == d.hex()
    with pytest.raises(ValueError, match="already finished"):
        h.update(b"more")
    with pytest.raises(ValueError, match="already finished"):
        h.zero(10)
    assert h.digest() == d


def test_copy_says_why():
    with pytest.raises(NotImplementedError, match="worker threads"):
        blkhash.new().copy()


@pytest.mark.parametrize("kwargs, match", [
    ({"name": "sha257"}, "unknown digest 'sha257'"),
    ({"block_size": 1000}, "block size must be a multiple of 512"),
    ({"block_size": 0}, "block size"),
    ({"block_size": -512}, "block size"),
    ({"block_size": 128 << 20}, "block size"),
    ({"threads": 0}, "threads must be 1 to 128"),
    ({"threads": 129}, "threads must be 1 to 128"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        blkhash.new(**kwargs)


def test_threads_each_its_own_hasher():
    inputs = [sample(100 + i, 4 << 20) for i in range(6)]
    want = [model(d) for d in inputs]
    got = [None] * len(inputs)

    def work(i):
        h = blkhash.new(threads=2)
        view = memoryview(inputs[i])
        for j in range(0, len(view), 1 << 20):
            h.update(view[j:j + (1 << 20)])
        got[i] = h.hexdigest()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


def test_threads_share_one_hasher():
    """Calls on a shared hasher are serialized: with identical whole-block
    chunks, any order gives the same checksum."""
    chunk = sample(5, 2 * BS)
    h = blkhash.new()
    barrier = threading.Barrier(4)

    def work():
        barrier.wait()
        for _ in range(50):
            h.update(chunk)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.hexdigest() == model(chunk * 200)


def test_many_hashers_alive():
    hashers = [blkhash.new(threads=1) for _ in range(50)]
    for i, h in enumerate(hashers):
        h.update(bytes([i + 1]) * 1000)
    for i, h in enumerate(hashers):
        assert h.hexdigest() == model(bytes([i + 1]) * 1000)


def test_model_self_check():
    """The model hashes blocks and length as docs/guide/libraries.md says."""
    if not model_available("sha256"):
        pytest.skip("no sha256")
    import hashlib
    a, b = os.urandom(512), os.urandom(100)
    outer = hashlib.sha256(hashlib.sha256(a).digest() + hashlib.sha256(b).digest()
                           + (612).to_bytes(8, "little"))
    assert model(a + b, "sha256", 512) == outer.hexdigest()
