"""The map-size case: peak RSS and time of the map commands as the map grows.

A map holds 32 bytes per data block. For disks of 64 GiB, 256 GiB and 1 TiB
full of data in 64 KiB blocks (maps of 32, 128 and 512 MiB), the same maps
are made from an export as many 512-byte blocks (512 MiB, 2 GiB and 8 GiB
of nbdkit's `pattern` plugin: data in every block) under a qcow2 overlay
holding the dirty bitmap `b`, served by `qemu-nbd -B b`: the map commands
see a map of the disk's size without hashing a TiB. Measured: the full map
over NBD (one run: the setup), the update after 1 MiB + 64 KiB written
(`blkmap --base --dirty-bitmap`), `blkdiff -q` of the two maps and `blkmap
merge` of the new map alone; and blksync with a state into a local raw
file: the first copy (before the writes), the update through the bitmap,
the update that reads the export whole, the update from a local copy of
the disk (`--cache`, and direct I/O), and a comparison with DST read
(`--force-rescan`); and Python's `map_range()` of the whole export and
`update_map()` through the bitmap (`python -c` in the bench's venv, beside
`import blkhash` alone: the interpreter's own RSS). Peak RSS must stay
flat; the
update's time beyond its dirty blocks is one pass over OLD and NEW:
reported as seconds per GiB of map."""

import dataclasses
import shutil
import tempfile
from pathlib import Path

from common import RELEASE, Cmd, GiB, MiB, TiB, human, run_case, run_once, serve

# Disk sizes (64 KiB blocks) whose maps are made, and the block size that
# makes a map of the same size from a smaller export.
DISKS = [64 * GiB, 256 * GiB, TiB]
QUICK_DISKS = [64 * GiB]
BS = 512


