#!/usr/bin/env bash
# Run every test: formatting, lints, unit, property, vector, command, C and
# Python tests.
#
# Every step runs even when an earlier one fails (one failing Rust test must
# not hide the Python suite); the run ends with a summary, each step with
# PASS or FAIL and its duration, whose last line is exactly "N passed, N
# failed" (CI reads it), and exits 1 if any step failed.
set -uo pipefail
cd "$(dirname "$0")/.."

summary=()
passed=0
failed=0

# step NAME COMMAND...: run COMMAND (its output as it comes), record the result.
step() {
    local name=$1 start=$SECONDS rc
    shift
    echo "==> $name"
    "$@"
    rc=$?
    local took=$((SECONDS - start))
    local t
    t=$(printf '%dm%02ds' $((took / 60)) $((took % 60)))
    if [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
        summary+=("$(printf 'PASS  %8s  %s' "$t" "$name")")
    else
        failed=$((failed + 1))
        summary+=("$(printf 'FAIL  %8s  %s (exit %d)' "$t" "$name" "$rc")")
    fi
    echo "==> $name: $([ "$rc" -eq 0 ] && echo PASS || echo "FAIL (exit $rc)") in $t"
}

step "setup (scripts/setup.sh)" scripts/setup.sh
step "cargo fmt --check" cargo fmt --all -- --check
step "cargo clippy" cargo clippy --workspace --all-targets --release -- -D warnings
# The API documentation builds without a warning (a broken link, a private item).
step "cargo doc" env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# A short fuzzing run of every parser of untrusted bytes: a line per target
# here, libFuzzer's whole output in target/fuzz-logs/. fuzz.sh installs
# cargo-fuzz (cargo install, into ~/.cargo/bin) if it is missing, and on a
# stable-only toolchain sets RUSTC_BOOTSTRAP=1 for its own builds, which
# need nightly flags (the sanitizers): see its comments.
step "fuzz (scripts/fuzz.sh)" scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
# libblkhash.so and .a, which the C tests link (cargo test builds only the rlib).
step "cargo build" cargo build --workspace --release
# Every test binary runs, and every failure is reported, not only the first.
# A hung test fails the run after 40 minutes instead of stalling CI (libtest
# names a test running for over 60 s, which points at the hang).
step "cargo test" timeout --kill-after=30 2400 cargo test --workspace --release --no-fail-fast
# scripts/install.sh into a scratch prefix: the commands, the C library
# through pkg-config, the manual pages.
step "install (scripts/test-install.sh)" scripts/test-install.sh
# The Python package, built and installed as a user would, and its tests.
step "python (scripts/test-python.sh)" scripts/test-python.sh
# The C library's ABI against libblkhash 0.11's, the crates' publish dry
# run, and the debs built, installed, used and removed (the RPMs:
# scripts/package.sh --rpm).
step "package (scripts/test-package.sh)" scripts/test-package.sh
# The static musl tarball of this architecture, its blksum run in an empty
# chroot on every reference vector.
step "static (scripts/test-static.sh)" scripts/test-static.sh
# arm64: the workspace cross-compiled, its unit, property and vector tests
# and blksum on real images under qemu-user (no speed figures: emulated).
# A missing cross tool or Rust target fails this step, naming it.
step "arm64 (scripts/test-cross.sh)" scripts/test-cross.sh

echo
echo "==> summary"
printf '%s\n' "${summary[@]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
