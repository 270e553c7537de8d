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
#   what to install;
# - the OCI image archive of the same build (scripts/package.sh --oci):
#   what skopeo inspect sees (this architecture's image under the image
#   index tagged VERSION, user 65532, PATH, the labels), its root file
#   system unpacked by umoci (the commands, no shell), and its blksum run
#   there as the image's user on a vector's image.
# chroot needs root: as another user it runs in a user namespace of its
# own (unshare -r), or fails saying so.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "test-static: $*" >&2; exit 1; }

arch=$(uname -m)
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
name=blkhash-$version-$arch-linux-musl
target=${CARGO_TARGET_DIR:-target}
scripts/package.sh --static="$arch" --static-profile=quick --oci
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

# The OCI image archive.
oci=$target/dist-quick/blkhash-$version-oci.tar
case $arch in x86_64) goarch=amd64 ;; aarch64) goarch=arm64 ;; *) fail "no OCI image for $arch" ;; esac
config=$(skopeo inspect --config "oci-archive:$oci:$version") || fail "skopeo inspect --config $oci"
raw=$(skopeo inspect --raw "oci-archive:$oci:$version") || fail "skopeo inspect --raw $oci"
python3 - "$version" "$goarch" "$(git rev-parse HEAD)" "$config" "$raw" <<'PYEOF'
import json, sys
version, goarch, revision, config, raw = sys.argv[1:]
config, raw = json.loads(config), json.loads(raw)
def check(ok, what):
    if not ok:
        sys.exit(f"test-static: OCI image: {what}: {json.dumps(config)[:2000]}")
check(raw.get("mediaType") == "application/vnd.oci.image.index.v1+json", f"{version} is not an image index: {raw}")
check([m["platform"] for m in raw["manifests"]] == [{"architecture": goarch, "os": "linux"}],
      f"the index's platforms: {raw['manifests']}")
check((config["architecture"], config["os"]) == (goarch, "linux"), "architecture")
c = config["config"]
check(c.get("User") == "65532:65532", "not user 65532")
check("PATH=/usr/bin" in c.get("Env", []), "PATH")
check(c.get("Cmd") == ["blksum", "--help"], "Cmd")
labels = c.get("Labels", {})
want = {"org.opencontainers.image.version": version, "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.licenses": "MIT OR Apache-2.0"}
check(all(labels.get(k) == v for k, v in want.items()), "labels")
check(labels.get("org.opencontainers.image.source", "").startswith("https://"), "source label")
PYEOF

# Its root file system as umoci unpacks it: the commands, no shell.
layout=$tmp/oci-layout bundle=$tmp/oci-bundle
mkdir -p "$layout"
tar -xf "$oci" -C "$layout"
umoci unpack --rootless --image "$layout:$version-$goarch" "$bundle" >/dev/null
rootfs=$bundle/rootfs
for b in blksum blkmap blkdiff blksync; do
    [ -x "$rootfs/usr/bin/$b" ] || fail "$oci: no /usr/bin/$b"
done
shells=$(find "$rootfs" -name sh -o -name bash -o -name busybox -o -name 'ld-*.so*' -o -name 'libc.so*')
[ -z "$shells" ] || fail "$oci: not only the commands: $shells"
[ "$(stat -c %a "$rootfs/tmp")" = 1777 ] || fail "$oci: /tmp is not 1777"
grep -q '"uid": *65532' "$bundle/config.json" || fail "$oci: the bundle's process does not run as 65532"

# Its blksum, run there as the image's user (as root, which chroot
# needs; in a user namespace the one user mapped is root), on a vector's
# image.
recipe="8m:t 8m:- 8m:r 8m:0"
want=$(python3 - "$recipe" <<'PYEOF'
import json, sys
for v in json.load(open("testkit/data/vectors.json"))["vectors"]:
    if (v["recipe"], v["digest"], v["block_size"], v.get("format")) == (sys.argv[1], "sha256", 65536, None):
        print(v["file"])
        break
PYEOF
)
[ -n "$want" ] || fail "no vector of $recipe for the OCI check"
"$mkimage" "$recipe" "$rootfs/tmp/disk.raw"
chmod 644 "$rootfs/tmp/disk.raw"
if [ "$(id -u)" -eq 0 ]; then
    got=$(chroot --userspec=65532:65532 "$rootfs" /usr/bin/blksum /tmp/disk.raw)
else
    got=$(unshare -r chroot "$rootfs" /usr/bin/blksum /tmp/disk.raw)
fi
[ "$got" = "$want  /tmp/disk.raw" ] || fail "the OCI image's blksum: want $want, got $got"
echo "test-static: ok ($oci: $goarch, user 65532, no shell, its blksum gives the vector's checksum)"
