"""The HTTP case: images published over HTTP, read where they are. nginx
(Debian's package, a configuration of its own in a temporary directory)
serves a qcow2 image (1 GiB of random data in scattered clusters, and an
internal snapshot holding 256 MiB the active layer does not use) and a raw
image of random data, over loopback and through bench/delay.py adding 2 and
10 ms to each reply (testkit's delay-relay). Side by side: our blksum of the URL, of the same file
read locally (page cache), what a user runs today (`curl -o FILE URL &&
blksum FILE`), QEMU's curl driver (`qemu-img convert -O raw URL FILE &&
blksum FILE`), nbdkit's curl plugin with qemu-nbd (`blksum nbd+unix://`),
and reading alone (`-d null` with a deep --io-depth); and the bytes nginx
sent (its access log) against the clusters and metadata of the active
layer."""

import json
import os
import random
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

from common import (RELEASE, Cmd, GiB, KiB, MiB, cpu_cell, human, log, make_with, median_cell,
                    ratio_cell, run_case, short, warm)

# testkit's delay relay (testkit/src/bin/delay-relay.rs), built with the rest.
DELAY = RELEASE / "delay-relay"
# Runs of QEMU's curl driver and nbdkit's curl plugin at 2 ms: each takes
# minutes on the 1 GiB images where ours take seconds (the first full run:
# about 5 minutes a run), so two rounds tell the ratio.
PEER_RUNS = 2
# Seconds a run of QEMU's curl driver or nbdkit's curl plugin may take: in
# the first full runs QEMU 7.2's curl driver now and then hung after the
# last range was sent, every connection idle and nothing in flight (a lost
# completion, not a slow server): such a run is reported as a hang and left
# out of the median (a run takes seconds here).
PEER_TIMEOUT = 120


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, what):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port}")


def qcow2_metadata(path):
    """Bytes of the metadata blksum must read: the header cluster (the first
    request asks for 64 KiB), the L1 table and each L2 table it points to."""
    with open(path, "rb") as f:
        h = f.read(48)
        cluster_bits, = struct.unpack(">I", h[20:24])
        l1_size, = struct.unpack(">I", h[36:40])
        l1_offset, = struct.unpack(">Q", h[40:48])
        f.seek(l1_offset)
        l1 = struct.unpack(f">{l1_size}Q", f.read(8 * l1_size))
    cluster = 1 << cluster_bits
    tables = sum(1 for e in l1 if e & 0x00FFFFFFFFFFFE00)
    return max(cluster, 64 * KiB) + 8 * l1_size + tables * cluster


def active_data(path):
    """Bytes of data clusters the active layer maps (qemu-img map)."""
    p = subprocess.run(["qemu-img", "map", "--output=json", str(path)], capture_output=True,
                       text=True, check=True)
    return sum(e["length"] for e in json.loads(p.stdout) if e.get("data"))


