#!/usr/bin/env bash
# scripts/install.sh as a user runs it, into a scratch prefix: the commands
# run, the library goes to the platform's library directory (or LIBDIR), a C
# program builds with pkg-config against the installed library and runs,
# another links statically (cc -static, pkg-config --static) and gives
# blksum's checksum, and every manual page (and each function's link page)
# renders.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=$(mktemp -d /tmp/blkhash-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
fail() { echo "test-install: $*" >&2; exit 1; }

env -u LIBDIR scripts/install.sh "$prefix" > "$prefix.log" 2>&1 ||
    { cat "$prefix.log"; fail "install.sh failed"; }
rm -f "$prefix.log"
# install.sh's default: lib64 where the system keeps its libraries there and
# is not Debian (whose /usr/lib64 holds only the loader), else lib.
if [ -d /usr/lib64 ] && [ ! -e /etc/debian_version ]; then
    libdir=$prefix/lib64
else
    libdir=$prefix/lib
fi
[ -e "$libdir/libblkhash.so.0" ] || fail "libblkhash.so.0 is not in $libdir"

# Checks read a command's whole output (a here-string), never a pipe into
# grep -q: with pipefail, grep leaving at its first match can kill the
# writer with SIGPIPE and fail the check, at random, on a busy machine.
for b in blksum blkmap blkdiff blksync; do
    "$prefix/bin/$b" --version >/dev/null || fail "$b does not run"
    grep -q ', stripped' <<<"$(file "$prefix/bin/$b")" || fail "$b is not stripped"
done
[ "$(readlink "$libdir/libblkhash.so")" = libblkhash.so.0 ] || fail "no libblkhash.so link"
grep -q 'SONAME *libblkhash.so.0' <<<"$(objdump -p "$libdir/libblkhash.so.0")" || fail "SONAME"

export PKG_CONFIG_PATH=$libdir/pkgconfig
pkg-config --atleast-version=0.11 blkhash || fail "pkg-config does not find blkhash >= 0.11"
# shellcheck disable=SC2046 # pkg-config's flags are words
cc -o "$prefix/api" libblkhash/tests/c/api.c $(pkg-config --cflags --libs blkhash)
grep -q 'api: ok' <<<"$(LD_LIBRARY_PATH=$libdir "$prefix/api")" || fail "the C program failed"
grep -q "$libdir/libblkhash.so.0" <<<"$(LD_LIBRARY_PATH=$libdir ldd "$prefix/api")" ||
    fail "the program does not load the installed library"

# Statically, as a user links it: Libs.private must name only libraries a
# static link finds (no -lgcc_s: gcc brings libgcc_eh itself). The program
# prints the checksum of its standard input, which must be blksum's.
# shellcheck disable=SC2046 # pkg-config's flags are words
cc -static -o "$prefix/hex" libblkhash/tests/c/hex.c $(pkg-config --static --cflags --libs blkhash) ||
    fail "cc -static with pkg-config --static --libs blkhash failed"
grep -q 'statically linked' <<<"$(file "$prefix/hex")" || fail "hex is not statically linked"
seq 1 400000 > "$prefix/data"
got=$("$prefix/hex" < "$prefix/data") || fail "the static program failed"
want=$("$prefix/bin/blksum" < "$prefix/data")
[ "$got" = "${want%% *}" ] || fail "static program: $got, blksum: $want"

# LIBDIR chooses the library directory.
LIBDIR=$prefix/elsewhere scripts/install.sh "$prefix" > "$prefix.log" 2>&1 ||
    { cat "$prefix.log"; fail "install.sh with LIBDIR failed"; }
rm -f "$prefix.log"
grep -qx "libdir=$prefix/elsewhere" "$prefix/elsewhere/pkgconfig/blkhash.pc" ||
    fail "LIBDIR=$prefix/elsewhere: blkhash.pc names another libdir"
[ -e "$prefix/elsewhere/libblkhash.so.0" ] || fail "LIBDIR: no libblkhash.so.0 there"

for page in blksum.1 blkmap.1 blkdiff.1 blksync.1 blkhash.3 blkhash-opts.3 blkhash-aio.3; do
    section=${page##*.}
    out=$(MANWIDTH=80 man --warnings -M "$prefix/share/man" "$section" "${page%.*}" 2>&1 >/dev/null) ||
        fail "man $section ${page%.*}: $out"
    [ -z "$out" ] || fail "man $section ${page%.*}: $out"
done
for fn in blkhash_new blkhash_update blkhash_final blkhash_opts_set_threads blkhash_aio_update \
    blkhash_aio_completions blkhash_digests; do
    grep -q "$fn" <<<"$(MANWIDTH=80 man -M "$prefix/share/man" 3 "$fn")" || fail "man 3 $fn"
done
echo "test-install: ok ($prefix)"
