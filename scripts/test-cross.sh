#!/usr/bin/env bash
# arm64 (aarch64) Linux, tested on this x86_64 machine (scripts/test.sh's
# "arm64" step):
# - the unit tests of blkhash, blkhash-map, blkhash-job, blkhash-image and
#   blksum, blkhash's property, model and vector tests, blkhash-map's map
#   and part tests and blksum's vector test, cross-compiled for
#   aarch64-unknown-linux-gnu by Debian's cross toolchain and run under
#   QEMU's user-mode emulation: qemu-aarch64 as cargo's runner for the
#   target, and binfmt_misc for the commands the tests start;
# - blkhash's tests again with the CPU's SHA-2 instructions hidden from the
#   run-time detection (scripts/cross/no-sha2.c), so that both SHA-256
#   kernels are checked: the ARMv8 SHA-2 one (QEMU's CPU has the
#   instructions) and the portable NEON one;
# - the rest of what the arm64 packages hold (the other commands,
#   libblkhash, the Python module) checked by the compiler for aarch64;
# - blksum for aarch64 on real images, raw and qcow2 made by qemu-img,
#   giving the x86_64 build's checksums.
# Emulation says nothing about speed: every figure of docs/performance.md
# is x86_64.
#
# Needs (scripts/setup.sh installs them on Debian and Ubuntu):
# gcc-aarch64-linux-gnu and libc6-dev-arm64-cross, qemu-user with
# qemu-user-binfmt (binfmt_misc mounted, the qemu-aarch64 handler
# enabled), and the Rust target (rustup target add
# aarch64-unknown-linux-gnu). Without one of them it fails, saying which.
# Built with the quick profile (Cargo.toml: release without its
# link-time optimization: emulation measures nothing, and those links were
# most of this step's time), in target/aarch64-unknown-linux-gnu/quick;
# the arm64 packages (scripts/package.sh) are built with the release
# profile.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "test-cross: $*" >&2; exit 1; }
say() { echo "test-cross: $*"; }

triple=aarch64-unknown-linux-gnu
sysroot=/usr/aarch64-linux-gnu

# What it needs, each missing one named with where it comes from.
command -v aarch64-linux-gnu-gcc >/dev/null ||
    fail "no aarch64-linux-gnu-gcc: install gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (scripts/setup.sh does)"
[ -e "$sysroot/lib/ld-linux-aarch64.so.1" ] ||
    fail "no $sysroot/lib/ld-linux-aarch64.so.1: install libc6-dev-arm64-cross (scripts/setup.sh does)"
command -v qemu-aarch64 >/dev/null ||
    fail "no qemu-aarch64: install qemu-user and qemu-user-binfmt (scripts/setup.sh does)"
grep -qx "$triple" <<<"$(rustup target list --installed 2>/dev/null)" ||
    fail "the Rust target $triple is not installed: rustup target add $triple (scripts/setup.sh tries; see its output for why it could not)"
binfmt=/proc/sys/fs/binfmt_misc/qemu-aarch64
[ "$(head -1 "$binfmt" 2>/dev/null)" = enabled ] ||
    fail "no enabled qemu-aarch64 handler in binfmt_misc ($binfmt): the tests start aarch64 commands; mount binfmt_misc and run update-binfmts --enable qemu-aarch64 (scripts/setup.sh does, as root)"

target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$PWD/$target ;; esac
export CARGO_TARGET_DIR=$target
var=CARGO_TARGET_$(tr 'a-z-' 'A-Z_' <<<"$triple")
export "${var}_LINKER=aarch64-linux-gnu-gcc"
# The test binaries run under qemu-aarch64 with the cross C library; the
# commands they start run through binfmt_misc, which finds that library
# through QEMU_LD_PREFIX.
export "${var}_RUNNER=qemu-aarch64 -L $sysroot"
export QEMU_LD_PREFIX=$sysroot

tmp=$(mktemp -d "${TMPDIR:-/tmp}/blkhash-cross-XXXXXX")
trap 'rm -rf "$tmp"' EXIT

start=$SECONDS
took() { printf '%dm%02ds' $(((SECONDS - $1) / 60)) $(((SECONDS - $1) % 60)); }

# part NAME COMMAND...: run COMMAND in a subshell that stops at its first
# failure, and go on to the next part whatever it gives: one failing test
# must not hide the parts after it. The step fails at the end, naming the
# parts that failed.
failed=()
part() {
    local name=$1 t=$SECONDS rc
    shift
    set +e
    (set -e; "$@")
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
        say "$name: ok in $(took "$t")"
    else
        say "$name: FAILED (exit $rc) in $(took "$t")"
        failed+=("$name")
    fi
}

# Every test this step runs, built by one cargo call and run by another
# with the same packages and targets: a call with other packages would
# resolve other features for the dependencies they share and rebuild them.
profile=quick
tests=(--profile "$profile" --target "$triple"
    -p blkhash -p blkhash-map -p blkhash-job -p blkhash-image -p blksum
    --lib --test vectors --test model --test limits --test map --test parts)
cargo test --no-run --message-format=json-render-diagnostics "${tests[@]}" > "$tmp/built.json"
say "tests built for $triple in $(took "$start")"

