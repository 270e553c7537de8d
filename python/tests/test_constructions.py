"""construction="imageio" and "pbs": oVirt imageio's checksum and a Proxmox
Backup Server fixed index's index_csum, from new(), checksum() and merge(),
checked against their definitions computed here with hashlib."""

import hashlib
import struct

import pytest

import blkhash
from conftest import recipe_bytes, write_image

# A size that is a multiple of 512 (a raw file is hashed at QEMU's size, rounded
# up to 512) but of no block size: the last block is short.
RECIPE = "3m:r 2m:- 4m:0 1m:t 700416:r"
MIB = 1 << 20


def imageio(data, name="blake2b", block_size=4 * MIB):
    """imageio's checksum API by its definition (ovirt_imageio blkhash.Hash):
    H(H(block 0) || ... || H(block n-1)), hashlib's blake2b at 32 bytes."""
    def new(b=b""):
        if name == "blake2b":
            return hashlib.blake2b(b, digest_size=32)
        return hashlib.new(name, b)
    outer = new()
    for i in range(0, len(data), block_size):
        outer.update(new(data[i:i + block_size]).digest())
    return outer.hexdigest()


def fidx(data, chunk=4 * MIB):
    """A PBS fixed index of data (proxmox-backup docs/file-formats.rst)."""
    digests = b"".join(hashlib.sha256(data[i:i + chunk]).digest()
                       for i in range(0, len(data), chunk))
    csum = hashlib.sha256(digests).digest()
    magic = hashlib.sha256(b"Proxmox Backup fixed sized chunk index v1.0").digest()[:8]
    head = magic + bytes(16) + struct.pack("<q", 0) + csum + struct.pack("<QQ", len(data), chunk)
    return head + bytes(4096 - len(head)) + digests, csum.hex()


def test_new_defaults_and_model():
    data = recipe_bytes(RECIPE)
    h = blkhash.new(None, data, construction="imageio")
    assert (h.name, h.block_size, h.construction) == ("blake2b-256", 4 * MIB, "imageio")
    assert h.hexdigest() == imageio(data)
    h = blkhash.new(construction="pbs")
    h.update(data)
    assert (h.name, h.block_size) == ("sha256", 4 * MIB)
    assert h.hexdigest() == imageio(data, "sha256")
    # imageio's names are taken; other block sizes too.
    h = blkhash.new("sha3_256", data, block_size=MIB, construction="imageio")
    assert h.hexdigest() == imageio(data, "sha3_256", MIB)
    assert blkhash.new("sha256", data).construction == "blkhash"
    with pytest.raises(ValueError, match="unknown construction 'ovirt'"):
        blkhash.new(construction="ovirt")
    # A digest imageio does not compute has no imageio checksum.
    for name in ("md5-sha1", "ripemd160", "sm3", "sha512_224", "shake_128", "blake3"):
        with pytest.raises(ValueError, match="oVirt imageio computes .*, not "):
            blkhash.new(name, construction="imageio")
        with pytest.raises(ValueError, match="oVirt imageio computes"):
            blkhash.checksum("/dev/null", digest=name, construction="imageio")


def test_a_raw_file_of_odd_size_at_its_exact_size(tmp_path, recwarn):
    """imageio's file backend and Proxmox's client read a raw file at its
    size: those constructions hash its exact bytes, with no warning."""
    img = tmp_path / "small.raw"
    data = bytes(range(256)) * 4 + b"tail"
    img.write_bytes(data)
    assert blkhash.checksum(img, construction="imageio") == imageio(data)
    assert blkhash.checksum(img, construction="pbs") == imageio(data, "sha256")
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
    # blkhash 0.11's construction keeps QEMU's rounding, and says so.
    with pytest.warns(UserWarning, match="1028 bytes, hashed as 1536"):
        blkhash.checksum(img)


def test_checksum_of_an_image(tmp_path):
    img = tmp_path / "disk.raw"
    write_image(RECIPE, img)
    data = img.read_bytes()
    assert blkhash.checksum(img, construction="imageio") == imageio(data)
    assert blkhash.checksum(img, construction="pbs") == imageio(data, "sha256")
    assert blkhash.checksum(img, digest="sha256", block_size=4 * MIB) != imageio(data, "sha256")


def test_merge_reads_a_fixed_index(tmp_path):
    img = tmp_path / "disk.raw"
    write_image(RECIPE, img)
    data = img.read_bytes()
    index, csum = fidx(data)
    p = tmp_path / "drive-scsi0.img.fidx"
    p.write_bytes(index)
    assert blkhash.merge([p], construction="pbs") == csum
    assert blkhash.merge([p]) == blkhash.checksum(img, digest="sha256", block_size=4 * MIB)
    assert blkhash.checksum(img, construction="pbs") == csum
    lying = bytearray(index)
    lying[40] ^= 1
    p.write_bytes(lying)
    with pytest.raises(ValueError, match="drive-scsi0.img.fidx: invalid PBS fixed index: index_csum"):
        blkhash.merge([p], construction="pbs")


def test_map_range_parts_merge_in_any_construction(tmp_path):
    img = tmp_path / "disk.raw"
    write_image(RECIPE, img)
    data = img.read_bytes()
    parts = []
    for k in (1, 2):
        out = tmp_path / f"part{k}"
        blkhash.map_range(img, out, part=(k, 2), construction="imageio")
        parts.append(out)
    assert blkhash.merge(parts, construction="imageio") == imageio(data)
    assert blkhash.merge(parts, tmp_path / "disk.map", construction="imageio") == imageio(data)
