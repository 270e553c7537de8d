#!/usr/bin/env bash
# The release as users get it (scripts/test.sh runs this after the Python
# step; the wheel is tested there, by scripts/test-python.sh):
# - the C library's ABI against libblkhash 0.11's (scripts/check-abi.sh);
# - the crates: `cargo publish --dry-run` of every publishable crate in
#   dependency order, each built from its package (scripts/package.sh
#   --crates);
# - the debs, built by scripts/package.sh --deb (reusing the release build
#   of target/), installed with dpkg -i and used as a user would: blksum on
#   a qcow2 image made by qemu-img, `man -w blksum`, `man -w
#   blkhash_update`, a C program built with `pkg-config --cflags --libs
#   blkhash` and run (and one linked statically), the library in ldconfig's
#   cache; then removed with dpkg -r, and none of their files may be left.
# dpkg needs root: as another user sudo is used if it asks no password, else
# the deb part is skipped with a message saying so. Where there is no
# dpkg-buildpackage (Fedora, RHEL) it is skipped too: there the RPMs are
# built and checked by `scripts/package.sh --rpm`.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "test-package: $*" >&2; exit 1; }

scripts/check-abi.sh
scripts/package.sh --crates

if ! command -v dpkg-buildpackage >/dev/null; then
    echo "test-package: SKIPPED the debs: no dpkg-buildpackage here (scripts/package.sh --rpm checks the RPMs)"
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        sudo="sudo -n"
    else
        echo "test-package: SKIPPED installing the debs: dpkg -i needs root (or sudo without a password)"
        scripts/package.sh --deb
        exit 0
    fi
fi
packages=(blkhash libblkhash0 libblkhash-dev)
for p in "${packages[@]}"; do
# Checks read a command's whole output (a here-string), never a pipe into
# grep -q: with pipefail, grep leaving at its first match can kill the
# writer with SIGPIPE and fail the check, at random, on a busy machine.
    if grep -q 'install ok installed' <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)"; then
        fail "$p is installed already: remove it first (dpkg -r ${packages[*]}), this test installs and removes it"
    fi
done

tmp=$(mktemp -d /tmp/blkhash-package-XXXXXX)
installed=0
cleanup() {
    if [ "$installed" = 1 ]; then
        $sudo dpkg -r "${packages[@]}" >/dev/null 2>&1 || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# TMPDIR in $tmp: lintian leaves its caches (mldbm-elf-*) in the temporary
# directory; they go with $tmp.
mkdir "$tmp/tmp"
TMPDIR=$tmp/tmp scripts/package.sh --deb

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=/usr/lib/$multiarch

debs=()
arch=$(dpkg --print-architecture)
for p in "${packages[@]}"; do
    # This machine's architecture (dist/ may hold the arm64 debs too).
    debs+=("$(ls dist/"${p}"_"$version"-*_"$arch".deb)")
done
installed=1
$sudo dpkg -i "${debs[@]}"
dpkg -L "${packages[@]}" | LC_ALL=C sort -u > "$tmp/files"

# The commands, stripped, from /usr/bin.
for b in blksum blkmap blkdiff blksync; do
    [ "$(command -v "$b")" = "/usr/bin/$b" ] ||
        fail "$b is $(command -v "$b" || echo missing), not /usr/bin/$b (another install earlier in PATH?)"
    grep -q ', stripped' <<<"$(file -L "/usr/bin/$b")" || fail "/usr/bin/$b is not stripped"
done
grep -q ', stripped' <<<"$(file -L "$libdir/libblkhash.so.0")" || fail "libblkhash.so.0 is not stripped"
grep -qF "$version" <<<"$(blksum --version)" || fail "blksum --version: $(blksum --version), not $version"

# blksum on a qcow2 image, which must agree with its raw content.
head -c 1048576 /dev/urandom > "$tmp/disk.raw"
truncate -s 64M "$tmp/disk.raw"
qemu-img convert -c -f raw -O qcow2 "$tmp/disk.raw" "$tmp/disk.qcow2"
qcow2=$(blksum "$tmp/disk.qcow2")
raw=$(blksum "$tmp/disk.raw")
[ "${qcow2%% *}" = "${raw%% *}" ] || fail "blksum: qcow2 $qcow2, raw $raw"

# Manual pages (unless dpkg is told to leave them out, as in slim images)
# and completions.
if grep -rqs '^path-exclude.*/usr/share/man' /etc/dpkg/dpkg.cfg.d/; then
    echo "test-package: not checking manual pages: dpkg excludes /usr/share/man here (/etc/dpkg/dpkg.cfg.d/)"
else
    [ "$(man -w blksum)" = /usr/share/man/man1/blksum.1.gz ] ||
        fail "man -w blksum: $(man -w blksum 2>&1)"
    # A link to the page that documents it (man -w names the page).
    case $(man -w blkhash_update) in
        /usr/share/man/man3/blkhash.3.gz | /usr/share/man/man3/blkhash_update.3.gz) ;;
        *) fail "man -w blkhash_update: $(man -w blkhash_update 2>&1)" ;;
    esac
    # (Output captured before grep -q: an early exit would fail the pipe.)
    grep -q 'blkhash_update' <<< "$(MANWIDTH=80 man blkhash_update 2>/dev/null)" ||
        fail "man blkhash_update does not render blkhash(3)"
    grep -q 'blksum' <<< "$(MANWIDTH=80 man blksum 2>/dev/null)" || fail "man blksum does not render"
