"""Write a virtnbdbackup stream of a raw file with virtnbdbackup's own
writer: its `libvirtnbdbackup` package (the stream's frames and metadata,
`SparseStream`; the payloads, lz4 frames included, `common.writeChunk` and
`common.writeBlock`, which cut extents at the NBD client's request size as
a backup does). What it reads from the disk comes from RAW instead of an
NBD export; nothing else differs from a backup.

    vnbd-stream.py RAW OUT [--frames data:OFF:LEN,zero:OFF:LEN,...]
        [--compress LEVEL] [--incremental] [--disk sda]
        [--checkpoint virtnbdbackup.0] [--parent ''] [--size BYTES]
        [--disk-format qcow2]

Without --frames, the frames are RAW's extents (SEEK_DATA/SEEK_HOLE): data
for data, zero for holes, which an incremental stream leaves out (as
virtnbdbackup's backup does). With --frames, exactly the frames listed, in
their order: virtnbdbackup never writes a zero frame into an incremental
stream, but another writer may, and the tests need one.

Run with the Python virtnbdbackup runs with (its script's first line).
"""

import argparse
import os
from argparse import Namespace

from libvirtnbdbackup.common import common as lib
from libvirtnbdbackup.sparsestream import streamer, types

# The request size virtnbdbackup's NBD client uses: longer extents are cut.
MAX_REQUEST = 32 << 20


class Disk:
    """What the writer asks of the NBD connection: reads at offsets."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_RDONLY)
        self.maxRequestSize = MAX_REQUEST
        self.nbd = self

    def pread(self, length, offset):
        data = os.pread(self.fd, length, offset)
        assert len(data) == length, f"short read at {offset}"
        return data


class Extent:
    """An extent as the backup's loop sees it."""

    def __init__(self, data, offset, length):
        self.data, self.offset, self.length = data, offset, length


def file_extents(path, size):
    """RAW's data and holes, in order."""
    out, off = [], 0
    with open(path, "rb") as f:
        fd = f.fileno()
        while off < size:
            try:
                data = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:
                data = size
            if data > off:
                out.append(Extent(False, off, min(data, size) - off))
                off = min(data, size)
                continue
            hole = min(os.lseek(fd, off, os.SEEK_HOLE), size)
            out.append(Extent(True, off, hole - off))
            off = hole
    return out


def listed_extents(spec):
    out = []
    for item in spec.split(","):
        kind, off, length = item.split(":")
        out.append(Extent(kind == "data", int(off), int(length)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--frames")
    ap.add_argument("--compress", type=int, default=False)
    ap.add_argument("--incremental", action="store_true")
    ap.add_argument("--disk", default="sda")
    ap.add_argument("--checkpoint", default="virtnbdbackup.0")
    ap.add_argument("--parent", default="")
    ap.add_argument("--size", type=int)
    # The format of the disk backed up, which virtnbdrestore restores to.
    ap.add_argument("--disk-format", default="qcow2")
    a = ap.parse_args()
    size = a.size if a.size is not None else os.path.getsize(a.raw)
    extents = listed_extents(a.frames) if a.frames else file_extents(a.raw, size)
    level = "inc" if a.incremental else "full"
    # The namespace the backup's arguments make, as far as the writer reads it.
    args = Namespace(compress=a.compress, level=level,
                     cpt=Namespace(name=a.checkpoint, parent=a.parent))
    stream = streamer.SparseStream(types)
    t = types.SparseStreamTypes()
    con = Disk(a.raw)
    data_size = sum(e.length for e in extents if e.data)
    with open(a.out, "wb") as w:
        meta = stream.dumpMetadata(args, size, data_size,
                                   Namespace(target=a.disk, format=a.disk_format))
        stream.writeFrame(w, t.META, 0, len(meta))
        w.write(meta)
        w.write(t.TERM)
        sizes = []
        for e in extents:
            if not e.data:
                if a.frames or not a.incremental:
                    stream.writeFrame(w, t.ZERO, e.offset, e.length)
                continue
            stream.writeFrame(w, t.DATA, e.offset, e.length)
            if e.length >= con.maxRequestSize:
                n, chunks = lib.writeChunk(w, e, con, "stream", a.compress)
            else:
                n, chunks = lib.writeBlock(w, e, con, "stream", a.compress), None
            w.write(t.TERM)
            if a.compress:
                sizes.append({n: chunks} if chunks else n)
        stream.writeFrame(w, t.STOP, 0, 0)
        if a.compress:
            stream.writeCompressionTrailer(w, sizes)


if __name__ == "__main__":
    main()
