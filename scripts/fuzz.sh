#!/usr/bin/env bash
# Fuzz every parser of untrusted bytes: scripts/fuzz.sh [SECONDS]
#
#   scripts/fuzz.sh 0      each target runs every input of its corpus once
#                          and nothing new: the regression run the test
#                          command makes (scripts/test.sh), a minute or so
#                          once the targets are built
#   scripts/fuzz.sh 600    each target fuzzes for 600 s (default 60): new
#                          inputs, the way bugs are found (fuzz/README.md)
#
# A target's corpus is fuzz/corpus/TARGET: when empty, it starts from the
# committed corpus (fuzz/seeds/TARGET, what long runs ended with) and small
# valid inputs made here (images by qemu-img, when scripts/setup.sh has
# installed it). Needs cargo-fuzz (installed here if missing) and a nightly
# toolchain, or a stable one made to accept nightly flags (below). Every
# target runs; each gets one line here (executions, seconds, result) and
# its whole libFuzzer output in target/fuzz-logs/TARGET.log. Crashes land
# in fuzz/artifacts/TARGET/ and make this script fail once all targets ran.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${1:-60}
case $seconds in
    '' | *[!0-9]*)
        echo "usage: scripts/fuzz.sh [SECONDS] (0: each corpus input once)" >&2
        exit 2
        ;;
esac
targets=(qcow2 nbd_reply nbd_transmission nbd_handshake blkmap check_file state record http_reply)

# cargo fuzz builds with nightly-only flags (-Zsanitizer=address and the
# sanitizer coverage options libFuzzer needs): a nightly toolchain when one
# is installed (rustup toolchain install nightly); on a machine with only a
# stable one (rustup's default, what the test command can count on),
# RUSTC_BOOTSTRAP=1 lets that stable compiler accept the flags. It is set
# for this script's fuzz builds only (their own workspace and target
# directory, fuzz/target), never for the builds that are shipped or tested.
toolchain=(+nightly)
if ! cargo +nightly --version >/dev/null 2>&1; then
    toolchain=()
    export RUSTC_BOOTSTRAP=1
fi
# cargo-fuzz is a cargo subcommand: it has to be installed where cargo
# finds it (~/.cargo/bin, as any `cargo install`), at the versions of its
# lock file.
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (cargo install --locked cargo-fuzz)" >&2
    cargo install --locked cargo-fuzz
fi
logs=$(cd .. && pwd)/target/fuzz-logs
mkdir -p "$logs"

# Small valid images as seeds (512-byte clusters keep them a few KiB).
seeds() {
    local dir=$1 tmp
    command -v qemu-img >/dev/null && command -v qemu-io >/dev/null || return 0
    tmp=$(mktemp -d)
    local n=0
    add() { # NAME CREATE-OPTIONS
        local img=$tmp/$1.qcow2
        qemu-img create -q -f qcow2 -o "$2" "$img" 256k
        qemu-io -f qcow2 -c 'write -P 0x11 0 3k' -c 'write -z 8k 2k' \
            -c 'write -P 0x22 100k 1k' "$img" >/dev/null
        cp "$img" "$dir/seed-$1"
        n=$((n + 1))
    }
    add v2 compat=0.10,cluster_size=512
    add v3 compat=1.1,cluster_size=512
    # Dirty bitmaps (qcow2 v3 only): a directory and tables to parse, one
    # bitmap disabled, both with bits set by the writes after them.
    qemu-img create -q -f qcow2 -o cluster_size=512 "$tmp/bm.qcow2" 256k
    qemu-img bitmap --add -g 4k "$tmp/bm.qcow2" a
    qemu-img bitmap --add -g 512 --disable "$tmp/bm.qcow2" b
    qemu-io -f qcow2 -c 'write -P 0x55 4k 9k' -c 'write -z 100k 4k' "$tmp/bm.qcow2" >/dev/null
    cp "$tmp/bm.qcow2" "$dir/seed-bitmaps-made"
    add v3-4k cluster_size=4k
    add extl2 extended_l2=on,cluster_size=16k
    qemu-img create -q -f raw "$tmp/src.raw" 64k
    qemu-io -f raw -c 'write -P 0x33 0 6k' -c 'write -P 0x44 10k 1k' "$tmp/src.raw" >/dev/null
    for ct in zlib zstd; do
        qemu-img convert -c -O qcow2 -o "compression_type=$ct,cluster_size=512" \
            "$tmp/src.raw" "$dir/seed-compressed-$ct"
    done
    rm -rf "$tmp"
}

