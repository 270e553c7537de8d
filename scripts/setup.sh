#!/usr/bin/env bash
# Install what building and testing blkhash needs on a fresh Debian machine.
# Safe to run again: apt-get skips what is installed.
set -euo pipefail

packages=(qemu-utils util-linux python3 python3-venv nbdkit gnutls-bin time gcc pkg-config valgrind
    binutils file man-db)

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi

if ! command -v cargo >/dev/null; then
    echo "setup: cargo not found: install a Rust toolchain (rustup) first" >&2
    exit 1
fi
