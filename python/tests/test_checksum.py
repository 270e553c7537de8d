"""blkhash.checksum(): images by path, qcow2, NBD URLs, other formats
through qemu-nbd, errors, and Ctrl-C."""

import errno
import shutil
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

import blkhash
from conftest import model, need, recipe_bytes

RECIPE = "1m:r 1m:- 1m:0 1m:t 100000:r"


@pytest.fixture
def raw(images):
    return images(RECIPE)


def padded(recipe):
    """The bytes of the image by path: its size rounded up to 512, as QEMU."""
    data = recipe_bytes(recipe)
    return data + bytes(-len(data) % 512)


def test_path_kinds(raw):
    want = model(padded(RECIPE))
    assert blkhash.checksum(str(raw)) == want
    assert blkhash.checksum(raw) == want  # os.PathLike
    assert blkhash.checksum(raw, cache=True, threads=1, read_size=4096, queue_depth=1) == want
    assert blkhash.checksum(raw, format="raw") == want
    assert blkhash.checksum(raw, digest="sha1", block_size=4096) == model(padded(RECIPE), "sha1", 4096)


def test_odd_size_is_rounded_up_with_a_warning(tmp_path):
    """A raw file of 1000 bytes is hashed as QEMU (and blksum) see it, 1024
    bytes, and a UserWarning says so, naming both sizes; new(data) hashes
    the exact bytes."""
    data = recipe_bytes("1000:r")
    small = tmp_path / "small"
    small.write_bytes(data)
    with pytest.warns(UserWarning) as caught:
        got = blkhash.checksum(small)
    assert got == model(data + bytes(24))
    assert got != blkhash.new("sha256", data).hexdigest()
    assert [str(w.message) for w in caught] == [
        f"{small}: 1000 bytes, hashed as 1024 (a raw image's size is rounded up to a "
        "multiple of 512, as QEMU does; standard input is hashed as it is)"]
    # A size QEMU need not round: no warning (an error here if there were one).
    even = tmp_path / "even"
    even.write_bytes(data[:512])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert blkhash.checksum(even) == model(data[:512])


def test_same_as_blksum(raw):
    """The same checksum as the blksum command, when it is built."""
    root = Path(__file__).resolve().parents[2]
    candidates = [Path(os.environ.get("CARGO_TARGET_DIR", root / "target")) / p / "blksum"
                  for p in ("release", "debug")]
    blksum = next((c for c in candidates if c.exists()), None)
    if blksum is None:
        pytest.skip("blksum not built")
    out = subprocess.run([blksum, "--digest", "blake3", raw], check=True,
                         capture_output=True, text=True).stdout
    assert out.split()[0] == blkhash.checksum(raw, digest="blake3")


def test_qcow2_and_its_raw_agree(raw, tmp_path):
    need("qemu-img", "qemu-utils")
    qcow2 = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow2], check=True)
    assert blkhash.checksum(qcow2) == blkhash.checksum(raw)
    assert blkhash.checksum(qcow2, format="qcow2", no_backing=True) == blkhash.checksum(raw)


def test_other_format_through_qemu_nbd(raw, tmp_path, monkeypatch):
    need("qemu-img", "qemu-utils")
    need("qemu-nbd", "qemu-utils")
    vmdk = tmp_path / "disk.vmdk"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "vmdk", raw, vmdk], check=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    assert blkhash.checksum(vmdk) == blkhash.checksum(raw)
    assert blkhash.checksum(vmdk, format="vmdk") == blkhash.checksum(raw)
    # The private qemu-nbd's directory is gone.
    assert list(scratch.iterdir()) == []


def test_nbd_url(raw, tmp_path, serve):
    need("qemu-nbd", "qemu-utils")
    sock = tmp_path / "nbd.sock"
    serve(["qemu-nbd", "--persistent", "--read-only", "--format=raw", "--shared=4",
           f"--socket={sock}", str(raw)], sock)
    url = f"nbd+unix:///?socket={sock}"
    assert blkhash.checksum(url) == model(padded(RECIPE))
    assert blkhash.checksum(url, digest="md5", block_size=512, timeout=30) == \
        model(padded(RECIPE), "md5", 512)
    with pytest.raises(ValueError, match="only format='raw'"):
        blkhash.checksum(url, format="qcow2")


def test_nbd_url_of_qcow2(raw, tmp_path, serve):
    """qemu-nbd serving a qcow2 image: its guest content, as the raw image."""
    need("qemu-nbd", "qemu-utils")
    qcow2 = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow2], check=True)
    sock = tmp_path / "nbd.sock"
    serve(["qemu-nbd", "--persistent", "--read-only", "--format=qcow2",
           f"--socket={sock}", str(qcow2)], sock)
    assert blkhash.checksum(f"nbd+unix:///?socket={sock}") == blkhash.checksum(raw)


