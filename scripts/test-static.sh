#!/usr/bin/env bash
# The static tarball of this machine's architecture
# (blkhash-VERSION-ARCH-linux-musl.tar.gz) as a user gets it
# (scripts/test.sh's "static" step), made as scripts/package.sh
# --static=ARCH makes the release's, with the quick profile
# (--static-profile: no link-time optimization, which static linking and
# every check below are blind to, and whose links were most of this step's
# time):
# - unpacked, its four commands statically linked (no program interpreter,
#   no shared library), with manual pages, completions, licenses, README;
# - blksum run in an empty chroot that holds nothing but itself and test
#   images (no C library, no loader, no /proc, no /dev): every reference
#   vector of testkit/data/vectors.json gives its checksum there, raw
#   images by path (a call per digest and block size) and through a pipe
#   (the vectors whose exact-length checksum differs), qcow2 images made by
#   qemu-img by path;
# - a format read through qemu-nbd, which the chroot has not, fails saying
#   what to install.
# chroot needs root: as another user it runs in a user namespace of its
# own (unshare -r), or fails saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "test-static: $*" >&2; exit 1; }

arch=$(uname -m)
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
name=blkhash-$version-$arch-linux-musl
target=${CARGO_TARGET_DIR:-target}
scripts/package.sh --static="$arch" --static-profile=quick
tarball=$target/dist-quick/$name.tar.gz
mkimage=$target/release/mkimage
[ -x "$mkimage" ] || cargo build --release -p testkit --bin mkimage

tmp=$(mktemp -d "${TMPDIR:-/tmp}/blkhash-static-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tarball" -C "$tmp"
dir=$tmp/$name
for f in blksum blkmap blkdiff blksync man/man1/blksum.1 man/man1/blksync.1 \
    complete/blksum.bash complete/_blksum complete/blksum.fish LICENSE-MIT LICENSE-APACHE README.md; do
    [ -s "$dir/$f" ] || fail "$tarball: no $name/$f"
done
for b in blksum blkmap blkdiff blksync; do
    elf=$(readelf -ldW "$dir/$b")
    ! grep -q 'INTERP\|(NEEDED)' <<<"$elf" || fail "$b is not statically linked: $(file "$dir/$b")"
    grep -q ', stripped' <<<"$(file "$dir/$b")" || fail "$b is not stripped"
done

# The chroot: blksum and the images, nothing else.
root=$tmp/root
mkdir -p "$root"
cp "$dir/blksum" "$root/blksum"
in_root=(chroot "$root")
if [ "$(id -u)" -ne 0 ]; then
    unshare -r true 2>/dev/null ||
        fail "chroot needs root, and user namespaces (unshare -r) are not available here"
    in_root=(unshare -r chroot "$root")
fi

python3 - "$root" "$mkimage" "${in_root[@]}" <<'EOF'
import collections, json, os, subprocess, sys

root, mkimage, *in_root = sys.argv[1:]
vectors = json.load(open("testkit/data/vectors.json"))["vectors"]
raws = {}   # recipe -> image name in the chroot

def raw(recipe):
    if recipe not in raws:
        name = f"r{len(raws)}.raw"
        subprocess.run([mkimage, recipe, os.path.join(root, name)], check=True)
        raws[recipe] = name
    return raws[recipe]

def blksum(args, stdin=None):
    p = subprocess.run(in_root + ["/blksum"] + args, stdin=stdin, capture_output=True)
    if p.returncode != 0:
        sys.exit(f"test-static: chroot blksum {' '.join(args)}: exit {p.returncode}: "
                 + p.stderr.decode(errors="replace"))
    return p.stdout.decode().splitlines()

checked = 0
# Raw and qcow2 images by path, one call per digest and block size.
groups = collections.defaultdict(list)
for i, v in enumerate(vectors):
    if v.get("format") is None:
        path = raw(v["recipe"])
    else:
        path = f"v{i}.{v['format']}"
        opts = (v.get("options") or "").split()
        subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", v["format"], *opts,
                        os.path.join(root, raw(v["recipe"])), os.path.join(root, path)], check=True)
    groups[(v["digest"], v["block_size"])].append((v, "/" + path))
for (digest, bs), group in sorted(groups.items()):
    lines = blksum(["-d", digest, "--block-size", str(bs)] + [p for _, p in group])
    want = [f"{v['file']}  {p}" for v, p in group]
    if lines != want:
        bad = next((w, l) for w, l in zip(want + [None] * len(lines), lines + [None] * len(want)) if w != l)
        sys.exit(f"test-static: {digest} --block-size {bs}: want {bad[0]!r}, got {bad[1]!r}")
    checked += len(group)
# Through a pipe: the exact bytes, where their checksum is not the file's.
for v in vectors:
    if v.get("format") is None and v.get("pipe"):
        with open(os.path.join(root, raw(v["recipe"])), "rb") as f:
            got = blksum(["-d", v["digest"], "--block-size", str(v["block_size"])], stdin=f)
        if got != [f"{v['pipe']}  -"]:
            sys.exit(f"test-static: pipe {v['recipe']} {v['digest']}: want {v['pipe']}, got {got}")
        checked += 1
print(f"test-static: {checked} vector checksums in the chroot "
      f"({len(raws)} raw images, {sum(1 for v in vectors if v.get('format'))} qcow2)")
EOF

# A format read through qemu-nbd: in the chroot, which has no qemu-nbd (nor
# a /tmp), and outside it with no qemu-nbd on PATH: the message says what
# to install, as the glibc build's does.
qemu-img create -q -f vmdk "$root/disk.vmdk" 1M
for how in chroot path; do
    if [ $how = chroot ]; then
        out=$("${in_root[@]}" /blksum /disk.vmdk 2>&1) && rc=0 || rc=$?
    else
        out=$(env PATH="$tmp/empty" "$dir/blksum" "$root/disk.vmdk" 2>&1) && rc=0 || rc=$?
    fi
    [ "$rc" = 1 ] || fail "blksum of a vmdk image without qemu-nbd ($how): exit $rc: $out"
    grep -q 'qemu-nbd, which is not installed: install qemu-utils' <<<"$out" ||
        fail "blksum of a vmdk image without qemu-nbd ($how): $out"
done
echo "test-static: ok ($tarball: static, runs with nothing beside it; without qemu-nbd: $out)"