# Small block maps as seeds: of qemu-made images, written by blkmap
# (built in the main workspace if needed).
map_seeds() {
    local dir=$1 tmp blkmap=${CARGO_TARGET_DIR:-../target}/release/blkmap
    command -v qemu-img >/dev/null && command -v qemu-io >/dev/null || return 0
    if [ ! -x "$blkmap" ]; then
        # A normal build (RUSTC_BOOTSTRAP would make the main workspace's
        # next build compile its dependencies again).
        env -u RUSTC_BOOTSTRAP cargo build --release -p blktools -p blksum \
            --manifest-path ../Cargo.toml
    fi
    tmp=$(mktemp -d)
    qemu-img create -q -f qcow2 "$tmp/a.qcow2" 64k
    qemu-io -f qcow2 -c 'write -P 0x11 0 3k' -c 'write -z 8k 2k' \
        -c 'write -P 0x22 40k 1k' "$tmp/a.qcow2" >/dev/null
    qemu-img create -q -f raw "$tmp/b.raw" 10000
    qemu-io -f raw -c 'write -P 0x33 0 1k' "$tmp/b.raw" >/dev/null
    "$blkmap" --block-size 512 "$tmp/a.qcow2" "$dir/seed-512" >/dev/null
    "$blkmap" --block-size 4k -d blake3 "$tmp/a.qcow2" "$dir/seed-blake3" >/dev/null
    "$blkmap" --block-size 512 -d md5 "$tmp/b.raw" "$dir/seed-short-last" >/dev/null
    "$blkmap" "$tmp/b.raw" "$dir/seed-64k" >/dev/null
    # Parts: a middle range, and the end of an image with a short last block.
    "$blkmap" --block-size 512 --range 4k+8k "$tmp/a.qcow2" "$dir/seed-part" >/dev/null
    "$blkmap" --block-size 512 -d md5 --range 2/3 "$tmp/b.raw" "$dir/seed-part-end" >/dev/null
    # A checkpoint: a part with a record of its image.
    "${blkmap%/blkmap}/blksum" --checkpoint "$dir/seed-checkpoint" --keep-checkpoint \
        --block-size 512 "$tmp/b.raw" >/dev/null
    rm -rf "$tmp"
}

# Replies to the nbd_transmission target's requests (cookies 1-5: read,
# write, write zeroes, block status, flush): simple, and structured with
# block status.
reply_seeds() {
    python3 - "$1" <<'PY'
import struct, sys
d = sys.argv[1]
def simple(cookie, err=0):
    return struct.pack(">IIQ", 0x67446698, err, cookie)
def chunk(flags, kind, cookie, payload):
    return struct.pack(">IHHQI", 0x668e33ef, flags, kind, cookie, len(payload)) + payload
with open(f"{d}/seed-simple", "wb") as f:
    f.write(bytes([0]) + simple(1) + b"\x11" * 4096 + simple(2) + simple(3, 5) + simple(5))
with open(f"{d}/seed-structured", "wb") as f:
    f.write(bytes([3]) + chunk(1, 1, 1, struct.pack(">Q", 0) + b"\x22" * 4096)
            + chunk(1, 0, 2, b"") + simple(3) + chunk(1, 5, 4, struct.pack(">III", 1, 1 << 20, 3))
            + chunk(0, 32769, 5, struct.pack(">IH", 5, 2) + b"no") + chunk(1, 0, 5, b""))
PY
}

# Checksum files (the first byte holds --check's flags): both line forms,
# an escaped name, a malformed line.
check_seeds() {
    local hex
    hex=$(printf '%064d' 0)
    printf '\0%s  disk.img\n' "$hex" >"$1/seed-plain"
    printf '\4blkhash/sha256/4k (a b) = %s\n\\%s  a\\nb\n' "$hex" "$hex" >"$1/seed-tagged"
    printf '\24%s *missing\nnot a line\n' "$hex" >"$1/seed-mixed"
}

# A side record as blksync writes it, and as earlier versions wrote it.
state_seeds() {
    python3 - "$1" <<'PY'
import hashlib, sys
bodies = {
    "side": "blkhash-input 1\nsize 4096\nmap ab\n"
            "file file 1 2 0 4096 5.000000006 7.000000008 /backup/dst%20copy.raw\n",
    "side-1": "blksync-dst 1\nchecksum ab\nkind file\ndev 1\nino 2\nrdev 0\n"
              "size 4096\nmtime 5.000000006\nctime 7.000000008\n",
}
for name, body in bodies.items():
    with open(f"{sys.argv[1]}/seed-{name}", "w") as f:
        f.write(body + "sha256 " + hashlib.sha256(body.encode()).hexdigest() + "\n")
PY
}

