"""The `decompress` case: compressed images (gzip, xz, zstd, written by their
CLIs) hashed as the raw image they hold, against the decompressor's own time.

blksum decodes on one thread (xz of a multi-block file on every core) and
digests on the others, so its time should be the decoder's: the decoder's
own time is the `decompress` example of blkimage (the same decoder, the
same crates, output discarded), and, for zstd, `zstd -dc > /dev/null`.
"""

import shlex
import shutil

from common import RELEASE, Cmd, GiB, MiB, human, log, make_with, run_case, short, warm


class DecompressCases:
    def decompressed_images(self, raw):
        """raw compressed by gzip, xz -T0 -1 (blocks of 3 MiB: several on any size
        here) and zstd: {kind: path}, made if missing (None if one cannot be)."""
        makers = {
            "gz": ["gzip", "-c"],
            # -T0's blocks are 3 × the dictionary: 3 MiB at -1. -1, not the
            # default -6: on machine D, loaded, -6 took over 20 minutes for
            # 1 GiB; decoding is liblzma's LZMA2 either way.
            "xz": ["xz", "-c", "-T0", "-1"],
            "zst": ["zstd", "-q", "-c"],
        }
        out = {}
        for ext, argv in makers.items():
            path = raw.with_name(raw.name + "." + ext)
            if not shutil.which(argv[0]):
                self.r.problem(f"FAILED: {argv[0]} not found (scripts/setup.sh)")
                return None
            if not path.exists() or path.stat().st_mtime < raw.stat().st_mtime:
                tmp = path.with_name(path.name + ".tmp")
                sh = f"{shlex.join(argv)} {shlex.quote(str(raw))} > {shlex.quote(str(tmp))}"
                if not make_with(["sh", "-c", sh], tmp, path, self.r):
                    return None
            out[ext] = path
        return out

    def cpu_table(self, c):
        """Each command's median CPU seconds (user + system, children
        included) beside its wall time, and the CPU time over its decoder's:
        on a loaded machine wall times follow the scheduler's share, while
        what blksum adds to decoding shows in its CPU time."""
        base = {"gz": "gz_lib", "gz_pipe": "gz_lib", "xz": "xz_lib1", "xz_lib": "xz_lib1",
                "zst": "zst_lib", "zst_cli": "zst_lib"}
        rows = []
        for key, cmd in c.items():
            if cmd.failed:
                continue
            den = c.get(base.get(key, ""))
            ratio = (f"{cmd.cpu / den.cpu:.2f}x" if den and not den.failed and den.cpu
                     else "")
            rows.append([cmd.name, f"{cmd.median:.3f}", f"{cmd.cpu:.3f}",
                         f"{cmd.cpu / cmd.median:.2f}", ratio])
        self.r.table(["command", "median wall s", "median CPU s", "CPU / wall",
                      "CPU / its decoder's CPU"], rows, "lrrrr")

    def case_decompress(self):
        size = self.a.decompress_size or (64 * MiB if self.a.quick else GiB)
        self.r(f"## Compressed images ({human(size)} of text lines, mkimage `{short(size)}:t`, "
               "compressed by `gzip`, `xz -T0 -1` and `zstd`; sha256)")
        self.r()
        if not self.a.no_build and not self.steps(
                ["cargo", "build", "--release", "-p", "blkhash-image", "--example", "decompress"]):
            return
        raw = self.image("text", size)
        if not raw:
            return
        imgs = self.decompressed_images(raw)
        if not imgs:
            return
        for path in [raw, *imgs.values()]:
            warm(path)
        helper = str(RELEASE / "examples" / "decompress")
        blksum = shlex.quote(self.blksum)
        c = {
            "raw": self.ours("sha256", raw, label="raw"),
            "gz_lib": Cmd("decompress gz (zlib-rs, to nothing)", [helper, str(imgs["gz"])]),
            "gz": self.ours("sha256", imgs["gz"], label="raw.gz"),
            "gz_pipe": Cmd("gzip -dc | blksum -",
                           ["sh", "-c", f"gzip -dc {shlex.quote(str(imgs['gz']))} | "
                                        f"{blksum} -d sha256 -"],
                           ours=True, key=("sha256", self.bs())),
            "xz_lib1": Cmd("decompress xz, 1 thread", [helper, str(imgs["xz"]), "1"]),
            "xz_lib": Cmd(f"decompress xz, {self.cores} threads",
                          [helper, str(imgs["xz"]), str(self.cores)]),
            "xz": self.ours("sha256", imgs["xz"], label="raw.xz"),
            "zst_cli": Cmd("zstd -dc > /dev/null",
                           ["sh", "-c", f"zstd -dc {shlex.quote(str(imgs['zst']))} > /dev/null"]),
            "zst_lib": Cmd("decompress zst (libzstd, to nothing)", [helper, str(imgs["zst"])]),
            "zst": self.ours("sha256", imgs["zst"], label="raw.zst"),
        }
        cmds = list(c.values())
        log(f"decompress: {len(cmds)} commands, {self.a.runs} rounds")
        run_case(cmds, self.a.runs, self.a.timeout)
        s = "decompress"
        self.results(s, cmds, size)
        self.cpu_table(c)
        self.ratios([(c["gz"], c["gz_lib"]), (c["gz_pipe"], c["gz"]),
                     (c["xz_lib"], c["xz_lib1"]), (c["xz"], c["xz_lib1"]), (c["xz"], c["xz_lib"]),
                     (c["zst"], c["zst_cli"]), (c["zst"], c["zst_lib"])])
        self.ratio_target(s, c, "gz", "gz_lib", "≤", 1.1,
                          "blksum X.raw.gz ≤ 1.1× the decoder's own time on it")
        self.ratio_target(s, c, "gz_pipe", "gz", "≥", 1.0,
                          "blksum X.raw.gz faster than gzip -dc X.raw.gz | blksum -")
        self.ratio_target(s, c, "xz_lib", "xz_lib1", "≤", 0.6,
                          f"xz -T0 file decoded on {self.cores} threads ≤ 0.6× one thread's time")
        self.ratio_target(s, c, "xz", "xz_lib1", "≤", 0.6,
                          "blksum X.raw.xz (xz -T0) ≤ 0.6× the decoder's time on one thread")
        self.ratio_target(s, c, "zst", "zst_cli", "≤", 1.1,
                          "blksum X.raw.zst ≤ 1.1× zstd -dc > /dev/null")
        self.memory_target(s, cmds, limit=64 * MiB + self.threads * self.read_size + GiB // 4)
        self.r()
