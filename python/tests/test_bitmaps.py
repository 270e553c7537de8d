"""QEMU dirty bitmaps: update_map(), dirty_ranges() and bitmaps() against
images made by qemu-img and written by qemu-io, and exports served by
qemu-nbd -B (no fakes). The oracle of update_map() is a full map of the
image: the same bytes, the same checksum."""

import json
import os
import signal
import subprocess

import pytest

import blkhash
from conftest import need

MiB = 1 << 20


def run(*argv):
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def qemu_io(img, *cmds):
    argv = ["qemu-io", "-f", "qcow2"]
    for c in cmds:
        argv += ["-c", c]
    run(*argv, str(img))


@pytest.fixture
def disk(tmp_path):
    """A 16 MiB qcow2 image with data, a bitmap 'b' added after it, and
    its map then (base.map)."""
    need("qemu-img", "qemu-utils")
    need("qemu-io", "qemu-utils")
    img = tmp_path / "disk.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", str(img), "16M")
    qemu_io(img, "write -P 1 0 4M", "write -P 2 8M 2M")
    base = tmp_path / "base.map"
    blkhash.map_range(img, tmp_path / "whole.part")
    blkhash.merge([tmp_path / "whole.part"], base)
    run("qemu-img", "bitmap", "--add", "-g", "64K", str(img), "b")
    return img, base


def full_map(img, out):
    part = out.with_suffix(".part")
    blkhash.map_range(img, part)
    return blkhash.merge([part], out)


def test_update_map_reads_the_dirty_blocks_and_gives_the_full_map(disk, tmp_path):
    img, base = disk
    qemu_io(img, "write -P 3 1M 64k", "write -z 8M 128k", "discard 2M 1M", "write -P 4 15M 4k")
    out = tmp_path / "new.map"
    got = blkhash.update_map(img, base, "b", out)
    want = full_map(img, tmp_path / "full.map")
    assert got == want == blkhash.checksum(img)
    assert out.read_bytes() == (tmp_path / "full.map").read_bytes()
    # The dirty ranges, widened to the 64k granularity.
    assert blkhash.dirty_ranges(img, "b") == [
        (1 * MiB, 64 << 10), (2 * MiB, MiB), (8 * MiB, 128 << 10), (15 * MiB, 64 << 10)]
    # Updating in place, with the audit.
    assert blkhash.update_map(img, base, "b", base, verify=True) == want


def test_bitmaps_lists_names_granularity_and_flags(disk):
    img, _ = disk
    run("qemu-img", "bitmap", "--add", "-g", "1M", "--disable", str(img), "old")
    got = sorted(blkhash.bitmaps(img), key=lambda b: b["name"])
    assert got == [
        {"name": "b", "granularity": 64 << 10, "in_use": False, "enabled": True},
        {"name": "old", "granularity": MiB, "in_use": False, "enabled": False},
    ]
    info = json.loads(subprocess.run(
        ["qemu-img", "info", "--output", "json", str(img)],
        check=True, capture_output=True).stdout)
    qemu = {b["name"]: b["granularity"] for b in info["format-specific"]["data"]["bitmaps"]}
    assert qemu == {b["name"]: b["granularity"] for b in got}


def test_untrustworthy_bitmaps_and_bases_are_refused(disk, tmp_path):
    img, base = disk
    out = tmp_path / "out.map"
    with pytest.raises(OSError, match="no dirty bitmap 'nope'"):
        blkhash.update_map(img, base, "nope", out)
    run("qemu-img", "bitmap", "--disable", str(img), "b")
    with pytest.raises(OSError, match="disabled"):
        blkhash.update_map(img, base, "b", out)
    with pytest.raises(OSError, match="disabled"):
        blkhash.dirty_ranges(img, "b")
    run("qemu-img", "bitmap", "--enable", str(img), "b")
    # A base of another image: its clean blocks do not hold what it says.
    other = tmp_path / "other.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", str(other), "16M")
    qemu_io(other, "write -P 9 0 16M")
    other_map = tmp_path / "other.map"
    full_map(other, other_map)
    with pytest.raises(OSError, match="other.map is not its map"):
        blkhash.update_map(img, other_map, "b", out)
    assert not out.exists()
    # A writer killed mid-write leaves the bitmap in use: refused.
    subprocess.run(["qemu-io", "-f", "qcow2", "-c", "write -P 5 0 64k", "-c", "abort", str(img)],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with pytest.raises(OSError, match="in use"):
        blkhash.update_map(img, base, "b", out)
    assert not out.exists()


def test_an_nbd_export_with_the_bitmap(disk, tmp_path, serve):
    need("qemu-nbd", "qemu-utils")
    img, base = disk
    qemu_io(img, "write -P 3 1M 64k", "write -P 4 15M 4k")
    sock = tmp_path / "nbd.sock"
    serve(["qemu-nbd", "-r", "-t", "-f", "qcow2", "-B", "b", "-k", str(sock), str(img)], str(sock))
    url = f"nbd+unix:///?socket={sock}"
    assert [b["name"] for b in blkhash.bitmaps(url)] == ["b"]
    assert blkhash.dirty_ranges(url, "b") == [(1 * MiB, 64 << 10), (15 * MiB, 64 << 10)]
    out = tmp_path / "new.map"
    assert blkhash.update_map(url, base, "b", out) == blkhash.checksum(url)
    with pytest.raises(OSError, match="qemu:dirty-bitmap:nope"):
        blkhash.dirty_ranges(url, "nope")