def test_image_in_use_needs_force_share(raw, tmp_path, serve):
    """An image a writable qemu-nbd holds (as a running VM would) is "in
    use", as for qemu-img; force_share=True reads it anyway (qemu-img -U)."""
    need("qemu-nbd", "qemu-utils")
    qcow2 = tmp_path / "busy.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow2], check=True)
    sock = tmp_path / "rw.sock"
    serve(["qemu-nbd", "--persistent", "--format=qcow2", f"--socket={sock}", str(qcow2)], sock)
    with pytest.raises(OSError, match="in use"):
        blkhash.checksum(qcow2)
    assert blkhash.checksum(qcow2, force_share=True) == blkhash.checksum(raw)


def test_missing_file(tmp_path):
    missing = tmp_path / "missing.img"
    with pytest.raises(FileNotFoundError) as e:
        blkhash.checksum(missing)
    assert e.value.errno == errno.ENOENT
    assert e.value.strerror == "No such file or directory"
    assert e.value.filename == str(missing)


SEEDS = Path(__file__).resolve().parents[2] / "fuzz" / "seeds" / "vnbd"


def test_a_gap_in_a_chain_names_the_missing_file(tmp_path):
    """An incremental virtnbdbackup stream without its full one, a qcow2
    image without its backing file: FileNotFoundError (ENOENT) whose
    filename is the missing file, not the image asked for."""
    inc = tmp_path / "sda.inc.virtnbdbackup.1.data"
    shutil.copy(SEEDS / "seed-inc", inc)
    with pytest.raises(FileNotFoundError) as e:
        blkhash.checksum(inc)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(tmp_path / "sda.full.data")
    assert "a gap in the chain" in e.value.strerror
    top = tmp_path / "top.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", "base.qcow2",
                    "-F", "qcow2", top, "1M"], check=True)
    with pytest.raises(FileNotFoundError) as e:
        blkhash.checksum(top)
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(tmp_path / "base.qcow2")
    assert "backing file" in e.value.strerror


def test_nbd_connect_errors_have_the_systems_errno(tmp_path):
    """A server that is not there: the errno connect() gave (under the
    library's "cannot connect to ..."), so Python picks the subclass."""
    url = f"nbd+unix:///?socket={tmp_path}/none.sock"
    with pytest.raises(FileNotFoundError) as e:
        blkhash.checksum(url)
    assert e.value.errno == errno.ENOENT
    assert e.value.strerror.startswith("cannot connect to"), e.value.strerror
    assert e.value.filename == url
    # A TCP port nothing listens on (bound, then closed: free again).
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionRefusedError) as e:
        blkhash.checksum(f"nbd://127.0.0.1:{port}/")
    assert e.value.errno == errno.ECONNREFUSED


def test_corrupt_qcow2(raw, tmp_path):
    need("qemu-img", "qemu-utils")
    qcow2 = tmp_path / "bad.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow2], check=True)
    with open(qcow2, "r+b") as f:
        # The L1 table offset (header bytes 40..48) far past the end.
        f.seek(40)
        f.write((1 << 50).to_bytes(8, "big"))
    with pytest.raises(OSError) as e:
        blkhash.checksum(qcow2)
    # blksum's line without "blksum: ": the name, then the reason.
    assert str(e.value).startswith(f"{qcow2}: ")
    assert "L1" in str(e.value)
    assert "None" not in str(e.value)


def test_not_qcow2(raw):
    with pytest.raises(OSError) as e:
        blkhash.checksum(raw, format="qcow2")
    assert str(e.value).startswith(f"{raw}: ")
    assert "qcow2" in str(e.value).split(": ", 1)[1]


def test_no_server(tmp_path):
    with pytest.raises(OSError) as e:
        blkhash.checksum(f"nbd+unix:///?socket={tmp_path / 'none.sock'}")
    assert "none.sock" in str(e.value)
    assert "None" not in str(e.value)


@pytest.mark.parametrize("kwargs, match", [
    ({"digest": "sha257"}, "unknown digest 'sha257'"),
    ({"block_size": 1000}, "block size must be a multiple of 512"),
    ({"format": "floppy"}, "unknown format 'floppy'"),
    ({"threads": 0}, "threads must be 1 to 128"),
    ({"read_size": 1000}, "read size"),
    ({"queue_depth": 0}, "queue depth"),
    ({"timeout": -1.0}, "timeout"),
])
def test_bad_arguments(raw, kwargs, match):
    with pytest.raises(ValueError, match=match):
        blkhash.checksum(raw, **kwargs)


