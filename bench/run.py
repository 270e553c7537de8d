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
    python3 bench/run.py --only remote --runs 3   # nbdkit exports with read delays, unix and TCP
    python3 bench/run.py --only dirty --dirty-size 2g --runs 1   # incremental maps, quick
    python3 bench/run.py --only dirty --before ../old/target/release   # and another build's
    python3 bench/run.py --only mapsize --runs 3   # map commands' RSS at 64 GiB, 256 GiB, 1 TiB
    python3 bench/run.py --only virtnbdbackup --before ../old/target/release  # streams, 2 builds
    python3 bench/run.py --plots         # the charts of docs/, from the reports in docs/bench/

Environment:
    BLKSUM_REF          the reference blksum binary (rows skipped if unset)
    BLKSUM_STATIC       a static blksum (the musl build of the release
                        tarball), run beside ours in the random and empty
                        cases, its time held to ≤ 1.05× ours (rows skipped
                        if unset)
    BLKHASH_BENCH_REF   the reference blkhash-bench binary (for --lib)
    IMAGEIO_VENV        the venv holding ovirt-imageio for the imageio case
                        (default: the one blksum/tests/imageio.rs makes
                        under target/tmp; imageio's rows skipped if none)

The qcow2 cases need qemu-img (images are converted from raw ones) and the
mkimage binary of the workspace (target/release/mkimage); the nbd case needs
qemu-nbd (package qemu-utils on Debian and Ubuntu, qemu-img on Fedora and RHEL).
The remote case needs nbdkit (its random plugin and delay filter).

Python 3 standard library only.
"""

import argparse
import contextlib
import json
import datetime
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

from common import (
    ALL_CASES,
    CASES,
    MKIMAGE,
    RELEASE,
    ROOT,
    Cmd,
    GiB,
    human,
    KiB,
    log,
    make_image,
    make_qcow2,
    MiB,
    nproc,
    parse_size,
    Report,
    run_case,
    run_once,
    short,
    TiB,
    warm,
)
from decompress import DecompressCases
from pbs import PbsCases
from device import DeviceCases
from dirty import DirtyCases
from mapsize import MapSizeCases
from web import HttpCases
from library import LibCases
from net import NetCases
from vnbd import VnbdCases

from cases import IMAGE_CASES


# ---------------------------------------------------------------- the bench


class Bench(NetCases, LibCases, DeviceCases, DirtyCases, MapSizeCases, HttpCases,
            VnbdCases, DecompressCases, PbsCases):
    def __init__(self, args, report):
        self.a = args
        self.r = report
        self.cores = nproc()
        self.blksum = str(RELEASE / "blksum")
        self.ref = os.environ.get("BLKSUM_REF") or None
        self.static = os.environ.get("BLKSUM_STATIC") or None
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

    def ours(self, digest, img, cache=True, label=None, threads=None, static=False, path=None):
        """label: the image in the command's name ("qcow2"); threads: -t, shown in the
        name (default: --threads, not shown); static: BLKSUM_STATIC's binary; path:
        "mapped" (`--mmap`) or "copied" (`--no-mmap`), else the default's measured
        choice."""
        argv = [self.static if static else self.blksum, "-d", digest]
        if cache:
            argv.append("--cache")
        if path:
            argv.append({"mapped": "--mmap", "copied": "--no-mmap"}[path])
        if self.a.block_size:
            argv += ["--block-size", short(self.a.block_size)]
        if threads or self.a.threads:
            argv += ["-t", str(threads or self.a.threads)]
        if self.a.read_size:
            argv += ["--read-size", short(self.a.read_size)]
        argv.append(str(img))
        mode = "cache" if cache else "direct"
        if path:
            mode += f", {path}"
        if threads:
            mode += f", -t {threads}"
        what = f"{digest} {label}" if label else digest
        name = "blksum static" if static else "blksum"
        return Cmd(f"{name} {what} ({mode})", argv, ours=True, key=(digest, self.bs()))

    def parts(self, img, n, cache=True):
        """`blkmap --range k/n` for k = 1..n one after another, then `blkmap
        merge` of the parts (printing the checksum): sha256."""
        blkmap = str(RELEASE / "blkmap")
        opts = ["--cache"] if cache else []
        if self.a.block_size:
            opts += ["--block-size", short(self.a.block_size)]
        if self.a.threads:
            opts += ["-t", str(self.a.threads)]
        opts = " ".join(opts)
        script = (f'd=$(mktemp -d) && trap \'rm -rf "$d"\' EXIT && '
                  f'for k in $(seq 1 {n}); do {blkmap} {opts} --range $k/{n} {img} "$d/p$k" '
                  f'|| exit 1; done && {blkmap} merge "$d/map" "$d"/p* | sed "s|$d/map|{img}|"')
        mode = "cache" if cache else "direct"
        return Cmd(f"{n} × blkmap --range k/{n}, blkmap merge ({mode})", ["sh", "-c", script],
                   ours=True, key=("sha256", self.bs()))

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
        if {"qcow2", "compressed", "decompress"} & set(self.a.cases):
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
        if key == "static":
            return "BLKSUM_STATIC not set"
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

    def memory_target(self, section, cmds, limit=None):
        """Peak RSS of our commands in cmds against limit (bytes; default 64 MiB +
        threads × read size)."""
        rule = human(limit) if limit else None
        if limit is None:
            limit = 64 * MiB + self.threads * self.read_size
            rule = (f"64 MiB + {self.threads} threads × {human(self.read_size)} = "
                    f"{limit / MiB:.0f} MiB")
        ours = [c for c in cmds if c.ours and c.samples]
        if ours:
            worst = max(ours, key=lambda c: c.rss_mib)
            self.target(section, f"peak RSS of blksum = {worst.rss_mib:.1f} MiB ({worst.name}) "
                        f"(target ≤ {rule})", worst.rss_mib * MiB <= limit)

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

    # -- image cases: the table (IMAGE_CASES) and the one function that runs it

    def run_table_case(self, name):
        """Run the case IMAGE_CASES[name]: make its images, run its commands
        alternately, report their times, ratios and targets."""
        case = IMAGE_CASES[name]
        size = case.quick_size if self.a.quick else case.size
        self.r(f"## {case.title.format(size=human(size))}")
        self.r()
        if case.before:
            getattr(self, case.before)()
        raw = self.image(case.image, size)
        if not raw:
            return
        imgs = {"raw": raw}
        if case.qcow2:
            imgs["qcow2"] = self.qcow2_image(raw, size)
            if not imgs["qcow2"]:
                return
        if case.warm:
            for img in imgs.values():
                warm(img)
        with case.around(self, imgs) if case.around else contextlib.nullcontext({}) as extra:
            imgs.update(extra)
            c = {key: make(self, imgs) for key, make in case.commands.items()}
            cmds = [x for x in c.values() if x]
            if case.warm_each:
                for x in cmds:
                    x.prep = x.prep or (lambda r: [warm(i, quiet=True) for i in imgs.values()])
            run_case(cmds, self.a.runs, self.a.timeout)
        self.results(name, cmds, size)
        self.ratios([(c[num], c[den]) for num, den in case.ratios])
        for num, den, op, want, what in case.targets:
            self.ratio_target(name, c, num, den, op, want, what)
        if case.after:
            getattr(self, case.after)(name, c, size)
        self.memory_target(name, cmds)
        self.r()

    def read_path(self, img, digest):
        """What the default read path chose for `img`: the share of its data
        `blksum --json --cache` says it hashed from memory maps (mapped-bytes),
        or None if that run failed."""
        argv = [self.blksum, "--json", "--cache", "-d", digest, str(img)]
        p = run_once(argv, self.a.timeout)
        try:
            doc = json.loads(p.out)["inputs"][0]
            return doc["mapped-bytes"] / max(doc["data-bytes"], 1)
        except (ValueError, KeyError, IndexError, TypeError):
            self.r.problem(f"FAILED: {' '.join(argv)}: exit {p.rc}: {p.err.strip()[-200:]}")
            return None

    def say_read_path(self, c, keys):
        """A line saying which read path the default took, for the commands c[k]
        (our default blksum with --cache) of `keys`: one more run of each with
        --json."""
        said = []
        for k in keys:
            cmd = c.get(k)
            if not cmd or cmd.failed:
                continue
            digest, img = cmd.argv[cmd.argv.index("-d") + 1], cmd.argv[-1]
            share = self.read_path(img, digest)
            if share is not None:
                way = "mapped" if share > 0.5 else "copied"
                said.append(f"{cmd.name}: {way} ({share:.0%} of the data from memory maps)")
        if said:
            self.r("Read path the default chose (`--json`'s mapped-bytes, one more run each; it "
                   "measures both ways on the first 32 MiB, then takes the cheaper but for one "
                   "round of 8 MiB in 16, or in 64 once a way costs a quarter more): "
                   + "; ".join(said))
            self.r()

    def read_path_choice(self, section, c, size):
        """The readpath case: the default against the faster of mapped and
        copied, CPU seconds of each, and what the default chose."""
        for d, (auto, mapped, copied) in (("sha256", ("ours", "mapped", "copied")),
                                          ("blake3", ("ours3", "mapped3", "copied3"))):
            a, m, p = c[auto], c[mapped], c[copied]
            what = f"{d}: the default's time ≤ 1.05× the faster of mapped and copied"
            if a.failed or m.failed or p.failed:
                self.target(section, f"{what}: a command failed", False)
                continue
            best = min(m, p, key=lambda x: x.median)
            v = a.median / best.median
            self.target(section, f"{what}: {a.name}/{best.name} = {v:.2f}x "
                        f"(target ≤ 1.05x)", v <= 1.05)
        cpu = [f"{x.name} {x.cpu:.3f}" for x in c.values() if x and not x.failed]
        self.r()
        self.r("CPU seconds (user + system, median): " + "; ".join(cpu))
        self.r()
        self.say_read_path(c, ["ours", "ours3"])

    def sha256_efficiency(self, section, c, size):
        """blksum's sha256 time against cores × single-thread SHA-256."""
        ours = c["ours"]
        what = "sha256: blksum ≥ 85% of cores × single-thread SHA-256"
        if not self.sha256_speed:
            self.target(section, f"{what}: no single-thread speed", None)
        elif ours.failed:
            self.target(section, f"{what}: blksum failed", False)
        else:
            limit = size / (self.cores * self.sha256_speed)
            eff = limit / ours.median
            self.target(section, f"{what}: limit {limit:.3f} s / blksum {ours.median:.3f} s = "
                        f"{eff:.0%} (target ≥ 85%)", eff >= 0.85)
            if self.sha256_many_speed:
                limit = size / (self.cores * self.sha256_many_speed)
                self.r(f"- For information, against cores × multi-buffer SHA-256 (the kernel the "
                       f"workers run): limit {limit:.3f} s / blksum {ours.median:.3f} s = "
                       f"{limit / ours.median:.0%}")
                self.r()
        self.say_read_path(c, ["ours", "ours3"])

    # -- compressed qcow2: images and a thread-scaling measure of their own

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


def plots(workdir):
    """bench/plots.py, in the bench's own venv (workdir/plots-venv, made with
    matplotlib the first time): the charts come from the reports kept in
    docs/bench/, so nothing is measured here."""
    venv = workdir / "plots-venv"
    python = venv / "bin" / "python"
    if subprocess.run([str(python), "-c", "import matplotlib"], capture_output=True).returncode \
            if python.exists() else True:
        log(f"making {venv} with matplotlib")
        workdir.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "matplotlib"], check=True)
    return subprocess.run([str(python), str(Path(__file__).with_name("plots.py"))]).returncode


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
    ap.add_argument("--decompress-size", type=parse_size,
                    help="image size of the decompress case (default 1 GiB; 64 MiB with --quick)")
    ap.add_argument("--dirty-size", type=parse_size,
                    help="image size of the dirty case (default 16 GiB, half of it data; "
                         "1 GiB with --quick)")
    ap.add_argument("--before",
                    help="dirty case: also run its blkmap and blksync commands with the "
                         "binaries in this directory (another commit's target/release), "
                         "alternating with ours, rows marked (before); virtnbdbackup case: "
                         "its blksum on the raw file and the lz4 stream")
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
    ap.add_argument("--plots", action="store_true",
                    help="draw the charts of docs/ (docs/images/*.png) from the reports in "
                         "docs/bench/, with matplotlib in a venv in --dir; run nothing else")
    a = ap.parse_args()
    if a.plots:
        return plots(Path(a.dir))

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
                if c in IMAGE_CASES:
                    bench.run_table_case(c)
                else:
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
