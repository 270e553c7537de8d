#!/usr/bin/env bash
# Build the release into dist/ (every package with the one version of the
# workspace's Cargo.toml):
#   scripts/package.sh [--deb] [--deb-arm64] [--wheel] [--wheel-arm64]
#                      [--crates] [--rpm] [--static[=ARCH,...]] [--oci] [--all]
#   scripts/package.sh --release
#
#   --deb     dist/*_amd64.deb (this machine's architecture): blkhash (the
#             commands, their manual pages and completions), libblkhash0
#             (libblkhash.so.0) and libblkhash-dev (header, .so link, static
#             library, blkhash.pc, manual pages), built by dpkg-buildpackage
#             from debian/ (debhelper: see debian/rules for why), then
#             checked by lintian (errors fail).
#   --deb-arm64  the same three for arm64, cross-built (dpkg-buildpackage
#             -a arm64: gcc-aarch64-linux-gnu; qemu-user runs the binaries
#             for their manual pages).
#   --wheel   dist/blkhash-VERSION-cp39-abi3-*.whl (one wheel for CPython
#             >= 3.9, built by maturin, stripped) and the sdist
#             dist/blkhash-VERSION.tar.gz.
#   --wheel-arm64  the manylinux aarch64 wheel (manylinux_2_17: maturin
#             --zig, zig from PyPI, links against glibc 2.17's symbols).
#   --crates  dist/crates/*.crate: every publishable workspace crate, checked
#             by `cargo publish --dry-run` in dependency order (each built
#             from its package, the unpublished ones resolved from the
#             packages made before them), then packaged.
#   --rpm     dist/rpm/: blkhash, blkhash-libs, blkhash-devel,
#             blkhash-static (libblkhash.a, as Fedora splits it), the source
#             RPM and the source tarball with vendored crates, built offline
#             by rpmbuild from packaging/rpm/blkhash.spec (a build of its
#             own from scratch: the slow one). This machine's architecture
#             only (no cross build of the spec).
#   --static  dist/blkhash-VERSION-ARCH-linux-musl.tar.gz for x86_64 and
#             aarch64 (--static=x86_64 or --static=aarch64: one): the four
#             commands statically linked against musl (no C library or
#             loader needed on the host), stripped, with their manual pages,
#             completions, the licenses and a README. x86_64 needs musl-gcc
#             (musl-tools) for the C parts; aarch64 is built with
#             cargo-zigbuild and zig (from PyPI, into a venv here).
#   --static-profile=NAME
#             the static tarballs built with cargo profile NAME instead of
#             release, into target/dist-NAME/ (never dist/: not what is
#             shipped). The test command's static step checks one built
#             with the quick profile (release without link-time optimization:
#             static linking and what the commands compute do not depend
#             on it, and those links were most of that step's time).
#   --oci     dist/blkhash-VERSION-oci.tar: an OCI image archive (an
#             oci-archive, as skopeo and podman read it) of the static
#             commands of --static's architectures (both unless
#             --static=ARCH says), built with umoci: one image per
#             architecture (linux/amd64, linux/arm64) under an image index
#             tagged VERSION (skopeo copy --all pushes both), each also
#             tagged VERSION-amd64 or VERSION-arm64. In each, the four
#             commands in /usr/bin, their manual pages, the licenses, the
#             CA certificates of this machine (for HTTPS URLs) and an empty
#             /tmp (blkdiff's and blkmap's temporary maps): no shell, no C
#             library. Runs as user 65532 (not root) by default,
#             PATH=/usr/bin, the command `blksum --help` unless given
#             another; labels org.opencontainers.image.* (version, source,
#             revision, licenses, created: the commit's time). Checked
#             with skopeo inspect. umoci and skopeo: scripts/setup.sh.
#   --all     --deb, --wheel, --crates, --rpm (this machine's architecture).
#   --release everything a release holds: dist/ emptied, then --deb,
#             --deb-arm64, --wheel, --wheel-arm64, --crates, --rpm, --static,
#             --oci.
# No option: --deb (where dpkg-buildpackage is), --wheel and --crates.
# Every run ends by writing dist/SHA256SUMS for every file in dist/
# (`sha256sum -c SHA256SUMS` checks them).
#
# The debs and the wheel reuse the release build in target/ (or
# CARGO_TARGET_DIR) that scripts/test.sh and scripts/install.sh make: after
# those, only what changed is rebuilt; the arm64 debs are built into
# target/aarch64-unknown-linux-gnu/release (scripts/test-cross.sh builds
# its own profile, quick). Tools:
# scripts/setup.sh installs debhelper, lintian, rpm, the aarch64 cross
# compiler, qemu-user and musl-tools; maturin, ziglang and cargo-zigbuild
# are installed here, into a venv under target/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