# The libraries' unit tests; blkhash's property, model and vector tests;
# blkhash-map's map and part tests; blksum's vectors (--lib and the
# integration tests by name: not the doc examples, which the x86_64 run
# covers, nor blkhash-image's and blksum's command tests, which need QEMU's
# tools and servers).
# BLKHASH_TEST_SHA2=1: QEMU's CPU has the SHA-2 instructions, and
# blkhash's kernel test checks they are found and used.
# BLKHASH_TEST_PIPES=differing: blksum's vectors from a pipe only where the
# exact bytes have a checksum of their own (blksum/tests/vectors.rs).
# Skipped: huge_zero_range_is_cheap, a bound on time (8 TiB of zeros in
# under a minute), which emulation says nothing about; and a map of a
# range wholly past the end of its file, which a kernel refuses
# (MADV_POPULATE_READ: EFAULT, a touch: SIGBUS) and qemu-user 7.2 reads
# without an error (seen: Ok where the test wants the error): emulation,
# not aarch64. x86_64 runs both natively; the file's size is also checked
# when a run ends (RawFile::finish).
part "unit, property and vector tests under qemu-aarch64" \
    env BLKHASH_TEST_SHA2=1 BLKHASH_TEST_PIPES=differing cargo test --no-fail-fast "${tests[@]}" -- \
    --skip huge_zero_range_is_cheap \
    --skip mapped::tests::a_range_is_lent_in_place_and_a_shrunk_file_is_an_error

# blkhash's test programs again on a CPU without the SHA-2 instructions:
# the shim hides them from getauxval(), in the emulated program only (-E),
# so that both SHA-256 kernels are checked: the ARMv8 SHA-2 one (above) and
# the portable NEON one. Run directly (cargo test with one package would
# rebuild, see above), as cargo runs them: from the package's directory.
no_sha2() {
    aarch64-linux-gnu-gcc -O2 -Wall -Werror -shared -fPIC -o "$tmp/no-sha2.so" scripts/cross/no-sha2.c
    local programs
    programs=$(python3 -c '
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] \
            and m["manifest_path"] == sys.argv[2]:
        print(m["executable"])
' "$tmp/built.json" "$PWD/blkhash/Cargo.toml")
    [ "$(wc -l <<<"$programs")" -eq 4 ] || fail "blkhash's test programs: want 4 (lib, limits, model, vectors), found: $programs"
    local p
    for p in $programs; do
        (cd blkhash && BLKHASH_TEST_SHA2=0 qemu-aarch64 -L "$sysroot" -E LD_PRELOAD="$tmp/no-sha2.so" \
            "$p" --skip huge_zero_range_is_cheap)
    done
}
part "blkhash's tests without the SHA-2 instructions" no_sha2

# What the arm64 packages hold beyond the tests above compiles for aarch64
# too: the other commands, libblkhash and the Python module (checked, not
# built: their code has nothing of its own to run under emulation, and the
# commands' and the C library's link is that of blksum above).
part "the rest of the workspace checked for aarch64" \
    cargo check --profile "$profile" --target "$triple" -p blktools -p libblkhash -p blkhash-python

# blksum for aarch64 on real images: raw with data, holes and zeros, and
# its qcow2 conversions (zlib- and zstd-compressed), the checksums the
# x86_64 build prints (target/release, built by scripts/test.sh's build
# step, else here).
aarch64_blksum() {
    [ -x "$target/release/blksum" ] || cargo build --release -p blksum
    # Built above for blksum's vectors test.
    arm=$target/$triple/$profile/blksum
    grep -q 'ARM aarch64' <<<"$(file -L "$arm")" || fail "$arm is not an aarch64 program: $(file -L "$arm")"
    head -c 3M /dev/urandom > "$tmp/disk.raw"
    truncate -s 24M "$tmp/disk.raw"
    seq 1 300000 | dd of="$tmp/disk.raw" bs=1M seek=9 conv=notrunc status=none
    dd if=/dev/zero of="$tmp/disk.raw" bs=1M seek=16 count=2 conv=notrunc status=none
    qemu-img convert -f raw -O qcow2 "$tmp/disk.raw" "$tmp/disk.qcow2"
    qemu-img convert -c -f raw -O qcow2 "$tmp/disk.raw" "$tmp/zlib.qcow2"
    qemu-img convert -c -f raw -O qcow2 -o compression_type=zstd "$tmp/disk.raw" "$tmp/zstd.qcow2"
    for d in sha256 blake3 sha512; do
        want=$("$target/release/blksum" -d "$d" "$tmp/disk.raw")
        want=${want%% *}
        for img in disk.raw disk.qcow2 zlib.qcow2 zstd.qcow2; do
            # Run as a user runs it: the kernel hands it to qemu-aarch64 (binfmt).
            got=$("$arm" -d "$d" "$tmp/$img")
            [ "${got%% *}" = "$want" ] || fail "$d $img: aarch64 blksum $got, x86_64 $want"
        done
        got=$("$arm" -d "$d" - < "$tmp/disk.raw")
        [ "${got%% *}" = "$want" ] || fail "$d from a pipe: aarch64 blksum $got, x86_64 $want"
    done
}
part "aarch64 blksum on raw, qcow2, zlib and zstd qcow2 and a pipe: the x86_64 checksums" aarch64_blksum
if [ "${#failed[@]}" -gt 0 ]; then
    fail "$(printf '%s; ' "${failed[@]}")failed, in $(took "$start")"
fi
say "ok in $(took "$start") (emulated: no speed figures)"
