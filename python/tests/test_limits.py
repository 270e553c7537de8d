"""The limits of the system and of the construction: worker threads the
system will not start (OSError), a length past 2**64 - 1 bytes
(OverflowError), and zeros that take long (Ctrl-C stops them)."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import blkhash


def thread_limited(uid, nproc, argv):
    """argv as user uid (no such user need exist), allowed nproc tasks,
    threads included (RLIMIT_NPROC): root ignores the limit, and a user
    that runs nothing else starts counting at this process alone."""
    if os.geteuid() != 0:
        pytest.skip("not root: cannot run as a user of its own under a thread limit")
    for prog in ("setpriv", "prlimit"):
        if shutil.which(prog) is None:
            pytest.fail(f"{prog} (util-linux) is needed: scripts/setup.sh installs it")
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            "prlimit", f"--nproc={nproc}", *argv]


def open_to_all(path):
    """True if another user may run or read path: it, and every directory
    above it, lets others in."""
    p = os.path.realpath(path)
    while True:
        if not os.stat(p).st_mode & 0o001 and not (os.path.isfile(p) and os.stat(p).st_mode & 0o004):
            return False
        if p == "/":
            return True
        p = os.path.dirname(p)


def open_tempdir():
    """A temporary directory another user can reach: in the temporary
    directory when every directory above it lets others through, else in
    /tmp (a private TMPDIR, mode 0700 as mktemp -d makes it, keeps other
    users out of all it holds)."""
    tmp = tempfile.gettempdir()
    return tempfile.TemporaryDirectory(dir=tmp if open_to_all(tmp) else "/tmp")


def other_user_python():
    """An interpreter another user can run, and the environment under
    which it imports this blkhash package: this interpreter if it is open
    to all, else the system's (the extension is abi3: any Python from 3.9
    runs it; a pyenv Python under a private home is not open to all)."""
    pkg = os.path.dirname(os.path.dirname(os.path.realpath(blkhash.__file__)))
    if not open_to_all(pkg):
        pytest.fail(f"{pkg} is not readable by other users (scripts/test-python.sh opens its venv)")
    for python in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(python) and open_to_all(python):
            return python, dict(os.environ, PYTHONPATH=pkg)
    pytest.fail("no Python that other users may run (install python3)")


LIMITED_SCRIPT = textwrap.dedent("""
    import sys, blkhash
    image = sys.argv[1]
    for name, make in [
        ("Hasher", lambda: blkhash.Hasher("sha256", threads=4)),
        ("new", lambda: blkhash.new("blake3", threads=2)),
        ("checksum", lambda: blkhash.checksum(image, threads=2)),
    ]:
        try:
            make()
            print(name, "made")
        except OSError as e:
            print(name, type(e).__name__, e.errno, e)
""")


def test_threads_that_cannot_start_raise_oserror():
    """With no thread allowed, a hasher and a checksum raise OSError
    (BlockingIOError: errno EAGAIN) naming the reason, not a
    PanicException, and nothing is printed on standard error."""
    # Another user reads the image and the package: a directory of our own
    # open to all, and the venv's (scripts/test-python.sh opens it).
    with open_tempdir() as d:
        os.chmod(d, 0o755)
        image = os.path.join(d, "a.img")
        with open(image, "wb") as f:
            f.write(b"\x01" * (1 << 20))
        os.chmod(image, 0o644)
        python, env = other_user_python()
        argv = thread_limited(64_301, 1, [python, "-c", LIMITED_SCRIPT, image])
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert p.stderr == ""
    lines = p.stdout.splitlines()
    assert len(lines) == 3, p.stdout
    for line in lines[:2]:
        assert line.endswith(
            "BlockingIOError 11 [Errno 11] cannot start a digest thread: "
            "Resource temporarily unavailable"), line
    assert lines[2].startswith("checksum "), lines[2]
    assert "OSError" in lines[2] or "BlockingIOError" in lines[2], lines[2]
    assert "cannot start" in lines[2] and "Resource temporarily unavailable" in lines[2], lines[2]


def test_length_past_two_to_the_64():
    """A checksum records the length as 64 bits: one byte past 2**64 - 1
    raises OverflowError before anything is added, and the hasher goes on
    as if the call had not been made. The null digest and 64 MiB blocks
    make 2**64 bytes of zeros quick."""
    def new():
        return blkhash.new("null", block_size=64 << 20, threads=1)

    h = new()
    h.update(b"x")
    with pytest.raises(OverflowError):
        h.zero(2**64 - 1)
    with pytest.raises(OverflowError):
        h.zero(2**64)
    h.zero(2**64 - 3)
    with pytest.raises(OverflowError):
        h.update(b"yz")
    with pytest.raises(OverflowError):
        h.update(bytearray(2 << 20))
    h.update(b"y")
    assert h.hexdigest() == ""

    # Nothing was added by the calls that raised: the same as without them.
    a, b = blkhash.new("sha256", block_size=512), blkhash.new("sha256", block_size=512)
    a.update(b"abc")
    with pytest.raises(OverflowError):
        a.zero(2**64 - 3)
    a.zero(1 << 20)
    b.update(b"abc")
    b.zero(1 << 20)
    assert a.hexdigest() == b.hexdigest()


ZERO_SCRIPT = textwrap.dedent("""
    import signal, sys, blkhash
    # Take Ctrl-C as an interactive Python does, even if started with
    # SIGINT ignored (a test run in the background).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # 2**62 bytes of 512-byte blocks: 2**53 zero-block digests to feed the
    # outer sha512, days of work.
    h = blkhash.new("sha512", block_size=512, threads=1)
    print("ready", flush=True)
    try:
        h.zero(2**62)
        print("finished", flush=True)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    # Part of the zeros went in: the hasher must not give a checksum now.
    try:
        h.hexdigest()
        print("digest given", flush=True)
    except (ValueError, RuntimeError) as e:
        print("no digest:", e, flush=True)
""")


def cpu_seconds(pid):
    """User and system CPU time of pid, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_ctrl_c_stops_zero():
    """Hasher.zero(2**62) takes days: Ctrl-C stops it promptly with
    KeyboardInterrupt, and the hasher then refuses to give a digest (it
    holds only part of the zeros)."""
    proc = subprocess.Popen([sys.executable, "-c", ZERO_SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        # Inside zero() for sure: after "ready" it is the only work, and
        # it has used a good part of a second of CPU.
        start = cpu_seconds(proc.pid)
        deadline = time.monotonic() + 60
        while cpu_seconds(proc.pid) - start < 0.3:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "zero() never ran"
            time.sleep(0.02)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    took = time.monotonic() - sent
    assert out.splitlines()[0] == "KeyboardInterrupt", (out, err)
    assert out.splitlines()[1].startswith("no digest:"), (out, err)
    assert took < 30, f"took {took:.1f} s to stop"
