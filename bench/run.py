#!/usr/bin/env python3
"""blkhash benchmark driver: blksum against its peers, and the library alone.

Builds the release binaries, makes test images in a work directory (reused
when present), runs the commands of each case alternately (A B C A B C ...),
and prints a Markdown report: median wall time, peak RSS, ratios, and the
targets from our issue with PASS/FAIL.

    python3 bench/run.py                 # everything
    python3 bench/run.py --quick         # small images, one run: smoke test
    python3 bench/run.py --only random,zero --runs 3
    python3 bench/run.py --lib           # library benchmark only
    python3 bench/run.py --only qcow2,compressed
    python3 bench/run.py --only sync --sync-size 256m   # blksync, smaller images
    python3 bench/run.py --only sync --settle 5         # each write from settled memory
    python3 bench/run.py --only sync_nbd --link-rate 1G # blksync to an NBD export over a link
    python3 bench/run.py --only python   # the Python package against blksum and the library

Environment:
    BLKSUM_REF          the reference blksum binary (rows skipped if unset)
    BLKHASH_BENCH_REF   the reference blkhash-bench binary (for --lib)

The qcow2 cases need qemu-img (images are converted from raw ones) and the
mkimage binary of the workspace (target/release/mkimage); the nbd case needs
qemu-nbd (qemu-utils).

Python 3 standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
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

CASES = ["speed", "random", "holes", "zero", "empty", "qcow2", "compressed", "nbd", "sync",
         "sync_nbd", "lib", "python"]
ALL_CASES = CASES


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
        self("| " + " | ".join(header) + " |")
        self("|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|")
        for r in rows:
            self("| " + " | ".join(str(c) for c in r) + " |")
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


# GNU time reports the command's own peak RSS: its wait4 sees a child that
# was a fork of the small `time` process before the exec. Our own wait4
# would count the forked Python interpreter (about 21 MiB) for every
# command, since the peak before exec stays in ru_maxrss.
GNU_TIME = "/usr/bin/time"


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
                                 start_new_session=True)
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
            rss = ru.ru_maxrss
        except ChildProcessError:  # reaped by the timer's poll: lost rusage
            t1 = time.perf_counter()
            rc, rss = p.wait(), 0
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
        return Sample(t1 - t0, rss, rc, stdout, stderr)


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
    def best(self):
        return None if self.failed else min(s.seconds for s in self.samples)

    @property
    def rss_mib(self):
        return max((s.rss_kib for s in self.samples), default=0) / 1024

    @property
    def checksums(self):
        return {s.out.split()[0] if s.out.split() else "" for s in self.samples if s.rc == 0}


def run_case(cmds, runs, timeout):
    for r in range(runs):
        for c in cmds:
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


def warm(path):
    """Read a file once so that it is in the page cache."""
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


class Bench:
    def __init__(self, args, report):
        self.a = args
        self.r = report
        self.cores = nproc()
        self.blksum = str(RELEASE / "blksum")
        self.ref = os.environ.get("BLKSUM_REF") or None
        self.bench_ref = os.environ.get("BLKHASH_BENCH_REF") or None
        b3 = shutil.which("b3sum") or str(Path.home() / ".cargo" / "bin" / "b3sum")
        self.b3sum = b3 if os.access(b3, os.X_OK) else None
        self.sha256sum = shutil.which("sha256sum")
        self.dd = shutil.which("dd")
        self.threads = args.threads or self.cores
        self.read_size = args.read_size or MiB
        self.sha256_speed = None  # single thread, bytes/s, at 64k
        self.sha256_many_speed = None  # the same, 16 buffers at once

    # -- commands

    def ours(self, digest, img, cache=True, label=None, threads=None):
        """label: the image in the command's name ("qcow2"); threads: -t, shown in the
        name (default: --threads, not shown)."""
        argv = [self.blksum, "-d", digest]
        if cache:
            argv.append("--cache")
        if self.a.block_size:
            argv += ["--block-size", short(self.a.block_size)]
        if threads or self.a.threads:
            argv += ["-t", str(threads or self.a.threads)]
        if self.a.read_size:
            argv += ["--read-size", short(self.a.read_size)]
        argv.append(str(img))
        mode = "cache" if cache else "direct"
        if threads:
            mode += f", -t {threads}"
        what = f"{digest} {label}" if label else digest
        return Cmd(f"blksum {what} ({mode})", argv, ours=True, key=(digest, self.bs()))

    def reference(self, digest, img, cache=True, label=None):
        if not self.ref:
            return None
        argv = [self.ref, "-d", digest]
        if cache:
            argv.append("-c")
        if self.a.block_size:
            argv += [f"--block-size={short(self.a.block_size)}"]
            if self.a.block_size >= MiB:
                argv += [f"--read-size={short(self.a.block_size)}"]
        if self.a.threads:
            argv += ["-t", str(self.a.threads)]
        argv.append(str(img))
        mode = "-c" if cache else "direct"
        what = f"{digest} {label}" if label else digest
        return Cmd(f"ref {what} ({mode})", argv, key=(digest, self.bs()))

    def bs(self):
        return self.a.block_size or 64 * KiB

    def peer(self, which, img):
        if which == "sha256sum":
            return Cmd("sha256sum", [self.sha256sum, str(img)]) if self.sha256sum else None
        if which == "b3sum":
            return Cmd("b3sum", [self.b3sum, str(img)]) if self.b3sum else None
        if which == "dd":
            return Cmd("dd bs=1M", [self.dd, f"if={img}", "of=/dev/null", "bs=1M"]) if self.dd else None
        raise ValueError(which)

    # -- helpers

    def steps(self, *argvs):
        """Run build steps in order; False (reported) at the first failure."""
        for argv in argvs:
            log(" ".join(argv))
            p = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
            if p.returncode != 0:
                self.r.problem(f"FAILED: {' '.join(argv)} (exit {p.returncode})")
                self.r.code(p.stderr[-4000:])
                return False
        return True

    def build(self):
        if self.a.no_build:
            return True
        return self.steps(["cargo", "build", "--release"],
                          ["cargo", "build", "--release", "-p", "blkhash", "--examples"])

    def image(self, kind, size):
        d = Path(self.a.dir)
        d.mkdir(parents=True, exist_ok=True)
        if kind == "text" and not MKIMAGE.exists():
            self.r.problem(f"FAILED: {MKIMAGE} missing (cargo build --release)")
            return None
        return make_image(kind, d / f"{kind}-{short(size)}.img", size, self.r)

    def qcow2_image(self, src, size, compression=None):
        """A qcow2 copy of the raw image src: src's name with .qcow2 (uncompressed) or
        .zlib.qcow2, .zstd.qcow2."""
        if not shutil.which("qemu-img"):
            self.r.problem("FAILED: qemu-img not found: the qcow2 images cannot be made")
            return None
        ext = f".{compression}.qcow2" if compression else ".qcow2"
        return make_qcow2(src, src.with_suffix(ext), size, compression, self.r)

    def header(self):
        r = self.r
        cpu = "unknown"
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        mem = "unknown"
        try:
            for line in open("/proc/meminfo"):
                if line.startswith("MemTotal:"):
                    mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                    break
        except OSError:
            pass
        commit = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip() or "unknown"
        r("# blkhash benchmark")
        r()
        r(f"- Date: {datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M:%S %z')}")
        r(f"- Host: nproc {self.cores}, CPU {cpu}, memory {mem}, "
          f"kernel {platform.release()}")
        r(f"- Commit: {commit}")
        r(f"- blksum: {self.blksum} (threads {self.threads}, read size {human(self.read_size)}, "
          f"block size {human(self.bs())})")
        r(f"- Reference blksum: {self.ref or 'not set (BLKSUM_REF): rows skipped'}")
        if self.a.lib:
            r(f"- Reference blkhash-bench: "
              f"{self.bench_ref or 'not set (BLKHASH_BENCH_REF): column skipped'}")
        r(f"- b3sum: {self.b3sum or 'missing: `cargo install b3sum`; rows skipped'}")
        if {"qcow2", "compressed"} & set(self.a.cases):
            qi = shutil.which("qemu-img")
            ver = ""
            if qi:
                out = subprocess.run([qi, "--version"], capture_output=True, text=True).stdout
                ver = f" ({out.splitlines()[0]})" if out.strip() else ""
            r(f"- qemu-img: {qi or 'missing: qcow2 cases fail'}{ver}")
        mode = "quick (smoke test, numbers meaningless)" if self.a.quick else "full"
        r(f"- Mode: {mode}; {self.a.runs} run(s) per command, alternating; median shown; "
          f"images in {self.a.dir}; page cache warmed; `--cache`/`-c` unless marked direct")
        r()
        if not self.b3sum:
            print("b3sum not found: install it with `cargo install b3sum`", file=sys.stderr)

    def target(self, section, text, ok):
        status = "SKIP" if ok is None else "PASS" if ok else "FAIL"
        if not any(t[0] == section for t in self.r.targets):
            self.r("Targets:")
            self.r()
        self.r(f"- [{status}] {text}")
        self.r.targets.append((section, status, text))

    def missing(self, key):
        """Why a command of a case is missing."""
        if key.startswith("ref"):
            return "BLKSUM_REF not set"
        return {"b3sum": "b3sum missing (`cargo install b3sum`)",
                "sha256sum": "sha256sum missing", "dd": "dd missing"}.get(key, "not run")

    def ratio_target(self, section, c, num_key, den_key, op, want, what):
        """A target on t(num)/t(den), commands c[num_key] and c[den_key]."""
        num, den = c[num_key], c[den_key]
        if num is None or den is None:
            why = self.missing(num_key if num is None else den_key)
            self.target(section, f"{what} (target {op} {want}x): skipped, {why}", None)
            return
        label = f"{num.name}/{den.name}"
        if num.failed or den.failed:
            self.target(section, f"{what}: {label} (target {op} {want}x): "
                        f"a command failed", False)
            return
        v = num.median / den.median
        ok = v >= want if op == "≥" else v <= want
        self.target(section, f"{what}: {label} = {v:.2f}x (target {op} {want}x)", ok)

    def results(self, section, cmds, size):
        """The table of a case, its checksum checks and its command lines."""
        r = self.r
        rows = []
        for c in cmds:
            if c.failed:
                rows.append([c.name, "FAILED", "", "", f"{c.rss_mib:.1f}", c.error])
                r.problems.append(f"FAILED: {section}: {c.name}: {c.error}")
                continue
            sums = sorted(x for x in c.checksums if x)
            if not sums:
                cs = ""
            elif len(sums) == 1:
                cs = sums[0][:16] + "…"
            else:
                cs = "VARIES: " + " ".join(x[:8] for x in sums)
            gbs = size / c.median / 1e9
            rows.append([c.name, f"{c.median:.3f}", f"{c.best:.3f}",
                         f"{gbs:,.2f}", f"{c.rss_mib:.1f}", cs])
        r.table(["command", "median s", "min s", "GB/s", "peak RSS MiB", "checksum"], rows,
                "lrrrrl")
        for c in cmds:
            if c.key and not c.failed and len(c.checksums) > 1:
                r.problem(f"MISMATCH: {section}: {c.name} printed different checksums "
                          f"across runs: {' '.join(sorted(c.checksums))}")
        keys = {}
        for c in cmds:
            if c.key and not c.failed:
                keys.setdefault(c.key, []).append(c)
        for key, group in keys.items():
            sums = {s for c in group for s in c.checksums}
            names = ", ".join(c.name for c in group)
            if len(sums) > 1:
                detail = "; ".join(f"{c.name}: {' '.join(sorted(c.checksums))}" for c in group)
                r.problem(f"MISMATCH: {section}: {key[0]} block size {human(key[1])}: {detail}")
            elif len(group) > 1:
                r(f"Checksums agree ({names}): {next(iter(sums))}")
                r()
        # Alternating commands: their first run's argv.
        r("Commands: " + "; ".join(
            f"{c.name}: `{' '.join(c.argv_for(0) if c.argv_for else c.argv)}`" for c in cmds))
        r()

    def memory_target(self, section, cmds):
        limit = 64 * MiB + self.threads * self.read_size
        ours = [c for c in cmds if c.ours and c.samples]
        if ours:
            worst = max(ours, key=lambda c: c.rss_mib)
            self.target(section, f"peak RSS of blksum = {worst.rss_mib:.1f} MiB ({worst.name}) "
                        f"(target ≤ 64 MiB + {self.threads} threads × {human(self.read_size)} = "
                        f"{limit / MiB:.0f} MiB)", worst.rss_mib * MiB <= limit)

    def ratios(self, pairs):
        """Informative time ratios: 'num/den = 3.1x'."""
        out = []
        for num, den in pairs:
            if num and den and not num.failed and not den.failed:
                out.append(f"{num.name}/{den.name} = {num.median / den.median:.2f}x")
        if out:
            self.r("Time ratios:")
            self.r()
            for line in out:
                self.r(f"- {line}")
            self.r()

    # -- digest speed

    def digest_speed(self, seconds, digests=(), sizes=()):
        """The digest_speed example's output and its table in bytes/s."""
        exe = RELEASE / "examples" / "digest_speed"
        argv = [str(exe), str(seconds)]
        for d in digests:
            argv += ["--digest", d]
        for size in sizes:
            argv += ["--size", size]
        p = run_once(argv, self.a.timeout)
        if p.rc != 0:
            self.r.problem(f"FAILED: {' '.join(argv)}: exit {p.rc}: {p.err.strip()[-200:]}")
            return None, {}
        table = {}
        lines = p.out.strip().splitlines()
        cols = lines[0].split()[1:] if lines else []
        for line in lines[1:]:
            parts = line.split()
            table[parts[0]] = {c: float(v) * 1e6 for c, v in zip(cols, parts[1:])}
        return p.out, table

    def case_speed(self):
        r = self.r
        r("## Digest speed (single thread, MB/s, `digest_speed` example)")
        r()
        secs = 0.02 if self.a.quick else 0.2
        out, _ = self.digest_speed(secs)
        if out:
            r.code(out)
        self.measure_sha256()

    def measure_sha256(self):
        if self.sha256_speed:
            return
        # The best of a few measurements: a busy machine only makes it slower.
        secs, tries = (0.2, 2) if self.a.quick else (1.0, 3)
        speeds, many = [], []
        for _ in range(tries):
            _, table = self.digest_speed(secs, ["sha256"], ["64k"])
            speed = table.get("sha256", {}).get("64k")
            if speed:
                speeds.append(speed)
            speed = table.get("sha256-many", {}).get("64k")
            if speed:
                many.append(speed)
        if speeds:
            speed = self.sha256_speed = max(speeds)
            self.r(f"Single-thread SHA-256 at 64k (best of {len(speeds)} × {secs} s: "
                   f"{', '.join(f'{x / 1e6:.0f}' for x in speeds)}): {speed / 1e6:.0f} MB/s; "
                   f"× {self.cores} cores = {self.cores * speed / 1e6:.0f} MB/s")
            self.r()
        if many:
            # What one core reaches hashing 16 blocks at once (the kernel
            # the workers use): the stricter limit, reported beside the
            # issue's single-stream one.
            speed = self.sha256_many_speed = max(many)
            self.r(f"Single-thread multi-buffer SHA-256 (16 × 64k at once, best of {len(many)}): "
                   f"{speed / 1e6:.0f} MB/s; × {self.cores} cores = {self.cores * speed / 1e6:.0f} MB/s")
            self.r()

    # -- image cases

    def case_random(self):
        size = 64 * MiB if self.a.quick else 2 * GiB
        self.r(f"## Random data ({human(size)})")
        self.r()
        self.measure_sha256()
        img = self.image("random", size)
        if not img:
            return
        warm(img)
        c = {
            "ours": self.ours("sha256", img),
            "ref": self.reference("sha256", img),
            "sha256sum": self.peer("sha256sum", img),
            "ours3": self.ours("blake3", img),
            "ref3": self.reference("blake3", img),
            "b3sum": self.peer("b3sum", img),
            "dd": self.peer("dd", img),
            "ours_direct": self.ours("sha256", img, cache=False),
            "ref_direct": self.reference("sha256", img, cache=False),
        }
        cmds = [x for x in c.values() if x]
        run_case(cmds, self.a.runs, self.a.timeout)
        s = "random"
        self.results(s, cmds, size)
        self.ratios([(c["sha256sum"], c["ours"]), (c["ref"], c["ours"]), (c["ours"], c["dd"]),
                     (c["b3sum"], c["ours3"]), (c["ref3"], c["ours3"]),
                     (c["ref_direct"], c["ours_direct"]), (c["ours_direct"], c["ours"])])
        self.ratio_target(s, c, "sha256sum", "ours", "≥", 6, "sha256: blksum ≥ 6× faster than sha256sum")
        self.ratio_target(s, c, "ref", "ours", "≥", 1.8, "sha256: blksum ≥ 1.8× the reference")
        ours = c["ours"]
        what = "sha256: blksum ≥ 85% of cores × single-thread SHA-256"
        if not self.sha256_speed:
            self.target(s, f"{what}: no single-thread speed", None)
        elif ours.failed:
            self.target(s, f"{what}: blksum failed", False)
        else:
            limit = size / (self.cores * self.sha256_speed)
            eff = limit / ours.median
            self.target(s, f"{what}: limit {limit:.3f} s / blksum {ours.median:.3f} s = "
                        f"{eff:.0%} (target ≥ 85%)", eff >= 0.85)
            if self.sha256_many_speed:
                limit = size / (self.cores * self.sha256_many_speed)
                self.r(f"- For information, against cores × multi-buffer SHA-256 (the kernel the "
                       f"workers run): limit {limit:.3f} s / blksum {ours.median:.3f} s = "
                       f"{limit / ours.median:.0%}")
        self.ratio_target(s, c, "ours3", "b3sum", "≤", 1.25, "blake3: blksum time ≤ 1.25× b3sum's")
        self.memory_target(s, cmds)
        self.r()

    def case_holes(self):
        size = 64 * MiB if self.a.quick else 2 * GiB
        self.r(f"## Half data, half holes ({human(size)}: 1 MiB data, 1 MiB hole, ...)")
        self.r()
        img = self.image("holes", size)
        if not img:
            return
        warm(img)
        c = {
            "ours": self.ours("sha256", img),
            "ref": self.reference("sha256", img),
            "sha256sum": self.peer("sha256sum", img),
        }
        cmds = [x for x in c.values() if x]
        run_case(cmds, self.a.runs, self.a.timeout)
        self.results("holes", cmds, size)
        self.ratios([(c["ref"], c["ours"]), (c["sha256sum"], c["ours"])])
        self.memory_target("holes", cmds)
        self.r()

    def case_zero(self):
        size = 64 * MiB if self.a.quick else 2 * GiB
        self.r(f"## Written zeros ({human(size)})")
        self.r()
        img = self.image("zero", size)
        if not img:
            return
        warm(img)
        c = {
            "ours": self.ours("sha256", img),
            "ref": self.reference("sha256", img),
            "dd": self.peer("dd", img),
        }
        cmds = [x for x in c.values() if x]
        run_case(cmds, self.a.runs, self.a.timeout)
        s = "zero"
        self.results(s, cmds, size)
        self.ratios([(c["ref"], c["ours"]), (c["ours"], c["dd"])])
        self.ratio_target(s, c, "ref", "ours", "≥", 4, "sha256: blksum ≥ 4× the reference")
        self.ratio_target(s, c, "ours", "dd", "≤", 2, "sha256: blksum time ≤ 2× dd's")
        self.memory_target(s, cmds)
        self.r()

    def case_empty(self):
        size = 16 * GiB if self.a.quick else TiB
        self.r(f"## Empty sparse image ({human(size)}; sha256sum and b3sum skipped)")
        self.r()
        img = self.image("empty", size)
        if not img:
            return
        c = {
            "ours": self.ours("sha256", img),
            "ref": self.reference("sha256", img),
            "ours3": self.ours("blake3", img),
            "ref3": self.reference("blake3", img),
        }
        cmds = [x for x in c.values() if x]
        run_case(cmds, self.a.runs, self.a.timeout)
        s = "empty"
        self.results(s, cmds, size)
        self.ratios([(c["ref"], c["ours"]), (c["ref3"], c["ours3"])])
        self.ratio_target(s, c, "ref", "ours", "≥", 1.5, "sha256: blksum ≥ 1.5× the reference")
        self.ratio_target(s, c, "ref3", "ours3", "≥", 5, "blake3: blksum ≥ 5× the reference")
        self.memory_target(s, cmds)
        self.r()

    # -- qcow2 cases

    def case_qcow2(self):
        size = 64 * MiB if self.a.quick else 2 * GiB
        self.r(f"## qcow2, half allocated ({human(size)}: the half data, half holes image "
               f"converted with `qemu-img convert -O qcow2`, 64 KiB clusters)")
        self.r()
        raw = self.image("holes", size)
        if not raw:
            return
        img = self.qcow2_image(raw, size)
        if not img:
            return
        warm(raw)
        warm(img)
        c = {
            "ours_raw": self.ours("sha256", raw, label="raw"),
            "ours": self.ours("sha256", img, label="qcow2"),
            "ref": self.reference("sha256", img, label="qcow2"),
        }
        cmds = [x for x in c.values() if x]
        run_case(cmds, self.a.runs, self.a.timeout)
        s = "qcow2"
        self.results(s, cmds, size)
        self.ratios([(c["ref"], c["ours"]), (c["ours"], c["ours_raw"])])
        self.ratio_target(s, c, "ref", "ours", "≥", 2,
                          "sha256: blksum ≥ 2× the reference on the qcow2 image")
        self.ratio_target(s, c, "ours", "ours_raw", "≤", 1.2,
                          "sha256: blksum time on the qcow2 image ≤ 1.2× on the raw image")
        self.memory_target(s, cmds)
        self.r()

    def case_compressed(self):
        size = 64 * MiB if self.a.quick else 2 * GiB
        self.r(f"## Compressed qcow2 ({human(size)} of text lines, mkimage `{short(size)}:t`, "
               f"converted with `qemu-img convert -c -O qcow2`, zlib and zstd)")
        self.r()
        raw = self.image("text", size)
        if not raw:
            return
        imgs = {}
        for comp in ("zlib", "zstd"):
            imgs[comp] = self.qcow2_image(raw, size, comp)
        if not all(imgs.values()):
            return
        for path in [raw, *imgs.values()]:
            warm(path)
        c = {"ours_raw": self.ours("sha256", raw, label="raw")}
        # Decompression scaling: -t 1 against -t 2 (reads and decompression run on the
        # digest workers). The command with the default thread count is reused for the
        # one with the same count.
        scaling = (1, 2)
        for comp, img in imgs.items():
            main_t = self.threads if self.threads in scaling else None
            c[f"ours_{comp}"] = self.ours("sha256", img, label=comp, threads=main_t)
            c[f"ref_{comp}"] = self.reference("sha256", img, label=comp)
            for t in scaling:
                c[f"{comp}_t{t}"] = (c[f"ours_{comp}"] if t == main_t else
                                     self.ours("sha256", img, label=comp, threads=t))
        cmds = []
        for x in c.values():
            if x and x not in cmds:
                cmds.append(x)
        run_case(cmds, self.a.runs, self.a.timeout)
        s = "compressed"
        self.results(s, cmds, size)
        pairs = []
        for comp in imgs:
            pairs += [(c[f"ref_{comp}"], c[f"ours_{comp}"]), (c[f"ours_{comp}"], c["ours_raw"]),
                      (c[f"{comp}_t1"], c[f"{comp}_t2"])]
        self.ratios(pairs)
        speedups = []
        for comp in imgs:
            t1, t2 = c[f"{comp}_t1"], c[f"{comp}_t2"]
            if t1.failed or t2.failed:
                speedups.append(f"{comp}: a command failed")
            else:
                speedups.append(f"{comp} {t1.median / t2.median:.2f}x "
                                f"({t1.median:.3f} s / {t2.median:.3f} s)")
        self.r("Decompression scaling, speedup t1/t2 (median time with `-t 1` / with `-t 2`; "
               f"2.00x is linear; {self.cores} cores): " + "; ".join(speedups))
        self.r()
        for comp in imgs:
            self.ratio_target(s, c, f"ref_{comp}", f"ours_{comp}", "≥", 1.5,
                              f"sha256: blksum ≥ 1.5× the reference on the {comp} image")
        self.memory_target(s, cmds)
        self.r()

    # -- delta copy (blksync)

    def changed_image(self, a, size, bs):
        """B: A with 1% of its blocks rewritten, spread by a seeded generator."""
        b = Path(self.a.dir) / f"random-{short(size)}.changed.img"
        if not b.exists() or b.stat().st_size != size or b.stat().st_mtime_ns < a.stat().st_mtime_ns:
            log(f"making {b} (1% of the blocks of {a.name} changed)")
            tmp = b.with_name(b.name + ".tmp")
            shutil.copyfile(a, tmp)
            rng = random.Random(6)
            blocks = size // bs
            with open(tmp, "r+b") as f:
                for i in rng.sample(range(blocks), max(1, blocks // 100)):
                    f.seek(i * bs)
                    f.write(os.urandom(bs))
                os.fsync(f.fileno())
            os.rename(tmp, b)
        return b

    def case_sync(self):
        size = self.a.sync_size or (64 * MiB if self.a.quick else 2 * GiB)
        bs = 64 * KiB
        settled = (f"each write started {self.a.settle:g} s after the last file removal and "
                   f"sync" if self.a.settle else "back to back")
        self.r(f"## Delta copy: blksync ({human(size)} of random data, 1% of 64 KiB blocks "
               f"changed, scattered; {settled})")
        self.r()
        qemu_img = shutil.which("qemu-img")
        if not qemu_img:
            self.r.problem("FAILED: qemu-img not found: the sync case compares with it")
            return
        d = Path(self.a.dir)
        d.mkdir(parents=True, exist_ok=True)
        a = self.image("random", size)
        if not a:
            return
        b = self.changed_image(a, size, bs)
        blksync = str(RELEASE / "blksync")
        dst, state = d / "sync-dst.raw", d / "sync-dst.map"
        first, full = d / "sync-first.raw", d / "sync-full.raw"
        # The same kept as a qcow2 image, which blksync writes through a
        # private qemu-nbd; its full copy is a conversion to qcow2.
        dst_q, state_q = d / "sync-dst.qcow2", d / "sync-dst-qcow2.map"
        full_q = d / "sync-full.qcow2"
        for p in (dst, state, Path(f"{state}.dst"), dst_q, state_q):
            p.unlink(missing_ok=True)
        # DSTs and their states: first copies of A (untimed).
        for argv in ([blksync, "--cache", str(a), str(dst), "--state", str(state)],
                     [blksync, "--cache", str(a), str(dst_q), "-O", "qcow2", "--state",
                      str(state_q)]):
            p = run_once(argv, self.a.timeout)
            if p.rc != 0:
                self.r.problem(f"FAILED: sync: first copy to set up DST: {p.err.strip()[-300:]}")
                return
        warm(a)
        warm(b)

        state_first = d / "sync-first.map"
        first_state = (first, state_first, Path(f"{state_first}.dst"))

        def clean(_r):
            # Every write starts from the same state: no copy left by any
            # command before (each is removed, whoever made it) and no dirty
            # pages (their writeback would be charged to whoever runs next).
            # Removing only one's own target let a command inherit the
            # memory another's removal had just freed.
            for path in (full, full_q, *first_state):
                path.unlink(missing_ok=True)
            os.sync()
            time.sleep(self.a.settle)

        # Each update run brings DST from one image to the other: run 1 A->B,
        # run 2 B->A, ...: 1% of the blocks every time, the state saved by the
        # run before.
        update = Cmd("blksync update, state", [], ours=True, prep=clean,
                     argv_for=lambda r: [blksync, "--cache", str(b if r % 2 == 0 else a),
                                         str(dst), "--state", str(state)])
        c = {
            "update": update,
            "blksum": Cmd("blksum SRC", [self.blksum, "--cache", str(b)], ours=True),
            "cp": Cmd("cp --sparse=always", ["cp", "--sparse=always", str(b), str(full)],
                      prep=clean),
            "convert": Cmd("qemu-img convert", [qemu_img, "convert", "-f", "raw", "-O", "raw",
                                                str(b), str(full)], prep=clean),
            # A full copy that is on the device when it ends, as blksync's
            # update is (it flushes DST before saving the state).
            "convert_wb": Cmd("qemu-img convert -t writeback", [
                qemu_img, "convert", "-t", "writeback", "-f", "raw", "-O", "raw", str(b),
                str(full)], prep=clean),
            "update_qcow2": Cmd("blksync update, state, qcow2 DST", [], ours=True, prep=clean,
                                argv_for=lambda r: [blksync, "--cache",
                                                    str(b if r % 2 == 0 else a), str(dst_q),
                                                    "--state", str(state_q)]),
            "convert_qcow2": Cmd("qemu-img convert -O qcow2", [
                qemu_img, "convert", "-f", "raw", "-O", "qcow2", str(b), str(full_q)],
                prep=clean),
            "first": Cmd("blksync first copy", [blksync, "--cache", str(a), str(first)],
                         ours=True, prep=clean),
            "convert_first": Cmd("qemu-img convert (first)", [qemu_img, "convert", "-f", "raw",
                                                              "-O", "raw", str(a), str(first)],
                                 prep=clean),
            # The first run of the delta-copy workflow: a new state, so DST
            # is flushed; against the copy that also flushes.
            "first_state": Cmd("blksync first copy, new state", [
                blksync, "--cache", str(a), str(first), "--state", str(state_first)],
                ours=True, prep=clean),
            "convert_wb_first": Cmd("qemu-img convert -t writeback (first)", [
                qemu_img, "convert", "-t", "writeback", "-f", "raw", "-O", "raw", str(a),
                str(first)], prep=clean),
        }
        cmds = list(c.values())
        run_case(cmds, self.a.runs, self.a.timeout)
        s = "sync"
        self.results(s, cmds, size)
        # The last updates left both DSTs as their source: same checksum.
        last = b if (self.a.runs - 1) % 2 == 0 else a
        want = run_once([self.blksum, "--cache", str(last)], self.a.timeout)
        for path in (dst, dst_q):
            check = run_once([self.blksum, "--cache", str(path)], self.a.timeout)
            if check.rc != 0 or want.rc != 0 or check.out.split()[:1] != want.out.split()[:1]:
                self.r.problem(f"MISMATCH: sync: {path.name} after the updates is not "
                               f"{last.name}")
            else:
                self.r(f"{path.name} after the last update has {last.name}'s checksum: "
                       f"{check.out.split()[0]}")
                self.r()
        self.ratios([(c["cp"], c["update"]), (c["convert"], c["update"]),
                     (c["convert_wb"], c["update"]), (c["update"], c["blksum"]),
                     (c["convert_qcow2"], c["update_qcow2"]), (c["update_qcow2"], c["blksum"]),
                     (c["first"], c["convert_first"]),
                     (c["first_state"], c["convert_wb_first"])])
        self.ratio_target(s, c, "cp", "update", "≥", 10,
                          "update with a state ≥ 10× faster than cp --sparse=always")
        self.ratio_target(s, c, "convert", "update", "≥", 10,
                          "update with a state ≥ 10× faster than qemu-img convert")
        self.ratio_target(s, c, "update", "blksum", "≤", 1.3,
                          "update with a state within 1.3× of blksum hashing SRC")
        self.ratio_target(s, c, "first", "convert_first", "≤", 1.3,
                          "first copy (no state, no DST) within 1.3× of qemu-img convert")
        self.ratio_target(s, c, "first_state", "convert_wb_first", "≤", 1.3,
                          "first copy saving a new state (DST flushed) within 1.3× of "
                          "qemu-img convert -t writeback (flushed)")
        for p in (full, full_q, *first_state):
            p.unlink(missing_ok=True)
        self.r()

    def case_sync_nbd(self):
        """blksync to an NBD export behind a link of --link-rate bits/s
        (nbdkit's file plugin with its rate filter): the delta copy's use
        case, keeping a remote copy of an image up to date. The full copy
        is qemu-img convert to an export of its own, behind the same rate."""
        size = self.a.sync_size or (64 * MiB if self.a.quick else 2 * GiB)
        bs = 64 * KiB
        rate = self.a.link_rate
        self.r(f"## Delta copy to an NBD export over a {rate}bit/s link (nbdkit file plugin, "
               f"rate filter; {human(size)} of random data, 1% of 64 KiB blocks changed)")
        self.r()
        qemu_img, nbdkit = shutil.which("qemu-img"), shutil.which("nbdkit")
        if not qemu_img or not nbdkit:
            self.r.problem("FAILED: sync_nbd needs qemu-img and nbdkit (scripts/setup.sh)")
            return
        d = Path(self.a.dir)
        d.mkdir(parents=True, exist_ok=True)
        a = self.image("random", size)
        if not a:
            return
        b = self.changed_image(a, size, bs)
        blksync, blkmap = str(RELEASE / "blksync"), str(RELEASE / "blkmap")
        dst, state = d / "sync-nbd-dst.raw", d / "sync-nbd-dst.map"
        full = d / "sync-nbd-full.raw"
        for p in (dst, state, Path(f"{state}.dst"), full):
            p.unlink(missing_ok=True)
        # DST holds A and the state is its map, made locally (untimed).
        for argv in (["cp", "--sparse=always", str(a), str(dst)], [blkmap, str(a), str(state)],
                     ["truncate", "-s", str(size), str(full)]):
            p = run_once(argv, self.a.timeout)
            if p.rc != 0:
                self.r.problem(f"FAILED: sync_nbd: {argv[0]}: {p.err.strip()[-300:]}")
                return
        warm(a)
        warm(b)
        with tempfile.TemporaryDirectory(prefix="blkhash-bench-sync-nbd-") as tmp:
            servers, urls = [], {}
            try:
                for key, path in (("dst", dst), ("full", full)):
                    sock = Path(tmp) / f"{key}.sock"
                    servers.append(serve([nbdkit, "--foreground", "-U", str(sock),
                                          "--filter=rate", "file", str(path), f"rate={rate}"],
                                         sock))
                    urls[key] = f"nbd+unix:///?socket={sock}"
                # Run 1 A->B, run 2 B->A, ...: 1% of the blocks every time.
                update = Cmd("blksync update over NBD, state", [], ours=True,
                             argv_for=lambda r: [blksync, "--cache", str(b if r % 2 == 0 else a),
                                                 urls["dst"], "--state", str(state)])
                c = {
                    "update": update,
                    "blksum": Cmd("blksum SRC", [self.blksum, "--cache", str(b)], ours=True),
                    "convert": Cmd("qemu-img convert -n to NBD", [
                        qemu_img, "convert", "-n", "-f", "raw", "-O", "raw", str(b),
                        urls["full"]]),
                    # Flushed at the end, as blksync always flushes an export.
                    "convert_wb": Cmd("qemu-img convert -n -t writeback to NBD", [
                        qemu_img, "convert", "-n", "-t", "writeback", "-f", "raw", "-O", "raw",
                        str(b), urls["full"]]),
                }
                cmds = list(c.values())
                run_case(cmds, self.a.runs, self.a.timeout)
            finally:
                for p in servers:
                    p.terminate()
                    p.wait()
        s = "sync_nbd"
        self.results(s, cmds, size)
        last = b if (self.a.runs - 1) % 2 == 0 else a
        check = run_once([self.blksum, "--cache", str(dst)], self.a.timeout)
        want = run_once([self.blksum, "--cache", str(last)], self.a.timeout)
        if check.rc != 0 or want.rc != 0 or check.out.split()[:1] != want.out.split()[:1]:
            self.r.problem(f"MISMATCH: sync_nbd: DST after the updates is not {last.name}")
        else:
            self.r(f"DST after the last update has {last.name}'s checksum: "
                   f"{check.out.split()[0]}")
            self.r()
        self.ratios([(c["convert"], c["update"]), (c["convert_wb"], c["update"]),
                     (c["update"], c["blksum"])])
        self.ratio_target(s, c, "convert", "update", "≥", 10,
                          f"update over a {rate}bit/s link ≥ 10× faster than qemu-img convert")
        self.ratio_target(s, c, "update", "blksum", "≤", 1.3,
                          "update over NBD within 1.3× of blksum hashing SRC")
        for p in (dst, state, full):
            p.unlink(missing_ok=True)
        self.r()

    # -- library benchmark

    # -- NBD cases

    def url_cmd(self, name, exe, url, digest="sha256", ours=True):
        return Cmd(name, [exe, "-d", digest, url], ours=ours, key=(digest, self.bs()))

    def case_nbd(self):
        """qemu-nbd exports on a unix socket: hashing over NBD against hashing
        the same file by path, and against the reference on the same URL."""
        size = 64 * MiB if self.a.quick else 2 * GiB
        big = 16 * GiB if self.a.quick else TiB
        qemu_nbd = shutil.which("qemu-nbd")
        self.r(f"## NBD: qemu-nbd exports on a unix socket ({human(size)} half data, "
               f"{human(big)} empty)")
        self.r()
        if not qemu_nbd:
            self.r.problem("qemu-nbd missing (apt-get install qemu-utils): NBD case skipped")
            return
        holes = self.image("holes", size)
        empty = self.image("empty", big)
        if not holes or not empty:
            return
        warm(holes)
        with tempfile.TemporaryDirectory(prefix="blkhash-bench-nbd-") as tmp:
            servers, urls = [], {}
            try:
                for key, img in (("holes", holes), ("empty", empty)):
                    sock = Path(tmp) / f"{key}.sock"
                    # Page cache on the server side (qemu-nbd's default
                    # cache=writeback), shared so several connections work.
                    servers.append(serve(
                        [qemu_nbd, "--read-only", "--persistent", "--shared=8", "-f", "raw",
                         "-k", str(sock), str(img)], sock))
                    urls[key] = f"nbd+unix:///?socket={sock}"
                c = {
                    "nbd": self.url_cmd("blksum sha256 (nbd+unix)", self.blksum, urls["holes"]),
                    "file": self.ours("sha256", holes),
                    "file_direct": self.ours("sha256", holes, cache=False),
                    "ref_nbd": (self.url_cmd("ref sha256 (nbd+unix)", self.ref, urls["holes"],
                                             ours=False) if self.ref else None),
                }
                cmds = [x for x in c.values() if x]
                run_case(cmds, self.a.runs, self.a.timeout)
                s = "nbd"
                self.results(s, cmds, size)
                self.ratios([(c["nbd"], c["file"]), (c["nbd"], c["file_direct"]),
                             (c["ref_nbd"], c["nbd"])])
                self.ratio_target(s, c, "nbd", "file", "≤", 1.3,
                                  "half data: over NBD ≤ 1.3× the time by path (both page cache)")
                self.ratio_target(s, c, "ref_nbd", "nbd", "≥", 1.2,
                                  "half data: blksum ≥ 1.2× the reference on the same URL")
                e = {
                    "nbd_empty": self.url_cmd("blksum sha256 empty (nbd+unix)", self.blksum,
                                              urls["empty"]),
                    "file_empty": self.ours("sha256", empty, label="empty"),
                    "ref_empty": (self.url_cmd("ref sha256 empty (nbd+unix)", self.ref,
                                               urls["empty"], ours=False) if self.ref else None),
                }
                ecmds = [x for x in e.values() if x]
                run_case(ecmds, self.a.runs, self.a.timeout)
                self.results("nbd-empty", ecmds, big)
                self.ratios([(e["nbd_empty"], e["file_empty"]), (e["ref_empty"], e["nbd_empty"])])
                self.ratio_target(s, e, "nbd_empty", "file_empty", "≤", 1.5,
                                  "empty: over NBD ≤ 1.5× the local empty file")
                self.memory_target(s, cmds + ecmds)
            finally:
                for p in servers:
                    p.terminate()
                    p.wait()
        self.r()

    def c_bench(self):
        """Our C benchmark (bench/c/bench.c) compiled with the system cc against
        the libblkhash.so of this build, or None (the reason is in the report)."""
        d = Path(self.a.dir)
        lib = d / "c-bench-lib"
        lib.mkdir(parents=True, exist_ok=True)
        # The program asks the loader for the SONAME, libblkhash.so.0.
        so = lib / "libblkhash.so.0"
        if so.is_symlink() or so.exists():
            so.unlink()
        so.symlink_to(RELEASE / "libblkhash.so")
        exe = d / "c-bench"
        argv = ["cc", "-O2", "-Wall", "-o", str(exe), str(ROOT / "bench" / "c" / "bench.c"),
                "-I", str(ROOT / "libblkhash" / "include"), "-L", str(RELEASE), "-lblkhash",
                f"-Wl,-rpath,{lib}"]
        return str(exe) if self.steps(argv) else None

    def case_lib(self):
        r = self.r
        secs = self.a.lib_seconds
        threads = [int(t) for t in self.a.lib_threads.split(",")]
        bs = short(self.bs())
        rs = short(self.read_size)
        r(f"## Library benchmark ({secs} s each, block size {bs}, buffers of {rs}, holes of 16g)")
        r()
        r("Rust: `blkhash_bench` example (data: `Pipeline::submit`/`reclaim`, zero-copy; zero: "
          "`update`; hole: `update_zeros`). C: `bench/c/bench.c` through libblkhash.so, simple "
          "(`blkhash_update`, which copies; hole: `blkhash_zero`) and async "
          "(`blkhash_aio_update` in place, queue depth 2 × threads + 2, as many buffers as the "
          "Rust example recycles, completions by `poll()`). C/Rust compares the C API's "
          "zero-copy path for data (async) and its simple calls for zeros and holes. "
          "Reference: `blkhash-bench` (data with `-a`, its zero-copy path). Throughput in GB/s.")
        r()
        ours_exe = str(RELEASE / "examples" / "blkhash_bench")
        c_exe = self.c_bench()
        rows = []
        for inp in ("data", "zero", "hole"):
            for digest in ("sha256", "blake3"):
                for t in threads:
                    log(f"lib: {inp} {digest} threads {t}")
                    argv = [ours_exe, "--input", inp, "--digest", digest, "--threads", str(t),
                            "--seconds", str(secs), "--block-size", bs, "--read-size", rs,
                            "--hole-size", "16g"]
                    ours = self.lib_run(argv, "gbs", 1.0)
                    c_simple = c_async = None
                    if c_exe:
                        argv = [c_exe, "-i", inp, "-d", digest, "-t", str(t), "-T", str(secs),
                                "-b", bs, "-r", rs, "-z", "16g"]
                        c_simple = self.lib_run(argv, "gbs", 1.0)
                        c_async = self.lib_run(argv + ["-q", str(2 * t + 2)], "gbs", 1.0)
                    ref = None
                    if self.bench_ref:
                        argv = [self.bench_ref, "-i", inp, "-d", digest, "-T", str(secs),
                                "-t", str(t), "-b", bs, "-r", rs, "-z", "16g"]
                        if inp == "data":
                            argv.append("-a")
                        ref = self.lib_run(argv, "throughput", 1e-9)
                    c_best = c_async if inp == "data" else c_simple
                    row = [inp, digest, t, fmt_gbs(ours), fmt_gbs(c_simple), fmt_gbs(c_async),
                           fmt_ratio(c_best, ours)]
                    if self.bench_ref:
                        row += [fmt_gbs(ref), fmt_ratio(ours, ref), fmt_ratio(c_best, ref)]
                    rows.append(row)
        header = ["input", "digest", "threads", "Rust GB/s", "C simple GB/s", "C async GB/s",
                  "C/Rust"]
        if self.bench_ref:
            header += ["ref GB/s", "Rust/ref", "C/ref"]
        r.table(header, rows)

    # -- the Python package

    def python_exe(self):
        """The interpreter with the blkhash package: --python, else a venv in
        the work directory where `pip install ./python` builds it."""
        if self.a.python:
            return self.a.python
        venv = Path(self.a.dir) / "python-venv"
        py = venv / "bin" / "python"
        if not self.a.no_build:
            Path(self.a.dir).mkdir(parents=True, exist_ok=True)
            if not self.steps([sys.executable, "-m", "venv", str(venv)],
                              [str(venv / "bin" / "pip"), "install", "--quiet",
                               "--disable-pip-version-check", str(ROOT / "python")]):
                return None
        if not py.exists():
            self.r.problem(f"FAILED: {py} missing (run without --no-build, or --python)")
            return None
        return str(py)

    def case_python(self):
        """blkhash.checksum() against blksum on the random image, and
        Hasher.update() with 1 MiB buffers against the Rust library."""
        r = self.r
        py = self.python_exe()
        if not py:
            return
        size = 64 * MiB if self.a.quick else 2 * GiB
        r(f"## Python package ({human(size)} random image; library: {self.a.lib_seconds} s runs)")
        r()
        r(f"Interpreter: `{py}`. `blkhash.checksum(IMAGE, cache=True)` in a fresh interpreter "
          "(its start-up counted) against `blksum --cache`, alternating.")
        r()
        img = self.image("random", size)
        if not img:
            return
        warm(img)
        ours = self.ours("sha256", img)
        opts = ""
        if self.a.threads:
            opts += f", threads={self.a.threads}"
        if self.a.block_size:
            opts += f", block_size={self.a.block_size}"
        if self.a.read_size:
            opts += f", read_size={self.a.read_size}"
        code = ("import sys, blkhash; "
                f"print(blkhash.checksum(sys.argv[1], cache=True{opts}))")
        pych = Cmd("python blkhash.checksum (cache)", [py, "-c", code, str(img)], ours=True,
                   key=("sha256", self.bs()))
        c = {"ours": ours, "py": pych}
        cmds = [ours, pych]
        run_case(cmds, self.a.runs, self.a.timeout)
        self.results("python", cmds, size)
        self.ratio_target("python", c, "py", "ours", "≤", 1.1,
                          "blkhash.checksum() time ≤ 1.1× blksum's")
        r()

        # update(): the same data path as blkhash_bench --input data (1 MiB
        # non-zero buffers, a few recycled, finalize included).
        secs = self.a.lib_seconds
        rs = self.read_size
        bs = self.bs()
        upd = textwrap.dedent(f"""
            import json, sys, time, blkhash
            threads, secs = int(sys.argv[1]), float(sys.argv[2])
            pattern = bytes(((i * 31 + 7) % 251) | 1 for i in range({rs}))
            bufs = [bytearray(pattern) for _ in range(2 * threads + 2)]
            h = blkhash.new("sha256", block_size={bs}, threads=threads)
            n = i = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < secs:
                h.update(bufs[i % len(bufs)])
                n += {rs}
                i += 1
            h.digest()
            print(json.dumps({{"gbs": n / (time.perf_counter() - t0) / 1e9}}))
        """)
        rust_exe = str(RELEASE / "examples" / "blkhash_bench")
        r(f"`Hasher.update()` with {human(rs)} buffers (sha256, block size {human(bs)}) "
          f"against the Rust library's `blkhash_bench --input data` (zero-copy `submit`), "
          f"{secs} s per run, {self.a.runs} runs alternating; median GB/s.")
        r()
        rows, targets = [], []
        for t in [int(x) for x in self.a.lib_threads.split(",")]:
            rust, pyt = [], []
            for i in range(self.a.runs):
                log(f"python update: threads {t}, run {i + 1}/{self.a.runs}")
                rust.append(self.lib_run(
                    [rust_exe, "--input", "data", "--digest", "sha256", "--threads", str(t),
                     "--seconds", str(secs), "--block-size", short(bs), "--read-size", short(rs)],
                    "gbs", 1.0))
                pyt.append(self.lib_run([py, "-c", upd, str(t), str(secs)], "gbs", 1.0))
            if any(not isinstance(x, float) for x in rust + pyt):
                rows.append([t, "FAILED", "FAILED", ""])
                continue
            rm, pm = statistics.median(rust), statistics.median(pyt)
            rows.append([t, fmt_gbs(rm), fmt_gbs(pm), f"{pm / rm:.2f}x"])
            targets.append((f"update() with {human(rs)} buffers, threads {t}: "
                            f"{pm:.2f} / {rm:.2f} GB/s = {pm / rm:.2f}x the Rust library "
                            f"(target ≥ 0.9x)", pm / rm >= 0.9))
        r.table(["threads", "Rust GB/s", "Python GB/s", "Python/Rust"], rows)
        for text, ok in targets:
            self.target("python update", text, ok)
        r()

    def lib_run(self, argv, key, scale):
        """Throughput from a JSON-printing benchmark, or an error string."""
        p = run_once(argv, self.a.timeout)
        if p.rc != 0:
            msg = f"{Path(argv[0]).name}: exit {p.rc}: {p.err.strip()[-200:]}"
            self.r.problems.append(f"FAILED: lib: {' '.join(argv)}: {msg}")
            return "FAILED"
        try:
            return float(json.loads(p.out)[key]) * scale
        except (ValueError, KeyError, TypeError) as e:
            self.r.problems.append(f"FAILED: lib: {' '.join(argv)}: bad output: {e}")
            return "FAILED"


def fmt_ratio(a, b):
    if isinstance(a, float) and isinstance(b, float) and b > 0:
        return f"{a / b:.2f}x"
    return ""


def fmt_gbs(v):
    if isinstance(v, float):
        return f"{v:,.2f}"
    return v or ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="cases: " + ", ".join(ALL_CASES))
    ap.add_argument("--dir", default="/var/tmp/blkhash-bench",
                    help="work directory for the images (default %(default)s)")
    ap.add_argument("--runs", type=int, help="runs per command (default 5; 1 with --quick)")
    ap.add_argument("--quick", action="store_true",
                    help="64 MiB images instead of 2 GiB, 16 GiB instead of 1 TiB, one run")
    ap.add_argument("--only", action="append", default=[],
                    help="run only these cases (comma-separated, repeatable)")
    ap.add_argument("--lib", action="store_true",
                    help="run the library benchmark only (same as --only lib)")
    ap.add_argument("--lib-seconds", type=int,
                    help="seconds per library benchmark (integer; default 3, 1 with --quick)")
    ap.add_argument("--lib-threads", default="1,2",
                    help="thread counts for the library benchmark (default %(default)s)")
    ap.add_argument("--python", help="python case: an interpreter with the blkhash package "
                         "installed (default: a venv in --dir, built with pip install ./python)")
    ap.add_argument("--out", help="also write the Markdown report to this file")
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build")
    ap.add_argument("--threads", type=int, help="pass -t N to both blksums (default: theirs)")
    ap.add_argument("--read-size", type=parse_size,
                    help="pass --read-size to our blksum (default: its 1 MiB)")
    ap.add_argument("--block-size", type=parse_size,
                    help="pass --block-size to both blksums (default: their 64 KiB)")
    ap.add_argument("--sync-size", type=parse_size,
                    help="image size of the sync case (default 2 GiB; 64 MiB with --quick)")
    ap.add_argument("--settle", type=float, default=0,
                    help="sync case: seconds to wait after removing a copy's target and "
                         "syncing, before each write (default 0: back to back). On a VM "
                         "with free page reporting, freed page-cache memory is returned to "
                         "the host a few seconds later; waiting lets every command start "
                         "from that settled state instead of racing it")
    ap.add_argument("--link-rate", default="1G",
                    help="sync_nbd case: the link's bits per second, as nbdkit's rate filter "
                         "takes it (default %(default)s: a 1 Gbit/s network)")
    ap.add_argument("--timeout", type=float, default=1800,
                    help="seconds before a command is killed (default %(default)s)")
    a = ap.parse_args()

    only = [c.strip() for o in a.only for c in o.split(",") if c.strip()]
    if a.lib:
        only.append("lib")
    for c in only:
        if c not in ALL_CASES:
            ap.error(f"unknown case '{c}' (cases: {', '.join(ALL_CASES)})")
    cases = [c for c in ALL_CASES if c in only] if only else CASES
    a.cases = cases
    a.lib = "lib" in cases
    if a.runs is None:
        a.runs = 1 if a.quick else 5
    if a.runs < 1:
        ap.error("--runs must be at least 1")
    if a.lib_seconds is None:
        a.lib_seconds = 1 if a.quick else 3
    if a.lib_seconds < 1:
        ap.error("--lib-seconds must be at least 1")

    report = Report()
    bench = Bench(a, report)
    bench.header()
    ok = bench.build()
    try:
        if ok:
            for c in cases:
                getattr(bench, f"case_{c}")()
    except KeyboardInterrupt:
        report.problem("INTERRUPTED")
    if report.targets:
        report("## Targets")
        report()
        for section, status, text in report.targets:
            report(f"- [{status}] {section}: {text}")
        report()
    if report.problems:
        report("## Problems")
        report()
        for p in report.problems:
            report(f"- **!!! {p}**" if p.startswith("MISMATCH") else f"- **{p}**")
        report()
    if a.out:
        report.write(a.out)
        log(f"report written to {a.out}")
    return 1 if report.problems or not ok else 0


if __name__ == "__main__":
    sys.exit(main())
