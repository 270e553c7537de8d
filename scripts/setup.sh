#!/usr/bin/env bash
# Install what building and testing blkhash needs, with apt-get (Debian,
# Ubuntu) or dnf (Fedora, CentOS Stream, RHEL with EPEL for nbdkit).
# Needs root or sudo for the packages; a Rust toolchain (rustup) must be
# there already. Safe to run again: only missing packages are installed.
set -euo pipefail

# The same tools under each family's package names: QEMU's qemu-img, qemu-io
# and qemu-nbd; nbdkit with its basic plugins and filters; certtool for the
# TLS tests; GNU time; a C compiler, pkg-config and valgrind for the C
# library's tests; objdump, file and man for the install test; Python with
# venv for the Python package.
apt_packages=(qemu-utils util-linux python3 python3-venv nbdkit gnutls-bin time gcc pkg-config
    valgrind binutils file man-db tmux)
dnf_packages=(qemu-img util-linux python3 nbdkit gnutls-utils time gcc pkgconf-pkg-config
    valgrind binutils file man-db tmux)

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi

missing=()
if command -v apt-get >/dev/null; then
    for p in "${apt_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
    fi
elif command -v dnf >/dev/null; then
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
