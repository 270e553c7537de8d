#!/usr/bin/env bash
# Install what building and testing blkhash needs, with apt-get (Debian,
# Ubuntu) or dnf (Fedora, CentOS Stream, RHEL with EPEL for nbdkit);
# `scripts/setup.sh --demo` only what scripts/demo.sh needs.
# Needs root or sudo for the packages; a Rust toolchain (rustup) must be
# there already. Safe to run again: only missing packages are installed.
set -euo pipefail

# The same tools under each family's package names: QEMU's qemu-img, qemu-io
# and qemu-nbd (qemu-utils on Debian, qemu-img on Fedora); nbdkit with its
# basic plugins and filters; certtool for the TLS tests; GNU time; a C
# compiler, pkg-config and valgrind for the C library's tests, and the static
# C library (libc.a: libc6-dev, glibc-static) for the static link of
# scripts/test-install.sh; objdump, file and man for the install test and
# the manual page tests; nginx for the HTTP(S) tests (started by the tests
# themselves, on a free port with a configuration of their own: the
# package's own service is not used); Dante's SOCKS server (dante-server)
# for the SOCKS proxy test (started by the test, its service not used);
# Python with venv for the Python package; tmux for
# blksum/tests/progress.rs, which runs blksum -p in a real terminal to see
# its progress bar drawn and cleared; for scripts/package.sh, debhelper
# (dpkg-buildpackage) and lintian for the debs, rpm (rpmbuild, rpm2archive;
# rpm-build on Fedora) for the RPMs. Other architectures and static builds
# (scripts/test-cross.sh, scripts/test-static.sh, scripts/package.sh
# --release): the aarch64 cross compiler with its C library
# (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross: Debian and Ubuntu only;
# Fedora's cross compilers have no C library), QEMU's user-mode emulation
# with its binfmt_misc handlers (qemu-user, qemu-user-binfmt), musl-gcc
# (musl-tools) for the C parts of the static x86_64 build; umoci and
# skopeo for the OCI image archive (scripts/package.sh --oci, checked by
# scripts/test-static.sh); Python's yaml for the Kubernetes manifests of
# docs/guide/kubevirt.md, which scripts/test-docs.py parses. libvirt's
# daemon, client and QEMU driver, QEMU's x86 system emulator and
# virtnbdbackup for blktools/tests/libvirt.rs (a libvirtd of the test's own
# in a private mount namespace: the packages' services are not used), and
# its stream writer and virtnbdrestore for blksum's stream tests
# (testkit::vnbd: no VM, libvirt's test driver).
# gzip, xz and zstd write the compressed images of blksum/tests/compressed.rs
# and the bench's compressed cases.
apt_packages=(qemu-utils util-linux python3 python3-venv nbdkit gnutls-bin time gcc libc6-dev
    pkg-config valgrind binutils file man-db tmux debhelper lintian rpm nginx dante-server
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross binfmt-support musl-tools gzip xz-utils zstd
    umoci skopeo python3-yaml)
# QEMU's other programs, which must be of qemu-utils' own version: Debian
# 12's qemu-system-x86 (7.2) installed beside a qemu-utils from
# bookworm-backports (10.x) makes apt remove qemu-utils. Where qemu-utils
# came from backports (as on the machines CI runs on), these come from
# there too, in an apt call of their own before libvirt (whose packages
# would otherwise pull in 7.2).
qemu_family=(qemu-system-x86 qemu-user qemu-user-binfmt)
# libvirt without its recommended extras (firewall, dnsmasq, ...): the
# tests start libvirtd with a configuration of their own.
vm_packages=(libvirt-daemon-system libvirt-clients libvirt-daemon-driver-qemu virtnbdbackup)
dnf_packages=(qemu-img util-linux python3 nbdkit gnutls-utils time gcc glibc-static
    pkgconf-pkg-config valgrind binutils file man-db tmux rpm-build nginx gzip xz zstd skopeo python3-pyyaml)
# Not in every dnf family's repositories (RHEL has no musl-gcc, nor
# dante-server without EPEL): tried, and the steps that need them fail naming
# what is missing (the SOCKS test says it is skipped).
dnf_optional=(musl-gcc qemu-user qemu-user-binfmt umoci
    libvirt-daemon-driver-qemu libvirt-client qemu-system-x86-core virtnbdbackup dante-server)

# --demo: only what scripts/demo.sh runs beside cargo (qemu-img; the rest
# is coreutils), not the tools of the tests and packages.
demo=false
if [ "${1:-}" = --demo ]; then
    demo=true
    apt_packages=(qemu-utils)
    dnf_packages=(qemu-img)
    qemu_family=()
    vm_packages=()
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi

# The packages of the list given that are not installed, on stdout.
apt_missing() {
    local p
    for p in "$@"; do
        grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || echo "$p"
    done
}

# apt-get install, non-interactive; Lock::Timeout: wait for another apt or
# dpkg run (another build on a shared machine) rather than fail at once.
apt_install() {
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq -o DPkg::Lock::Timeout=600 "$@"
}

# Debian's backports source for this release, added if the system has none.
backports_source() {
    local codename
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$codename" ] || { echo "setup: no VERSION_CODENAME in /etc/os-release" >&2; return 1; }
    if ! grep -rqs -- "$codename-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
            "$codename-backports" | $sudo tee "/etc/apt/sources.list.d/$codename-backports.sources" >/dev/null
    fi
    echo "$codename-backports"
}

