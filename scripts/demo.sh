#!/usr/bin/env bash
# Build blksum and hash a real image: a 4 GiB sparse file with data written
# at a few places, next to sha256sum's time on the same file.
set -euo pipefail
cd "$(dirname "$0")/.."

# qemu-img (for its view of the image) and nothing else of the test tools.
scripts/setup.sh --demo
# Only what the demo runs: blksum (not the Python extension or the C library),
# its dependencies' features as scripts/install.sh builds them: after an
# install nothing is built here. After scripts/package.sh --wheel it is:
# the wheel holds no blksum, and its build gives some dependencies other
# features.
echo "demo: building blksum (release: from a fresh clone some minutes, the last" \
    "one its link-time optimization; nothing after scripts/install.sh)"
cargo build --release -p blksum

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
img="$dir/demo.img"
truncate -s 4G "$img"
for gib in 0 1 3; do
    dd if=/dev/urandom of="$img" bs=1M count=64 seek=$((gib * 1024)) conv=notrunc status=none
done
# The image's own lines (qemu-img also prints the disk size of its child node).
qemu-img info "$img" | grep -E "^(virtual size|disk size)"

echo "blksum (reads the 192 MiB of data, skips the holes):"
time target/release/blksum "$img"
echo "sha256sum (reads all 4 GiB):"
time sha256sum "$img"
echo "The two checksums differ by design: blksum's is the blkhash construction"
echo "(a digest of the block digests), not a SHA-256 of the whole image."
