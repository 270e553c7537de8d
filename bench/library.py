"""The library cases: the Rust library, the C library and the reference
library's benchmark side by side, and the Python package against them."""

import json
import statistics
import sys
import textwrap
from pathlib import Path

from common import RELEASE, ROOT, Cmd, GiB, human, log, MiB, run_case, run_once, short, warm


class LibCases:
    """Mixed into run.Bench: uses its commands, results and targets."""

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