class HttpCases:
    """Mixed into run.Bench: uses its commands, results and targets."""

    def http_images(self):
        """(qcow2, raw, sizes) in the work directory, made once."""
        quick = self.a.quick
        size, data, snap = (256 * MiB, 64 * MiB, 16 * MiB) if quick else (4 * GiB, GiB, 256 * MiB)
        d = Path(self.a.dir)
        d.mkdir(parents=True, exist_ok=True)
        qcow2 = d / f"http-{short(size)}-{short(data)}.qcow2"
        raw = d / f"http-{short(data)}.raw"
        if not raw.exists() or raw.stat().st_size != data:
            log(f"making {raw}")
            tmp = raw.with_name(raw.name + ".tmp")
            with open(tmp, "wb") as f:
                for _ in range(data // MiB):
                    f.write(os.urandom(MiB))
            os.rename(tmp, raw)
        if qcow2.exists():
            return qcow2, raw, (size, data, snap)
        log(f"making {qcow2} ({human(data)} scattered, a snapshot of {human(snap)} more)")
        rng = random.Random(37)
        # Pieces of 64 KiB to 1 MiB at 64 KiB-aligned places, apart.
        pieces, total, taken = [], 0, set()
        while total < data:
            n = min(rng.choice([1, 2, 4, 8, 16]) * 64 * KiB, data - total)
            at = rng.randrange(0, size - n, 64 * KiB)
            span = range(at // (64 * KiB) - 1, (at + n) // (64 * KiB) + 1)
            if any(c in taken for c in span):
                continue
            taken.update(span)
            pieces.append((at, n))
            total += n
        with tempfile.TemporaryDirectory(dir=d) as tmp:
            sparse = Path(tmp) / "src.raw"
            with open(sparse, "wb") as f:
                f.truncate(size)
                for at, n in sorted(pieces):
                    f.seek(at)
                    f.write(os.urandom(n))
            out = Path(tmp) / "out.qcow2"
            if not make_with(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(sparse),
                              str(out)], out, out, self.r):
                return None
            subprocess.run(["qemu-img", "snapshot", "-c", "s1", str(out)], check=True)
            # The first pieces, `snap` bytes of them, written again with new
            # random data: the active layer gets new clusters, the
            # snapshot keeps the old ones, which nothing may fetch.
            cmds, done = [], 0
            for i, (at, n) in enumerate(pieces):
                if done >= snap:
                    break
                p = Path(tmp) / f"p{i}"
                p.write_bytes(os.urandom(n))
                cmds.append(f"write -s {p} {at} {n}")
                done += n
            argv = ["qemu-io", "-f", "qcow2", str(out)]
            for c in cmds:
                argv += ["-c", c]
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
            os.rename(out, qcow2)
        return qcow2, raw, (size, data, snap)

    def qemu_curl(self, tmp):
        """A qemu-img with QEMU's curl driver: the system's if it has the
        module, else Debian 12's qemu-utils with its qemu-block-extra
        (apt-get download, unpacked in the work directory: the machine's
        QEMU 10 from backports has no curl module in Debian 12). (argv
        prefix, env, version) or None."""
        env = dict(os.environ)
        # Any URL: the module loads (then the connection fails) or it does not.
        probe = subprocess.run(["qemu-img", "info", "http://127.0.0.1:1/x"], capture_output=True,
                               text=True)
        if "module" not in probe.stderr:
            v = subprocess.run(["qemu-img", "--version"], capture_output=True, text=True)
            return ["qemu-img"], env, v.stdout.split("\n")[0]
        root = Path(self.a.dir) / "qemu-curl"
        img, mod = root / "usr/bin/qemu-img", root / "usr/lib/x86_64-linux-gnu/qemu"
        if not (img.exists() and (mod / "block-curl.so").exists()):
            debs = Path(tmp) / "debs"
            debs.mkdir()
            log("apt-get download qemu-utils qemu-block-extra (Debian 12's, for the curl driver)")
            version = subprocess.run(["apt-cache", "policy", "qemu-block-extra"],
                                     capture_output=True, text=True).stdout
            cand = [l.split()[-1] for l in version.splitlines() if "Candidate:" in l]
            if not cand or cand[0] == "(none)":
                return None
            r = subprocess.run(["apt-get", "download", f"qemu-block-extra={cand[0]}",
                                f"qemu-utils={cand[0]}"], cwd=debs, capture_output=True,
                               text=True)
            if r.returncode != 0:
                log(r.stderr)
                return None
            for deb in debs.glob("*.deb"):
                subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
        env["QEMU_MODULE_DIR"] = str(mod)
        v = subprocess.run([str(img), "--version"], capture_output=True, text=True, env=env)
        return [str(img)], env, v.stdout.split("\n")[0]

    def start_nginx(self, tmp, www):
        conf_dir = Path(tmp) / "nginx"
        (conf_dir / "tmp").mkdir(parents=True)
        port = free_port()
        user = "user root;\n" if os.geteuid() == 0 else ""
        d = conf_dir
        (d / "nginx.conf").write_text(
            f"{user}worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\n"
            f"error_log {d}/error.log warn;\nevents {{ worker_connections 1024; }}\n"
            f"http {{\n log_format blk '$status $body_bytes_sent \"$http_range\" $request_uri';\n"
            f" access_log {d}/access.log blk;\n client_body_temp_path {d}/tmp;\n"
            f" proxy_temp_path {d}/tmp;\n fastcgi_temp_path {d}/tmp;\n"
            f" uwsgi_temp_path {d}/tmp;\n scgi_temp_path {d}/tmp;\n"
            f" default_type application/octet-stream;\n keepalive_requests 100000;\n"
            # Connections never closed by the server's timeouts during the
            # case (keep-alive 75 s and send 60 s by default): in the first
            # full run QEMU 7.2's curl driver hung for minutes on closed
            # connections (CLOSE-WAIT, in ppoll with no timeout); with
            # these, a run takes seconds.
            f" keepalive_timeout 3600s;\n send_timeout 3600s;\n"
            f" sendfile on;\n server {{ listen 127.0.0.1:{port}; root {www}; }}\n}}\n")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        p = subprocess.Popen([nginx, "-c", str(d / "nginx.conf"), "-p", str(d)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        wait_port(port, p, "nginx")
        return p, port, d / "access.log"

    def start_delay(self, target, ms):
        port = free_port()
        p = subprocess.Popen([str(DELAY), str(port), str(target), str(ms)],
                             stdin=subprocess.DEVNULL)
        wait_port(port, p, "delay-relay")
        return p, port

    def case_http(self):
        self.r("## HTTP: images published over HTTP (nginx on 127.0.0.1, and through a "
               "delay proxy adding 2 and 10 ms to each reply)")
        self.r()
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not (os.access(nginx, os.X_OK) and shutil.which("qemu-img") and DELAY.exists()):
            self.r.problem(f"FAILED: nginx, qemu-img or {DELAY} not found (scripts/setup.sh, "
                           "cargo build --release): http case skipped")
            return
        made = self.http_images()
        if not made:
            return
        qcow2, raw, (size, data, snap) = made
        meta = qcow2_metadata(qcow2)
        active = active_data(qcow2)
        self.r(f"Images: {qcow2.name} ({human(size)} virtual, {human(active)} of data in "
               f"the active layer, a snapshot holding {human(snap)} it does not use, "
               f"{os.path.getsize(qcow2) / MiB:.0f} MiB file; metadata read: "
               f"{meta / KiB:.0f} KiB); {raw.name} ({human(data)} of random data).")
        self.r()
        servers = []
        with tempfile.TemporaryDirectory(prefix="blkhash-bench-http-") as tmp:
            www = Path(tmp) / "www"
            www.mkdir()
            for img in (qcow2, raw):
                (www / img.name).symlink_to(img)
            download = Path(self.a.dir) / "http-download.tmp"
            try:
                p, port, access = self.start_nginx(tmp, www)
                servers.append(p)
                ports = {0: port}
                for ms in (2, 10):
                    dp, ports[ms] = self.start_delay(port, ms)
                    servers.append(dp)
                qemu = self.qemu_curl(tmp)
                if qemu:
                    self.r(f"QEMU's curl driver: {qemu[2]} ({' '.join(qemu[0])}).")
                    self.r()
                for img in (qcow2, raw):
                    warm(img)
                self.http_bytes(qcow2, access, ports[0], active, meta)
                summary = []
                for ms in (0, 2, 10):
                    for img in (qcow2, raw):
                        c = self.http_run(img, ms, ports[ms], download, qemu, tmp)
                        summary.append((img, ms, c))
            finally:
                for p in servers:
                    p.terminate()
                    p.wait()
                download.unlink(missing_ok=True)
        self.http_summary(summary)

    def http_bytes(self, qcow2, access, port, active, meta):
        """One run of blksum URL: what nginx sent for it, against the active
        layer's data clusters and the metadata."""
        access.write_text("")
        url = f"http://127.0.0.1:{port}/{qcow2.name}"
        subprocess.run([self.blksum, url], check=True, stdout=subprocess.DEVNULL)
        ranges = []
        for line in access.read_text().splitlines():
            status, sent, rng, uri = line.split(" ", 3)
            if uri == f"/{qcow2.name}":
                a, b = rng.strip('"').removeprefix("bytes=").split("-")
                ranges.append((int(a), int(b), int(sent), status))
        sent = sum(r[2] for r in ranges)
        ranges.sort()
        twice = sum(max(0, prev[1] - cur[0] + 1) for prev, cur in zip(ranges, ranges[1:]))
        want = active + meta
        self.r(f"Bytes nginx sent for one `blksum {url}`: {sent:,} in {len(ranges)} range "
               f"requests (statuses {sorted({r[3] for r in ranges})}); the active layer's data "
               f"clusters {active:,} + metadata {meta:,} = {want:,}; bytes fetched twice: {twice}.")
        self.r()
        self.target("http", f"bytes sent ≤ 1.02× active clusters + metadata: "
                    f"{sent / want:.4f}x (target ≤ 1.02x)", sent <= 1.02 * want and twice == 0)

    def http_run(self, img, ms, port, download, qemu, tmp):
        url = f"http://127.0.0.1:{port}/{img.name}"
        kind = "qcow2" if img.suffix == ".qcow2" else "raw"
        key = ("sha256", 64 * KiB)
        blksum = self.blksum
        s = f"http-{kind}-{ms}ms"
        self.r(f"### {kind}, {ms} ms per reply")
        self.r()
        c = {
            "url": Cmd(f"blksum URL ({kind}, {ms} ms)", [blksum, url], ours=True, key=key),
            "floor": Cmd("blksum -d null --io-depth 64 URL (reading alone)",
                         [blksum, "-d", "null", "--io-depth", "64", url], ours=True),
            "local": None, "copy": None, "curl": None, "qemu": None, "nbdkit": None,
            "deep": None,
        }
        if ms == 0:
            c["local"] = Cmd("blksum --cache FILE (local, page cache)",
                             [blksum, "--cache", str(img)], ours=True, key=key)
            # The local file as the URL's bytes arrive: copied into buffers
            # (--cache maps it: no copy at all, which no socket can match).
            c["copy"] = Cmd("blksum --cache --no-mmap FILE (local, copied)",
                            [blksum, "--cache", "--no-mmap", str(img)], ours=True, key=key)
            c["curl"] = Cmd("curl -o FILE URL && blksum FILE", [
                "sh", "-c", 'curl -sSf -o "$1" "$2" && "$3" "$1"; rc=$?; rm -f "$1"; exit $rc',
                "sh", str(download), url, blksum], key=key)
        if ms == 2 and qemu:
            argv, env, _ = qemu
            fmt = kind
            script = (f'{" ".join(argv)} convert -f {fmt} -O raw "$2" "$1" && "$3" "$1"; '
                      'rc=$?; rm -f "$1"; exit $rc')
            env_prefix = [f"QEMU_MODULE_DIR={env['QEMU_MODULE_DIR']}"] if "QEMU_MODULE_DIR" in env else []
            c["qemu"] = Cmd("qemu-img convert -O raw URL FILE (curl driver) && blksum FILE",
                            ["timeout", str(PEER_TIMEOUT), "env", *env_prefix, "sh", "-c",
                             script, "sh", str(download), url, blksum], key=key,
                            max_runs=PEER_RUNS)
        if ms == 2 and shutil.which("nbdkit") and shutil.which("qemu-nbd"):
            # Each socket waited for at most 30 s (3000 × 10 ms).
            wait = ('i=0; while [ ! -S "$d/{s}" ] && [ $i -lt 3000 ]; do sleep 0.01; '
                    'i=$((i+1)); done; ')
            # The directory goes however the run ends (a hang's SIGTERM too).
            nbd = ('d=$(mktemp -d) || exit 1; trap \'rm -rf "$d"\' EXIT; trap "exit 143" TERM; '
                   'nbdkit -f -U "$d/c.sock" curl "$1" & n=$!; ' + wait.format(s="c.sock"))
            if kind == "qcow2":
                nbd += ('qemu-nbd -r -f qcow2 -k "$d/q.sock" "nbd+unix:///?socket=$d/c.sock" & '
                        'q=$!; ' + wait.format(s="q.sock") +
                        '"$2" "nbd+unix:///?socket=$d/q.sock"; rc=$?; kill $q $n; ')
            else:
                nbd += '"$2" "nbd+unix:///?socket=$d/c.sock"; rc=$?; kill $n; '
            nbd += 'wait; exit $rc'
            what = "+ qemu-nbd " if kind == "qcow2" else ""
            c["nbdkit"] = Cmd(f"nbdkit curl {what}+ blksum nbd+unix://",
                              ["timeout", str(PEER_TIMEOUT), "sh", "-c", nbd, "sh", url, blksum],
                              key=key, max_runs=PEER_RUNS)
        if ms == 10:
            # The default against a deep queue, both hashing: whether the
            # default's reads in flight hide the latency, apart from the
            # digest's CPU, which reading alone does not spend.
            c["deep"] = Cmd("blksum --io-depth 64 URL (deep, hashing)",
                            [blksum, "--io-depth", "64", url], ours=True, key=key)
        cmds = [x for x in c.values() if x]
        run_case(cmds, self.a.runs, self.a.timeout)
        self.peer_hangs([c["qemu"], c["nbdkit"]])
        self.results(s, cmds, self.http_size(img))
        self.ratios([(c["url"], c["local"]), (c["url"], c["copy"]), (c["url"], c["curl"]),
                     (c["qemu"], c["url"]), (c["nbdkit"], c["url"]), (c["url"], c["floor"]),
                     (c["url"], c["deep"])])
        # On a machine whose cores the server (and the delay relay) share,
        # CPU is what a URL costs beyond a local file.
        self.r("CPU seconds (user + system, median; the server's and the relay's not "
               "counted): " + "; ".join(f"{x.name}: {x.cpu:.2f}" for x in cmds if not x.failed))
        self.r()
        if ms == 0 and kind == "qcow2":
            self.ratio_target(s, c, "url", "local", "≤", 1.3,
                              "qcow2 over loopback ≤ 1.3× blksum of the file (page cache)")
            self.ratio_target(s, c, "url", "curl", "≤", 0.8,
                              "qcow2 over loopback ≤ 0.8× curl -o FILE URL && blksum FILE")
        if ms == 2:
            for k, what in (("qemu", "QEMU's curl driver"), ("nbdkit", "nbdkit curl")):
                if c[k]:
                    self.ratio_target(s, c, k, "url", "≥", 3,
                                      f"at 2 ms, ≥ 3× faster than {what}")
                else:
                    self.target(s, f"at 2 ms, ≥ 3× faster than {what}: skipped, not found", None)
        if ms == 10:
            self.ratio_target(s, c, "url", "floor", "≤", 1.1,
                              "at 10 ms, the default ≤ 1.1× reading alone")
        self.memory_target(s, [c["url"]], limit=80 * MiB)
        self.r()
        return c

    def peer_hangs(self, peers):
        """Runs of a peer that `timeout` ended (exit 124): said, and left out
        of its samples (if another run finished), so that its median is of
        the runs that did."""
        for p in peers:
            if not p:
                continue
            hung = [x for x in p.samples if x.rc == 124]
            done = [x for x in p.samples if x.rc != 124]
            if hung:
                self.r(f"{p.name}: {len(hung)} of {len(p.samples)} runs hung and were killed "
                       f"after {PEER_TIMEOUT} s; the times shown are of the others "
                       f"({', '.join(f'{x.seconds:.1f} s' for x in done) or 'none'}).")
                self.r()
                if done:
                    p.samples = done

    def http_size(self, img):
        """Bytes a run hashes: the virtual size."""
        if img.suffix == ".qcow2":
            p = subprocess.run(["qemu-img", "info", "--output=json", str(img)],
                               capture_output=True, text=True)
            return json.loads(p.stdout)["virtual-size"]
        return img.stat().st_size

    def http_summary(self, summary):
        t, ratio = median_cell, ratio_cell
        self.r("### HTTP, medians (s)")
        self.r()
        self.r.table(["image, delay", "blksum URL", "reading alone", "local file",
                      "curl && blksum", "QEMU curl", "nbdkit curl", "URL / local",
                      "URL / curl", "QEMU / URL", "nbdkit / URL", "URL / reading alone",
                      "URL / deep", "CPU s URL / alone / local", "peak RSS MiB"],
                     [[f"{img.suffix[1:]}, {ms} ms", t(c["url"]), t(c["floor"]), t(c["local"]),
                       t(c["curl"]), t(c["qemu"]), t(c["nbdkit"]), ratio(c["url"], c["local"]),
                       ratio(c["url"], c["curl"]), ratio(c["qemu"], c["url"]),
                       ratio(c["nbdkit"], c["url"]), ratio(c["url"], c["floor"]),
                       ratio(c["url"], c["deep"]),
                       " / ".join(cpu_cell(c[k]) for k in ("url", "floor", "local")),
                       f"{c['url'].rss_mib:.1f}"]
                      for img, ms, c in summary])
