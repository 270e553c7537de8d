#!/usr/bin/env bash
# Build the Python package as a user installs it (pip install ./python: one
# release build by maturin) into a throwaway venv, and run its pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=$(mktemp -d "${TMPDIR:-/tmp}/blkhash-venv.XXXXXX")
trap 'rm -rf "$venv"' EXIT
# Readable by all: the thread-limit tests (test_limits.py) run its Python as
# a user of its own, since RLIMIT_NPROC does not bind root.
chmod 755 "$venv"

python3 -m venv "$venv"
# blake3: the tests' model of the construction for that digest (not in hashlib).
# distributed (dask): the fan-out test runs map_range on a local cluster.
"$venv/bin/pip" install --quiet --disable-pip-version-check ./python pytest blake3 distributed
# From python/: the tests import the installed package, not the sources.
(cd python && "$venv/bin/python" -m pytest -q -p no:cacheprovider tests "$@")
