"""The `pbs` case: a Proxmox Backup Server snapshot read from its datastore's
chunks, against zstd decompressing the same chunks alone on every core.

The datastore is written here from the published format (proxmox-backup's
docs/file-formats.rst) over a text image: 4 MiB chunks, each a blob
compressed with zstd at level 1 (as the PBS client does) where that is
smaller, the fixed index and the manifest. The decoder's time is `zstd -dcq`
of the same compressed payloads (copied without their 12-byte blob header),
split over `xargs -P cores`. With `--construction pbs` each chunk's digest
is the block digest (one SHA-256 pass); the default construction digests
64 KiB blocks on top of the chunk check.
"""

import hashlib
import json
import shlex
import struct
import subprocess
import zlib

from common import Cmd, GiB, MiB, human, log, run_case, warm

CHUNK = 4 * MiB


def blob_magic(label):
    return hashlib.sha256(f"Proxmox Backup {label} blob v1.0".encode()).digest()[:8]


def write_datastore(raw, store):
    """The datastore of a backup of `raw` under `store` (made if missing):
    the index's path and the directory of the bare zstd payloads."""
    snap = store / "vm" / "100" / "2026-11-28T10:00:00Z"
    index = snap / "drive-scsi0.img.fidx"
    payloads = store.parent / (store.name + ".zst")
    if index.exists() and index.stat().st_mtime >= raw.stat().st_mtime:
        return index, payloads
    log(f"pbs: writing a datastore of {raw} in {store}")
    snap.mkdir(parents=True, exist_ok=True)
    payloads.mkdir(parents=True, exist_ok=True)
    size = raw.stat().st_size
    digests = b""
    with open(raw, "rb") as f:
        n = 0
        while chunk := f.read(CHUNK):
            d = hashlib.sha256(chunk).digest()
            digests += d
            packed = subprocess.run(["zstd", "-1", "-q", "-c"], input=chunk,
                                    capture_output=True, check=True).stdout
            if len(packed) < len(chunk):
                payload, magic = packed, blob_magic("zstd compressed")
                (payloads / f"{n:08d}.zst").write_bytes(packed)
            else:
                payload, magic = chunk, blob_magic("uncompressed")
            path = store / ".chunks" / d.hex()[:4] / d.hex()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(magic + struct.pack("<I", zlib.crc32(payload)) + payload)
            n += 1
    csum = hashlib.sha256(digests).digest()
    magic = hashlib.sha256(b"Proxmox Backup fixed sized chunk index v1.0").digest()[:8]
    head = (magic + bytes(16) + struct.pack("<q", 1764324000) + csum
            + struct.pack("<QQ", size, CHUNK))
    files = [{"filename": index.name, "crypt-mode": "none", "size": size, "csum": csum.hex()}]
    manifest = {"backup-type": "vm", "backup-id": "100", "backup-time": 1764324000,
                "files": files}
    text = json.dumps(manifest).encode()
    (snap / "index.json.blob").write_bytes(
        blob_magic("uncompressed") + struct.pack("<I", zlib.crc32(text)) + text)
    index.write_bytes(head + bytes(4096 - len(head)) + digests)
    return index, payloads


class PbsCases:
    def case_pbs(self):
        size = self.a.decompress_size or (64 * MiB if self.a.quick else GiB)
        self.r(f"## A Proxmox backup read from its datastore ({human(size)} of text lines in "
               "4 MiB chunks, zstd level 1; sha256)")
        self.r()
        raw = self.image("text", size)
        if not raw:
            return
        index, payloads = write_datastore(raw, raw.with_name(raw.name + ".pbs"))
        for path in [raw, index, *payloads.iterdir(), *(index.parents[3] / ".chunks").rglob("*")]:
            if path.is_file():
                warm(path)
        blksum = self.blksum

        def ours(label, *args, target=index):
            key = ("pbs", CHUNK) if "pbs" in args else ("sha256", self.bs())
            return Cmd(f"blksum {' '.join(args)} {label}".replace("  ", " "),
                       [blksum, "--cache", *args, str(target)], ours=True, key=key)

        unzstd = (f"ls {shlex.quote(str(payloads))}/*.zst | "
                  f"xargs -P {self.cores} -n 16 zstd -dcq > /dev/null")
        c = {
            "zst": Cmd(f"zstd -dcq of the chunks, xargs -P {self.cores}", ["sh", "-c", unzstd]),
            "pbs": ours("X.fidx", "--construction", "pbs"),
            "default": ours("X.fidx"),
            "raw_pbs": ours("raw", "--construction", "pbs", target=raw),
            "raw": ours("raw", target=raw),
        }
        cmds = list(c.values())
        log(f"pbs: {len(cmds)} commands, {self.a.runs} rounds")
        run_case(cmds, self.a.runs, self.a.timeout)
        s = "pbs"
        self.results(s, cmds, size)
        self.ratios([(c["pbs"], c["zst"]), (c["default"], c["zst"]),
                     (c["pbs"], c["raw_pbs"]), (c["default"], c["raw"])])
        self.ratio_target(s, c, "pbs", "zst", "≤", 1.3,
                          "blksum --construction pbs X.fidx ≤ 1.3× zstd decoding its chunks")
        self.ratio_target(s, c, "default", "zst", "≤", 2.2,
                          "blksum X.fidx (the default construction) ≤ 2.2× zstd decoding "
                          "its chunks")
        self.memory_target(s, [c["pbs"], c["default"]], limit=64 * MiB)
        self.r()
