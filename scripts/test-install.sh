#!/usr/bin/env bash
# scripts/install.sh as a user runs it, into a scratch prefix: the commands
# run, a C program builds with pkg-config against the installed library and
# runs, and every manual page (and each function's link page) renders.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=$(mktemp -d /tmp/blkhash-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
fail() { echo "test-install: $*" >&2; exit 1; }

scripts/install.sh "$prefix" > "$prefix.log" 2>&1 || { cat "$prefix.log"; fail "install.sh failed"; }
rm -f "$prefix.log"

for b in blksum blkmap blkdiff blksync; do
    "$prefix/bin/$b" --version >/dev/null || fail "$b does not run"
    file "$prefix/bin/$b" | grep -q ', stripped' || fail "$b is not stripped"
done
[ "$(readlink "$prefix/lib/libblkhash.so")" = libblkhash.so.0 ] || fail "no libblkhash.so link"
objdump -p "$prefix/lib/libblkhash.so.0" | grep -q 'SONAME *libblkhash.so.0' || fail "SONAME"

export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
pkg-config --atleast-version=0.11 blkhash || fail "pkg-config does not find blkhash >= 0.11"
# shellcheck disable=SC2046 # pkg-config's flags are words
cc -o "$prefix/api" libblkhash/tests/c/api.c $(pkg-config --cflags --libs blkhash)
LD_LIBRARY_PATH=$prefix/lib "$prefix/api" | grep -q 'api: ok' || fail "the C program failed"
LD_LIBRARY_PATH=$prefix/lib ldd "$prefix/api" | grep -q "$prefix/lib/libblkhash.so.0" ||
    fail "the program does not load the installed library"

for page in blksum.1 blkmap.1 blkdiff.1 blksync.1 blkhash.3 blkhash-opts.3 blkhash-aio.3; do
    section=${page##*.}
    out=$(MANWIDTH=80 man --warnings -M "$prefix/share/man" "$section" "${page%.*}" 2>&1 >/dev/null) ||
        fail "man $section ${page%.*}: $out"
    [ -z "$out" ] || fail "man $section ${page%.*}: $out"
done
for fn in blkhash_new blkhash_update blkhash_final blkhash_opts_set_threads blkhash_aio_update \
    blkhash_aio_completions blkhash_digests; do
    MANWIDTH=80 man -M "$prefix/share/man" 3 "$fn" | grep -q "$fn" || fail "man 3 $fn"
done
echo "test-install: ok ($prefix)"