deb=0 deb_arm64=0 wheel=0 wheel_arm64=0 crates=0 rpm=0 static=() release=0 static_profile=release oci=0
for arg in "$@"; do
    case $arg in
        --deb) deb=1 ;;
        --deb-arm64) deb_arm64=1 ;;
        --wheel) wheel=1 ;;
        --wheel-arm64) wheel_arm64=1 ;;
        --crates) crates=1 ;;
        --rpm) rpm=1 ;;
        --static) static=(x86_64 aarch64) ;;
        --static=*)
            IFS=, read -ra static <<<"${arg#--static=}"
            for a in "${static[@]}"; do
                case $a in x86_64 | aarch64) ;; *) echo "package: --static: no $a (x86_64, aarch64)" >&2; exit 2 ;; esac
            done
            ;;
        --static-profile=?*) static_profile=${arg#--static-profile=} ;;
        --oci) oci=1 ;;
        --all) deb=1 wheel=1 crates=1 rpm=1 ;;
        --release) release=1 deb=1 deb_arm64=1 wheel=1 wheel_arm64=1 crates=1 rpm=1 static=(x86_64 aarch64) oci=1 ;;
        -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "package: unknown option $arg (see --help)" >&2; exit 2 ;;
    esac
done
# The image is made of the static builds: both unless --static=ARCH says.
if [ "$oci" = 1 ] && [ ${#static[@]} -eq 0 ]; then
    static=(x86_64 aarch64)
fi
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
if [ "$static_profile" != release ]; then
    [ "$deb$deb_arm64$wheel$wheel_arm64$crates$rpm$release" = 0000000 ] ||
        fail "--static-profile=$static_profile: with --static only (the other packages are release builds)"
    dist=$target/dist-$static_profile
fi
tools=$target/pkgtools
mkdir -p "$dist" "$tools"
# maturin for the wheels, pinned so that a rebuild gives the same wheel;
# zig (the ziglang package) and cargo-zigbuild for the aarch64 wheel and the
# aarch64 static binaries: a C cross compiler and linker with the C
# libraries' headers for every target, which Debian has no package of for
# aarch64 musl.
maturin_version=1.16.0
ziglang_version=0.17.1
zigbuild_version=0.24.1

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

# The debs of one architecture: this machine's (amd64 here), or arm64
# cross-built. build_deb [ARCH]
build_deb() {
    local start=$SECONDS build_arch arch
    for tool in dpkg-buildpackage dh lintian; do
        command -v "$tool" >/dev/null || fail "$tool not found: run scripts/setup.sh (debhelper, lintian)"
    done
    build_arch=$(dpkg --print-architecture)
    arch=${1:-$build_arch}
    local cross=() env=()
    if [ "$arch" != "$build_arch" ]; then
        [ "$arch" = arm64 ] || fail "debs for $arch: only arm64 is cross-built"
        cross_arm64_check
        # -a: the host architecture (debian/rules then builds for
        # aarch64-unknown-linux-gnu); the runner runs the binaries for their
        # manual pages (scripts/install.sh).
        cross=(-a "$arch")
        env=("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64 -L /usr/aarch64-linux-gnu")
    fi
    rm -f "$dist"/*_"$arch".deb "$dist"/blkhash_*_"$arch".buildinfo "$dist"/blkhash_*_"$arch".changes
    # -b: binary packages only; -d: no build-dependency check (the Rust
    # toolchain is rustup's, not Debian's cargo and rustc: debian/control);
    # the debs, .buildinfo and .changes go to dist/, not to the parent
    # directory.
    local changes=$dist/blkhash_${deb_version}_$arch
    # debian/rules clean afterwards, even on failure: dh would otherwise
    # take the steps it logged as done for done next time.
    if ! env "${env[@]}" DEB_DESTDIR="$dist" dpkg-buildpackage -b -d --no-sign "${cross[@]}" \
        --buildinfo-file="$changes.buildinfo" --buildinfo-option=-u"$dist" \
        --changes-file="$changes.changes" --changes-option=-u"$dist"; then
        debian/rules clean >/dev/null 2>&1 || true
        fail "dpkg-buildpackage ${cross[*]} failed"
    fi
    debian/rules clean >/dev/null
    local debs=("$dist"/*_"$arch".deb)
    # Errors fail; warnings and the rest are shown.
    lintian --fail-on error "${debs[@]}" ||
        fail "lintian found errors in the $arch debs"
    local size
    size=$(du -cb "${debs[@]}" | tail -1 | cut -f1)
    [ "$size" -le 15000000 ] || fail "the $arch debs weigh $size bytes, over 15 MB"
    ls -l "${debs[@]}"
    say "$arch debs: $size bytes in all, in $(took "$start")"
}

# The arm64 cross tools, each missing one named.
cross_arm64_check() {
    command -v aarch64-linux-gnu-gcc >/dev/null ||
        fail "no aarch64-linux-gnu-gcc: install gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (scripts/setup.sh)"
    command -v qemu-aarch64 >/dev/null || fail "no qemu-aarch64: install qemu-user (scripts/setup.sh)"
    rust_target aarch64-unknown-linux-gnu
}

rust_target() {
    grep -qx "$1" <<<"$(rustup target list --installed 2>/dev/null)" ||
        fail "the Rust target $1 is not installed: rustup target add $1 (scripts/setup.sh)"
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

# Another for the aarch64 builds: maturin, zig and cargo-zigbuild (which
# finds zig as `python3 -m ziglang` in the venv); prints its bin directory.
zig_venv() {
    local venv=$tools/zig have
    local want="cargo-zigbuild==$zigbuild_version maturin==$maturin_version ziglang==$ziglang_version"
    have=$("$venv/bin/pip" freeze --disable-pip-version-check 2>/dev/null |
        grep -Ei '^(cargo-zigbuild|maturin|ziglang)==' | tr 'A-Z' 'a-z' | sort | tr '\n' ' ')
    if [ "${have% }" != "$want" ]; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        # shellcheck disable=SC2086 # the pinned requirements are words
        "$venv/bin/pip" install --quiet --disable-pip-version-check $want ||
            fail "pip install $want failed (PyPI)"
    fi
    echo "$venv/bin"
}

build_wheel() {
    local start=$SECONDS maturin
    maturin=$(maturin_venv)
    rm -f "$dist"/blkhash-"$version"-cp39-abi3-*"$(uname -m)".whl "$dist/blkhash-$version.tar.gz"
    # --release: the workspace's release profile (as scripts/test.sh builds);
    # --strip: its line tables stay out of the wheel.
    "$maturin" build --release --strip --out "$dist" -m python/Cargo.toml
    "$maturin" sdist --out "$dist" -m python/Cargo.toml
    local whl
    whl=$(ls "$dist"/blkhash-"$version"-cp39-abi3-*"$(uname -m)".whl) || fail "no abi3 wheel for $version in dist/"
    local list
    list=$(python3 -m zipfile -l "$whl")
    grep -q 'licenses/LICENSE-MIT' <<< "$list" || fail "$whl: no LICENSE-MIT"
    grep -q 'licenses/LICENSE-APACHE' <<< "$list" || fail "$whl: no LICENSE-APACHE"
    ls -l "$whl" "$dist/blkhash-$version.tar.gz"
    say "wheel and sdist in $(took "$start")"
}

# The manylinux aarch64 wheel: maturin with zig as the cross linker, against
# glibc 2.17's symbols (manylinux2014: every aarch64 distribution of the
# last ten years), where Debian's cross gcc would tie it to Debian 12's
# glibc 2.36. abi3: no aarch64 Python needed to build it.
build_wheel_arm64() {
    local start=$SECONDS bin
    rust_target aarch64-unknown-linux-gnu
    bin=$(zig_venv)
    rm -f "$dist"/blkhash-"$version"-cp39-abi3-*aarch64.whl
    PATH=$bin:$PATH "$bin/maturin" build --release --strip --zig --compatibility manylinux2014 \
        --target aarch64-unknown-linux-gnu --out "$dist" -m python/Cargo.toml
    local whl
    whl=$(ls "$dist"/blkhash-"$version"-cp39-abi3-manylinux*aarch64.whl) ||
        fail "no manylinux aarch64 wheel for $version in dist/"
    local list
    list=$(python3 -m zipfile -l "$whl")
    grep -q 'licenses/LICENSE-MIT' <<< "$list" || fail "$whl: no LICENSE-MIT"
    grep -q 'licenses/LICENSE-APACHE' <<< "$list" || fail "$whl: no LICENSE-APACHE"
    ls -l "$whl"
    say "aarch64 wheel in $(took "$start")"
}

# The dry run puts the packages it made in a registry of its own under
# target/package and builds each crate against the ones before it, as
# extracted into $CARGO_HOME/registry/src/-HASH/NAME-VERSION, the hash
# being the registry's path. Cargo extracts a package only once there: a
# later run from the same directory (CI's checkout, with CARGO_HOME kept)
# would build against the sources of an earlier commit of the same
# version, and fail to compile whatever uses what they lack. So they are
# removed, before and after: only our crates' directories, only under
# such local registries (crates.io's is index.crates.io-HASH).
forget_packaged_sources() {
    local name dir
    for name in "$@"; do
        for dir in "${CARGO_HOME:-$HOME/.cargo}/registry/src/"-*/"$name-$version"; do
            if [ -d "$dir" ]; then rm -rf "$dir"; fi
        done
    done
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
    # Each crate's package must carry the license files (symbolic links to
    # the root's, which cargo packages as files).
    local list name
    for name in $names; do
        list=$(cargo package --list --allow-dirty -p "$name" 2>/dev/null) ||
            fail "cargo package --list -p $name failed"
        { grep -qx LICENSE-MIT <<< "$list" && grep -qx LICENSE-APACHE <<< "$list"; } ||
            fail "$name: no LICENSE-MIT and LICENSE-APACHE in its package (ln -s ../LICENSE-MIT ../LICENSE-APACHE $name/)"
    done
    # What `cargo publish` would do, short of the upload: every publishable
    # crate in dependency order, each packaged and built from its package as
    # crates.io users build it. The crates not on crates.io yet resolve from
    # the packages made before them (cargo >= 1.90's multi-package publish;
    # one crate at a time, a dry run would look for its unpublished
    # dependencies on crates.io and fail). --allow-dirty: a release is cut
    # from a clean tag, but this runs on work trees too.
    rm -rf "$dist/crates"
    forget_packaged_sources $names
    cargo publish --dry-run --workspace --allow-dirty
    forget_packaged_sources $names
    # The .crate files themselves (the same packages: nothing built again).
    # Named one by one: --workspace would package the crates that are not
    # published too, and refuses libblkhash's path-only dependency.
    local packages=()
    for name in $names; do
        packages+=(-p "$name")
    done
    cargo package --no-verify --allow-dirty "${packages[@]}"
    mkdir -p "$dist/crates"
    for name in $names; do
        cp "$target/package/$name-$version.crate" "$dist/crates/"
    done
    ls -l "$dist/crates"
    say "crates ($names) in $(took "$start")"
}

# A static tarball: blkhash-VERSION-ARCH-linux-musl.tar.gz, the four
# commands linked statically against musl (Rust's own copy of its libc.a),
# so that they run on any Linux of that architecture: no C library or
# loader needed, none of the host's looked at. build_static ARCH
build_static() {
    local start=$SECONDS arch=$1 triple strip
    triple=$arch-unknown-linux-musl
    rust_target "$triple"
    local build=(cargo build) run=()
    case $arch in
        x86_64)
            # The C parts (ring, zstd, blake3's assembly) by musl-gcc, which
            # the cc crate picks for this target.
            command -v musl-gcc >/dev/null || fail "no musl-gcc: install musl-tools (scripts/setup.sh)"
            strip=strip
            [ "$(uname -m)" = x86_64 ] || run=(qemu-x86_64)
            ;;
        aarch64)
            # Debian has no musl cross compiler for aarch64: zig is one (C
            # headers of musl for every target), driven by cargo-zigbuild.
            command -v aarch64-linux-gnu-strip >/dev/null ||
                fail "no aarch64-linux-gnu-strip: install binutils-aarch64-linux-gnu (scripts/setup.sh)"
            local bin
            bin=$(zig_venv)
            build=(env "PATH=$bin:$PATH" "$bin/cargo-zigbuild" zigbuild)
            strip=aarch64-linux-gnu-strip
            if [ "$(uname -m)" != aarch64 ]; then
                command -v qemu-aarch64 >/dev/null || fail "no qemu-aarch64: install qemu-user (scripts/setup.sh)"
                run=(qemu-aarch64)
            fi
            ;;
    esac
    # The commands' two packages only (no C library, no Python module).
    "${build[@]}" --profile "$static_profile" --target "$triple" -p blksum -p blktools
    local name=blkhash-$version-$arch-linux-musl
    local stage=$tools/static/$name out=$target/$triple/$static_profile
    rm -rf "$stage"
    mkdir -p "$stage/man/man1" "$stage/complete"
    local b
    for b in blksum blkmap blkdiff blksync; do
        "$strip" -o "$stage/$b" "$out/$b"
        # Static: no program interpreter (loader), no shared library.
        ! grep -q 'INTERP\|(NEEDED)' <<<"$(readelf -ldW "$stage/$b")" ||
            fail "$b for $arch is not statically linked: $(file "$stage/$b")"
        # It runs (here, or under qemu-user) and writes its own manual page
        # and completions.
        "${run[@]}" "$stage/$b" --man > "$stage/man/man1/$b.1"
        "${run[@]}" "$stage/$b" --completions bash > "$stage/complete/$b.bash"
        "${run[@]}" "$stage/$b" --completions zsh > "$stage/complete/_$b"
        "${run[@]}" "$stage/$b" --completions fish > "$stage/complete/$b.fish"
    done
    grep -qF "$version" <<<"$("${run[@]}" "$stage/blksum" --version)" || fail "$name: blksum --version is not $version"
    cp LICENSE-MIT LICENSE-APACHE "$stage/"
    sed -e "s/@VERSION@/$version/g" -e "s/@ARCH@/$arch/g" packaging/static/README.md > "$stage/README.md"
    rm -f "$dist/$name.tar.gz"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$(git log -1 --format=%ct)" \
        -C "$tools/static" -czf "$dist/$name.tar.gz" "$name"
    rm -rf "$stage"
    ls -l "$dist/$name.tar.gz"
    say "$arch static tarball in $(took "$start")"
}

