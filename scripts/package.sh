#!/usr/bin/env bash
# Build the release into dist/ (every package with the one version of the
# workspace's Cargo.toml):
#   scripts/package.sh [--deb] [--wheel] [--crates] [--rpm] [--all]
#
#   --deb     dist/*.deb: blkhash (the commands, their manual pages and
#             completions), libblkhash0 (libblkhash.so.0) and libblkhash-dev
#             (header, .so link, static library, blkhash.pc, manual pages),
#             built by dpkg-buildpackage from debian/ (debhelper: see
#             debian/rules for why), then checked by lintian (errors fail).
#   --wheel   dist/blkhash-VERSION-cp39-abi3-*.whl (one wheel for CPython
#             >= 3.9, built by maturin, stripped) and the sdist
#             dist/blkhash-VERSION.tar.gz.
#   --crates  dist/crates/*.crate: every publishable workspace crate,
#             packaged and built from its package in dependency order
#             (cargo package: what cargo publish would upload).
#   --rpm     dist/rpm/: blkhash, blkhash-libs, blkhash-devel,
#             blkhash-static (libblkhash.a, as Fedora splits it), the source
#             RPM and the source tarball with vendored crates, built offline
#             by rpmbuild from packaging/rpm/blkhash.spec (a build of its
#             own from scratch: the slow one).
#   --all     all four.
# No option: --deb (where dpkg-buildpackage is), --wheel and --crates.
#
# The debs and the wheel reuse the release build in target/ (or
# CARGO_TARGET_DIR) that scripts/test.sh and scripts/install.sh make: after
# those, only what changed is rebuilt. Tools: scripts/setup.sh installs
# debhelper, lintian and rpm; maturin is installed here, into a venv under
# target/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

deb=0 wheel=0 crates=0 rpm=0
for arg in "$@"; do
    case $arg in
        --deb) deb=1 ;;
        --wheel) wheel=1 ;;
        --crates) crates=1 ;;
        --rpm) rpm=1 ;;
        --all) deb=1 wheel=1 crates=1 rpm=1 ;;
        -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "package: unknown option $arg (see --help)" >&2; exit 2 ;;
    esac
