#!/usr/bin/env bash
# Install what building and testing blkhash needs, with apt-get (Debian,
# Ubuntu) or dnf (Fedora, CentOS Stream, RHEL with EPEL for nbdkit).
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
# package's own service is not used); Python with venv for the Python package; tmux for
# blksum/tests/progress.rs, which runs blksum -p in a real terminal to see
# its progress bar drawn and cleared; for scripts/package.sh, debhelper
# (dpkg-buildpackage) and lintian for the debs, rpm (rpmbuild, rpm2archive;
# rpm-build on Fedora) for the RPMs.
apt_packages=(qemu-utils util-linux python3 python3-venv nbdkit gnutls-bin time gcc libc6-dev
    pkg-config valgrind binutils file man-db tmux debhelper lintian rpm nginx)
dnf_packages=(qemu-img util-linux python3 nbdkit gnutls-utils time gcc glibc-static
    pkgconf-pkg-config valgrind binutils file man-db tmux rpm-build nginx)

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi

missing=()
if command -v apt-get >/dev/null; then
    for p in "${apt_packages[@]}"; do
        grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
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
else
    echo "setup: neither apt-get nor dnf found: install these (Debian names) by hand:" >&2
    echo "  ${apt_packages[*]}" >&2
    exit 1
fi

if ! command -v cargo >/dev/null; then
    echo "setup: cargo not found: install a Rust toolchain (https://rustup.rs) first" >&2
    exit 1
fi
