"""The virtnbdbackup case: blksum of virtnbdbackup's streams, plain and
lz4-compressed, against the raw file they hold.

The image: SIZE bytes of this machine's executables and libraries (the
files under /usr/bin, /usr/lib, ... in name order, concatenated: a disk's
mix of code and data, which lz4 compresses about 1.8 times; the text and
random images compress 12 times and not at all). The streams are written
from it by virtnbdbackup's own writer (its Python package, driven by
testkit/data/vnbd-stream.py with the Python virtnbdbackup runs with): one
data frame, cut in lz4 frames of 32 MiB for `--compress` as a backup cuts
long extents. Without virtnbdbackup the case is skipped.

With --before DIR, the raw file and the lz4 stream are also read by DIR's
blksum, in the same alternation.
"""

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path

from common import ROOT, Cmd, MiB, human, log, run_case, short, warm

ROOTS = ["/usr/bin", "/usr/sbin", "/usr/lib", "/usr/libexec", "/usr/share"]


def vnbd_python():
    """The Python virtnbdbackup runs with, if it imports its package."""
    exe = shutil.which("virtnbdbackup")
    if not exe:
        return None
    with open(exe) as f:
        first = f.readline()
    py = first[2:].split()[0] if first.startswith("#!") else None
    if not py:
        return None
    ok = subprocess.run([py, "-c", "import libvirtnbdbackup.sparsestream, lz4.frame"],
                        capture_output=True).returncode == 0
    return py if ok else None


def exec_image(path, size):
    """SIZE bytes of the machine's executables and libraries in `path`
    (made once, reused)."""
    if path.exists() and path.stat().st_size == size:
        log(f"reusing {path}")
        return path
    log(f"making {path} ({human(size)} of executables and libraries)")
    tmp = path.with_name(path.name + ".tmp")
    left = size
    with open(tmp, "wb") as out:
        for root in ROOTS:
            for d, dirs, files in os.walk(root):
                dirs.sort()
                for name in sorted(files):
                    p = os.path.join(d, name)
                    if left == 0 or os.path.islink(p) or not os.path.isfile(p):
                        continue
                    try:
                        with open(p, "rb") as f:
                            left -= out.write(f.read(left))
                    except OSError:
                        pass
        if left:
            return None
    os.rename(tmp, path)
    return path


def stream(py, raw, out, args):
    """The stream `out` of `raw` (virtnbdbackup's writer), made once."""
    if out.exists() and out.stat().st_mtime >= raw.stat().st_mtime:
        log(f"reusing {out}")
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    argv = [py, str(ROOT / "testkit" / "data" / "vnbd-stream.py"), str(raw), str(out), *args]
    log(" ".join(argv))
    subprocess.run(argv, check=True)
    return out


class VnbdCases:
    def case_virtnbdbackup(self):
        r, s = self.r, "virtnbdbackup"
        size = 64 * MiB if self.a.quick else 512 * MiB
        r(f"## virtnbdbackup streams ({human(size)} of executables and libraries, "
          f"written by virtnbdbackup's writer, plain and lz4)")
        r()
        py = vnbd_python()
        if not py:
            r("Skipped: virtnbdbackup (its Python package and python-lz4) is not installed.")
            r()
            return
        d = Path(self.a.dir)
        d.mkdir(parents=True, exist_ok=True)
        raw = exec_image(d / f"exec-{short(size)}.img", size)
        if not raw:
            r.problem(f"FAILED: {s}: fewer than {human(size)} of executables and libraries")
            return
        plain = stream(py, raw, d / "vnbd-plain" / "sda.full.data", [])
        lz4 = stream(py, raw, d / "vnbd-lz4" / "sda.full.data", ["--compress", "2"])
        r(f"The lz4 stream: {lz4.stat().st_size / MiB:.0f} MiB.")
        r()
        for p in (raw, plain, lz4):
            warm(p)
        c = {"raw": self.ours("sha256", raw, label="raw"),
             "plain": self.ours("sha256", plain, label="plain stream"),
             "lz4": self.ours("sha256", lz4, label="lz4 stream")}
        if self.a.before:
            exe = Path(self.a.before).resolve() / "blksum"
            for k in ("raw", "lz4"):
                argv = [str(exe)] + c[k].argv[1:]
                c[f"{k}_before"] = dataclasses.replace(c[k], name=f"{c[k].name} (before)",
                                                       argv=argv, samples=[])
        cmds = list(c.values())
        run_case(cmds, self.a.runs, self.a.timeout)
        self.results(s, cmds, size)
        pairs = [(c["plain"], c["raw"]), (c["lz4"], c["raw"])]
        if self.a.before:
            pairs += [(c["lz4_before"], c["raw_before"]), (c["lz4_before"], c["lz4"])]
        self.ratios(pairs)
        self.ratio_target(s, c, "plain", "raw", "≤", 1.2,
                          "sha256: a plain stream's time ≤ 1.2× the raw file's")
        self.ratio_target(s, c, "lz4", "raw", "≤", 1.5,
                          "sha256: an lz4 stream's time ≤ 1.5× the raw file's")
        r()