done
if [ $# -eq 0 ]; then
    wheel=1 crates=1
    if command -v dpkg-buildpackage >/dev/null; then deb=1; fi
fi

fail() { echo "package: $*" >&2; exit 1; }
say() { echo "package: $*"; }
took() { printf '%dm%02ds' $(((SECONDS - $1) / 60)) $(((SECONDS - $1) % 60)); }

target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac
export CARGO_TARGET_DIR=$target
dist=$root/dist
tools=$target/pkgtools
mkdir -p "$dist" "$tools"
# maturin for the wheel, pinned so that a rebuild gives the same wheel.
maturin_version=1.16.0

# One version for everything: the workspace's; debian/changelog and the spec
# must say the same (their own formats keep their own copy).
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || fail "no version in Cargo.toml's [workspace.package]"
deb_version=$(sed -n '1s/^blkhash (\([^)]*\)).*/\1/p' debian/changelog)
[ "${deb_version%-*}" = "$version" ] ||
    fail "debian/changelog is at $deb_version, Cargo.toml at $version: add a debian/changelog entry"
spec_version=$(sed -n 's/^Version: *//p' packaging/rpm/blkhash.spec)
[ "$spec_version" = "$version" ] ||
    fail "packaging/rpm/blkhash.spec is at $spec_version, Cargo.toml at $version"
say "version $version"

build_deb() {
    local start=$SECONDS
    for tool in dpkg-buildpackage dh lintian; do
        command -v "$tool" >/dev/null || fail "$tool not found: run scripts/setup.sh (debhelper, lintian)"
    done
    rm -f "$dist"/*.deb "$dist"/blkhash_*.buildinfo "$dist"/blkhash_*.changes
    # -b: binary packages only; -d: no build-dependency check (the Rust
    # toolchain is rustup's, not Debian's cargo and rustc: debian/control);
    # the debs, .buildinfo and .changes go to dist/, not to the parent
    # directory.
    local arch changes
    arch=$(dpkg --print-architecture)
    changes=$dist/blkhash_${deb_version}_$arch
    # debian/rules clean afterwards, even on failure: dh would otherwise
    # take the steps it logged as done for done next time.
    if ! DEB_DESTDIR=$dist dpkg-buildpackage -b -d --no-sign \
        --buildinfo-file="$changes.buildinfo" --buildinfo-option=-u"$dist" \
        --changes-file="$changes.changes" --changes-option=-u"$dist"; then
        debian/rules clean >/dev/null 2>&1 || true
        fail "dpkg-buildpackage failed"
    fi
    debian/rules clean >/dev/null
    # Errors fail; warnings and the rest are shown.
    lintian --fail-on error "$dist"/*.deb ||
        fail "lintian found errors in the debs"
    local size
    size=$(du -cb "$dist"/*.deb | tail -1 | cut -f1)
    [ "$size" -le 15000000 ] || fail "the debs weigh $size bytes, over 15 MB"
    ls -l "$dist"/*.deb
    say "debs: $size bytes in all, in $(took "$start")"
}

# A venv of its own for maturin (pip, from PyPI), kept under target/.
maturin_venv() {
    local venv=$tools/venv
    if ! grep -q " $maturin_version\$" <<<"$("$venv/bin/maturin" --version 2>/dev/null)"; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check "maturin==$maturin_version"
    fi
    echo "$venv/bin/maturin"
}

build_wheel() {
    local start=$SECONDS maturin
    maturin=$(maturin_venv)
    rm -f "$dist"/blkhash-*.whl "$dist"/blkhash-*.tar.gz
    # --release: the workspace's release profile (as scripts/test.sh builds);
    # --strip: its line tables stay out of the wheel.
    "$maturin" build --release --strip --out "$dist" -m python/Cargo.toml
    "$maturin" sdist --out "$dist" -m python/Cargo.toml
    local whl
    whl=$(ls "$dist"/blkhash-"$version"-cp39-abi3-*.whl) || fail "no abi3 wheel for $version in dist/"
    local list
    list=$(python3 -m zipfile -l "$whl")
    grep -q 'licenses/LICENSE-MIT' <<< "$list" || fail "$whl: no LICENSE-MIT"
    grep -q 'licenses/LICENSE-APACHE' <<< "$list" || fail "$whl: no LICENSE-APACHE"
    ls -l "$whl" "$dist/blkhash-$version.tar.gz"
    say "wheel and sdist in $(took "$start")"
}

build_crates() {
    local start=$SECONDS
    # The workspace's publishable crates (publish not false), from cargo
    # metadata: a crate added to the workspace is packaged too.
    local names
    names=$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
m = json.load(sys.stdin)
members = set(m["workspace_members"])
print(" ".join(sorted(p["name"] for p in m["packages"]
                      if p["id"] in members and p.get("publish") != [])))')
    local args=() name
    for name in $names; do
        args+=(-p "$name")
    done
    # Each crate's package must carry the license files (symbolic links to
    # the root's, which cargo packages as files).
    local list
    for name in $names; do
        list=$(cargo package --list --allow-dirty -p "$name" 2>/dev/null) ||
            fail "cargo package --list -p $name failed"
        { grep -qx LICENSE-MIT <<< "$list" && grep -qx LICENSE-APACHE <<< "$list"; } ||
            fail "$name: no LICENSE-MIT and LICENSE-APACHE in its package (ln -s ../LICENSE-MIT ../LICENSE-APACHE $name/)"
    done
    # What `cargo publish` would upload, each crate built from its package
    # (as crates.io users build it), in dependency order: the crates not on
    # crates.io yet resolve from the ones packaged before them (cargo >=
    # 1.90). --allow-dirty: a release is cut from a clean tag, but this runs
    # on work trees too. `cargo publish --dry-run` with the same arguments
    # runs the same checks.
    rm -rf "$dist/crates"
    cargo package --allow-dirty "${args[@]}"
    mkdir -p "$dist/crates"
    for name in $names; do
        cp "$target/package/$name-$version.crate" "$dist/crates/"
    done
    ls -l "$dist/crates"
    say "crates ($names) in $(took "$start")"
}

build_rpm() {
    local start=$SECONDS
    command -v rpmbuild >/dev/null || fail "rpmbuild not found: run scripts/setup.sh (rpm, rpm-build)"
    local out=$dist/rpm stage=$tools/rpm
    local src=$stage/blkhash-$version
    rm -rf "$out" "$stage"
    mkdir -p "$out" "$src/.cargo"
    # The source tree as it is (tracked files and new ones not ignored), with
    # its crates vendored and cargo told to use them: rpmbuild then builds
    # with no network.
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf - | tar -xf - -C "$src"
    (cd "$src" && cargo vendor --locked --quiet vendor > .cargo/config.toml)
    local tarball=$out/blkhash-$version-vendored.tar.gz
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$(git log -1 --format=%ct)" \
        -C "$stage" -czf "$tarball" "blkhash-$version"
    rm -rf "$src"
    # --nodeps: on Debian, rpm's database knows none of the BuildRequires.
    # Debian's rpm runs brp-compress (the manual pages' gzip) with dash,
    # whose read has no -d: run it with bash. The build is the spec's own,
    # from the tarball, in rpmbuild's directory: not in CARGO_TARGET_DIR.
    local defines=()
    local brp_compress
    brp_compress=$(rpm --eval '%{?__brp_compress}')
    if [ -n "$brp_compress" ]; then
        defines+=(--define "__brp_compress bash $brp_compress")
    fi
    env -u CARGO_TARGET_DIR rpmbuild -ba --nodeps \
        --define "_topdir $stage/rpmbuild" --define "_sourcedir $out" \
        --define "_rpmdir $out" --define "_srcrpmdir $out" \
        --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
        "${defines[@]}" packaging/rpm/blkhash.spec
    rm -rf "$stage"
    grep -q '^libblkhash.so.0()(64bit)' <<< "$(rpm -qp --provides "$out/blkhash-libs-$version"-*.rpm)" ||
        fail "blkhash-libs does not provide libblkhash.so.0()(64bit)"
    # The files where Fedora puts them, unpacked into a scratch root.
    local r=$stage/root arch
    arch=$(rpm --eval '%{_arch}')
    mkdir -p "$r"
    for p in "$out"/*."$arch".rpm; do
        rpm2archive - < "$p" | tar -xzf - -C "$r"
    done
    for f in usr/bin/blksum usr/bin/blkmap usr/bin/blkdiff usr/bin/blksync usr/lib64/libblkhash.so.0; do
        grep -q ', stripped' <<<"$(file "$r/$f")" || fail "$f is not stripped in the RPMs"
    done
    [ "$(readlink "$r/usr/lib64/libblkhash.so")" = libblkhash.so.0 ] || fail "no libblkhash.so link"
    grep -qx 'libdir=/usr/lib64' "$r/usr/lib64/pkgconfig/blkhash.pc" || fail "blkhash.pc: libdir is not /usr/lib64"
    grep -qx "Version: $version" "$r/usr/lib64/pkgconfig/blkhash.pc" || fail "blkhash.pc: Version is not $version"
    for f in usr/share/man/man1/blksum.1.gz usr/share/man/man3/blkhash_update.3.gz usr/lib64/libblkhash.a; do
        [ -e "$r/$f" ] || [ -L "$r/$f" ] || fail "no /$f in the RPMs"
    done
    # %license: /usr/share/licenses/NAME (Fedora) or NAME-VERSION (older rpm).
    for p in blkhash blkhash-libs blkhash-devel blkhash-static; do
        for f in LICENSE-MIT LICENSE-APACHE; do
            [ -e "$r/usr/share/licenses/$p/$f" ] || [ -e "$r/usr/share/licenses/$p-$version/$f" ] ||
                fail "$p: no $f in /usr/share/licenses"
        done
    done
    grep -qF "$version" <<<"$("$r/usr/bin/blksum" --version)" || fail "the RPMs' blksum is not $version"
    rm -rf "$stage"
    local p
    for p in "$out"/*.rpm; do
        echo "== $(basename "$p")"
        echo "provides: $(rpm -qp --provides "$p" | tr '\n' ' ')"
        echo "requires: $(rpm -qp --requires "$p" | grep -v '^rpmlib(' | tr '\n' ' ')"
        rpm -qp --recommends "$p" | sed 's/^/recommends: /'
        rpm -qpl "$p" | sed 's/^/  /'
    done
    say "RPMs in $(took "$start")"
}

[ "$deb" = 0 ] || build_deb
[ "$wheel" = 0 ] || build_wheel
[ "$crates" = 0 ] || build_crates
[ "$rpm" = 0 ] || build_rpm
say "done: $dist"
