"""What every benchmark case uses: sizes and their spelling, the report,
running a command with its wall time and its own peak RSS, and the test
images (made once in the work directory, checked before reuse)."""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
# cargo's target directory: CARGO_TARGET_DIR if set, as cargo itself does.
RELEASE = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target").resolve() / "release"
MKIMAGE = RELEASE / "mkimage"
KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
CHUNK = MiB

CASES = ["speed", "random", "readpath", "holes", "zero", "empty", "ranges", "qcow2", "compressed",
         "decompress", "pbs", "direct",
         "nbd", "remote", "http", "virtnbdbackup",
         "sync", "sync_nbd", "lib", "python"]
# Run only when named (--only): dirty needs about 24 GiB of disk at its
# default size; mapsize hashes 10.5 GiB over NBD and writes 1.3 GiB of maps;
# imageio needs the venv of ovirt-imageio (blksum/tests/imageio.rs makes it).
ALL_CASES = CASES + ["dirty", "mapsize", "imageio"]


def parse_size(s):
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)(i?b)?\s*", s, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"invalid size '{s}'")
    shift = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2).lower()]
    return int(m.group(1)) << shift


def human(n):
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def short(n):
    """A size for file names and command lines: 64m, 2g, 1t."""
    for suffix, size in (("t", TiB), ("g", GiB), ("m", MiB), ("k", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def nproc():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


# ---------------------------------------------------------------- report


class Report:
    """Lines printed as they come, and kept for --out."""

    def __init__(self):
        self.lines = []
        self.targets = []  # (section, status, text)
        self.problems = []  # failures and mismatches

    def __call__(self, line=""):
        self.lines.append(line)
        print(line, flush=True)

    def table(self, header, rows, align=None):
        """align: one character per column, 'l' or 'r' (default: first left)."""
        align = align or "l" + "r" * (len(header) - 1)
        def cells(row):
            # A command line's pipe would split its cell.
            return "| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |"

        self(cells(header))
        self("|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|")
        for r in rows:
            self(cells(r))
        self()

    def code(self, text):
        self("```")
        for line in text.rstrip("\n").splitlines():
            self(line)
        self("```")
        self()

    def problem(self, text):
        self.problems.append(text)
        self(f"**!!! {text}**")
        self()

    def write(self, path):
        Path(path).write_text("\n".join(self.lines) + "\n")


def log(msg):
    """Progress on stderr, not part of the report."""
    print(f"# {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- running


@dataclass
class Sample:
    seconds: float
    rss_kib: int
    rc: int
    out: str
    err: str
    # User + system CPU seconds of the command and the children it waited
    # for (wait4's rusage); 0 when lost.
    cpu: float = 0.0


# GNU time reports the command's own peak RSS: its wait4 sees a child that
# was a fork of the small `time` process before the exec. Our own wait4
# would count the forked Python interpreter (about 21 MiB) for every
# command, since the peak before exec stays in ru_maxrss.
GNU_TIME = "/usr/bin/time"


def _autogroup_nice():
    """BLKHASH_BENCH_AUTOGROUP_NICE: the nice value of the scheduler's
    autogroup each command runs in (a new session: its own group). On a
    machine shared with other sessions, autogroups share the CPU evenly
    whatever a command's threads, so a command of 2 threads gets as much as
    one of 1; a negative value (root) lets the measured commands have the
    cores. None when unset."""
    v = os.environ.get("BLKHASH_BENCH_AUTOGROUP_NICE")
    if not v:
        return None

    def set_nice():
        with open("/proc/self/autogroup", "w") as f:
            f.write(v)
    return set_nice


def run_once(argv, timeout):
    """Run argv with no input; wall time, peak RSS of the command itself
    (GNU time's %M, else wait4's, which includes the forked interpreter)
    and output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile(mode="r") as rss_file:
        timed = os.access(GNU_TIME, os.X_OK)
        if timed:
            argv = [GNU_TIME, "-q", "-f", "%M", "-o", rss_file.name, *argv]
        t0 = time.perf_counter()
        try:
            # Its own process group: a timeout kills GNU time and the command.
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                 start_new_session=True, preexec_fn=_autogroup_nice())
        except OSError as e:
            return Sample(0.0, 0, 127, "", str(e))
        killed = []

        def kill():
            killed.append(True)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
            t1 = time.perf_counter()
            rc = os.waitstatus_to_exitcode(status)
            rss, cpu = ru.ru_maxrss, ru.ru_utime + ru.ru_stime
        except ChildProcessError:  # reaped by the timer's poll: lost rusage
            t1 = time.perf_counter()
            rc, rss, cpu = p.wait(), 0, 0.0
        finally:
            timer.cancel()
        if timed:
            # "Command exited with non-zero status N" may precede the figure.
            lines = rss_file.read().split()
            rss = int(lines[-1]) if lines and lines[-1].isdigit() else 0
        p.returncode = rc
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
        if killed:
            stderr += f"\nkilled after {timeout} s"
            rc = rc or -9
        return Sample(t1 - t0, rss, rc, stdout, stderr, cpu)


@dataclass
class Cmd:
    name: str
    argv: list
    ours: bool = False
    # Commands with the same key must print the same checksum.
    key: Optional[tuple] = None
    samples: list = field(default_factory=list)
    # Run before each sample, untimed, with the run index: resets what the
    # command changes (a copy's target, a state).
    prep: Optional[object] = None
    # The argv of run i, when runs differ (blksync alternating sources).
    argv_for: Optional[object] = None
    # Runs at most (a peer that takes minutes where ours take seconds: its
    # first rounds alternate with ours, then ours go on alone).
    max_runs: Optional[int] = None

    @property
    def failed(self):
        return not self.samples or any(s.rc != 0 for s in self.samples)

    @property
    def error(self):
        for s in self.samples:
            if s.rc != 0:
                last = [l for l in s.err.strip().splitlines() if l.strip()]
                why = last[-1] if last else ""
                return f"exit {s.rc}: {why}"[:200]
        return "not run"

    @property
    def median(self):
        return None if self.failed else statistics.median(s.seconds for s in self.samples)

    @property
    def cpu(self):
        """Median CPU seconds (user + system) of its runs."""
        return None if self.failed else statistics.median(s.cpu for s in self.samples)

    @property
    def best(self):
        return None if self.failed else min(s.seconds for s in self.samples)

    @property
    def rss_mib(self):
        return max((s.rss_kib for s in self.samples), default=0) / 1024

    @property
    def checksums(self):
        return {s.out.split()[0] if s.out.split() else "" for s in self.samples if s.rc == 0}


@dataclass
class ImageCase:
    """One case of the table: its images, its commands (run alternately),
    the ratios it reports and the targets it checks."""

    title: str  # "{size}" is replaced by the image size
    image: str  # the kind of raw image (make_image)
    commands: dict  # key -> function(bench, images) -> Cmd or None
    ratios: list = field(default_factory=list)  # (key of numerator, key of denominator)
    targets: list = field(default_factory=list)  # (num, den, "≥" or "≤", ratio, text)
    size: int = 2 * GiB
    quick_size: int = 64 * MiB
    qcow2: bool = False  # also its qcow2 conversion, as images["qcow2"]
    warm: bool = True  # read the images into the page cache first
    # ...and again before every run, untimed: on machine D (a Firecracker
    # VM) a run after an idle pause or a slower command took 25 to 55%
    # longer, so the command after the reference's always lost.
    warm_each: bool = False
    before: Optional[str] = None  # a Bench method run first
    after: Optional[str] = None  # a Bench method given (section, commands, size)
    # A context manager factory, function(bench, images), entered once the
    # images exist and left once the commands ran: a server they talk to
    # (imageio's daemon). What it yields (a dict) joins the images.
    around: Optional[object] = None



def median_cell(cmd):
    """A command's median time for a summary table, or a dash."""
    return f"{cmd.median:.3f}" if cmd and not cmd.failed else "—"


def cpu_cell(cmd):
    """A command's median CPU seconds for a summary table, or a dash."""
    return f"{cmd.cpu:.2f}" if cmd and not cmd.failed else "—"


def ratio_cell(num, den):
    """t(num)/t(den) for a summary table, or a dash."""
    ok = num and den and not num.failed and not den.failed
    return f"{num.median / den.median:.2f}x" if ok else "—"


def run_case(cmds, runs, timeout):
    for r in range(runs):
        for c in cmds:
            if c.max_runs is not None and r >= c.max_runs:
                continue
            log(f"run {r + 1}/{runs}: {c.name}")
            if c.prep:
                c.prep(r)
            c.samples.append(run_once(c.argv_for(r) if c.argv_for else c.argv, timeout))


def serve(argv, sock):
    """Start a server on the unix socket `sock`; returns once a connection
    succeeds (the socket file exists before the server listens)."""
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.socket(socket.AF_UNIX) as c:
                c.connect(str(sock))
            return p
        except OSError:
            time.sleep(0.05)
    p.terminate()
    p.wait()
    raise RuntimeError(f"{argv[0]} did not start on {sock}")


def warm(path, quiet=False):
    """Read a file once so that it is in the page cache."""
    if not quiet:
        log(f"warming the page cache: {path}")
    buf = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


# ---------------------------------------------------------------- images


def allocated(st):
    return st.st_blocks * 512


def image_ok(kind, path, size):
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    if st.st_size != size:
        return False
    a = allocated(st)
    if kind in ("random", "zero", "text"):
        return a >= size
    if kind == "holes":
        return 0.4 * size <= a <= 0.7 * size
    if kind == "empty":
        return a == 0
    return False


def make_image(kind, path, size, report):
    """The image, made if missing or not as expected; None if it cannot be."""
    if image_ok(kind, path, size):
        log(f"reusing {path}")
        return path
    need = {"random": size, "zero": size, "text": size, "holes": size // 2, "empty": 0}[kind]
    free = shutil.disk_usage(path.parent).free
    if need + GiB // 4 > free:
        report.problem(f"FAILED: not enough space in {path.parent} for {path.name} "
                       f"({human(need)} needed, {free / GiB:.1f} GiB free)")
        return None
    log(f"making {path} ({kind}, {human(size)})")
    tmp = path.with_name(path.name + ".tmp")
    if kind == "text":
        # Compressible text lines: our mkimage's recipe `SIZE:t`.
        return make_with([str(MKIMAGE), f"{short(size)}:t", str(tmp)], tmp, path, report)
    try:
        with open(tmp, "wb") as f:
            if kind == "random":
                for _ in range(size // CHUNK):
                    f.write(os.urandom(CHUNK))
                f.write(os.urandom(size % CHUNK))
            elif kind == "zero":
                zeros = bytes(CHUNK)
                for _ in range(size // CHUNK):
                    f.write(zeros)
                f.write(bytes(size % CHUNK))
            elif kind == "holes":
                # 1 MiB of data, 1 MiB hole, repeated.
                for off in range(0, size, 2 * CHUNK):
                    f.seek(off)
                    f.write(os.urandom(min(CHUNK, size - off)))
            f.truncate(size)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except OSError as e:
        report.problem(f"FAILED: cannot make {path}: {e}")
        try:
            tmp.unlink()
        except OSError:
            pass
        return None
    return path


def make_with(argv, tmp, path, report, timeout=3600):
    """Run argv, which writes tmp; fsync it and rename it to path."""
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    log(" ".join(argv))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, timeout=timeout)
        err, rc = p.stderr, p.returncode
    except OSError as e:
        err, rc = str(e), 127
    except subprocess.TimeoutExpired:
        err, rc = f"killed after {timeout} s", -9
    if rc == 0:
        try:
            # Written back now, not while the commands are timed.
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, path)
            log(f"made {path} in {time.perf_counter() - t0:.1f} s")
            return path
        except OSError as e:
            err, rc = str(e), 1
    last = [l for l in err.strip().splitlines() if l.strip()]
    report.problem(f"FAILED: cannot make {path}: `{' '.join(argv)}`: exit {rc}: "
                   f"{last[-1] if last else ''}"[:300])
    try:
        tmp.unlink()
    except OSError:
        pass
    return None


def qemu_img_info(path):
    """`qemu-img info` of a file as a dict, or None."""
    try:
        p = subprocess.run(["qemu-img", "info", "--output=json", "-U", str(path)],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        return json.loads(p.stdout) if p.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def qcow2_ok(path, src, size, compression):
    """A qcow2 image converted from src, newer than src, as expected."""
    try:
        st, sst = os.stat(path), os.stat(src)
    except FileNotFoundError:
        return False
    if st.st_mtime_ns < sst.st_mtime_ns:
        return False
    info = qemu_img_info(path)
    if not info or info.get("format") != "qcow2" or info.get("virtual-size") != size \
            or info.get("cluster-size") != 64 * KiB:
        return False
    data = info.get("format-specific", {}).get("data", {})
    if compression:
        # Text compresses to a small fraction; an uncompressed copy would not.
        return data.get("compression-type", "zlib") == compression and allocated(st) < size // 2
    # Half of the clusters allocated, like the raw image.
    return 0.4 * size <= allocated(st) <= 0.7 * size


def make_qcow2(src, path, size, compression, report):
    """qemu-img convert src (raw) to path (qcow2, 64 KiB clusters), compressed with
    compression ("zlib", "zstd") or not (None); reused when present and newer than src."""
    if qcow2_ok(path, src, size, compression):
        log(f"reusing {path}")
        return path
    need = size // 4 if compression else size // 2
    free = shutil.disk_usage(path.parent).free
    if need + GiB // 4 > free:
        report.problem(f"FAILED: not enough space in {path.parent} for {path.name} "
                       f"({human(need)} needed, {free / GiB:.1f} GiB free)")
        return None
    argv = ["qemu-img", "convert", "-f", "raw", "-O", "qcow2"]
    if compression:
        argv.append("-c")
        if compression != "zlib":  # the default
            argv += ["-o", f"compression_type={compression}"]
    tmp = path.with_name(path.name + ".tmp")
    log(f"making {path} ({compression or 'uncompressed'} qcow2 of {src.name}); "
        f"this can take a minute")
    if not make_with(argv + [str(src), str(tmp)], tmp, path, report):
        return None
    if not qcow2_ok(path, src, size, compression):
        report.problem(f"FAILED: {path} is not as expected after `{' '.join(argv)}` "
                       f"(qemu-img info: {qemu_img_info(path)})"[:500])
        return None
    return path


# ---------------------------------------------------------------- the cases