def qemu_nbd_children(pid):
    """qemu-nbd processes whose parent is `pid`."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if comm == "qemu-nbd" and ppid == pid:
            found.append(int(d.name))
    return found


SLOW_SCRIPT = textwrap.dedent("""
    import signal, sys, blkhash
    # Python leaves SIGINT ignored when it starts ignored (a test run
    # started in the background by a non-interactive shell): a user's
    # Ctrl-C is what is tested, so take it as an interactive Python does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        # The test waits for this line (then for a sign of the run) rather
        # than sleeping: a signal before the handler above would kill Python.
        print("started", flush=True)
        # One thread, 512-byte blocks, a slow digest, small reads one at a
        # time: seconds per image on any machine.
        print(blkhash.checksum(sys.argv[1], digest="sha3-512", block_size=512,
                               threads=1, read_size=4096, queue_depth=1), flush=True)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
        sys.exit(130)
""")


def wait_until(what, probe, timeout=60.0):
    """Poll `probe()` until it returns something true: that value. The
    timeout catches a hang, not a slow machine."""
    deadline = time.monotonic() + timeout
    while not (found := probe()):
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.01)
    return found


def start_slow(image, env=None):
    """SLOW_SCRIPT on `image`, once it says it started the checksum."""
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SCRIPT, str(image)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line == "started\n", (line, proc.stderr.read() if not line else "")
    return proc


def logged_read(log):
    """A probe: nbdkit's log filter logged a read request (the client is
    waiting for its reply)."""
    return lambda: log.exists() and " Read id=" in log.read_text()


def run_and_interrupt(image, tmp_path, under_way):
    """Interrupt SLOW_SCRIPT on `image` once `under_way(pid)` returns
    something true (that value is returned, with the scratch TMPDIR)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch))
    proc = start_slow(image, env)
    seen = wait_until("sign of the run", lambda: under_way(proc.pid))
    assert proc.poll() is None, "finished before the interrupt: image too small"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 130, (out, err)
    assert out.strip() == "KeyboardInterrupt"
    assert took < 5, f"took {took:.1f} s to stop"
    return scratch, seen


def test_ctrl_c_stops_and_cleans_up(tmp_path):
    """A checksum through a private qemu-nbd, interrupted: KeyboardInterrupt
    promptly, and neither qemu-nbd nor its directory left behind."""
    need("qemu-img", "qemu-utils")
    need("qemu-nbd", "qemu-utils")
    big = tmp_path / "big.img"
    with open(big, "wb") as f:
        block = b"\x5a" * (1 << 20)
        for _ in range(128):
            f.write(block)
    vmdk = tmp_path / "big.vmdk"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "vmdk", big, vmdk], check=True)
    big.unlink()
    # Interrupted once its qemu-nbd runs.
    scratch, children = run_and_interrupt(vmdk, tmp_path, qemu_nbd_children)
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or \
            "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3], \
            f"qemu-nbd {pid} left running"
    assert list(scratch.iterdir()) == []


def test_ctrl_c_slow_nbd_server(tmp_path, serve):
    """An NBD server that answers slowly (nbdkit's delay filter)."""
    need("nbdkit", "nbdkit")
    sock = tmp_path / "slow.sock"
    log = tmp_path / "nbdkit.log"
    serve(["nbdkit", "--foreground", "--unix", str(sock), "--filter=log", "--filter=delay",
           "--filter=noextents", "pattern", "size=1G", "rdelay=200ms", f"logfile={log}"],
          sock)
    # Interrupted while a read waits for its reply.
    run_and_interrupt(f"nbd+unix:///?socket={sock}", tmp_path, lambda _: logged_read(log)())


def test_gil_released_while_hashing(tmp_path, serve):
    """Other Python threads run while checksum() waits on a slow server."""
    need("nbdkit", "nbdkit")
    sock = tmp_path / "slow.sock"
    serve(["nbdkit", "--foreground", "--unix", str(sock), "--filter=delay",
           "--filter=noextents", "pattern", "size=16M", "rdelay=100ms"], sock)
    url = f"nbd+unix:///?socket={sock}"
    result = []
    # 128 reads of 128 KiB, each 100 ms, at most 16 in flight (an NBD
    # URL's default): at least 0.8 s, whatever the number of cores.
    t = threading.Thread(
        target=lambda: result.append(blkhash.checksum(url, read_size=1 << 17, threads=1)))
    start = last = time.monotonic()
    t.start()
    gap = 0.0
    while t.is_alive():
        now = time.monotonic()
        gap, last = max(gap, now - last), now
    took = time.monotonic() - start
    t.join()
    # Held for the whole call, the GIL would stall this loop as long.
    assert took > 0.5 and gap < took / 2, (gap, took)
    # nbdkit's pattern: each 8-byte word is its own offset, big-endian.
    data = b"".join(i.to_bytes(8, "big") for i in range(0, 16 << 20, 8))
    assert result == [model(data)]


