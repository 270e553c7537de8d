#!/usr/bin/env bash
# Run every test: formatting, lints, unit, property, vector and command tests.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
# The API documentation builds without a warning (a broken link, a private item).
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# A short fuzzing run of every parser of untrusted bytes.
scripts/fuzz.sh "${FUZZ_SECONDS:-60}"

# libblkhash.so and .a, which the C tests link (cargo test builds only the rlib).
cargo build --workspace --release
# Every test binary runs, and every failure is reported, not only the first.
# A hung test fails the run after 40 minutes instead of stalling CI (libtest
# names a test running for over 60 s, which points at the hang).
timeout --kill-after=30 2400 cargo test --workspace --release --no-fail-fast

# scripts/install.sh into a scratch prefix: the commands, the C library
# through pkg-config, the manual pages.
scripts/test-install.sh

# The Python package, built and installed as a user would, and its tests.
scripts/test-python.sh
