"""The NBD and delta-copy cases: blksum over an NBD export against qemu-img
and the reference, over exports that answer each read late (a remote
server), and blksync's first copy, update and compare, to a file and to an
NBD export behind a rate-limited link."""

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from common import (
    median_cell,
    ratio_cell,
    RELEASE,
    Cmd,
    GiB,
    human,
    KiB,
    log,
    MiB,
    run_case,
    run_once,
    serve,
    short,
    TiB,
    warm,
)


class NetCases:
    """Mixed into run.Bench: uses its commands, results and targets."""

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

    def sync_images(self, size, bs, tools):
        """The work directory, the random image A and B, A changed; None
        (reported) if one of `tools` is missing or an image cannot be made."""
        missing = [t for t in tools if not shutil.which(t)]
        if missing:
            self.r.problem(f"FAILED: {', '.join(missing)} not found (scripts/setup.sh)")
            return None
        d = Path(self.a.dir)
        d.mkdir(parents=True, exist_ok=True)
        a = self.image("random", size)
        if not a:
            return None
        return d, a, self.changed_image(a, size, bs)

    def case_sync(self):
        size = self.a.sync_size or (64 * MiB if self.a.quick else 2 * GiB)
        bs = 64 * KiB
        settled = (f"each write started {self.a.settle:g} s after the last file removal and "
                   f"sync" if self.a.settle else "back to back")
        self.r(f"## Delta copy: blksync ({human(size)} of random data, 1% of 64 KiB blocks "
               f"changed, scattered; {settled})")
        self.r()
        qemu_img = shutil.which("qemu-img")
        pair = self.sync_images(size, bs, ["qemu-img"])
        if not pair:
            return
        d, a, b = pair
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
        if not self.steps([blksync, "--cache", str(a), str(dst), "--state", str(state)],
                          [blksync, "--cache", str(a), str(dst_q), "-O", "qcow2", "--state",
                           str(state_q)]):
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
        pair = self.sync_images(size, bs, ["qemu-img", "nbdkit"])
        if not pair:
            return
        d, a, b = pair
        blksync, blkmap = str(RELEASE / "blksync"), str(RELEASE / "blkmap")
        dst, state = d / "sync-nbd-dst.raw", d / "sync-nbd-dst.map"
        full = d / "sync-nbd-full.raw"
        for p in (dst, state, Path(f"{state}.dst"), full):
            p.unlink(missing_ok=True)
        # DST holds A and the state is its map, made locally (untimed).
        if not self.steps(["cp", "--sparse=always", str(a), str(dst)], [blkmap, str(a), str(state)],
                          ["truncate", "-s", str(size), str(full)]):
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
            self.r.problem("qemu-nbd missing (qemu-utils on Debian, qemu-img on Fedora): NBD case skipped")
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

    # -- remote exports: nbdkit's random plugin behind its delay filter

    def serve_remote(self, nbdkit, args, sock=None):
        """nbdkit serving args on the unix socket sock, or else on a free TCP
        port of 127.0.0.1; (process, URL) once a connection succeeds."""
        for _ in range(3):
            if sock:
                argv, addr, url = ([nbdkit, "--foreground", "-U", str(sock), *args],
                                   (socket.AF_UNIX, str(sock)), f"nbd+unix:///?socket={sock}")
            else:
                # A free port: bound, released, then given to nbdkit.
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                argv, addr, url = ([nbdkit, "--foreground", "-i", "127.0.0.1", "-p", str(port),
                                    *args], (socket.AF_INET, ("127.0.0.1", port)),
                                   f"nbd://127.0.0.1:{port}")
            log(" ".join(argv))
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and p.poll() is None:
                try:
                    with socket.socket(addr[0]) as c:
                        c.connect(addr[1])
                    return p, url
                except OSError:
                    time.sleep(0.05)
            if p.poll() is None:
                p.terminate()
            p.wait()
            if sock:
                break  # a port taken meanwhile is worth another try, nothing else
        raise RuntimeError(f"nbdkit did not start: {' '.join(argv)}")

    def case_remote(self):
        """Exports across a network, imitated: nbdkit's random plugin
        (incompressible data, a fixed seed) behind its delay filter, each read
        answered 0, 2 or 10 ms late, on a unix socket and on TCP (127.0.0.1).
        Our default against more reads in flight, against reading alone
        (`-d null --io-depth 32`: the floor the server and transport allow)
        and against the reference (libnbd, many requests in flight)."""
        exports = ([(32 * MiB, 0), (32 * MiB, 2), (16 * MiB, 10)] if self.a.quick else
                   [(256 * MiB, 0), (256 * MiB, 2), (128 * MiB, 10)])
        self.r("## Remote NBD exports: nbdkit random plugin, delay filter (" +
               ", ".join(f"{human(size)} at {ms} ms per read" for size, ms in exports) +
               "; unix socket and TCP on 127.0.0.1)")
        self.r()
        nbdkit = shutil.which("nbdkit")
        if not nbdkit:
            self.r.problem("FAILED: nbdkit not found (scripts/setup.sh): remote case skipped")
            return
        summary = []
        with tempfile.TemporaryDirectory(prefix="blkhash-bench-remote-") as tmp:
            for size, ms in exports:
                for transport in ("unix", "tcp"):
                    # seed: the same data on both transports, checksums comparable.
                    args = ["--filter=delay", "random", f"size={size}", "seed=1",
                            f"delay-read={ms}ms"]
                    sock = Path(tmp) / f"{short(size)}-{ms}ms.sock" if transport == "unix" else None
                    s = f"remote-{short(size)}-{ms}ms-{transport}"
                    self.r(f"### {human(size)}, {ms} ms per read, {transport}")
                    self.r()
                    # The same export without multi-conn: one connection
                    # carries every request in flight.
                    one_args = ["--filter=multi-conn", *args, "multi-conn-mode=disable"]
                    one_sock = sock.with_suffix(".one.sock") if sock else None
                    try:
                        server, url = self.serve_remote(nbdkit, args, sock)
                    except (OSError, RuntimeError) as e:
                        self.r.problem(f"FAILED: {s}: {e}")
                        continue
                    try:
                        one_server, one_url = self.serve_remote(nbdkit, one_args, one_sock)
                    except (OSError, RuntimeError) as e:
                        server.terminate()
                        server.wait()
                        self.r.problem(f"FAILED: {s}: {e}")
                        continue
                    try:
                        key = ("sha256", 64 * KiB)
                        c = {
                            "default": Cmd("blksum (default)", [self.blksum, url], ours=True,
                                           key=key),
                            "depth": Cmd("blksum --io-depth 16",
                                         [self.blksum, "--io-depth", "16", url], ours=True,
                                         key=key),
                            "floor": Cmd("blksum -d null --io-depth 32 (reading alone)",
                                         [self.blksum, "-d", "null", "--io-depth", "32", url],
                                         ours=True),
                            "ref": (Cmd("ref (default)", [self.ref, url], key=key)
                                    if self.ref else None),
                            "one": Cmd("blksum (default), one connection (multi-conn off)",
                                       [self.blksum, one_url], ours=True, key=key),
                        }
                        cmds = [x for x in c.values() if x]
                        run_case(cmds, self.a.runs, self.a.timeout)
                    finally:
                        for p in (server, one_server):
                            p.terminate()
                            p.wait()
                    self.results(s, cmds, size)
                    self.ratios([(c["default"], c["floor"]), (c["default"], c["ref"]),
                                 (c["one"], c["default"]),
                                 (c["depth"], c["floor"]), (c["depth"], c["ref"])])
                    self.ratio_target(s, c, "default", "floor", "≤", 1.1,
                                      "our default ≤ 1.1× the time of reading alone")
                    vs_ref = 0.7 if ms >= 10 else 0.9
                    self.ratio_target(s, c, "default", "ref", "≤", vs_ref,
                                      f"our default ≤ {vs_ref}× the reference's time")
                    self.memory_target(s, [c["default"]], limit=80 * MiB)
                    self.r()
                    summary.append((size, ms, transport, c))

        t, ratio = median_cell, ratio_cell
        self.r("### Remote exports, medians (s)")
        self.r()
        self.r.table(["export", "default", "--io-depth 16", "-d null --io-depth 32", "reference",
                      "one connection", "default / reading alone", "default / reference",
                      "one connection / default", "default peak RSS MiB"],
                     [[f"{human(size)}, {ms} ms, {transport}", t(c["default"]), t(c["depth"]),
                       t(c["floor"]), t(c["ref"]), t(c["one"]), ratio(c["default"], c["floor"]),
                       ratio(c["default"], c["ref"]), ratio(c["one"], c["default"]),
                       f"{c['default'].rss_mib:.1f}"]
                      for size, ms, transport, c in summary])