fi
for f in /usr/share/bash-completion/completions/blksum /usr/share/zsh/vendor-completions/_blksum \
    /usr/share/fish/vendor_completions.d/blksum.fish; do
    [ -s "$f" ] || fail "no completion $f"
done

# The library: in ldconfig's cache (libblkhash0's trigger ran), found by
# pkg-config, and a C program built against it runs; a static one gives
# blksum's checksum.
# (With /lib a link to /usr/lib, ldconfig and ldd may name either.)
grep -Eq "libblkhash.so.0 .*=> (/usr)?/lib/$multiarch/libblkhash.so.0" <<< "$(ldconfig -p)" ||
    fail "ldconfig -p does not list $libdir/libblkhash.so.0"
[ "$(pkg-config --modversion blkhash)" = "$version" ] ||
    fail "pkg-config --modversion blkhash: $(pkg-config --modversion blkhash 2>&1), not $version"
pkg-config --atleast-version 0.11 blkhash || fail "pkg-config --atleast-version 0.11 blkhash failed"
[ "$(pkg-config --variable=libdir blkhash)" = "$libdir" ] ||
    fail "pkg-config finds blkhash.pc with libdir $(pkg-config --variable=libdir blkhash), not $libdir"
# shellcheck disable=SC2046 # pkg-config's flags are words
cc -o "$tmp/api" libblkhash/tests/c/api.c $(pkg-config --cflags --libs blkhash)
grep -q 'api: ok' <<<"$("$tmp/api")" || fail "the C program failed"
grep -Eq "=> (/usr)?/lib/$multiarch/libblkhash.so.0" <<< "$(ldd "$tmp/api")" || fail "the C program does not load $libdir/libblkhash.so.0"
# shellcheck disable=SC2046 # pkg-config's flags are words
cc -static -o "$tmp/hex" libblkhash/tests/c/hex.c $(pkg-config --static --cflags --libs blkhash)
seq 1 400000 > "$tmp/data"
got=$("$tmp/hex" < "$tmp/data")
want=$(blksum < "$tmp/data")
[ "$got" = "${want%% *}" ] || fail "static program: $got, blksum: $want"

# Removed, nothing of theirs is left: no file, and no directory that only
# they had (empty, and no other package's).
$sudo dpkg -r "${packages[@]}"
installed=0
left=()
while IFS= read -r path; do
    if [ -L "$path" ] || [ -f "$path" ]; then
        left+=("$path")
    elif [ -d "$path" ] && [ -z "$(ls -A "$path")" ] && ! dpkg -S "$path" >/dev/null 2>&1; then
        left+=("$path/")
    fi
done < "$tmp/files"
[ ${#left[@]} -eq 0 ] || fail "left after dpkg -r: ${left[*]}"
! grep -q 'libblkhash.so.0 ' <<< "$(ldconfig -p)" || fail "ldconfig -p still lists libblkhash.so.0 after dpkg -r"

echo "test-package: ok (ABI; ${debs[*]##*/} installed, used, removed: $(wc -l < "$tmp/files") paths, none left)"
