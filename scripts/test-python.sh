#!/usr/bin/env bash
# The Python package as users get it: the release wheel (scripts/package.sh
# --wheel: maturin, abi3, into dist/) installed into a throwaway venv with
# pip --no-index and no cargo or rustc on PATH, then its pytest suite.
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
venv=$(mktemp -d "$tmp/blkhash-venv.XXXXXX")
trap 'rm -rf "$venv"' EXIT
chmod 755 "$venv"

scripts/package.sh --wheel
python3 -m venv "$venv"
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
PATH=$no_rust "$venv/bin/pip" install --quiet --disable-pip-version-check --no-index dist/blkhash-*-abi3-*.whl
# blake3: the tests' model of the construction for that digest (not in hashlib).
# distributed (dask): the fan-out test runs map_range on a local cluster.
"$venv/bin/pip" install --quiet --disable-pip-version-check pytest blake3 distributed
# From python/: the tests import the installed package, not the sources.
# --basetemp: pytest's tmp_path directories in the venv, removed with it
# (by default pytest keeps the last three runs' under the temporary directory).
(cd python && "$venv/bin/python" -m pytest -q -p no:cacheprovider --basetemp="$venv/pytest" tests "$@")
