"""The incremental case: maps and copies from a QEMU dirty bitmap.

A qcow2 image (16 GiB, its first half random data; --dirty-size to change
it) gets a dirty bitmap, then 1% of its data is rewritten by qemu-io in
scattered 1 MiB pieces. Timed, alternately: the incremental map (`blkmap
--base OLD --dirty-bitmap b`) against hashing the rewritten bytes alone
(the floor) and against a full map; the same over `qemu-nbd -r -B b`; the
incremental blksync against one without the bitmap and against dd of the
dirty bytes (the floor of the write side)."""

import dataclasses
import os
import random
import shutil
import tempfile
from pathlib import Path

from common import RELEASE, Cmd, GiB, human, MiB, run_case, run_once, serve, short


# The commands --before also runs with another build's binaries.
BEFORE = ("incr", "full", "incr_nbd", "full_nbd", "sync", "sync_full")


class DirtyCases:
    """Mixed into run.Bench: uses its commands, results and targets."""

    def dirty_setup(self, size):
        """PRE (a qcow2 image of the random image's data in the first half,
        zeros after, converted from a thin overlay of it: an image that
        reads no other file, as IMG), IMG (PRE converted, the bitmap b
        added, 1% of the data rewritten), OLD (IMG's map before the
        writes), the rewritten pieces' offsets and FLOOR (a raw file of
        their size); None (reported) on trouble."""
        missing = [t for t in ("qemu-img", "qemu-io", "qemu-nbd", "dd") if not shutil.which(t)]
        if missing:
            self.r.problem(f"FAILED: {', '.join(missing)} not found (scripts/setup.sh)")
            return None
        d = Path(self.a.dir)
        d.mkdir(parents=True, exist_ok=True)
        data = size // 2
        raw = self.image("random", data)
        if not raw:
            return None
        blkmap = str(RELEASE / "blkmap")
        pre, img, old = d / "dirty-pre.qcow2", d / f"dirty-{short(size)}.qcow2", d / "dirty-old.map"
        thin = d / "dirty-thin.qcow2"
        sparse = d / f"dirty-only-{short(size)}.qcow2"
        for p in (thin, pre, img, old, sparse):
            p.unlink(missing_ok=True)
        # The pieces: 1% of the data, whole MiB, at MiB offsets drawn by a
        # seeded generator.
        pieces = max(1, data // 100 // MiB)
        offsets = sorted(random.Random(7).sample(range(data // MiB), pieces))
        floor = self.image("random", pieces * MiB)
        if not floor:
            return None
        writes = []
        for i, mib in enumerate(offsets):
            writes += ["-c", f"write -P {1 + i % 255} {mib * MiB} 1M"]
        if not self.steps(
                ["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(raw), "-F", "raw",
                 str(thin), str(size)],
                # A state made from an image with a backing file cannot
                # vouch for one without it (the update refuses: the files
                # the image reads are not those the state recorded).
                ["qemu-img", "convert", "-f", "qcow2", "-O", "qcow2", str(thin), str(pre)],
                ["qemu-img", "convert", "-f", "qcow2", "-O", "qcow2", str(pre), str(img)],
                [blkmap, str(img), str(old)],
                ["qemu-img", "bitmap", "--add", str(img), "b"],
                ["qemu-io", "-f", "qcow2", *writes, str(img)],
                # The same pieces at the same offsets, alone in an image of
                # the same size: the dirty bytes read as the update reads
                # them (scattered, through the qcow2 reader).
                ["qemu-img", "create", "-q", "-f", "qcow2", str(sparse), str(size)],
                ["qemu-io", "-f", "qcow2", *writes, str(sparse)]):
            return None
        return d, pre, img, old, offsets, floor, sparse, (raw, writes)

    def case_dirty(self):
        size = self.a.dirty_size or (GiB if self.a.quick else 16 * GiB)
        data = size // 2
        self.r(f"## Incremental maps and copies from a dirty bitmap ({human(size)} qcow2, "
               f"{human(data)} of random data, 1% of it rewritten in scattered 1 MiB pieces; "
               f"direct I/O, the default; the page cache dropped before each blksync run)")
        self.r()
        setup = self.dirty_setup(size)
        if not setup:
            return
        d, pre, img, old, offsets, floor, sparse, (raw, writes) = setup
        changed = len(offsets) * MiB
        self.r(f"Rewritten: {len(offsets)} pieces of 1 MiB ({human(changed)}); bitmap `b` "
               f"(64 KiB granularity) added after the first map")
        self.r()
        blkmap, blksync = str(RELEASE / "blkmap"), str(RELEASE / "blksync")
        out, out_nbd = d / "dirty-out.map", d / "dirty-out-nbd.map"
        full, full_nbd = d / "dirty-full.map", d / "dirty-full-nbd.map"
        dst, state = d / "dirty-dst.raw", d / "dirty-dst.map"
        dd_out = d / "dirty-dd.raw"
        for p in (dst, state, Path(f"{state}.dst")):
            p.unlink(missing_ok=True)
        # DST and its state: PRE's copy (untimed).
        if not self.steps([blksync, str(pre), str(dst), "--state", str(state)]):
            return
        # blksync's SRC: a copy of IMG of its own (IMG is served while the
        # syncs run), whose writes each run undoes and makes again.
        simg, restore = self.dirty_sync_image(d, pre, raw, offsets, size)
        if not simg:
            return

        def back_to_pre(_r):
            # DST and the state as they were before SIMG was written, the
            # state made from SIMG itself (an update through the bitmap
            # refuses a state made from another file): SIMG's pieces
            # written back with what they held, its bitmap cleared, DST
            # updated from it, then the pieces written again (the bitmap
            # marks them). Each update starts from the same point; untimed.
            for argv in (["qemu-io", "-f", "qcow2", *restore, str(simg)],
                         ["qemu-img", "bitmap", "--clear", str(simg), "b"],
                         [blksync, "--cache", str(simg), str(dst), "--state", str(state)],
                         ["qemu-io", "-f", "qcow2", *writes, str(simg)]):
                p = run_once(argv, self.a.timeout)
                if p.rc != 0:
                    raise RuntimeError(f"{' '.join(argv[:3])}: {p.err.strip()[-300:]}")
            drop_caches()

        def rm_dd(_r):
            dd_out.unlink(missing_ok=True)

        with tempfile.TemporaryDirectory(prefix="blkhash-bench-dirty-") as tmp:
            sock = Path(tmp) / "img.sock"
            server = serve(["qemu-nbd", "--read-only", "--persistent", "--shared=8", "-f",
                            "qcow2", "-B", "b", "-k", str(sock), str(img)], sock)
            url = f"nbd+unix:///?socket={sock}"
            try:
                key = ("sha256", 64 * 1024)
                c = {
                    "incr": Cmd("blkmap --base --dirty-bitmap", [
                        blkmap, "--base", str(old), "--dirty-bitmap", "b", str(img), str(out)],
                        ours=True, key=key),
                    "floor": Cmd(f"blksum of an image holding only the rewritten data "
                                 f"({human(changed)} at their offsets, qcow2)",
                                 [self.blksum, str(sparse)], ours=True),
                    "floor_raw": Cmd(f"blksum of the rewritten data in one raw file "
                                     f"({human(changed)})", [self.blksum, str(floor)],
                                     ours=True),
                    "full": Cmd("blkmap (full)", [blkmap, str(img), str(full)], ours=True,
                                key=key),
                    "incr_nbd": Cmd("blkmap --base --dirty-bitmap over NBD", [
                        blkmap, "--base", str(old), "--dirty-bitmap", "b", url, str(out_nbd)],
                        ours=True, key=key),
                    "full_nbd": Cmd("blkmap over NBD (full)", [blkmap, url, str(full_nbd)],
                                    ours=True, key=key),
                    "sync": Cmd("blksync --dirty-bitmap --state", [
                        blksync, "--dirty-bitmap", "b", "--state", str(state), str(simg),
                        str(dst)], ours=True, prep=back_to_pre),
                    "sync_full": Cmd("blksync --state (no bitmap)", [
                        blksync, "--state", str(state), str(simg), str(dst)], ours=True,
                        prep=back_to_pre),
                    "dd": Cmd(f"dd of the dirty bytes ({human(changed)}, fsync)", [
                        "dd", f"if={floor}", f"of={dd_out}", "bs=1M", "conv=fsync"],
                        prep=rm_dd),
                }
                cmds = self.dirty_before(c)
                try:
                    for r in range(self.a.runs):
                        run_case(self.dirty_order(c, cmds, r), 1, self.a.timeout)
                except RuntimeError as e:
                    self.r.problem(f"FAILED: dirty: {e}")
                    return
            finally:
                server.terminate()
                server.wait()
        s = "dirty"
        self.results(s, cmds, size)
        # The maps written must hold the full map's digests (blkdiff of two
        # maps: exit 0 when every block's digest is the same; the bytes
        # differ where a map records what it was made from: a file or an
        # export); DST SRC's.
        blkdiff = str(RELEASE / "blkdiff")
        for p in (out, out_nbd, full_nbd):
            same = full.exists() and p.exists() and run_once(
                [blkdiff, "-q", str(full), str(p)], self.a.timeout).rc == 0
            if not same:
                self.r.problem(f"MISMATCH: dirty: {p.name} is not the full map {full.name}")
        cmp = run_once(["qemu-img", "compare", "-q", str(img), str(dst)], self.a.timeout)
        if cmp.rc != 0:
            self.r.problem(f"MISMATCH: dirty: {dst.name} after the last update is not "
                           f"{img.name} (qemu-img compare: exit {cmp.rc})")
        else:
            self.r(f"{dst.name} after the last update holds {img.name}'s content "
                   f"(qemu-img compare); the incremental maps hold the full map's digests (blkdiff)")
            self.r()
        self.ratios([(c["incr"], c["floor"]), (c["incr"], c["floor_raw"]),
                     (c["full"], c["incr"]),
                     (c["full_nbd"], c["incr_nbd"]), (c["sync_full"], c["sync"]),
                     (c["sync"], c["incr"])]
                    + [(c[k], c[f"{k}_before"]) for k in BEFORE if f"{k}_before" in c])
        self.ratio_target(s, c, "incr", "floor", "≤", 1.3,
                          "incremental map within 1.3× of hashing the rewritten data alone")
        self.ratio_target(s, c, "full", "incr", "≥", 30,
                          "incremental map ≥ 30× faster than a full map")
        self.ratio_target(s, c, "full_nbd", "incr_nbd", "≥", 10,
                          "over NBD: incremental map ≥ 10× faster than a full map")
        self.sum_target(s, c["sync"], (c["incr"], c["dd"]), 1.3,
                        "incremental blksync within 1.3× of the incremental map + dd of the "
                        "dirty bytes")
        self.ratio_target(s, c, "sync_full", "sync", "≥", 30,
                          "incremental blksync ≥ 30× faster than blksync without the bitmap")
        for p in (out, out_nbd, full, full_nbd, dd_out, sparse, simg):
            p.unlink(missing_ok=True)
        shutil.rmtree(d / "dirty-pieces", ignore_errors=True)
        self.r()

    def dirty_sync_image(self, d, pre, raw, offsets, size):
        """SIMG (PRE converted, bitmap b added, as IMG before its writes)
        and the qemu-io arguments that write back what its rewritten
        pieces held (RAW's bytes there, each in a file of its own under
        `d`/dirty-pieces); (None, None) on trouble."""
        simg, pieces = d / f"dirty-sync-{short(size)}.qcow2", d / "dirty-pieces"
        simg.unlink(missing_ok=True)
        shutil.rmtree(pieces, ignore_errors=True)
        pieces.mkdir()
        restore = []
        with open(raw, "rb") as f:
            for i, mib in enumerate(offsets):
                f.seek(mib * MiB)
                piece = pieces / f"{i}.bin"
                piece.write_bytes(f.read(MiB))
                restore += ["-c", f"write -s {piece} {mib * MiB} 1M"]
        if not self.steps(["qemu-img", "convert", "-f", "qcow2", "-O", "qcow2", str(pre),
                           str(simg)],
                          ["qemu-img", "bitmap", "--add", str(simg), "b"]):
            return None, None
        return simg, restore

    def dirty_before(self, c):
        """The commands in the order they run: with --before, each of
        BEFORE followed by the same command with the binaries of that
        directory (added to `c` as KEY_before), so that the two builds
        alternate."""
        if not self.a.before:
            return list(c.values())
        before = Path(self.a.before).resolve()
        cmds = []
        for k, cmd in list(c.items()):
            cmds.append(cmd)
            if k not in BEFORE:
                continue
            exe = before / Path(cmd.argv[0]).name
            if not exe.exists():
                self.r.problem(f"FAILED: dirty: {exe} missing (--before)")
                continue
            b = dataclasses.replace(cmd, name=f"{cmd.name} (before)",
                                    argv=[str(exe), *cmd.argv[1:]], samples=[])
            c[f"{k}_before"] = b
            cmds.append(b)
        return cmds

    @staticmethod
    def dirty_order(c, cmds, r):
        """The commands of round `r`: with --before, each pair's (ours and
        before) order swapped every other round, so that neither build
        always follows the page cache's drop (a blksync run's reset) or
        reads what the other left in it."""
        if r % 2 == 0:
            return cmds
        swapped = list(cmds)
        for k in BEFORE:
            if f"{k}_before" in c:
                i, j = swapped.index(c[k]), swapped.index(c[f"{k}_before"])
                swapped[i], swapped[j] = swapped[j], swapped[i]
        return swapped

    def sum_target(self, section, num, dens, want, what):
        """A target on t(num) / (t(den1) + t(den2) + ...) ≤ want."""
        label = f"{num.name}/({' + '.join(x.name for x in dens)})"
        if num.failed or any(x.failed for x in dens):
            self.target(section, f"{what}: {label} (target ≤ {want}x): a command failed", False)
            return
        v = num.median / sum(x.median for x in dens)
        self.target(section, f"{what}: {label} = {v:.2f}x (target ≤ {want}x)", v <= want)


def drop_caches():
    """Empty the page cache (root only; else nothing): each blksync run then
    reads SRC from the disk, as the first run of a night does, not from
    what the runs before it left in memory."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass
