"""The imageio case: blksum --construction imageio beside oVirt imageio's
own checksums, its client library function and its daemon's HTTP API.

ovirt-imageio comes from the venv blksum/tests/imageio.rs makes (running
that test once makes it) or IMAGEIO_VENV; without one, imageio's rows are
skipped. The daemon runs on 127.0.0.1 with a configuration of its own in a
temporary directory (removed afterwards) and is stopped by its pid.
"""

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, Cmd, ImageCase, MiB, log

TICKET = "blkhash-bench"


def imageio_venv():
    """The venv holding ovirt-imageio (IMAGEIO_VENV, else the one
    blksum/tests/imageio.rs makes under target/tmp), if there is one."""
    venv = Path(os.environ.get("IMAGEIO_VENV") or ROOT / "target" / "tmp" / "imageio-venv")
    return venv if (venv / "bin" / "ovirt-imageio").exists() else None


def imageio_client():
    """ovirt-imageio's client library function, `ovirt_imageio.client.checksum()`
    (qemu-nbd, its extents, hashlib), printing the checksum first."""
    def cmd(b, imgs):
        venv = imageio_venv()
        if venv is None:
            return None
        code = ("import sys; from ovirt_imageio.client import checksum; "
                "print(checksum(sys.argv[1])['checksum'])")
        return Cmd("ovirt_imageio.client.checksum()", [str(venv / "bin" / "python"), "-c", code,
                   str(imgs["raw"])], key=("imageio", "blake2b-256", 4 * MiB))
    return cmd


# What an oVirt user's program does: one GET, the checksum from its JSON
# (Python's standard library; the daemon does the reading and hashing).
GET = ("import http.client, json, sys\n"
       "c = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=3600)\n"
       "c.request('GET', sys.argv[2])\n"
       "r = c.getresponse()\n"
       "body = r.read()\n"
       "if r.status != 200:\n"
       "    sys.exit(f'GET {sys.argv[2]}: {r.status} {body[:200]!r}')\n"
       "print(json.loads(body)['checksum'])\n")


def imageio_daemon():
    """`GET /images/TICKET/checksum` from the daemon (imageio's defaults:
    blake2b, 4 MiB), the checksum printed."""
    def cmd(b, imgs):
        port = imgs.get("imageio_port")
        if port is None:
            return None
        path = f"/images/{TICKET}/checksum"
        return Cmd(f"imageio daemon: GET {path}", [sys.executable, "-c", GET, str(port), path],
                   key=("imageio", "blake2b-256", 4 * MiB))
    return cmd


def construction(name):
    """blksum --construction NAME with its defaults (blake2b-256, 4 MiB for imageio)."""
    def cmd(b, imgs):
        c = b.ours("blake2b-256", imgs["raw"])
        argv = [c.argv[0], "--construction", name] + c.argv[1:]
        argv[argv.index("-d") + 1:argv.index("-d") + 2] = ["blake2b-256", "--block-size", "4m"]
        key = (name, "blake2b-256", 4 * MiB) if name == "imageio" else ("blkhash", "b2-4m")
        return Cmd(f"blksum --construction {name} -d blake2b-256 --block-size 4m (cache)",
                   argv, ours=True, key=key)
    return cmd


def free_port():
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(d, port):
    """imageio's configuration in `d`: the remote service on 127.0.0.1:port
    without TLS, a control socket and run dir of its own, its log on
    standard error (nothing under /run or /var/log), privileges kept."""
    conf = d / "conf"
    (conf / "conf.d").mkdir(parents=True)
    (d / "run").mkdir()
    (conf / "conf.d" / "50-bench.conf").write_text(
        f"[daemon]\nrun_dir = {d / 'run'}\ndrop_privileges = false\nsystemd_enable = false\n"
        f"[tls]\nenable = false\n"
        f"[remote]\nhost = 127.0.0.1\nport = {port}\n"
        f"[local]\nenable = false\n"
        f"[control]\ntransport = unix\nsocket = {d / 'run' / 'sock'}\n"
        f"[handlers]\nkeys = stderr\n"
        f"[logger_root]\nhandlers = stderr\nlevel = WARNING\n")
    return conf


def get_json(port, path):
    """The JSON of a GET from the daemon's remote service."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read()
        if r.status != 200:
            raise RuntimeError(f"imageio daemon: GET {path}: {r.status} {body[:200]!r}")
        return json.loads(body)
    finally:
        c.close()


def wait_listening(p, port, log_path):
    """Until the daemon's remote port answers; its log if it exits first."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"imageio daemon exited ({p.returncode}): "
                               f"{log_path.read_text()[-500:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("imageio daemon did not start in 60 s")


def cpu_seconds(pid):
    """User + system CPU seconds of a live process (/proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def daemon(b, imgs):
    """ovirt-imageio's daemon with a read ticket for the raw image (its file
    backend), for the commands of the case; stopped by its pid (SIGTERM,
    then SIGKILL after 10 s), its directory removed. Yields the port as
    "imageio_port" (nothing when there is no venv)."""
    venv = imageio_venv()
    if venv is None:
        yield {}
        return
    with tempfile.TemporaryDirectory(prefix="blkhash-bench-imageio-") as tmp:
        d = Path(tmp)
        port = free_port()
        conf = write_config(d, port)
        img = imgs["raw"]
        ticket = d / "ticket.json"
        ticket.write_text(json.dumps({"uuid": TICKET, "size": img.stat().st_size,
                                      "url": f"file://{img}", "timeout": 86400,
                                      "ops": ["read"]}))
        log_path = d / "daemon.log"
        with open(log_path, "wb") as err:
            p = subprocess.Popen([str(venv / "bin" / "ovirt-imageio"), "-c", str(conf),
                                  "-t", str(ticket)],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_listening(p, port, log_path)
            algs = get_json(port, f"/images/{TICKET}/checksum/algorithms")["algorithms"]
            log(f"imageio daemon (pid {p.pid}) on 127.0.0.1:{port}")
            cpu = cpu_seconds(p.pid)
            yield {"imageio_port": port}
            cpu = cpu_seconds(p.pid) - cpu
            b.r(f"The imageio daemon (file backend, ticket for the raw image) lists "
                f"{len(algs)} algorithms at `/images/TICKET/checksum/algorithms`; its CPU "
                f"time over the case's {b.a.runs} checksum requests: {cpu:.2f} s "
                f"(user + system; its row's RSS and CPU are the HTTP client's).")
            b.r()
        finally:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


IMAGEIO_CASE = ImageCase(
    title="oVirt imageio's checksum ({size}: half data, half holes; blake2b-256, 4 MiB "
          "blocks): blksum's two constructions, imageio's client library and its daemon's "
          "HTTP API",
    image="holes",
    commands={
        "blkhash": construction("blkhash"),
        "imageio": construction("imageio"),
        "client": imageio_client(),
        "daemon": imageio_daemon(),
    },
    ratios=[("imageio", "blkhash"), ("client", "imageio"), ("daemon", "imageio"),
            ("daemon", "client")],
    targets=[
        ("imageio", "blkhash", "≤", 1.05,
         "--construction imageio costs what blkhash 0.11's costs (time ≤ 1.05×)"),
    ],
    around=daemon,
)
