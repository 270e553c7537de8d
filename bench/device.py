"""The device's limit: blksum reading with direct I/O (its default) next to
fio on the same file, the page cache bypassed; and blksum on a pipe next to
cat. A VM's disk varies from run to run by 1.5x, so the commands run in
rounds, each round in a new shuffled order, and the figure of a command is
the median of its per-round ratios to fio (or to cat)."""

import random
import shutil
import statistics

from pathlib import Path

from common import RELEASE, Cmd, GiB, MiB, human, log, run_once


class DeviceCases:
    """Mixed into run.Bench: uses its commands, results and targets."""

    def rounds(self, cmds, rounds):
        """Run `cmds` in `rounds` rounds, each in a shuffled order (seeded);
        each command's samples in round order."""
        rng = random.Random(18)
        for r in range(rounds):
            order = list(cmds)
            rng.shuffle(order)
            for c in order:
                log(f"round {r + 1}/{rounds}: {c.name}")
                c.samples.append(run_once(c.argv, self.a.timeout))

    def per_round(self, num, den):
        """The median of num's time / den's time, round by round."""
        if not num or not den or num.failed or den.failed:
            return None
        return statistics.median(a.seconds / b.seconds for a, b in zip(num.samples, den.samples))

    def fio(self, name, img, size):
        """fio reading `size` bytes of `img` with direct I/O, 1 MiB reads, 32
        in flight (libaio: every kernel has it)."""
        exe = shutil.which("fio")
        if not exe:
            return None
        return Cmd(name, [exe, "--name=read", f"--filename={img}", "--direct=1", "--rw=read",
                          "--bs=1M", "--iodepth=32", "--ioengine=libaio", f"--size={size}",
                          "--readonly", "--output-format=terse"])

    def case_direct(self):
        size = 64 * MiB if self.a.quick else 2 * GiB
        rounds = 3 if self.a.quick else max(self.a.runs, 9)
        self.r(f"## Direct I/O against the device's limit ({human(size)}; {rounds} rounds, "
               f"shuffled; median of the per-round ratios to fio)")
        self.r()
        rnd, holes = self.image("random", size), self.image("holes", size)
        if not rnd or not holes:
            return
        q = self.qcow2_image(holes, size)
        if not q:
            return
        c = {
            "fio": self.fio(f"fio {human(size)}", rnd, size),
            "fio_half": self.fio(f"fio {human(size // 2)}", rnd, size // 2),
            "ours": self.ours("sha256", rnd, cache=False),
            "ours_d0": self.ours_depth(rnd, 0),
            "ours_t8": self.ours("sha256", rnd, cache=False, threads=8),
            "null": self.ours("null", rnd, cache=False),
            "sync": self.sync_update(rnd),
            "holes": self.ours("sha256", holes, cache=False, label="holes"),
            "qcow2": self.ours("sha256", q, cache=False, label="holes qcow2"),
        }
        # The half-holes image and its conversion have a checksum of their own.
        for key in ("holes", "qcow2"):
            c[key].key = ("sha256 (half-holes image)", self.bs())
        if not c["fio"]:
            self.r.problem("FAILED: fio missing (apt-get install fio): the direct case "
                           "compares with it")
            return
        cmds = [x for x in c.values() if x]
        self.rounds(cmds, rounds)
        s = "direct"
        self.results(s, cmds, size)
        rows = []
        for key, den in (("ours", "fio"), ("ours_d0", "fio"), ("ours_t8", "fio"), ("null", "fio"),
                         ("sync", "fio"), ("sync", "ours"), ("holes", "fio_half"),
                         ("qcow2", "fio_half")):
            v = self.per_round(c[key], c[den])
            rows.append([c[key].name, c[den].name, f"{v:.2f}x" if v else "failed"])
        self.r.table(["command", "against", "median of per-round ratios"], rows, "llr")
        for key, den, what in (
                ("ours", "fio", "default blksum on the random image"),
                ("holes", "fio_half", "default blksum on the half-holes image (its data)"),
                ("qcow2", "fio_half", "default blksum on its qcow2 conversion (its data)")):
            v = self.per_round(c[key], c[den])
            self.target(s, f"{what}: {v:.2f}x fio's time (target ≤ 1.1x)" if v else
                        f"{what}: a command failed", v is not None and v <= 1.1)
        self.memory_target(s, cmds)
        self.r()
        self.pipe_rounds(rnd, size, rounds)

    def sync_update(self, src):
        """blksync SRC DST --state STATE with DST already SRC's copy and
        STATE its map (made once, untimed): SRC is read and hashed as blksum
        does, nothing is written."""
        d = src.parent
        dst, state = d / f"{src.stem}.direct-dst.raw", d / f"{src.stem}.direct-dst.map"
        blksync, blkmap = str(RELEASE / "blksync"), str(RELEASE / "blkmap")
        if not dst.exists() or dst.stat().st_mtime < src.stat().st_mtime or not state.exists():
            log(f"making {dst} and its state {state}")
            for p in (dst, state, Path(f"{state}.dst")):
                p.unlink(missing_ok=True)
            if not self.steps([blksync, str(src), str(dst), "--state", str(state)]):
                return None
        argv = [blksync, str(src), str(dst), "--state", str(state)]
        return Cmd("blksync update, state (direct)", argv, ours=True)

    def ours_depth(self, img, depth):
        cmd = self.ours("sha256", img, cache=False)
        cmd.argv.insert(-1, "--io-depth")
        cmd.argv.insert(-1, str(depth))
        cmd.name = cmd.name.replace("(direct)", f"(direct, --io-depth {depth})")
        return cmd

    def pipe_rounds(self, img, size, rounds):
        """A pipe: cat IMAGE | blksum against cat IMAGE | cat > /dev/null (a
        reader that only moves the bytes through the pipe), b3sum, and cat
        IMAGE > /dev/null, which crosses no pipe at all."""
        self.r(f"### A pipe ({human(size)} of random data from the page cache)")
        self.r()
        sh = shutil.which("sh")
        path = str(img)

        def piped(name, cmd):
            return Cmd(name, [sh, "-c", f"cat {path} | {cmd}"], key=None)

        c = {
            "cat": piped("cat | cat > /dev/null", "cat > /dev/null"),
            "nopipe": Cmd("cat > /dev/null", [sh, "-c", f"cat {path} > /dev/null"]),
            "null": piped("cat | blksum -d null", f"{self.blksum} -d null"),
            "ours3": piped("cat | blksum -d blake3", f"{self.blksum} -d blake3"),
            "b3sum": piped("cat | b3sum", self.b3sum) if self.b3sum else None,
            "ours": piped("cat | blksum", self.blksum),
            "sha256sum": piped("cat | sha256sum", self.sha256sum),
        }
        cmds = [x for x in c.values() if x]
        self.rounds(cmds, rounds)
        self.results("pipe", cmds, size)
        rows = []
        fmt = lambda v: f"{v:.2f}x" if v else "failed"  # noqa: E731
        for key in ("nopipe", "null", "ours3", "b3sum", "ours", "sha256sum"):
            if c[key]:
                rows.append([c[key].name, fmt(self.per_round(c[key], c["cat"])),
                             fmt(self.per_round(c[key], c["null"]))])
        self.r.table(["command", "per-round ratio to cat | cat > /dev/null",
                      "to cat | blksum -d null"], rows, "lrr")
        v = self.per_round(c["ours3"], c["cat"])
        self.target("pipe", f"cat | blksum -d blake3: {fmt(v)} the time of cat | cat > /dev/null "
                    "(target ≤ 1.1x)", v is not None and v <= 1.1)
        self.r()