# The OCI image archive of the static tarballs of ARCH... (made first by
# build_static): dist/blkhash-VERSION-oci.tar. build_oci ARCH...
build_oci() {
    local start=$SECONDS tool
    for tool in umoci skopeo; do
        command -v "$tool" >/dev/null || fail "$tool not found: run scripts/setup.sh (umoci, skopeo)"
    done
    local stage=$tools/oci
    local layout=$stage/layout created revision source
    rm -rf "$stage"
    mkdir -p "$stage"
    umoci init --layout "$layout"
    # Reproducible: times are the commit's, as for the tarballs.
    created=$(date -u -d "@$(git log -1 --format=%ct)" +%Y-%m-%dT%H:%M:%SZ)
    revision=$(git rev-parse HEAD)
    source=$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository *= *"\(.*\)"/\1/p' Cargo.toml)
    local labels=(
        "org.opencontainers.image.title=blkhash"
        "org.opencontainers.image.description=blksum, blkmap, blkdiff and blksync: disk image checksums of guest content"
        "org.opencontainers.image.version=$version"
        "org.opencontainers.image.source=$source"
        "org.opencontainers.image.url=$source"
        "org.opencontainers.image.revision=$revision"
        "org.opencontainers.image.licenses=MIT OR Apache-2.0"
        "org.opencontainers.image.created=$created"
    )
    local arch goarch arches=()
    for arch in "$@"; do
        case $arch in x86_64) goarch=amd64 ;; aarch64) goarch=arm64 ;; esac
        oci_image "$layout" "$arch" "$goarch" "$created" "${labels[@]}"
        arches+=("$goarch")
    done
    umoci gc --layout "$layout"
    oci_index "$layout" "${arches[@]}"
    # An oci-archive is the layout in a tar file.
    local out=$dist/blkhash-$version-oci.tar
    find "$layout" -exec touch -h -d "$created" {} +
    rm -f "$out"
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="$created" -C "$layout" -cf "$out" .
    rm -rf "$stage"
    # What skopeo makes of it: the image of this machine's architecture.
    local seen
    seen=$(skopeo inspect --config "oci-archive:$out:$version") || fail "skopeo inspect $out failed"
    grep -q '"User": "65532:65532"' <<<"$seen" || fail "$out: not run as user 65532: $seen"
    grep -qF "\"org.opencontainers.image.version\": \"$version\"" <<<"$seen" ||
        fail "$out: no version label: $seen"
    ls -l "$out"
    say "OCI image archive ($*) in $(took "$start")"
}

