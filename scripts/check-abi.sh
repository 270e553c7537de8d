#!/usr/bin/env bash
# The C library's ABI against libblkhash 0.11's:
#   scripts/check-abi.sh [LIBRARY]     (default: target/release/libblkhash.so)
#
# - the SONAME is libblkhash.so.0;
# - the exported symbols (nm -D --defined-only), with their kind and symbol
#   version, are exactly those of libblkhash/abi/libblkhash.so.0.symbols;
# - blkhash.h declares exactly those functions, and
#   debian/libblkhash0.symbols (dpkg-gensymbols' list) names the same;
# - the public struct and constant of blkhash.h have 0.11's layout and value.
# Builds the library (cargo build --release, as scripts/test.sh does) when
# LIBRARY is not given and not built yet.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "check-abi: $*" >&2; exit 1; }

lib=${1:-${CARGO_TARGET_DIR:-target}/release/libblkhash.so}
if [ $# -eq 0 ] && [ ! -e "$lib" ]; then
    cargo build --release
fi
[ -e "$lib" ] || fail "$lib: no such file"
expected=libblkhash/abi/libblkhash.so.0.symbols
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

soname=$(objdump -p "$lib" | awk '$1 == "SONAME" { print $2 }')
[ "$soname" = libblkhash.so.0 ] || fail "$lib: SONAME is '$soname', not libblkhash.so.0"

# NAME KIND VERSION for each exported symbol: nm writes NAME@@VERSION (the
# default version), NAME@VERSION, or NAME alone for an unversioned symbol.
nm -D --defined-only "$lib" | awk '{
    name = $3; version = "-"
    if (index(name, "@")) { version = name; sub(/^[^@]*@+/, "", version); sub(/@.*/, "", name) }
    print name, $2, version
}' | LC_ALL=C sort > "$tmp/actual"
grep -v '^#' "$expected" | grep -v '^$' | LC_ALL=C sort > "$tmp/expected"
if ! diff -u "$tmp/expected" "$tmp/actual" > "$tmp/diff"; then
    cat "$tmp/diff" >&2
    fail "$lib exports other symbols than $expected (- expected, + exported)"
fi

# The functions blkhash.h declares (comments removed by the preprocessor).
cc -E -P -x c libblkhash/include/blkhash.h | grep -oE '\bblkhash_[a-z0-9_]+ *\(' |
    tr -d ' (' | LC_ALL=C sort -u > "$tmp/header"
awk '{ print $1 }' "$tmp/expected" > "$tmp/names"
if ! diff -u "$tmp/names" "$tmp/header" > "$tmp/diff"; then
    cat "$tmp/diff" >&2
    fail "blkhash.h declares other functions than $expected lists (- listed, + declared)"
fi
# Lines marked (arch=...) are extras of one architecture, not libblkhash
# 0.11's API: on arm64 the blake3 crate exports its portable compression
# function (#[no_mangle], for its NEON C code to call), and every cdylib
# linking blake3 exports it too.
grep '^ ' debian/libblkhash0.symbols | grep -v '^ *(arch=' |
    sed 's/^ *\([^@ ]*\).*/\1/' | LC_ALL=C sort > "$tmp/debian"
if ! diff -u "$tmp/names" "$tmp/debian" > "$tmp/diff"; then
    cat "$tmp/diff" >&2
    fail "debian/libblkhash0.symbols names other symbols than $expected (- listed, + there)"
fi

# The layout programs compiled against 0.11's header rely on (x86_64 and
# other LP64 targets: a pointer then an int, padded to 16 bytes).
cat > "$tmp/layout.c" <<'EOF'
#include <stddef.h>
#include "blkhash.h"
_Static_assert(BLKHASH_MAX_MD_SIZE == 64, "BLKHASH_MAX_MD_SIZE");
_Static_assert(offsetof(struct blkhash_completion, user_data) == 0, "user_data offset");
_Static_assert(offsetof(struct blkhash_completion, error) == sizeof(void *), "error offset");
_Static_assert(sizeof(struct blkhash_completion) == 2 * sizeof(void *), "struct size");
int main(void) { return 0; }
EOF
cc -std=c99 -Ilibblkhash/include -o "$tmp/layout" "$tmp/layout.c" ||
    fail "blkhash.h: struct blkhash_completion or BLKHASH_MAX_MD_SIZE differs from libblkhash 0.11's"

echo "check-abi: ok ($lib: SONAME $soname, $(wc -l < "$tmp/actual") symbols as libblkhash 0.11, unversioned)"