missing=()
if command -v apt-get >/dev/null; then
    mapfile -t missing < <(apt_missing "${apt_packages[@]}")
    updated=false
    if [ ${#missing[@]} -gt 0 ]; then
        $sudo apt-get update -qq
        updated=true
        apt_install "${missing[@]}"
    fi
    qemu_version=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
    if [ -n "$(apt_missing "${qemu_family[@]}")" ]; then
        case "$qemu_version" in
            *~bpo*)
                suite=$(backports_source)
                $sudo apt-get update -qq
                apt_install --no-install-recommends -t "$suite" "${qemu_family[@]}"
                ;;
            *)
                $updated || $sudo apt-get update -qq
                updated=true
                apt_install --no-install-recommends "${qemu_family[@]}"
                ;;
        esac
    fi
    mapfile -t missing < <(apt_missing "${vm_packages[@]}")
    if [ ${#missing[@]} -gt 0 ]; then
        $updated || $sudo apt-get update -qq
        apt_install --no-install-recommends "${missing[@]}"
    fi
elif command -v dnf >/dev/null; then
    # RHEL and its rebuilds (CentOS Stream, AlmaLinux, Rocky) ship nbdkit in
    # EPEL, not in their own repositories (Fedora does): enable EPEL first,
    # with its epel-release package (in CentOS Stream's and the rebuilds'
    # extras), or on RHEL proper from the Fedora project. EPEL's packages
    # and glibc-static need CRB (CodeReady Builder), which epel-release's
    # crb command enables.
    os_id=$(. /etc/os-release 2>/dev/null && echo "${ID:-} ${ID_LIKE:-}")
    version=$(. /etc/os-release 2>/dev/null && echo "${VERSION_ID%%.*}")
    # RHEL says ID=rhel, its rebuilds name rhel or centos in ID_LIKE; Fedora
    # says neither.
    # (--demo needs no EPEL: qemu-img is in the system's repositories.)
    $demo && os_id=""
    case " $os_id " in
        *" rhel "* | *" centos "*)
            if ! rpm -q epel-release >/dev/null 2>&1; then
                $sudo dnf install -y -q epel-release ||
                    $sudo dnf install -y -q \
                        "https://dl.fedoraproject.org/pub/epel/epel-release-latest-$version.noarch.rpm"
            fi
            if command -v crb >/dev/null; then
                $sudo crb enable
            fi
            ;;
    esac
    for p in "${dnf_packages[@]}"; do
        rpm -q "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        $sudo dnf install -y -q "${missing[@]}"
    fi
    for p in "${dnf_optional[@]}"; do
        rpm -q "$p" >/dev/null 2>&1 || $sudo dnf install -y -q "$p" ||
            echo "setup: WARNING: dnf could not install $p: the static and arm64 steps need it" >&2
    done
else
    echo "setup: neither apt-get nor dnf found: install these (Debian names) by hand:" >&2
    echo "  ${apt_packages[*]}" >&2
    exit 1
fi

if ! command -v cargo >/dev/null; then
    echo "setup: cargo not found: install a Rust toolchain (https://rustup.rs) first" >&2
    exit 1
fi

# The Rust targets of the static and arm64 builds (rustup's own download).
# A failure here does not stop the set-up: the steps that need a target
# fail on their own, naming it (scripts/test-cross.sh, test-static.sh).
targets=(x86_64-unknown-linux-musl aarch64-unknown-linux-gnu aarch64-unknown-linux-musl)
if command -v rustup >/dev/null; then
    missing=()
    installed=$(rustup target list --installed)
    for t in "${targets[@]}"; do
        grep -qx "$t" <<<"$installed" || missing+=("$t")
    done
    if [ ${#missing[@]} -gt 0 ] && ! rustup target add "${missing[@]}"; then
        echo "setup: WARNING: rustup target add ${missing[*]} failed: the static and arm64 steps will fail" >&2
    fi
else
    echo "setup: WARNING: no rustup: add the targets ${targets[*]} to your toolchain, or the static and arm64 steps fail" >&2
fi

# aarch64 programs run by the kernel through qemu-aarch64 (binfmt_misc), as
# the arm64 tests start the commands: mount binfmt_misc where it is not
# (containers, minimal systems) and register the handler qemu-user-binfmt
# installed. QEMU 7's package (Debian 12) describes it to binfmt-support
# (/usr/share/binfmts, enabled by update-binfmts); QEMU 10's (Debian 13,
# and 12's backports, which this script takes with their qemu-utils) to
# systemd-binfmt (/usr/lib/binfmt.d), which nothing reads without systemd:
# its line is then written to the kernel as systemd-binfmt would. Needs
# root; a failure is reported by scripts/test-cross.sh.
binfmts=/usr/share/binfmts/qemu-aarch64
binfmt_d=/usr/lib/binfmt.d/qemu-aarch64.conf
if [ -e "$binfmts" ] || [ -e "$binfmt_d" ]; then
    if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
        $sudo mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc ||
            echo "setup: WARNING: cannot mount binfmt_misc: the arm64 step will fail" >&2
    fi
    if [ -e /proc/sys/fs/binfmt_misc/status ] && [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]; then
        if [ -e "$binfmts" ] && command -v update-binfmts >/dev/null; then
            $sudo update-binfmts --enable qemu-aarch64 ||
                echo "setup: WARNING: update-binfmts --enable qemu-aarch64 failed: the arm64 step will fail" >&2
        fi
        if [ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && [ -e "$binfmt_d" ]; then
            grep -m1 '^:' "$binfmt_d" | $sudo tee /proc/sys/fs/binfmt_misc/register >/dev/null ||
                echo "setup: WARNING: cannot register $binfmt_d: the arm64 step will fail" >&2
        fi
    fi
fi