# One architecture's image in the layout, tagged VERSION-GOARCH, from its
# static tarball. oci_image LAYOUT ARCH GOARCH CREATED LABEL...
oci_image() {
    local layout=$1 arch=$2 goarch=$3 created=$4
    shift 4
    local name=blkhash-$version-$arch-linux-musl tag=$version-$goarch
    local bundle=$tools/oci/bundle-$goarch
    [ -f "$dist/$name.tar.gz" ] || fail "no $dist/$name.tar.gz: --oci needs the static build"
    umoci new --image "$layout:$tag"
    umoci unpack --rootless --image "$layout:$tag" "$bundle"
    local r=$bundle/rootfs
    mkdir -p "$r/usr/bin" "$r/usr/share/licenses/blkhash" "$r/usr/share/man/man1" "$r/etc/ssl/certs" "$r/tmp"
    tar -xzf "$dist/$name.tar.gz" -C "$tools/oci"
    local b
    for b in blksum blkmap blkdiff blksync; do
        install -m 755 "$tools/oci/$name/$b" "$r/usr/bin/$b"
    done
    install -m 644 "$tools/oci/$name"/man/man1/*.1 "$r/usr/share/man/man1/"
    install -m 644 "$tools/oci/$name"/LICENSE-* "$r/usr/share/licenses/blkhash/"
    # HTTPS URLs checked with the usual CAs (a cluster's own CA, as a
    # VirtualMachineExport's: --tls-certificates).
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
        install -m 644 /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/"
    fi
    chmod 1777 "$r/tmp"
    rm -rf "${tools:?}/oci/$name"
    find "$r" -exec touch -h -d "$created" {} +
    umoci repack --image "$layout:$tag" --history.created "$created" \
        --history.comment "blkhash $version static commands" "$bundle"
    local config=(--architecture "$goarch" --os linux --created "$created" --no-history
        --config.user 65532:65532 --config.env PATH=/usr/bin --config.workingdir /
        --config.cmd blksum --config.cmd --help)
    local l
    for l in "$@"; do
        config+=(--config.label "$l" --manifest.annotation "$l")
    done
    umoci config --image "$layout:$tag" "${config[@]}"
    rm -rf "$bundle"
}

# The image index of the architectures' images, tagged VERSION (what
# `skopeo copy --all` pushes): a small JSON document of the OCI image
# spec that umoci does not write (it tags manifests, never an index of
# them). oci_index LAYOUT GOARCH...
oci_index() {
    python3 - "$version" "$@" <<'PYEOF'
import hashlib, json, os, sys
version, layout, arches = sys.argv[1], sys.argv[2], sys.argv[3:]
index_path = os.path.join(layout, "index.json")
top = json.load(open(index_path))
by_tag = {m["annotations"]["org.opencontainers.image.ref.name"]: m for m in top["manifests"]}
entries = []
for arch in arches:
    m = dict(by_tag[f"{version}-{arch}"])
    m.pop("annotations", None)
    m["platform"] = {"architecture": arch, "os": "linux"}
    entries.append(m)
index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
         "manifests": entries}
blob = json.dumps(index, separators=(",", ":"), sort_keys=True).encode()
digest = hashlib.sha256(blob).hexdigest()
with open(os.path.join(layout, "blobs", "sha256", digest), "wb") as f:
    f.write(blob)
top["manifests"].append({"mediaType": "application/vnd.oci.image.index.v1+json",
                         "digest": f"sha256:{digest}", "size": len(blob),
                         "annotations": {"org.opencontainers.image.ref.name": version}})
with open(index_path, "w") as f:
    json.dump(top, f, separators=(",", ":"), sort_keys=True)
PYEOF
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

if [ "$release" = 1 ]; then
    # A release is what this run makes, and nothing else.
    rm -rf "$dist"
    mkdir -p "$dist"
fi
[ "$deb" = 0 ] || build_deb
[ "$deb_arm64" = 0 ] || build_deb arm64
[ "$wheel" = 0 ] || build_wheel
[ "$wheel_arm64" = 0 ] || build_wheel_arm64
[ "$crates" = 0 ] || build_crates
[ "$rpm" = 0 ] || build_rpm
for a in "${static[@]}"; do
    build_static "$a"
done
[ "$oci" = 0 ] || build_oci "${static[@]}"
# The checksums of everything in dist/, as `sha256sum -c SHA256SUMS` reads
# them (paths relative to dist/).
(cd "$dist" && find . -type f ! -name 'SHA256SUMS*' -printf '%P\n' | LC_ALL=C sort |
    xargs -r -d '\n' sha256sum > SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
say "done: $dist ($(wc -l < "$dist/SHA256SUMS") files in SHA256SUMS)"
