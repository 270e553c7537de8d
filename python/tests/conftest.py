"""Shared helpers: the vectors, their images built from the recipes, a
pure-Python model of the construction, and real servers (qemu-nbd)."""

import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VECTORS = json.loads((ROOT / "testkit" / "data" / "vectors.json").read_text())["vectors"]

# blkhash (OpenSSL) names -> hashlib constructors, for the model. blake3 is
# not in hashlib: the blake3 package when installed (scripts/test-python.sh
# installs it), else the model skips it (the vectors still check it).
HASHLIB = {
    "md5": lambda: hashlib.new("md5"),
    "sha1": lambda: hashlib.new("sha1"),
    "sha224": lambda: hashlib.new("sha224"),
    "sha256": lambda: hashlib.new("sha256"),
    "sha384": lambda: hashlib.new("sha384"),
    "sha512": lambda: hashlib.new("sha512"),
    "sha512-224": lambda: hashlib.new("sha512_224"),
    "sha512-256": lambda: hashlib.new("sha512_256"),
    "sha3-224": lambda: hashlib.new("sha3_224"),
    "sha3-256": lambda: hashlib.new("sha3_256"),
    "sha3-384": lambda: hashlib.new("sha3_384"),
    "sha3-512": lambda: hashlib.new("sha3_512"),
    "blake2b512": lambda: hashlib.new("blake2b"),
    "blake2b-256": lambda: hashlib.blake2b(digest_size=32),
    "blake2s256": lambda: hashlib.new("blake2s"),
    "sm3": lambda: hashlib.new("sm3"),
    "ripemd160": lambda: hashlib.new("ripemd160"),
    "md5-sha1": lambda: hashlib.new("md5-sha1"),
    "shake128": lambda: hashlib.new("shake_128"),
    "shake256": lambda: hashlib.new("shake_256"),
}
try:
    import blake3

    HASHLIB["blake3"] = blake3.blake3
except ImportError:
    pass
# Output sizes of the extendable-output functions, as OpenSSL's defaults.
XOF_SIZE = {"shake128": 16, "shake256": 32}


def model_available(name):
    try:
        HASHLIB[name]()
        return True
    except (KeyError, ValueError):
        return False


def _final(name, h):
    return h.digest(XOF_SIZE[name]) if name in XOF_SIZE else h.digest()


def model(data, name="sha256", block_size=65536):
    """The blkhash checksum by its definition:
    H(H(block 0) || ... || H(block n-1) || le64(len)), block by block."""
    outer = HASHLIB[name]()
    view = memoryview(data)
    for i in range(0, len(view), block_size):
        inner = HASHLIB[name]()
        inner.update(view[i:i + block_size])
        outer.update(_final(name, inner))
    outer.update(len(view).to_bytes(8, "little"))
    return _final(name, outer).hex()


# The recipe grammar (testkit/src/lib.rs): "SIZE:KIND ...", KIND "-" a hole,
# "0" zeros, "r" pseudo-random, "t" text lines, any other character that byte.

def parse_size(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if s[-1].lower() in mult:
        return int(s[:-1]) * mult[s[-1].lower()]
    return int(s)


def parse_recipe(recipe):
    """[(offset, length, kind)]."""
    out, offset = [], 0
    for word in recipe.split():
        size, kind = word.split(":")
        n = parse_size(size)
        out.append((offset, n, kind))
        offset += n
    return out


def _stream(offset, length, unit, piece):
    first, last = offset // unit, (offset + length + unit - 1) // unit
    data = b"".join(piece(i) for i in range(first, last))
    skip = offset - first * unit
    return data[skip:skip + length]


def segment_bytes(offset, length, kind):
    if kind in ("-", "0"):
        return bytes(length)
    if kind == "r":
        return _stream(offset, length, 32, lambda i: hashlib.sha256(
            b"blkhash-vector" + i.to_bytes(8, "little")).digest())
    if kind == "t":
        return _stream(offset, length, 64, lambda k: (
            f"{k:016x} the quick brown fox jumps over the lazy dog.".encode()
            .ljust(63) + b"\n"))
    return kind.encode() * length


_BYTES = {}


def recipe_bytes(recipe):
    if recipe not in _BYTES:
        _BYTES[recipe] = b"".join(segment_bytes(*s) for s in parse_recipe(recipe))
    return _BYTES[recipe]


def write_image(recipe, path):
    """The raw image, holes left unwritten (sparse)."""
    segments = parse_recipe(recipe)
    with open(path, "wb") as f:
        for offset, length, kind in segments:
            if kind == "-":
                continue
            f.seek(offset)
            f.write(segment_bytes(offset, length, kind))
        f.truncate(sum(n for _, n, _ in segments))


@pytest.fixture(scope="session")
def images(tmp_path_factory):
    """recipe -> path of its raw image, made once per session."""
    root = tmp_path_factory.mktemp("images")
    made = {}

    def get(recipe):
        if recipe not in made:
            path = root / f"image-{len(made)}.img"
            write_image(recipe, path)
            made[recipe] = path
        return made[recipe]

    return get


def pytest_configure(config):
    # Many images here have sizes that are not multiples of 512 on purpose
    # (the rounding is tested): checksum()'s UserWarning about it would fill
    # the summary. test_checksum.py checks the warning itself (pytest.warns
    # sees warnings whatever the filters).
    config.addinivalue_line(
        "filterwarnings", "ignore:.* bytes, hashed as .*rounded up:UserWarning")


# Debian package names -> Fedora's, where they differ.
FEDORA_PACKAGE = {"qemu-utils": "qemu-img"}


def need(program, package):
    """Skip unless `program` is installed; `package`: its Debian package."""
    if shutil.which(program) is None:
        fedora = FEDORA_PACKAGE.get(package, package)
        pytest.skip(f"{program} not installed ({package} on Debian, {fedora} on Fedora; "
                    "scripts/setup.sh installs it)")


def wait_for_socket(path, proc, timeout=60.0):
    # Ready once the server greets a client: qemu-nbd listens before it
    # opens the image and takes its locks, and the kernel accepts
    # connections meanwhile, so a connection alone proves nothing. The
    # timeout catches a server that never starts; a loaded machine
    # starting one slowly must not fail the test.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        if os.path.exists(path) and greets(path):
            return
        time.sleep(0.05)
    raise RuntimeError(f"server did not start on {path}")


def greets(path):
    """Whether the NBD server on the unix socket `path` sends its newstyle
    greeting; the probe then leaves as the protocol asks (NBD_OPT_ABORT),
    so that the server logs no error and frees its slot."""
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2.0)
            s.connect(str(path))
            greeting = b""
            while len(greeting) < 18:
                chunk = s.recv(18 - len(greeting))
                if not chunk:
                    return False
                greeting += chunk
            if greeting[:16] != b"NBDMAGICIHAVEOPT":
                return False
            # Fixed newstyle client flag, then NBD_OPT_ABORT with no data.
            s.sendall(struct.pack(">I8sII", 1, b"IHAVEOPT", 2, 0))
            try:
                s.recv(20)
            except OSError:
                pass
            return True
    except OSError:
        return False


@pytest.fixture
def serve(tmp_path):
    """serve(argv, socket) starts a server listening on a unix socket and
    stops it at the end of the test."""
    procs = []

    def start(argv, sock):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        procs.append(proc)
        wait_for_socket(sock, proc)
        return proc

    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=10)