# A checkpoint's record of its image: a qcow2 overlay and its backing
# file (names with a space and a non-ASCII byte), an image with an
# external data file, an NBD export, and a qcow2 image over HTTP with its
# backing file.
record_seeds() {
    python3 - "$1" <<'PY'
import hashlib, sys
bodies = {
    "files": "blkhash-input 1\nsize 1073741824\n"
             "file file 2049 12 0 196616 1700000000.000000001 1700000000.000000002 /img/over%20lay.qcow2\n"
             "file block 5 7 2049 0 1.000000000 2.000000000 /dev/%C3%A9\n",
    "data": "blkhash-input 1\nsize 67108864\n"
            "file file 2049 77 0 393216 1795690889.926266915 1795690890.070266924 /img/img.qcow2\n"
            "data file 2049 78 0 67108864 1795690889.000000001 1795690890.058266923 /img/d.raw\n",
    "export": "blkhash-input 1\nsize 16777216\nnbd unix /run/nbd.sock plain disk\n",
    "http": "blkhash-input 1\nsize 4294967296\n"
            "http https://h/top.qcow2 1245184 \"6571d5a2-130000\" Wed,%2025%20Nov%202026%2010:00:00%20GMT\n"
            "http https://h/base.raw 4294967296 - -\n",
}
for name, body in bodies.items():
    with open(f"{sys.argv[1]}/seed-{name}", "w") as f:
        f.write(body + "sha256 " + hashlib.sha256(body.encode()).hexdigest() + "\n")
PY
}

# Valid handshakes for the nbd_handshake target (flags byte, then the
# server's bytes): fixed newstyle with structured replies, base:allocation
# and block sizes; without structured replies; NBD_OPT_GO unsupported
# (NBD_OPT_EXPORT_NAME); oldstyle; NBD_OPT_STARTTLS acknowledged first.
handshake_seeds() {
    python3 - "$1" <<'PY'
import struct, sys
d = sys.argv[1]
greeting = struct.pack(">QQH", 0x4e42444d41474943, 0x49484156454f5054, 3)
def rep(opt, kind, data=b""):
    return struct.pack(">QIII", 0x0003e889045565a9, opt, kind, len(data)) + data
export = rep(7, 3, struct.pack(">HQH", 0, 1 << 20, 1))
sizes = rep(7, 3, struct.pack(">HIII", 3, 512, 4096, 32 << 20))
meta = rep(10, 4, struct.pack(">I", 1) + b"base:allocation") + rep(10, 1)
seeds = {
    "full": b"\0" + greeting + rep(8, 1) + meta + export + sizes + rep(7, 1),
    "plain": b"\0" + greeting + rep(8, 0x80000001) + export + rep(7, 1),
    "export-name": b"\0" + greeting + rep(8, 0x80000001) + rep(7, 0x80000001)
        + struct.pack(">QH", 1 << 20, 1),
    "oldstyle": b"\0" + struct.pack(">QQQI", 0x4e42444d41474943, 0x0000420281861253, 1 << 20, 1)
        + bytes(124),
    "starttls": b"\1" + greeting + rep(5, 1) + rep(8, 1) + meta + export + rep(7, 1),
}
for name, data in seeds.items():
    with open(f"{d}/seed-{name}", "wb") as f:
        f.write(data)
PY
}

failures=()
for t in "${targets[@]}"; do
    corpus=corpus/$t
    mkdir -p "$corpus"
    if [ -z "$(ls -A "$corpus")" ]; then
        case $t in
            blkmap) map_seeds "$corpus" ;;
            nbd_transmission) reply_seeds "$corpus" ;;
            check_file) check_seeds "$corpus" ;;
            state) state_seeds "$corpus" ;;
            record) record_seeds "$corpus" ;;
            nbd_handshake) handshake_seeds "$corpus" ;;
            *) seeds "$corpus" ;;
        esac
        # The corpus a long run ended with (minimized): a short run starts there.
        if [ -d "seeds/$t" ]; then
            cp seeds/"$t"/* "$corpus"/
        fi
    fi
    log=$logs/$t.log
    start=$SECONDS
    # -runs=0: the corpus only (libFuzzer runs every input of it once).
    if [ "$seconds" -eq 0 ]; then
        limit=(-runs=0)
    else
        limit=(-max_total_time="$seconds")
    fi
    if cargo "${toolchain[@]}" fuzz run -O "$t" "$corpus" -- \
        "${limit[@]}" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
        >"$log" 2>&1; then
        result=ok
    else
        result="FAILED (exit $?)"
        failures+=("$t")
    fi
    # libFuzzer's last words on a clean end: "Done N runs in S second(s)".
    done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1 || true)
    runs=$(awk '{print $2}' <<<"$done_line")
    secs=$(awk '{print $5}' <<<"$done_line")
    printf 'fuzz: %-17s %10s runs in %4s s (%4d s with the build): %s\n' \
        "$t" "${runs:-?}" "${secs:-?}" $((SECONDS - start)) "$result"
    if [ "$result" != ok ]; then
        # What went wrong (the crash, the build error), without the log's bulk.
        tail -n 40 "$log" | sed "s/^/fuzz: $t: /"
    fi
done
echo "fuzz: whole output in $logs/"
if [ ${#failures[@]} -gt 0 ]; then
    echo "fuzz: failed: ${failures[*]} (crash inputs in fuzz/artifacts/)" >&2
    exit 1
fi
