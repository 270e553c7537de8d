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
    # A base of another image file: refused by its record of that file.
    other = tmp_path / "other.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", str(other), "16M")
    qemu_io(other, "write -P 9 0 16M")
    other_map = tmp_path / "other.map"
    full_map(other, other_map)
    with pytest.raises(OSError, match="is not the one .*other.map was made from"):
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


def overlay(tmp_path):
    """top.qcow2 over base.qcow2 (data in both), bitmap 'b' on top, and
    top's map then (old.map)."""
    need("qemu-img", "qemu-utils")
    need("qemu-io", "qemu-utils")
    base = tmp_path / "base.qcow2"
    top = tmp_path / "top.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", str(base), "16M")
    qemu_io(base, "write -P 1 0 12M")
    run("qemu-img", "create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(top))
    qemu_io(top, "write -P 2 2M 1M")
    run("qemu-img", "bitmap", "--add", str(top), "b")
    old = tmp_path / "old.map"
    full_map(top, old)
    return base, top, old


def refused(img, old, out, match):
    with pytest.raises(OSError, match=match):
        blkhash.update_map(img, old, "b", out)
    assert not out.exists()
    with pytest.raises(OSError):
        blkhash.update_map(img, old, "b", out, verify=True)
    assert not out.exists()


def test_changes_no_bitmap_records_are_refused(disk, tmp_path):
    """What a dirty bitmap never sees ends in OSError, nothing written:
    a shrink and grow, a base made before the bitmap, a backing file
    written, an unsafe rebase, a data file written outside QEMU."""
    img, base = disk
    out = tmp_path / "out.map"
    # Data at 8 MiB cut off, then the image grown again.
    run("qemu-img", "resize", "-q", "--shrink", str(img), "6M")
    run("qemu-img", "resize", "-q", str(img), "16M")
    refused(img, base, out, "bitmap 'b'")

    # A write into a hole of the base before the bitmap was made.
    d = tmp_path / "before"
    d.mkdir()
    img = d / "disk.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", str(img), "16M")
    qemu_io(img, "write -P 1 0 4M")
    old = d / "old.map"
    full_map(img, old)
    qemu_io(img, "write -P 2 12M 64k")
    run("qemu-img", "bitmap", "--add", str(img), "b")
    refused(img, old, out, "12582912\\+65536.*allocation")

    d = tmp_path / "backing"
    d.mkdir()
    backing, top, old = overlay(d)
    qemu_io(backing, "write -P 7 6M 64k")
    refused(top, old, out, "base.qcow2 changed after")

    d = tmp_path / "rebase"
    d.mkdir()
    other = d / "other.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", str(other), "16M")
    backing, top, old = overlay(d)
    run("qemu-img", "rebase", "-u", "-b", str(other), "-F", "qcow2", str(top))
    refused(top, old, out, "no longer reads .*base.qcow2")

    d = tmp_path / "data"
    d.mkdir()
    img = d / "img.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", "-o",
        f"data_file={d / 'd.raw'},data_file_raw=on", str(img), "16M")
    qemu_io(img, "write -P 1 0 4M")
    run("qemu-img", "bitmap", "--add", str(img), "b")
    old = d / "old.map"
    full_map(img, old)
    with open(d / "d.raw", "r+b") as f:
        f.seek(2 * MiB)
        f.write(b"\x55" * 4096)
    refused(img, old, out, "d.raw \\(the image's data file\\) was written after QEMU")
    # Written through QEMU, the bitmap records it: the update goes on.
    img2 = d / "img2.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", "-o",
        f"data_file={d / 'd2.raw'},data_file_raw=on", str(img2), "16M")
    qemu_io(img2, "write -P 1 0 4M")
    run("qemu-img", "bitmap", "--add", str(img2), "b")
    old2 = d / "old2.map"
    full_map(img2, old2)
    qemu_io(img2, "write -P 3 1M 4k")
    assert blkhash.update_map(img2, old2, "b", out) == blkhash.checksum(img2)


def test_update_map_refuses_another_file_renamed_over_the_image(disk, tmp_path):
    """A copy of the image, changed in one block before its own bitmap was
    added, renamed over it: its bitmap cannot say what changed."""
    img, base = disk
    copy = tmp_path / "copy.qcow2"
    copy.write_bytes(img.read_bytes())
    qemu_io(copy, "write -P 9 1M 64k")
    run("qemu-img", "bitmap", "--add", str(copy), "nb")
    os.rename(copy, img)
    out = tmp_path / "new.map"
    with pytest.raises(OSError, match="not the one"):
        blkhash.update_map(img, base, "nb", out)
    assert not out.exists()
    # Every block read: the block the bitmap missed is found.
    with pytest.raises(OSError, match="1048576"):
        blkhash.update_map(img, base, "nb", out, verify=True)