def test_second_ctrl_c_returns_at_once(tmp_path, serve):
    """A server that does not answer: the first Ctrl-C waits for the run to
    stop, a second one raises at once (as blksum's second Ctrl-C exits)."""
    need("nbdkit", "nbdkit")
    sock = tmp_path / "stuck.sock"
    log = tmp_path / "nbdkit.log"
    serve(["nbdkit", "--foreground", "--unix", str(sock), "--filter=log", "--filter=delay",
           "pattern", "size=1G", "rdelay=60", f"logfile={log}"], sock)
    proc = start_slow(f"nbd+unix:///?socket={sock}")
    # The first Ctrl-C once a read is stuck (its reply 60 s away).
    wait_until("read request", logged_read(log))
    proc.send_signal(signal.SIGINT)
    # Still waiting for the run to stop a second later (a slower machine
    # only makes that more so).
    time.sleep(1.0)
    assert proc.poll() is None, "returned before the stuck read ended"
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert time.monotonic() - sent < 5
    assert proc.returncode == 130, (out, err)
    assert out.strip() == "KeyboardInterrupt"


def test_chain_of_standalone_backups(tmp_path):
    """chain=True: standalone qcow2 files named oldest first between
    commas, each over the one before, are the disk QEMU reads once they
    are chained with qemu-img rebase -u (as blksum --chain); a missing
    file raises OSError naming it."""
    need("qemu-img", "qemu-utils")
    need("qemu-io", "qemu-utils")
    names = []
    for i, (size, cmd) in enumerate([("4M", "write -P 1 0 2M"), ("6M", "write -P 2 1M 64k")]):
        p = tmp_path / f"b{i}.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", p, size], check=True)
        subprocess.run(["qemu-io", "-f", "qcow2", "-c", cmd, p], check=True, capture_output=True)
        names.append(p)
    r0, r1 = tmp_path / "r0.qcow2", tmp_path / "r1.qcow2"
    r0.write_bytes(names[0].read_bytes())
    r1.write_bytes(names[1].read_bytes())
    subprocess.run(["qemu-img", "rebase", "-u", "-F", "qcow2", "-b", r0, r1], check=True)
    chain = ",".join(str(p) for p in names)
    assert blkhash.checksum(chain, chain=True) == blkhash.checksum(r1)
    with pytest.raises(OSError, match="gone.qcow2"):
        blkhash.checksum(f"{names[0]},{tmp_path / 'gone.qcow2'}", chain=True)


def test_size_hashes_the_first_bytes(raw, tmp_path):
    """size=N: the image's first N bytes, as an image of that size (a block
    device larger than the image written to it)."""
    grown = tmp_path / "grown.raw"
    data = padded(RECIPE)
    grown.write_bytes(data + b"\xee" * 65536)
    assert blkhash.checksum(grown, size=len(data)) == blkhash.checksum(raw)
    assert blkhash.checksum(grown) != blkhash.checksum(raw)
    with pytest.raises(OSError, match="more than the image"):
        blkhash.checksum(raw, size=len(data) + 1)


def test_compressed_images_are_the_image_they_hold(images, tmp_path):
    """A file compressed by the gzip, xz and zstd CLIs is the image it
    holds: a raw image hashed as it streams (no warning), a qcow2 image
    decompressed into a temporary file (a UserWarning says so); format="raw"
    hashes the compressed bytes; a truncated file raises OSError naming it."""
    for tool, package in [("gzip", "gzip"), ("xz", "xz-utils"), ("zstd", "zstd")]:
        need(tool, package)
    need("qemu-img", "qemu-utils")
    raw = images("1m:r 1m:- 1m:0 1m:t 512:r")
    want = blkhash.checksum(raw)

    def compress(tool, src, out):
        with open(out, "wb") as f:
            subprocess.run([tool, "-c", src], stdout=f, check=True)
        return out

    for tool, ext in [("gzip", "gz"), ("xz", "xz"), ("zstd", "zst")]:
        packed = compress(tool, raw, tmp_path / f"disk.raw.{ext}")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert blkhash.checksum(packed) == want, tool
        assert blkhash.checksum(packed, format="raw") != want, tool
    qcow2 = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, qcow2], check=True)
    packed = compress("zstd", qcow2, tmp_path / "disk.qcow2.zst")
    with pytest.warns(UserWarning, match="decompressed into an unnamed temporary file"):
        assert blkhash.checksum(packed) == want
    gz = tmp_path / "disk.raw.gz"
    cut = tmp_path / "cut.raw.gz"
    cut.write_bytes(gz.read_bytes()[: gz.stat().st_size // 2])
    with pytest.raises(OSError, match="cut.raw.gz"):
        blkhash.checksum(cut)