class MapSizeCases:
    """Mixed into run.Bench: uses its commands, results and targets."""

    def case_mapsize(self):
        missing = [t for t in ("nbdkit", "qemu-img", "qemu-io", "qemu-nbd")
                   if not shutil.which(t)]
        if missing:
            self.r.problem(f"FAILED: {', '.join(missing)} not found (scripts/setup.sh)")
            return
        self.r("## Maps of large disks: peak RSS and time as the map grows")
        self.r()
        self.r(f"Each disk full of data in 64 KiB blocks has the map of an export of "
               f"{BS}-byte blocks of 1/128 its size (nbdkit pattern under a qcow2 overlay "
               f"with bitmap `b`, qemu-nbd -B b; blake3: 32-byte digests). The update follows "
               f"1 MiB + 64 KiB written.")
        self.r()
        rows, cmds_all = [], []
        # Python's rows, when the package is there: the interpreter, and
        # its RSS with the package imported (what its rows hold beyond the
        # library's work).
        self.mapsize_py = self.python_exe()
        self.mapsize_py_base = None
        if self.mapsize_py:
            base = Cmd("python -c 'import blkhash' (the interpreter alone)",
                       [self.mapsize_py, "-c", "import blkhash"], ours=True)
            run_case([base], self.a.runs, self.a.timeout)
            self.mapsize_py_base = base
            rows.append(["", "", base.name, f"{base.median:.2f}" if not base.failed else "FAILED",
                         f"{base.rss_mib:.1f}", ""])
        for disk in (QUICK_DISKS if self.a.quick else DISKS):
            got = self.mapsize_one(disk)
            if got is None:
                return
            rows += got[0]
            cmds_all += got[1]
        self.r.table(["disk (64 KiB blocks)", "map MiB", "command", "median s", "peak RSS MiB",
                      "s per GiB of map"], rows, "lrlrrr")
        self.r()
        for c in cmds_all:
            local = any(w in c.name for w in ("blkdiff", "merge", "local SRC"))
            limit = 16 * MiB if local else 48 * MiB
            if "--force-rescan" in c.name:
                limit = 32 * MiB  # two local images hashed at once: SRC and DST
            rss, beyond = c.rss_mib, ""
            if c.name.startswith("python") and self.mapsize_py_base:
                # The interpreter's own pages are not the map's.
                rss -= self.mapsize_py_base.rss_mib
                beyond = " beyond the interpreter's"
            self.target("mapsize", f"peak RSS of {c.name}{beyond} = {rss:.1f} MiB "
                        f"(target ≤ {human(limit)})", not c.failed and rss * MiB <= limit)

    def mapsize_one(self, disk):
        """The rows of one disk size and its commands; None on trouble."""
        size = disk // (64 * 1024) * BS
        blkmap, blkdiff = str(RELEASE / "blkmap"), str(RELEASE / "blkdiff")
        blksync = str(RELEASE / "blksync")
        Path(self.a.dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="blkhash-bench-mapsize-", dir=self.a.dir) as t:
            d = Path(t)
            psock, qsock = d / "pattern.sock", d / "top.sock"
            pattern = serve(["nbdkit", "-f", "-U", str(psock), "pattern", f"size={size}"],
                            psock)
            server = None
            try:
                top = d / "top.qcow2"
                for argv in (["qemu-img", "create", "-q", "-f", "qcow2", "-b",
                              f"nbd+unix:///?socket={psock}", "-F", "raw", str(top)],
                             ["qemu-img", "bitmap", "--add", str(top), "b"]):
                    if run_once(argv, self.a.timeout).rc != 0:
                        self.r.problem(f"FAILED: mapsize: {' '.join(argv)}")
                        return None
                server = serve(["qemu-nbd", "--persistent", "--shared=8", "-f", "qcow2",
                                "-B", "b", "-k", str(qsock), str(top)], qsock)
                url = f"nbd+unix:///?socket={qsock}"
                old, new, merged = d / "old.map", d / "new.map", d / "merged.map"
                opts = ["-d", "blake3", "--block-size", str(BS)]
                full = Cmd(f"blkmap over NBD (full, {human(disk)})", [blkmap, *opts, url,
                                                                       str(old)],
                           ours=True, max_runs=1)
                dst, state = d / "dst.raw", d / "dst.map"
                first = Cmd(f"blksync --state, first copy over NBD ({human(disk)})",
                            [blksync, *opts, url, str(dst), "--state", str(state)],
                            ours=True, max_runs=1)
                run_case([full, first], 1, self.a.timeout)
                p = run_once(["qemu-io", "-f", "raw", url, "-c", "write -P 0x33 1M 1M",
                              "-c", f"write -P 0x44 {size // 2} 64k"], self.a.timeout)
                if full.failed or first.failed or p.rc != 0:
                    self.r.problem(f"FAILED: mapsize {human(disk)}: {full.error} "
                                   f"{first.error} {p.err[-200:]}")
                    return None
                cmds = [
                    Cmd(f"blkmap --base --dirty-bitmap ({human(disk)})",
                        [blkmap, "--base", str(old), "--dirty-bitmap", "b", url, str(new)],
                        ours=True),
                    Cmd(f"blkdiff -q OLD NEW ({human(disk)})",
                        [blkdiff, "-q", str(old), str(new)], ours=True),
                    Cmd(f"blkmap merge NEW ({human(disk)})",
                        [blkmap, "merge", str(merged), str(new)], ours=True),
                ]
                # blkdiff exits 1: the maps differ, as they must.
                run_case(cmds[:1], self.a.runs, self.a.timeout)
                run_case(cmds[2:], self.a.runs, self.a.timeout)
                for _ in range(self.a.runs):
                    s = run_once(cmds[1].argv, self.a.timeout)
                    cmds[1].samples.append(dataclasses.replace(s, rc=0) if s.rc == 1 else s)
                cmds += self.mapsize_python(disk, d, url, old)
                syncs = self.mapsize_syncs(disk, d, url, blksync)
                map_mib = old.stat().st_size / MiB
            finally:
                for p in (server, pattern):
                    if p:
                        p.terminate()
                        p.wait()
        rows = []
        for c in [full, *cmds, first, *syncs]:
            med = "FAILED" if c.failed else f"{c.median:.2f}"
            per = "" if c.failed else f"{c.median / (map_mib / 1024):.2f}"
            rows.append([human(disk), f"{map_mib:.0f}", c.name, med, f"{c.rss_mib:.1f}", per])
        return rows, [full, *cmds, first, *syncs]

    def mapsize_python(self, disk, d, url, old):
        """Python's map_range() of the whole export (one run, as the full
        map) and update_map() through the bitmap from OLD, as the commands
        above run them; none without the package."""
        py = self.mapsize_py
        if not py:
            return []
        part, upd = d / "py-part.map", d / "py-new.map"
        rng = Cmd(f"python map_range() over NBD (whole export, {human(disk)})",
                  [py, "-c", "import sys, blkhash; blkhash.map_range(sys.argv[1], sys.argv[2], "
                   f"digest='blake3', block_size={BS})", url, str(part)],
                  ours=True, max_runs=1, prep=lambda _r: part.unlink(missing_ok=True))
        update = Cmd(f"python update_map() over NBD ({human(disk)})",
                     [py, "-c", "import sys, blkhash; print(blkhash.update_map(sys.argv[1], "
                      "sys.argv[2], 'b', sys.argv[3]))", url, str(old), str(upd)], ours=True)
        run_case([rng, update], self.a.runs, self.a.timeout)
        part.unlink(missing_ok=True)
        upd.unlink(missing_ok=True)
        return [rng, update]

    def mapsize_syncs(self, disk, d, url, blksync):
        """blksync's updates of DST (`d`/dst.raw, its state `d`/dst.map,
        made by the first copy before the writes): through the bitmap, the
        export read whole, then a local copy of the disk read whole (with
        the page cache, and direct I/O), and compared with DST read
        (`--force-rescan`). Each writes nothing but the first through the
        bitmap (the rest find DST up to date)."""
        dst, state, local = d / "dst.raw", d / "dst.map", d / "src.raw"
        into = [str(dst), "--state", str(state)]
        bitmap = Cmd(f"blksync --state --dirty-bitmap over NBD ({human(disk)})",
                     [blksync, "--dirty-bitmap", "b", url, *into], ours=True)
        whole = Cmd(f"blksync --state over NBD, SRC read whole ({human(disk)})",
                    [blksync, url, *into], ours=True, max_runs=1)
        run_case([bitmap], self.a.runs, self.a.timeout)
        run_case([whole], self.a.runs, self.a.timeout)
        # DST is the disk now: its copy is a local SRC with the same data.
        shutil.copyfile(dst, local)
        cached = Cmd(f"blksync --state --cache, local SRC ({human(disk)})",
                     [blksync, "--cache", str(local), *into], ours=True)
        direct = Cmd(f"blksync --state, local SRC, direct I/O ({human(disk)})",
                     [blksync, str(local), *into], ours=True)
        run_case([cached, direct], self.a.runs, self.a.timeout)
        rescan = Cmd(f"blksync --state --force-rescan --cache, local SRC, DST read "
                     f"({human(disk)})",
                     [blksync, "--force-rescan", "--cache", str(local), *into], ours=True,
                     max_runs=1)
        run_case([rescan], self.a.runs, self.a.timeout)
        local.unlink()
        return [bitmap, whole, cached, direct, rescan]
