#!/usr/bin/env bash
# The Python package as users get it: the release wheel (scripts/package.sh
# --wheel: maturin, abi3, into dist/) installed into a throwaway venv by
# the README's own install line (pip --no-index --find-links dist), with no
# cargo or rustc on PATH, then its pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."

# Readable by all: the thread-limit tests (test_limits.py) run its Python as
# a user of its own, since RLIMIT_NPROC does not bind root. So it is made in
# the temporary directory only when others can pass through every directory
# above it (a private TMPDIR, mode 0700 as mktemp -d makes it, does not let
# them), else in /tmp.
open_to_all() {
    local d
    d=$(realpath "$1")
    while :; do
        [ $(($(stat -c '0%a' "$d") & 1)) -eq 1 ] || return 1
        [ "$d" = / ] && return 0
        d=$(dirname "$d")
    done
}
tmp=${TMPDIR:-/tmp}
open_to_all "$tmp" || tmp=/tmp
top=$(mktemp -d "$tmp/blkhash-venv.XXXXXX")
trap 'rm -rf "$top"' EXIT
chmod 755 "$top"

scripts/package.sh --wheel
# PATH without the directories that hold cargo or rustc: the wheel must
# install without building anything.
no_rust=""
IFS=: read -ra dirs <<< "$PATH"
for d in "${dirs[@]}"; do
    if [ -e "$d/cargo" ] || [ -e "$d/rustc" ]; then
        continue
    fi
    no_rust=${no_rust:+$no_rust:}$d
done
# The README's install line, as it is written there, run where dist/ is
# this one's: the wheel of this machine picked by pip among dist/'s
# (--release puts the aarch64 one there too), nothing built.
line=$(grep -E '^python3 -m venv venv && venv/bin/pip install' README.md)
[ "$(wc -l <<< "$line")" -eq 1 ] || { echo "test-python: no one install line in README.md" >&2; exit 1; }
ln -s "$PWD/dist" "$top/dist"
(cd "$top" && PATH=$no_rust PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_QUIET=1 bash -ec "$line")
venv=$top/venv
# blake3: the tests' model of the construction for that digest (not in hashlib).
# distributed (dask): the fan-out test runs map_range on a local cluster.
"$venv/bin/pip" install --quiet --disable-pip-version-check pytest blake3 distributed
# From python/: the tests import the installed package, not the sources.
# --basetemp: pytest's tmp_path directories in the venv, removed with it
# (by default pytest keeps the last three runs' under the temporary directory).
# A failure here does not stop the script: the libvirt test below still
# runs and reports; the script exits 1 if either failed.
status=0
(cd python && "$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp="$venv/pytest" tests "$@") || status=1
# Python over libvirt's backup export and virtnbdbackup's streams: a Rust
# test (blktools/tests/libvirt.rs: it starts libvirtd and a VM) given this
# venv's Python; cargo on the full PATH. Only for the whole suite: pytest's
# own arguments (-k NAME) select Python tests, not this one.
if [ $# -eq 0 ]; then
    BLKHASH_PYTHON=$venv/bin/python cargo test --profile quick -p blktools --test commands \
        libvirt::libvirt_from_python -- --exact --nocapture || status=1
else
    echo "test-python: pytest arguments given: libvirt_from_python not run"
fi
exit "$status"
