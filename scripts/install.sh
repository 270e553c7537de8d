#!/usr/bin/env bash
# Build and install the commands and libblkhash:
#   scripts/install.sh [PREFIX]      (default /usr/local)
#
# PREFIX/bin: blksum, blkmap, blkdiff, blksync (stripped);
# PREFIX/share/man/man1 and the shell completion directories: the
# commands' manual pages and bash, zsh and fish completions;
# LIBDIR: libblkhash.so.0 (its SONAME, as libblkhash 0.11's) with the
# libblkhash.so link, libblkhash.a, pkgconfig/blkhash.pc. LIBDIR comes from
# the environment, else it is the platform's: PREFIX/lib64 where the system
# keeps its 64-bit libraries in /usr/lib64 (Fedora, RHEL, openSUSE), else
# PREFIX/lib (Debian and Ubuntu, whose /usr/lib64 holds only the loader;
# their multiarch PREFIX/lib/x86_64-linux-gnu is LIBDIR=... away);
# PREFIX/include/blkhash.h; PREFIX/share/man/man3: blkhash(3),
# blkhash-opts(3), blkhash-aio(3) and a page per function.
# Run as root for a system prefix: ldconfig then refreshes the loader's cache.
# For packages (scripts/package.sh: debian/rules, packaging/rpm/blkhash.spec):
# DESTDIR=DIR stages the files under DIR (blkhash.pc still names PREFIX's
# paths; no ldconfig), INSTALL_STRIP=no leaves stripping to the packaging
# tools (dh_strip, rpmbuild's debuginfo). CARGO_BUILD_TARGET=TRIPLE (cargo's
# own variable) builds and installs for another architecture (the arm64
# debs: debian/rules): the binaries then run for their manual pages and
# completions through cargo's runner for that target,
# CARGO_TARGET_<TRIPLE>_RUNNER (qemu-user: scripts/package.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${1:-/usr/local}
if [ -d /usr/lib64 ] && [ ! -e /etc/debian_version ]; then
    libdir=${LIBDIR:-$prefix/lib64}
else
    libdir=${LIBDIR:-$prefix/lib}
fi
includedir=$prefix/include
mandir=$prefix/share/man
release=${CARGO_TARGET_DIR:-target}/${CARGO_BUILD_TARGET:+$CARGO_BUILD_TARGET/}release
run=()
if [ -n "${CARGO_BUILD_TARGET:-}" ]; then
    runner=CARGO_TARGET_$(tr 'a-z.-' 'A-Z__' <<<"$CARGO_BUILD_TARGET")_RUNNER
    read -ra run <<<"${!runner:-}"
fi
dest=${DESTDIR:-}
strip=(-s)
if [ "${INSTALL_STRIP:-yes}" = no ]; then
    strip=()
fi
# The release version, for blkhash.pc: the workspace's (Cargo.toml), above
# the libblkhash 0.11 API it implements (pkg-config --atleast-version 0.11).
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)

# Only what is installed: the commands and the C library, not the Python
# extension (scripts/package.sh --wheel), the test kit or the fuzz checks.
# Their dependencies' features are those scripts/demo.sh's `-p blksum`
# build gives them, so that neither rebuilds what the other built; the
# debs (debian/rules), the RPM (packaging/rpm/blkhash.spec) and
# scripts/test.sh build this same set first, so that the build here finds
# nothing to do (a build of other packages along with them unifies some
# dependencies' features differently, and would be built again here).
# The release profile links each command with thin LTO, in one codegen
# unit: the last minutes of the build, while cargo shows only "Compiling
# blktools" or "blksum".
echo "install: building blksum, blkmap, blkdiff, blksync and libblkhash (release:" \
    "from a fresh clone some minutes, the last ones the commands' link-time" \
    "optimization, while cargo shows only \"Compiling blktools\")" >&2
cargo build --release -p blksum -p blktools -p libblkhash

for b in blksum blkmap blkdiff blksync; do
    install -D "${strip[@]}" -m 755 "$release/$b" "$dest$prefix/bin/$b"
done
mkdir -p "$dest$mandir/man1" "$dest$mandir/man3" \
    "$dest$prefix/share/bash-completion/completions" \
    "$dest$prefix/share/zsh/site-functions" \
    "$dest$prefix/share/fish/vendor_completions.d"
for b in blksum blkmap blkdiff blksync; do
    "${run[@]}" "$release/$b" --man > "$dest$mandir/man1/$b.1"
    "${run[@]}" "$release/$b" --completions bash > "$dest$prefix/share/bash-completion/completions/$b"
    "${run[@]}" "$release/$b" --completions zsh > "$dest$prefix/share/zsh/site-functions/_$b"
    "${run[@]}" "$release/$b" --completions fish > "$dest$prefix/share/fish/vendor_completions.d/$b.fish"
done

# The library: the file under its SONAME, the link the linker looks for.
install -D "${strip[@]}" -m 755 "$release/libblkhash.so" "$dest$libdir/libblkhash.so.0"
ln -sfn libblkhash.so.0 "$dest$libdir/libblkhash.so"
install -D -m 644 "$release/libblkhash.a" "$dest$libdir/libblkhash.a"
install -D -m 644 libblkhash/include/blkhash.h "$dest$includedir/blkhash.h"
mkdir -p "$dest$libdir/pkgconfig"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|$libdir|" \
    -e "s|@INCLUDEDIR@|$includedir|" -e "s|@VERSION@|$version|" \
    libblkhash/blkhash.pc.in > "$dest$libdir/pkgconfig/blkhash.pc"
for page in libblkhash/man/*.3; do
    install -m 644 "$page" "$dest$mandir/man3/"
    # One page per function, each pointing at the page that documents it
    # (man blkhash_update finds blkhash(3)).
    name=$(basename "$page")
    sed -n '/^\.SH NAME/,/\\-/p' "$page" | tr -s ', \n' '\n' | grep '^blkhash_' |
        while read -r fn; do
            printf '.so man3/%s\n' "$name" > "$dest$mandir/man3/$fn.3"
        done
done
if [ -n "$dest" ]; then
    echo "staged in $dest for $prefix (libdir $libdir)"
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v ldconfig >/dev/null; then
    ldconfig
fi

echo "installed in $prefix: blksum, blkmap, blkdiff, blksync (manual pages and completions);"
echo "libblkhash.so.0, libblkhash.a and blkhash.pc in $libdir, blkhash.h in $includedir,"
echo "manual pages blkhash(3), blkhash-opts(3), blkhash-aio(3)"
case ":$(ldconfig -p 2>/dev/null | grep -o "=> $libdir/" | head -1):" in
    *"$libdir"*) ;;
    *) echo "note: $libdir is not in the loader's path: add it to /etc/ld.so.conf.d/ and run ldconfig, or set LD_LIBRARY_PATH" ;;
esac
